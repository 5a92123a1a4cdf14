"""Ingest: idempotent on run_id and on (job_id, attempt), exact round trip, deduplicated machines/environments."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from deltabench.db import queries
from deltabench.db.engine import session_scope
from deltabench.db.ingest import ingest_document, pack_samples, unpack_samples
from deltabench.db.models import Check, Environment, Machine, Result, ResultSamples, Run
from deltabench.harness.document import HARDWARE_CHECKS, CheckRecord


def _count(engine, model) -> int:  # type: ignore[no-untyped-def]
    with session_scope(engine) as s:
        return s.scalar(select(func.count()).select_from(model))


def test_round_trip_is_exact(engine, factory) -> None:  # type: ignore[no-untyped-def]
    doc = factory.document()
    with session_scope(engine) as s:
        assert ingest_document(s, doc) == doc.run_id
    with session_scope(engine) as s:
        loaded = queries.load_run_document(s, doc.run_id)
    assert loaded.model_dump() == doc.model_dump()
    assert loaded.jobs[3].timing is None and loaded.jobs[3].status == "incorrect"
    assert loaded.jobs[0].timing.samples_ms == doc.jobs[0].timing.samples_ms


def test_check_scopes_load_only_what_a_page_shows(engine, factory) -> None:  # type: ignore[no-untyped-def]
    """A page loads the records of failed jobs and the GPU state of timed GPU jobs, not every passing record."""
    doc = factory.document()
    assert any(j.status == "ok" and j.verification for j in doc.jobs)
    assert any(j.status != "ok" and j.verification for j in doc.jobs)
    gpu = doc.jobs[0]
    assert gpu.status == "ok"
    gpu.device = "cuda"
    state = [
        CheckRecord(check=name, metric="m", value=1980.0, threshold=None, passed=True, gating=False, detail="SM")
        for name in HARDWARE_CHECKS
    ]
    gpu.verification = [*gpu.verification, *state]
    with session_scope(engine) as s:
        ingest_document(s, doc)
        failed_only = queries.load_run_document(s, doc.run_id, checks="failed_jobs")
        no_checks = queries.load_run_document(s, doc.run_id, checks="none")
        with pytest.raises(ValueError, match="checks_scope"):
            queries.load_run_document(s, doc.run_id, checks="some")
    assert failed_only.jobs[0].verification == state
    for stored, loaded in zip(doc.jobs[1:], failed_only.jobs[1:], strict=True):
        assert loaded.verification == ([] if stored.status == "ok" else stored.verification)
    assert all(job.verification == [] for job in no_checks.jobs)
    # everything but the records is the exact document
    assert [j.model_dump(exclude={"verification"}) for j in no_checks.jobs] == [
        j.model_dump(exclude={"verification"}) for j in doc.jobs
    ]


def test_ingest_twice_stores_once(engine, factory) -> None:  # type: ignore[no-untyped-def]
    doc = factory.document()
    for _ in range(2):
        with session_scope(engine) as s:
            assert ingest_document(s, doc) == doc.run_id
    assert _count(engine, Run) == 1
    assert _count(engine, Result) == 4
    assert _count(engine, ResultSamples) == 3  # the incorrect job has no timing
    assert _count(engine, Check) == 8


def test_worker_retry_in_another_document_stores_job_once(engine, factory) -> None:  # type: ignore[no-untyped-def]
    job = factory.job()
    first = factory.document(jobs=[job])
    retry = factory.document(jobs=[job, factory.job(impl="other")])  # new run id, same job again plus a new one
    with session_scope(engine) as s:
        ingest_document(s, first)
    with session_scope(engine) as s:
        ingest_document(s, retry)
    assert _count(engine, Result) == 2
    with session_scope(engine) as s:
        assert [r.impl for r in queries.run_results(s, run_id=first.run_id)] == ["torch_chunk"]
        assert [r.impl for r in queries.run_results(s, run_id=retry.run_id)] == ["other"]
        assert s.scalar(select(func.count()).select_from(Check)) == 4


def test_new_attempt_of_a_job_is_a_new_result(engine, factory) -> None:  # type: ignore[no-untyped-def]
    job = factory.job(status="failed")
    again = job.model_copy(update={"attempt": 2})
    with session_scope(engine) as s:
        ingest_document(s, factory.document(jobs=[job, again]))
    assert _count(engine, Result) == 2


def test_same_run_with_more_jobs_adds_them(engine, factory) -> None:  # type: ignore[no-untyped-def]
    doc = factory.document()
    partial = doc.model_copy(update={"jobs": doc.jobs[:2]})
    with session_scope(engine) as s:
        ingest_document(s, partial)
    with session_scope(engine) as s:
        ingest_document(s, doc)
    with session_scope(engine) as s:
        assert queries.load_run_document(s, doc.run_id).model_dump() == doc.model_dump()
    assert _count(engine, Run) == 1


def test_machines_and_environments_are_shared(engine, factory) -> None:  # type: ignore[no-untyped-def]
    with session_scope(engine) as s:
        ingest_document(s, factory.document())
        ingest_document(s, factory.document())  # same environment
        ingest_document(s, factory.document(commit="b" * 40))  # same machine, new fingerprint
        ingest_document(s, factory.document(host="gpu-node-2"))
    assert _count(engine, Run) == 4
    assert _count(engine, Environment) == 3
    assert _count(engine, Machine) == 2


def test_large_document_in_batches(engine, factory) -> None:  # type: ignore[no-untyped-def]
    jobs = [factory.job(T=64 * (1 + i % 7), median=0.1 + i) for i in range(1203)]
    doc = factory.document(jobs=jobs)
    with session_scope(engine) as s:
        ingest_document(s, doc)
    with session_scope(engine) as s:
        loaded = queries.load_run_document(s, doc.run_id)
    assert [j.job_id for j in loaded.jobs] == [j.job_id for j in jobs]
    assert _count(engine, Check) == 2 * 1203


def test_samples_pack_exactly() -> None:
    samples = [0.1, 1e-9, 123456.789, 3.0000000000000004]
    assert unpack_samples(pack_samples(samples)) == samples
    assert len(pack_samples(samples)) == 8 * len(samples)


def test_concurrent_uploads_store_once(engine, factory) -> None:  # type: ignore[no-untyped-def]
    """Four writers at once (a worker's retry racing the original, the API and a local worker): no duplicate,
    no lost document, no 'database is locked'."""
    from concurrent.futures import ThreadPoolExecutor

    same = factory.document(jobs=[factory.job(T=64 * (i + 1)) for i in range(60)])
    others = [factory.document(jobs=[factory.job(T=64 * (i + 1)) for i in range(60)]) for _ in range(3)]

    def upload(doc) -> str:  # type: ignore[no-untyped-def]
        with session_scope(engine) as s:
            return ingest_document(s, doc)

    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(upload, [same, same, *others, same]))
    assert got == [same.run_id, same.run_id, *(d.run_id for d in others), same.run_id]
    assert _count(engine, Run) == 4
    assert _count(engine, Result) == 4 * 60
    assert _count(engine, Check) == 4 * 60 * 2
    with session_scope(engine) as s:
        assert queries.load_run_document(s, same.run_id).model_dump() == same.model_dump()


def test_postgresql_ingest_writes_its_rows_with_copy_not_a_statement_per_row(  # type: ignore[no-untyped-def]
    pg_url, factory, monkeypatch
) -> None:
    """A statement per row (psycopg's pipelined executemany) was most of an ingest's time on PostgreSQL."""
    import psycopg

    from deltabench.db.engine import get_engine

    rows_sent: list[int] = []
    executemany = psycopg.Cursor.executemany

    def counted(self, query, params_seq, **kwargs):  # type: ignore[no-untyped-def]
        params_seq = list(params_seq)
        rows_sent.append(len(params_seq))
        return executemany(self, query, params_seq, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "executemany", counted)
    jobs = [factory.job(T=64 * (1 + i % 7), median=0.1 + i) for i in range(300)]
    doc = factory.document(jobs=jobs)
    engine = get_engine(pg_url)
    with session_scope(engine) as s:
        ingest_document(s, doc)
    assert sum(rows_sent) < 10, f"{sum(rows_sent)} rows sent a statement each"
    with session_scope(engine) as s:
        loaded = queries.load_run_document(s, doc.run_id)
    assert loaded.model_dump() == doc.model_dump()
    assert _count(engine, Check) == sum(len(j.verification) for j in jobs)


def test_a_batch_stores_a_job_in_two_documents_once_with_the_first(engine, factory) -> None:  # type: ignore[no-untyped-def]
    """Documents stored together (one request's batch) keep the rules of documents stored one by one."""
    from deltabench.db.ingest import store_documents

    job = factory.job()
    first = factory.document(jobs=[job])
    retry = factory.document(jobs=[job, factory.job(impl="other")])
    again = factory.document(jobs=[factory.job(impl="third")])
    with session_scope(engine) as s:
        counts = store_documents(s, [first, retry, first])
    assert counts == [(first.run_id, 1), (retry.run_id, 1), (first.run_id, 0)]
    with session_scope(engine) as s:
        assert [r.impl for r in queries.run_results(s, run_id=first.run_id)] == ["torch_chunk"]
        assert [r.impl for r in queries.run_results(s, run_id=retry.run_id)] == ["other"]
        assert store_documents(s, [again, retry]) == [(again.run_id, 1), (retry.run_id, 0)]
    with session_scope(engine) as s:
        stored = [queries.load_run_document(s, d.run_id) for d in (first, retry, again)]
    assert [[j.impl for j in d.jobs] for d in stored] == [["torch_chunk"], ["other"], ["third"]]
    assert [len(j.verification) for d in stored for j in d.jobs] == [2, 2, 2]


def test_postgresql_ingests_a_batch_of_documents_in_one_insert(pg_url, factory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Per document, the COPY and INSERT statements' own cost was a third of a batch's time on PostgreSQL: the
    documents of one request go in together."""
    import psycopg

    from deltabench.db.engine import get_engine
    from deltabench.db.ingest import store_documents

    inserts: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self, query, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(query).startswith("INSERT INTO results"):
            inserts.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    docs = [
        factory.document(jobs=[factory.job(T=64 * (1 + i), median=0.1 + i + d) for i in range(5)]) for d in range(4)
    ]
    engine = get_engine(pg_url)
    with session_scope(engine) as s:
        assert store_documents(s, docs) == [(d.run_id, 5) for d in docs]
    assert len(inserts) == 1
    with session_scope(engine) as s:
        for doc in docs:
            assert queries.load_run_document(s, doc.run_id).model_dump() == doc.model_dump()
