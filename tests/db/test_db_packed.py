"""Packed sequences (cu_seqlens) in the store: a packed job is stored under its count of sequences, apart from the
dense job of the same dims, and its stored shape id is the case's."""

from __future__ import annotations

import datetime as dt

from conftest import make_document, make_job

from deltabench.db.engine import get_engine, session_scope
from deltabench.db.ingest import ingest_document
from deltabench.db.queries import load_run_document
from deltabench.harness.cases import Case


def test_a_packed_job_is_stored_apart_from_its_dense_shape(db_url) -> None:  # type: ignore[no-untyped-def]
    dense = make_job(T=150)
    dense.case = dense.case.model_copy(update={"B": 1, "H": 2, "K": 16, "V": 16})
    packed = make_job(T=150)
    packed.case = dense.case.model_copy(update={"seqlens": [17, 64, 1, 68]})
    assert packed.case.shape_id == Case("gdn", B=1, T=150, H=2, K=16, V=16, seqlens=(17, 64, 1, 68)).shape_id
    doc = make_document(jobs=[dense, packed])
    with session_scope(get_engine(db_url)) as session:
        ingest_document(session, doc)
    with session_scope(get_engine(db_url)) as session:
        loaded = load_run_document(session, doc.run_id)
        ids = sorted(j.case.shape_id for j in loaded.jobs)
        assert ids == ["B1-T150-H2-K16-V16", "B1-T150-H2-K16-V16-N4"]


def test_a_packed_series_has_a_history_and_its_regressions_refresh(db_url) -> None:  # type: ignore[no-untyped-def]
    """Ingesting a packed job marks its series changed; the refresh and the history read it back by its N."""
    from deltabench.cli.options import refresh_regressions
    from deltabench.db.queries import series_history

    runs = []
    for i, median in enumerate((1.0, 1.0, 1.5)):
        job = make_job(T=150, median=median)
        job.case = job.case.model_copy(update={"B": 1, "H": 2, "K": 16, "V": 16, "seqlens": [17, 64, 1, 68]})
        created = dt.datetime(2026, 1, 1 + i, 12, tzinfo=dt.timezone.utc)
        runs.append(make_document(jobs=[job], commit=f"{i}" * 40, created_at=created))
    engine = get_engine(db_url)
    for doc in runs:
        with session_scope(engine) as session:
            ingest_document(session, doc)
    assert refresh_regressions(engine) >= 1
    with session_scope(engine) as session:
        points = series_history(
            session, op="gdn", impl="torch_chunk", shape="B1-T150-H2-K16-V16-N4", dtype="bf16", mode="fwd",
            machine_kind="h200",
        )  # fmt: skip
    assert [round(p.median_ms, 3) for p in points] == [1.0, 1.0, 1.5]
