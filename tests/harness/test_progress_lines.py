"""`deltabench run` into a log (stdout not a terminal): one plain, timestamped line per gate and per job on stderr,
saying which job it was and how it ended; none with --quiet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from deltabench.harness.cli import main

PLANTED = str(Path(__file__).parents[1] / "runners" / "planted_impls.py")

SUITE = """
name = "lines"
device = "cpu"
shapes = ["B=1,T=20,H=1,K=8,V=8"]
dtypes = ["fp32"]
modes = ["fwd"]
timeout_s = 120
[timing]
budget_s = 0.05
min_reps = 3
warmup_s = 0.02
cpu_threads = 1
[gate]
seeds = 1
[ops.gdn]
impls = ["torch_chunk", "planted_wrong"]
baseline = "torch_chunk"
"""


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    suite = tmp_path / "lines.toml"
    suite.write_text(SUITE)
    args = ["run", "--suite", str(suite), "--import", PLANTED, "--no-db", "--out", str(tmp_path / "o.json")]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--gate-workers", "2", *extra])
    assert exc.value.code == 1  # planted_wrong is incorrect
    return capsys.readouterr().err


def test_a_logged_run_prints_a_line_per_gate_and_per_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _run(tmp_path, capsys)
    stamp = r"^\s*\d+\.\d s  "
    assert re.search(stamp + r"gating 2 jobs first, 2 impls' gates at once$", err, re.M)
    assert re.search(stamp + r"gate \d/2 gdn torch_chunk B1-T20-H1-K8-V8 fp32 fwd: ok in \d+\.\d s$", err, re.M)
    wrong = r"gate \d/2 gdn planted_wrong B1-T20-H1-K8-V8 fp32 fwd: incorrect in \d+\.\d s: failed the gate"
    assert re.search(stamp + wrong, err, re.M)
    assert re.search(stamp + r"\[\d/2\] gdn torch_chunk B1-T20-H1-K8-V8 fp32 fwd: ok, median [\d.e-]+ ms in ", err, re.M)
    assert re.search(stamp + r"\[\d/2\] gdn planted_wrong B1-T20-H1-K8-V8 fp32 fwd: incorrect", err, re.M)


def test_quiet_prints_no_progress_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _run(tmp_path, capsys, "--quiet")
    assert "gating" not in err and "gate 1/2" not in err and "[1/2]" not in err
