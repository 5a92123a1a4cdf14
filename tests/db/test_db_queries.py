"""Queries: runs, run-id resolution, result filters, commit ranges, series history, comparisons."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pg_fixtures
import pytest

from deltabench.db import queries
from deltabench.db.engine import session_scope
from deltabench.db.ingest import ingest_document
from deltabench.db.models import Annotation
from deltabench.harness.errors import BadInput
from deltabench.harness.series import series_key

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)


def _history(engine, factory) -> list:  # type: ignore[no-untyped-def]
    """Five runs a day apart on commits c0..c4 (h200), plus one cpu run; medians 1.0, 1.1, ... for torch_chunk."""
    docs = []
    for i in range(5):
        jobs = [
            factory.job(impl="torch_chunk", median=1.0 + 0.1 * i),
            factory.job(impl="triton_chunk", median=0.5),
            factory.job(impl="triton_chunk", T=4096, status="incorrect"),
            factory.job(op="kda", impl="torch_chunk", dtype="fp32", mode="fwd+bwd", median=2.0),
        ]
        docs.append(factory.document(jobs=jobs, created_at=T0 + dt.timedelta(days=i), commit=f"c{i}" + "0" * 38))
    docs.append(
        factory.document(
            jobs=[factory.job(impl="torch_chunk", median=9.0)],
            created_at=T0 + dt.timedelta(days=2, hours=1),
            commit="c2" + "0" * 38,
            machine_kind="cpu",
            host="laptop",
        )
    )
    with session_scope(engine) as s:
        for doc in docs:
            ingest_document(s, doc)
    return docs


def test_list_and_count_runs(engine, factory) -> None:  # type: ignore[no-untyped-def]
    docs = _history(engine, factory)
    with session_scope(engine) as s:
        runs = queries.list_runs(s, limit=3)
        assert [r.run_id for r in runs] == [docs[4].run_id, docs[3].run_id, docs[5].run_id]
        assert runs[0].status_counts == {"ok": 3, "incorrect": 1} and runs[0].n_results == 4
        assert runs[0].machine_kind == "h200" and runs[0].created_at == T0 + dt.timedelta(days=4)
        assert queries.count_runs(s) == 6
        assert queries.count_runs(s, machine_kind="cpu") == 1
        assert [r.run_id for r in queries.list_runs(s, commit="c2")] == [docs[5].run_id, docs[2].run_id]
        assert queries.count_runs(s, since=T0 + dt.timedelta(days=3)) == 2
        assert [r.run_id for r in queries.list_runs(s, limit=2, offset=5)] == [docs[0].run_id]


def test_resolve_run_id(engine, factory) -> None:  # type: ignore[no-untyped-def]
    with session_scope(engine) as s, pytest.raises(BadInput, match="no runs"):
        queries.resolve_run_id(s, ref=None)
    a = factory.document(run_id="abc123", created_at=T0)
    b = factory.document(run_id="abd456", created_at=T0 + dt.timedelta(hours=1))
    with session_scope(engine) as s:
        ingest_document(s, a)
        ingest_document(s, b)
    with session_scope(engine) as s:
        assert queries.resolve_run_id(s, ref=None) == "abd456"
        assert queries.resolve_run_id(s, ref="latest") == "abd456"
        assert queries.resolve_run_id(s, ref="abc") == "abc123"
        assert queries.resolve_run_id(s, ref="abd456") == "abd456"
        with pytest.raises(BadInput, match="ambiguous"):
            queries.resolve_run_id(s, ref="ab")
        with pytest.raises(BadInput, match="no run"):
            queries.resolve_run_id(s, ref="zz")
        with pytest.raises(BadInput, match="no run"):
            queries.resolve_run_id(s, ref="a_")  # '_' is not a wildcard
        with pytest.raises(BadInput, match="no run"):
            queries.load_run_document(s, "nope")


def test_find_results_filters(engine, factory) -> None:  # type: ignore[no-untyped-def]
    docs = _history(engine, factory)
    with session_scope(engine) as s:
        assert len(queries.find_results(s)) == 21
        assert len(queries.find_results(s, run_id=docs[0].run_id)) == 4
        assert queries.find_results(s, run_id="missing") == []
        assert len(queries.find_results(s, op="kda")) == 5
        assert len(queries.find_results(s, impl="triton_chunk")) == 10
        assert len(queries.find_results(s, impl=["triton_chunk", "torch_chunk"], op="gdn")) == 16
        assert len(queries.find_results(s, shape="B2-T4096-H4-K64-V64")) == 5
        assert len(queries.find_results(s, shape={"T": 1024}, dtype="bf16")) == 11
        assert len(queries.find_results(s, mode="fwd+bwd")) == 5
        assert len(queries.find_results(s, machine_kind="cpu")) == 1
        assert len(queries.find_results(s, status="incorrect")) == 5
        assert len(queries.find_results(s, status=["ok"], machine_kind="h200")) == 15
        newest = queries.find_results(s, impl="torch_chunk", op="gdn", limit=2)
        assert [r.median_ms for r in newest] == [pytest.approx(1.4), pytest.approx(1.3)]
        assert len(queries.find_results(s, commits=["c1" + "0" * 38, "c3" + "0" * 38])) == 8
        in_range = queries.find_results(s, commit_range=("c1", "c3"))
        assert len(in_range) == 13  # runs of c1, c2 (h200 and cpu), c3
        assert {r.git_commit[:2] for r in in_range} == {"c1", "c2", "c3"}
        with pytest.raises(BadInput, match="no run is stored for commit"):
            queries.find_results(s, commit_range=("c1", "ffff"))
        with pytest.raises(BadInput, match="unknown dimension"):
            queries.find_results(s, shape="Q3")


def test_series_history(engine, factory) -> None:  # type: ignore[no-untyped-def]
    docs = _history(engine, factory)
    key = {"op": "gdn", "impl": "torch_chunk", "shape": "B2-T1024-H4-K64-V64", "dtype": "bf16", "mode": "fwd"}
    with session_scope(engine) as s:
        points = queries.series_history(s, **key, machine_kind="h200")
        assert [p.median_ms for p in points] == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4])
        assert [p.run_id for p in points] == [d.run_id for d in docs[:5]]
        assert points[0].torch == "2.11.0" and points[0].host == "gpu-node-1" and points[0].samples_ms is None
        last2 = queries.series_history(s, **key, machine_kind="h200", limit=2, with_samples=True)
        assert [p.median_ms for p in last2] == pytest.approx([1.3, 1.4])
        assert len(last2[0].samples_ms) == 12
        assert [p.median_ms for p in queries.series_history(s, **key, machine_kind="cpu")] == [9.0]
        broken = {**key, "impl": "triton_chunk", "shape": {"B": 2, "T": 4096, "H": 4, "K": 64, "V": 64}}
        assert queries.series_history(s, **broken, machine_kind="h200") == []
        assert len(queries.series_history(s, **broken, machine_kind="h200", statuses=None)) == 5
        with pytest.raises(BadInput, match="all of B, T, H, K, V"):
            queries.series_history(s, **{**key, "shape": "B2-T1024"}, machine_kind="h200")
        series = queries.list_series(s)
        assert len(series) == 4  # incorrect-only series are not listed
        software = "cuda=13.0,python=3.11,torch=2.11,triton=3.6"
        assert series[0].key == f"gdn/torch_chunk/B2-T1024-H4-K64-V64/bf16/fwd@cpu[{software}]"
        assert series[0].software == software
        assert series[0].legacy_key == "gdn/torch_chunk/B2-T1024-H4-K64-V64/bf16/fwd/cpu"
        assert len(queries.list_series(s, machine_kind="h200", op="gdn")) == 2


def test_a_major_software_change_starts_a_new_series(engine, factory) -> None:  # type: ignore[no-untyped-def]
    """harness/series.py's definition: the same case on the same machine class with torch 2.11 and with torch 2.12
    are two series; a patch release (2.11.1) stays in the series."""
    versions = ["2.11.0", "2.11.1", "2.12.0", "2.12.0"]
    docs = [
        factory.document(
            jobs=[factory.job(impl="torch_chunk", median=1.0 + i)],
            created_at=T0 + dt.timedelta(days=i),
            commit=f"c{i}" + "0" * 38,
            torch=torch,
        )
        for i, torch in enumerate(versions)
    ]
    with session_scope(engine) as s:
        for doc in docs:
            ingest_document(s, doc)
    key = {"op": "gdn", "impl": "torch_chunk", "shape": "B2-T1024-H4-K64-V64", "dtype": "bf16", "mode": "fwd"}
    old, new = "cuda=13.0,python=3.11,torch=2.11,triton=3.6", "cuda=13.0,python=3.11,torch=2.12,triton=3.6"
    with session_scope(engine) as s:
        listed = queries.list_series(s, op="gdn")
        assert [k.software for k in listed] == [old, new]
        by_harness = {series_key(job, doc.environment).key for doc in docs for job in doc.jobs}
        assert {k.key for k in listed} == by_harness, "the db's series are harness/series.py's"
        assert [p.median_ms for p in queries.series_history(s, **key, machine_kind="h200", software=old)] == [1.0, 2.0]
        assert [p.median_ms for p in queries.series_history(s, **key, machine_kind="h200", software=new)] == [3.0, 4.0]
        # No software given: the series the newest result is in, never a mix.
        assert [p.median_ms for p in queries.series_history(s, **key, machine_kind="h200")] == [3.0, 4.0]
        assert queries.series_software_now(s, key=listed[0]) == new
        assert queries.series_history(s, **key, machine_kind="h200", software="torch=9.9") == []


def test_latest_run_for_commit_and_machines(engine, factory) -> None:  # type: ignore[no-untyped-def]
    docs = _history(engine, factory)
    with session_scope(engine) as s:
        assert queries.latest_run_for_commit(s, commit_prefix="c2") == docs[5].run_id
        assert queries.latest_run_for_commit(s, commit_prefix="c2", machine_kind="h200") == docs[2].run_id
        assert queries.latest_run_for_commit(s, commit_prefix="c9") is None
        assert [(m.machine_kind, m.host) for m in queries.list_machines(s)] == [
            ("cpu", "laptop"),
            ("h200", "gpu-node-1"),
        ]


def test_compare_runs_and_impls(engine, factory) -> None:  # type: ignore[no-untyped-def]
    docs = _history(engine, factory)
    with session_scope(engine) as s:
        pairs = queries.compare_runs(s, base_run_id=docs[0].run_id, head_run_id=docs[4].run_id)
        assert len(pairs) == 4 and all(p.base and p.head for p in pairs)
        assert pairs[0].key == ("gdn", "torch_chunk", 2, 1024, 4, 64, 64, "", "bf16", "fwd")  # "": no extra dims
        assert pairs[0].head.median_ms / pairs[0].base.median_ms == pytest.approx(1.4)
        partial = queries.compare_runs(s, base_run_id=docs[4].run_id, head_run_id=docs[5].run_id)
        assert [(p.base is not None, p.head is not None) for p in partial] == [(True, True)] + [(True, False)] * 3
        by_impl = queries.compare_impls(s, run_id=docs[1].run_id, base_impl="torch_chunk", head_impl="triton_chunk")
        assert [(p.key[2], p.base is not None, p.head is not None) for p in by_impl] == [
            (1024, True, True),
            (1024, True, False),  # kda fp32 fwd+bwd: torch only
            (4096, False, True),
        ]
        assert by_impl[0].head.median_ms == 0.5


def _comparison_runs(factory) -> list:  # type: ignore[no-untyped-def]
    """A base run, a head run with every kind of outcome against it, and a run on another machine class."""
    job = factory.job
    # Only an imported summary (pytest-benchmark's op) may be ok without raw samples.
    no_samples = job(op="pytest-benchmark", impl="fla_chunk", T=4096, median=2.0)
    no_samples = no_samples.model_copy(update={"timing": no_samples.timing.model_copy(update={"samples_ms": []})})
    base = factory.document(
        created_at=T0,
        jobs=[
            job(impl="torch_chunk", median=1.0),
            job(impl="triton_chunk", median=0.5),
            job(impl="triton_chunk", T=4096, median=0.9),
            job(op="kda", impl="torch_chunk", dtype="fp32", mode="fwd+bwd", median=2.0),
            job(impl="fla_chunk", median=1.5, status="unsupported"),
            job(op="pytest-benchmark", impl="fla_chunk", T=4096, median=2.0),
            job(op="gdn2", impl="torch_chunk", median=1.0),  # missing in head
        ],
    )
    head = factory.document(
        created_at=T0 + dt.timedelta(days=1),
        commit="b" * 40,
        jobs=[
            job(impl="torch_chunk", median=1.3),  # regression
            job(impl="triton_chunk", median=0.5, job_id="retried"),
            job(impl="triton_chunk", median=0.35, job_id="retried", attempt=2),  # improvement; the retry counts
            job(impl="triton_chunk", T=4096, status="incorrect"),  # correctness failure
            job(op="kda", impl="torch_chunk", dtype="fp32", mode="fwd+bwd", median=2.0),  # within noise
            job(impl="fla_chunk", median=1.5),  # unsupported in base
            no_samples,  # graded from summaries
            job(op="gdn2", impl="triton_chunk", median=1.0),  # new job
        ],
    )
    elsewhere = factory.document(created_at=T0 + dt.timedelta(days=2), machine_kind="cpu", host="laptop")
    return [base, head, elsewhere]


def test_load_comparison_input_compares_as_whole_documents(engine, factory) -> None:  # type: ignore[no-untyped-def]
    from deltabench.regression import compare_documents

    docs = _comparison_runs(factory)
    with session_scope(engine) as s:
        for doc in docs:
            ingest_document(s, doc)
    with session_scope(engine) as s:
        lean = {d.run_id: queries.load_comparison_input(s, run_id=d.run_id) for d in docs}
        whole = {d.run_id: queries.load_run_document(s, d.run_id, checks="none") for d in docs}
        with pytest.raises(BadInput, match="no run"):
            queries.load_comparison_input(s, run_id="nope")
    for doc in docs:
        got = lean[doc.run_id]
        assert got.run_id == doc.run_id and got.environment == doc.environment
        # The stored jobs in document order, every field as stored but the three a comparison does not read.
        skip = {"verification", "memory", "work"}
        assert [j.model_dump(exclude=skip) for j in got.jobs] == [j.model_dump(exclude=skip) for j in doc.jobs]
        assert all(not j.verification and j.memory is None and j.work is None for j in got.jobs)
    found = {}
    for base, head in [(0, 1), (1, 0), (0, 2), (1, 1)]:
        b, h = docs[base].run_id, docs[head].run_id
        expected = compare_documents(whole[b], whole[h]).to_dict()
        assert compare_documents(lean[b], lean[h]).to_dict() == expected
        assert compare_documents(docs[base], docs[head]).to_dict() == expected  # and as ingested
        found[base, head] = expected
    # Every path through the grading was taken: the equalities above cover them all.
    assert [(r["impl"], r["outcome"]) for r in found[0, 1]["rows"]] == [
        ("torch_chunk", "regression"),
        ("triton_chunk", "improvement"),
        ("triton_chunk", "correctness_failure"),
        ("torch_chunk", "within_noise"),
        ("fla_chunk", "not_comparable"),  # unsupported in base
        ("fla_chunk", "within_noise"),  # from summaries: no raw samples in head
        ("triton_chunk", "not_comparable"),  # new in head
        ("torch_chunk", "not_comparable"),  # missing in head
    ]
    assert found[0, 1]["rows"][5]["reason"].endswith("(from summaries: no raw samples)")
    assert found[0, 2]["context_mismatch"] == "machine_kind h200 vs cpu"


def test_annotations(engine) -> None:  # type: ignore[no-untyped-def]
    key = "gdn/torch_chunk/B2-T1024-H4-K64-V64/bf16/fwd/h200"
    with session_scope(engine) as s:
        s.add(Annotation(series_key=key, run_id="r1", git_commit="c1", kind="expected", note="new algorithm"))
        s.add(Annotation(series_key="other", kind="acknowledged"))
    with session_scope(engine) as s:
        found = queries.list_annotations(s, series_key=key)
        assert [(a.kind, a.note) for a in found] == [("expected", "new algorithm")]
        assert len(queries.list_annotations(s)) == 2


def _attempts_history(engine, factory, runs: int):  # type: ignore[no-untyped-def]
    """`runs` runs of one series, each with two attempts of its job (ties on the run's time), medians 1, 2, ..."""
    docs = []
    for r in range(runs):
        first = factory.job(median=2.0 * r + 1.0)
        second = first.model_copy(update={"attempt": 2, "timing": factory.job(median=2.0 * r + 2.0).timing})
        docs.append(factory.document(jobs=[first, second], created_at=T0 + dt.timedelta(hours=r)))
    with session_scope(engine) as s:
        for doc in docs:
            ingest_document(s, doc)
    return docs


def test_series_history_newest_points_keep_ties_of_one_run_in_order(engine, factory) -> None:  # type: ignore[no-untyped-def]
    """The newest `limit` points by (time, id), also when the limit falls between two results of one run."""
    _attempts_history(engine, factory, 6)
    key = {"op": "gdn", "impl": "torch_chunk", "shape": "B2-T1024-H4-K64-V64", "dtype": "bf16", "mode": "fwd"}
    with session_scope(engine) as s:
        every = [p.median_ms for p in queries.series_history(s, **key, machine_kind="h200")]
        assert every == pytest.approx([float(i) for i in range(1, 13)])
        for limit in (1, 2, 3, 5, 12, 13, 50):
            newest = queries.series_history(s, **key, machine_kind="h200", limit=limit)
            assert [p.median_ms for p in newest] == pytest.approx(every[-limit:]), limit
        assert queries.series_history(s, **key, machine_kind="h200", limit=0) == []
        assert (
            queries.series_software_now(
                s,
                key=queries.series_key(
                    "gdn", "torch_chunk", queries.series_dims("gdn", key["shape"]), "bf16", "fwd", "h200"
                ),
            )
            is not None
        )


def test_postgresql_series_history_reads_only_the_newest_points(pg_url, factory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Where PostgreSQL estimates one row for a series it sorted every point of it (24,000 at 10M results): the
    newest `limit` are bounded by the time of the `limit`-th newest, whatever the plan (an incremental sort turned
    off here leaves the planner only the full sort)."""
    from sqlalchemy import text

    from deltabench.db.engine import get_engine

    engine = get_engine(pg_url)
    pg_fixtures.empty_tables(pg_url)
    _attempts_history(engine, factory, 40)
    key = {"op": "gdn", "impl": "torch_chunk", "shape": "B2-T1024-H4-K64-V64", "dtype": "bf16", "mode": "fwd"}
    with session_scope(engine) as s:
        sent: list[Any] = []
        execute = s.execute
        monkeypatch.setattr(s, "execute", lambda q, *a, **kw: (sent.append(q), execute(q, *a, **kw))[1])
        assert len(queries.series_history(s, **key, machine_kind="h200", limit=3)) == 3
        monkeypatch.undo()
        sql = str(sent[-1].compile(engine, compile_kwargs={"literal_binds": True}))
        s.execute(text("SET LOCAL enable_incremental_sort = off"))
        plan = s.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.replace(":", "\\:"))).scalar()

    def scanned(node: dict[str, Any]) -> int:  # results rows the statement read, its bound's subquery aside
        own = node["Actual Rows"] if node.get("Relation Name") == "results" else 0
        kids = [c for c in node.get("Plans", []) if c.get("Parent Relationship") != "InitPlan"]
        return own + sum(scanned(c) for c in kids)

    assert scanned(plan[0]["Plan"]) <= 4  # the newest 3 and the other attempt of their oldest run, not all 80
