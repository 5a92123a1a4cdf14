"""`deltabench run` of decode steps on the CPU: the shipped decode-cpu suite's gdn jobs gated and timed in real
subprocesses, stored in a real SQLite file, with the decode figures; the decode-h200 suite as issue 42 sets it."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltabench.cli.app import main
from deltabench.harness.document import ResultDocument
from deltabench.harness.suites import load_suite


def test_decode_cpu_suite_runs_and_stores(tmp_path: Path) -> None:
    out, db = tmp_path / "results.json", tmp_path / "store.db"
    argv = ["run", "--suite", "decode-cpu", "--op", "gdn", "--out", str(out), "--db", str(db)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code in (0, None)
    doc = ResultDocument.from_json(out.read_text())
    impls = ("torch_decode", "torch_recurrent")
    assert {(j.impl, j.case.T, j.case.dtype) for j in doc.jobs} == {
        (i, t, d) for i in impls for t in (1, 4) for d in ("fp32", "bf16")
    }
    for job in doc.jobs:
        assert job.status == "ok" and job.case.mode == "decode", job.reason
        assert not any(r.check.startswith("grad") for r in job.verification)
        w, case = job.work, job.case
        assert w.us_per_step == pytest.approx(job.timing.median_ms * 1e3)
        assert w.tokens_per_s == pytest.approx(case.B * case.T / (job.timing.median_ms / 1e3))
        assert w.state_gbps > 0 and w.pct_of_copy > 0


def test_decode_h200_suite_is_the_issue_grid() -> None:
    suite = load_suite("decode-h200")
    jobs = suite.jobs(device="cuda")
    gdn = [(c, i) for c, i in jobs if c.op == "gdn"]
    assert {(c.B, c.T) for c, _ in gdn} == {(b, t) for b in (1, 8, 64, 256, 512) for t in (1, 2, 4, 8)}
    assert {(c.H, c.K, c.V, c.dtype, c.mode) for c, _ in jobs} == {(16, 128, 128, "bf16", "decode")}
    assert {i for _, i in gdn} == {
        "triton_decode", "triton_recurrent", "fla_recurrent", "flashinfer_decode", "flashinfer_mtp", "flash_qla",
        "torch_decode",
    }  # fmt: skip
    for op in ("gdn2", "kda"):  # ours and FLA's token-serial kernels beside the reference, at a third of the grid
        rows = [(c, i) for c, i in jobs if c.op == op]
        assert {i for _, i in rows} == {"triton_decode", "fla_decode", "fla_recurrent", "torch_decode"}
        assert {(c.B, c.T) for c, _ in rows} == {(b, t) for b in (1, 64, 512) for t in (1, 4)}
