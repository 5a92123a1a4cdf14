"""benchmarks/gpu/gdn2_pallas_parts.py, run on the CPU in Pallas' interpreter: every row of every kernel taken
apart, and the walks' tiling grid, time something (a row that fails to build says "failed" and is caught here
rather than in a device call)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu" / "gdn2_pallas_parts.py"


def test_every_row_runs_in_the_interpreter() -> None:
    args = ["--allow-cpu", "--shape", "B=1,T=96,H=1,K=16,V=32", "--reps", "1", "--grads-warps", "8"]
    args += ["--only", "prepare,gradients,walks", "--walk-tilings", "block_v=32,16:num_warps=4"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "failed" not in run.stdout, run.stdout
    # the gradient rows are a difference of two timings (the backward less the cotangent's walk): on an idle-noisy
    # CPU at this size it can come out below zero, as the walks' rows can
    ms = r"-?\d+\.\d+"
    timed_rows = re.findall(rf"^\| (prepare|gradients) \| 4 \| ([^|]+) \| {ms} \| [\d.]+ \|$", run.stdout, re.M)
    assert [row.strip() for _, row in timed_rows] == [
        "whole", "no pairwise scores", "no WY solve",
        "whole", "no scores gradients", "far pairs only", "near pairs only",
    ]  # fmt: skip
    walks = re.findall(r"^\| block_v=(\d+), num_warps=4 \| [\d.-]+ \| [\d.]+ \|$", run.stdout, re.M)
    assert walks == ["32", "16"]


def test_without_a_gpu_it_says_so_and_exits_2() -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 2
    assert run.stdout.strip().splitlines()[-1].startswith("gdn2_pallas_parts: no GPU visible to JAX")


def test_a_malformed_tiling_grid_is_refused_in_one_line() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--walk-tilings", "block_v=big"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2
    expected = "expected name=1,2:dots=bf16 (integers; dots by name), got 'block_v=big'"
    assert run.stderr.strip().splitlines()[-1].endswith(expected)
