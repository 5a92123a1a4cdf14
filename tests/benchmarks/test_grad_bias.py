"""benchmarks/gpu/grad_bias.py on the CPU (torch_chunk, a tiny bf16 shape): the planted 1% scale of dk shows as a
1e-2 component along the reference, the honest impl's rounding well under it; bad input is exit 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu" / "grad_bias.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_the_planted_scale_is_the_component_along_the_reference() -> None:
    run = _run(
        "--device", "cpu", "--impls", "torch_chunk", "--planted", "torch_chunk", "--shape", "B=1,T=40,H=2,K=16,V=16"
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "torch_chunk: 29 gradient comparisons, failed none" in run.stdout
    assert "torch_chunk*dk1.01: 29 gradient comparisons, failed grad:k" in run.stdout
    found = re.search(r"^grad:k: honest \|along\| at most (\S+), planted (\S+)$", run.stdout, re.M)
    assert found, run.stdout
    honest, bug = float(found.group(1)), float(found.group(2))
    assert honest < 3e-3 and 8e-3 < bug < 1.2e-2, (honest, bug)
    # the planted bug scales dk only: every other gradient's component is the honest one's
    for check in ("grad:q", "grad:v", "grad:beta"):
        line = re.search(rf"^{check}: honest \|along\| at most (\S+), planted (\S+)$", run.stdout, re.M)
        assert line and line.group(1) == line.group(2), run.stdout


def test_an_unknown_impl_or_shape_exits_2() -> None:
    run = _run("--device", "cpu", "--impls", "nope")
    assert run.returncode == 2 and run.stderr.startswith("grad_bias.py: ") and "nope" in run.stderr
    run = _run("--device", "cpu", "--shape", "B=1,T=x")
    assert run.returncode == 2 and run.stderr.startswith("grad_bias.py: ")
