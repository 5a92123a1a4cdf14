"""benchmarks/gpu/gdn2_pallas.py on the CPU (``--allow-cpu``): the plumbing a device call relies on, the table, the
oracle check and the per-kernel stage timings, runs to its end here rather than in a device call."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu" / "gdn2_pallas.py"
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def test_the_table_and_the_stages_come_out_on_the_cpu() -> None:
    args = ["--allow-cpu", "--shape", "B=1,T=64,H=1,K=16,V=32", "--reps", "1", "--no-fla", "--stages"]
    args += ["--dots", "bf16", "--block-v", "16", "--walk-warps", "8"]
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=ENV)
    assert run.returncode == 0, run.stderr[-2000:]
    # jax_chunk timed and checked against the float64 oracle (within the bf16 bounds: a number, not a failure note)
    ms, err = r"\d+\.\d+", r"\d\.\de-0\d"
    row = re.search(rf"^\| jax_chunk \| {ms} \| {ms} \| [\d.]+ / [\d.]+ \| ({err}) \| {err} \|  \|$", run.stdout, re.M)
    assert row, run.stdout
    assert float(row.group(1)) < 1e-2
    # the Pallas GPU kernels cannot compile for the CPU: said in the row's note, and the stages still timed (in
    # Pallas' interpreter) for the tiling asked
    assert re.search(
        r"^\| pallas_gpu_chunk \(block_v=16, dots=bf16, .*walk_warps=8\) \|.*\| does not lower", run.stdout, re.M
    )
    stages = re.search(r"^\| block_v=16, dots=bf16, .*walk_warps=8 \|( -?[\d.]+ \|){6}$", run.stdout, re.M)
    assert stages, run.stdout


def test_without_a_gpu_it_says_so_and_exits_2() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--no-fla"], capture_output=True, text=True, timeout=300, env=ENV
    )
    assert run.returncode == 2
    assert run.stdout.strip().splitlines()[-1].startswith("no GPU visible to JAX")
