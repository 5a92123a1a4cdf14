"""benchmarks/cpu/kernel_resources.py: launches recorded without running them, compiled for sm_90a on this CPU
machine, the cubin's figures read back."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "cpu" / "kernel_resources.py"
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
needs_tools = pytest.mark.skipif(not os.path.exists(CUOBJDUMP), reason="this Triton build ships no cuobjdump")


def _run(*args: str, interpret: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the tests' conftest sets it
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


@needs_tools
def test_every_kernel_of_a_fwd_bwd_is_compiled_and_measured() -> None:
    run = _run("--shape", "B=1,T=64,H=2,K=16,V=32", "--impl", "triton_chunk")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {}
    for line in run.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[0].endswith("_kernel"):
            rows.setdefault(cells[0], []).append(cells)
    expected = {"wy_inverse_kernel", "wy_apply_kernel", "state_fwd_kernel", "state_bwd_kernel", "local_bwd_kernel"}
    assert expected <= set(rows)
    for cells in (c for group in rows.values() for c in group):
        registers, stack, shared = int(cells[4]), int(cells[5]), int(cells[6])
        assert 1 <= registers <= 255 and stack >= 0 and 0 <= shared <= 232448


def test_refuses_the_interpreter_and_a_bad_shape() -> None:
    run = _run("--shape", "B=1,T=64", interpret=True)
    assert run.returncode == 2 and "unset TRITON_INTERPRET" in run.stderr
    run = _run("--shape", "B=1,T=64")
    assert run.returncode == 2 and re.search(r"lacks H, K", run.stderr)


@needs_tools
def test_gdn2_kernels_with_a_launch_entry_set() -> None:
    """KDA's eight launches (GDN-2's kernels), the pair kernel's channels split in two by ``--launch``."""
    run = _run("--op", "kda", "--shape", "B=1,T=64,H=2,K=32,V=16", "--launch", "pair_block_k=16", "pair_warps=1")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "launch pair_block_k=16 pair_warps=1" in run.stdout
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in run.stdout.splitlines() if "_kernel |" in line]
    assert {r[0] for r in rows} == {
        "scores_kernel", "inverse_kernel", "apply_kernel", "walk_kernel",
        "state_bwd_kernel", "local_bwd_kernel", "pair_bwd_kernel", "dg_kernel",
    }  # fmt: skip
    (pair,) = [r for r in rows if r[0] == "pair_bwd_kernel"]
    assert "BKP=16, NKB=2" in pair[1] and pair[2] == "1"
    assert all(1 <= int(r[4]) <= 255 for r in rows)


def test_refuses_a_launch_entry_the_op_has_not() -> None:
    run = _run("--op", "gdn2", "--shape", "B=1,T=64,H=2,K=32,V=16", "--launch", "pair_blocks=16")
    assert run.returncode == 2 and "--launch 'pair_blocks=16'" in run.stderr
    run = _run("--op", "gdn", "--shape", "B=1,T=64,H=2,K=32,V=16", "--launch", "pair_block_k=16")
    assert run.returncode == 2 and "launch tables" in run.stderr
