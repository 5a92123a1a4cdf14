"""``integrity:plausibility``: a timing faster than the machine's measured ceilings allow is rejected, naming the
ceiling. End to end with `deltabench run` (real job processes) over ceilings planted in the cache it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deltabench.cli.app import main
from deltabench.harness.document import ResultDocument
from deltabench.runners.environment import collect_environment
from deltabench.runners.integrity import PLAUSIBLE_PCT_OF_FLOOR, plausibility_record

SUITE = """
name = "plausible"
device = "cpu"
shapes = ["B=1,T=20,H=1,K=8,V=8"]
dtypes = ["fp32"]
modes = ["fwd"]
timeout_s = 120
[timing]
budget_s = 0.05
min_reps = 3
warmup_s = 0.02
[gate]
seeds = 1
extra_seed = false
[ops.gdn]
impls = ["torch_chunk"]
baseline = "torch_chunk"
"""


def test_the_record_names_the_ceiling_it_exceeds() -> None:
    ceilings = {"matmul_tflops": 1.0, "copy_gbps": 10.0}
    fine = plausibility_record(40.0, ceilings, 0.4, 4.0)
    assert fine is not None and fine.passed and fine.check == "integrity:plausibility"
    over = plausibility_record(PLAUSIBLE_PCT_OF_FLOOR + 1, ceilings, 0.5, 30.0)
    assert over is not None and not over.passed and over.gating
    assert "copy ceiling 10 GB/s" in over.detail and "matmul" not in over.detail
    assert plausibility_record(None, ceilings, None, None) is None


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ceilings: dict[str, float], db: Path | None = None
) -> tuple[int, ResultDocument]:
    cache = tmp_path / "cache"
    (cache / "deltabench").mkdir(parents=True)
    key = f"cpu:{collect_environment('cpu').device_name}"
    (cache / "deltabench" / "ceilings.json").write_text(json.dumps({key: ceilings}))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    suite, out = tmp_path / "s.toml", tmp_path / "out.json"
    suite.write_text(SUITE)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--suite", str(suite), "--out", str(out), *(["--db", str(db)] if db else ["--no-db"]), "-q"])
    return exit_info.value.code, ResultDocument.model_validate_json(out.read_text())


def test_a_time_beyond_the_ceilings_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rejected, stored with its integrity records, and shown among the run page's failing checks."""
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.queries import load_run_document
    from deltabench.web.services import run_tables

    ceilings = {"matmul_tflops": 1e-9, "copy_gbps": 1e-6, "matmul_dtype_bits": 32.0}
    code, doc = _run(tmp_path, monkeypatch, ceilings, db=tmp_path / "store.db")
    with session_scope(get_engine(str(tmp_path / "store.db"))) as session:
        stored = load_run_document(session, doc.run_id)
    assert stored.jobs[0].integrity == doc.jobs[0].integrity != []
    (table,) = run_tables(stored)
    cells = [c for _, row in table.rows for c in row if c]
    shown = [k["check"] for c in cells for k in c.get("failing_checks", [])]
    assert "integrity:plausibility" in shown, table
    (job,) = doc.jobs
    assert code == 1
    assert job.status == "incorrect" and job.timing is None
    (rec,) = [r for r in job.integrity if r.check == "integrity:plausibility"]
    assert not rec.passed and "above the measured matmul ceiling" in rec.detail
    assert job.reason.startswith("failed integrity: plausibility:")


def test_a_time_within_the_ceilings_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, doc = _run(tmp_path, monkeypatch, {"matmul_tflops": 1e3, "copy_gbps": 1e6, "matmul_dtype_bits": 32.0})
    (job,) = doc.jobs
    assert code == 0 and job.status == "ok"
    assert all(r.passed for r in job.integrity)
    assert "integrity:plausibility" in {r.check for r in job.integrity}


def test_the_regression_gate_counts_a_flagged_job_as_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`deltabench gate`: a head job flagged by an integrity defence, its base ok, is a correctness failure (exit 1)."""
    base_dir, head_dir, db = tmp_path / "base", tmp_path / "head", tmp_path / "store.db"
    base_dir.mkdir(), head_dir.mkdir()
    code, _ = _run(base_dir, monkeypatch, {"matmul_tflops": 1e3, "copy_gbps": 1e6, "matmul_dtype_bits": 32.0}, db)
    assert code == 0
    code, head = _run(head_dir, monkeypatch, {"matmul_tflops": 1e-9, "copy_gbps": 1e-6, "matmul_dtype_bits": 32.0}, db)
    assert head.jobs[0].status == "incorrect"
    capsys.readouterr()
    argv = ["gate", "--base", str(base_dir / "out.json"), "--head", str(head_dir / "out.json"), "--db", str(db)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 1
    assert "correctness failure" in capsys.readouterr().out
