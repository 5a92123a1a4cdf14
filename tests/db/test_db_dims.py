"""Dims beyond B, T, H, K, V in the store (results.extra_dims, migration 0006), and version 1 documents from before
that change: they still validate, ingest, load and compare."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import inspect, text

from deltabench.db.dims import dims_columns, dims_of
from deltabench.db.engine import downgrade, get_engine, session_scope, upgrade
from deltabench.db.ingest import ingest_document
from deltabench.db.queries import compare_runs, find_results, load_run_document
from deltabench.harness import document
from deltabench.harness.document import CaseSpec, ResultDocument

# A run stored before documents had a version 2: eight jobs on an H200 (benchmarks/results/README.md).
V1_RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "fixtures" / "split-h200.json"


def test_dims_columns_round_trip() -> None:
    delta = {"B": 2, "T": 64, "H": 4, "K": 16, "V": 32}
    assert dims_columns(delta) == {**delta, "extra_dims": ""}
    other = {"B": 2, "T": 64, "H": 4, "S": 128, "D": 32, "W": 4, "R": 8}
    cols = dims_columns(other)
    assert (cols["K"], cols["V"], cols["extra_dims"]) == (0, 0, '{"D":32,"R":8,"S":128,"W":4}')
    assert dims_of(*(cols[d] for d in "BTHKV"), cols["extra_dims"]) == {
        "B": 2, "T": 64, "H": 4, "D": 32, "R": 8, "S": 128, "W": 4,
    }  # fmt: skip


def test_a_version_1_document_ingests_loads_and_compares(db_url) -> None:  # type: ignore[no-untyped-def]
    raw = json.loads(V1_RUN.read_text())
    assert raw["schema_version"] == 1 and all("extra_dims" not in j["case"] for j in raw["jobs"])
    base = ResultDocument.model_validate(raw)
    head_raw = json.loads(V1_RUN.read_text())
    head_raw["run_id"] += "-again"
    for job in head_raw["jobs"]:
        job["job_id"] += "-again"
    head = ResultDocument.model_validate(head_raw)
    with session_scope(get_engine(db_url)) as session:
        ingest_document(session, base)
        ingest_document(session, head)
    with session_scope(get_engine(db_url)) as session:
        loaded = load_run_document(session, base.run_id)
        assert loaded.schema_version == 1
        assert [j.case.shape_id for j in loaded.jobs] == [j.case.shape_id for j in base.jobs]
        assert all(j.case.extra_dims == {} for j in loaded.jobs)
        pairs = compare_runs(session, base_run_id=base.run_id, head_run_id=head.run_id)
        assert len(pairs) == len(base.jobs) and all(p.base and p.head for p in pairs)
        assert len(find_results(session, shape=base.jobs[0].case.shape_id)) >= 2


def test_0006_stores_extra_dims_and_downgrades_without_them(tmp_path, factory) -> None:  # type: ignore[no-untyped-def]
    engine = get_engine(f"sqlite:///{tmp_path / 'm.db'}", migrate=False)
    upgrade(engine)
    document.register_op_name("bankop")
    try:
        delta = factory.document()
        other = factory.document(commit="b" * 40)
        for job in other.jobs:
            job.case = CaseSpec.from_dims("bankop", {"B": 2, "T": 64, "H": 4, "S": 128, "D": 32}, dtype="fp32")
        with session_scope(engine) as session:
            ingest_document(session, delta)
            ingest_document(session, other)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT op, K, V, extra_dims FROM results ORDER BY op")).all()
        assert {tuple(r) for r in rows} >= {("bankop", 0, 0, '{"D":32,"S":128}'), ("gdn", 64, 64, "")}
        with session_scope(engine) as session:
            shapes = {j.case.shape_id for j in load_run_document(session, other.run_id).jobs}
        assert shapes == {"B2-T64-H4-D32-S128"}

        downgrade(engine, "0005")
        assert "extra_dims" not in {c["name"] for c in inspect(engine).get_columns("results")}
        with engine.connect() as conn:
            assert {r[0] for r in conn.execute(text("SELECT DISTINCT op FROM results"))} == {"gdn"}
            orphans = conn.execute(text("SELECT COUNT(*) FROM checks WHERE result_id NOT IN (SELECT id FROM results)"))
            assert orphans.scalar() == 0
        upgrade(engine)
        with engine.connect() as conn:
            assert {r[0] for r in conn.execute(text("SELECT DISTINCT extra_dims FROM results"))} == {""}
    finally:
        document._registered_ops.discard("bankop")


def test_ingest_builds_each_cases_columns_as_dims_columns_of_its_stored_dims() -> None:
    """Ingest keeps a case's columns by its dims (built once a shape): the same as built per case, for delta-family,
    extra-dim and packed cases, whatever order the extra dims come in."""
    from deltabench.db.dims import stored_dims
    from deltabench.db.ingest import _case_dims_columns

    cases = [
        CaseSpec(op="gdn", B=2, T=64, H=4, K=16, V=32, dtype="fp32"),
        CaseSpec(op="gdn", B=2, T=64, H=4, K=16, V=16, dtype="fp32"),
        CaseSpec(op="sdm", B=1, T=128, H=2, extra_dims={"S": 64, "D": 32, "W": 4, "R": 8}, dtype="bf16"),
        CaseSpec(op="sdm", B=1, T=128, H=2, extra_dims={"R": 8, "W": 4, "D": 32, "S": 64}, dtype="bf16"),
        CaseSpec(op="sdm", B=1, T=128, H=2, extra_dims={"S": 64, "D": 16, "W": 4, "R": 8}, dtype="bf16"),
        CaseSpec(op="gdn", B=1, T=300, H=2, K=32, V=32, dtype="fp32", seqlens=[100, 150, 50]),
        CaseSpec(op="gdn", B=1, T=300, H=2, K=32, V=32, dtype="fp32", seqlens=[100, 200]),
    ]
    for case in cases * 2:
        assert _case_dims_columns(case) == dims_columns(stored_dims(case)), case
