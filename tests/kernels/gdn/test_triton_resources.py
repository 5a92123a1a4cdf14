"""Every launch of the Triton GDN impls fits a Hopper block's shared memory, checked without a GPU: each launch the
launchers choose at the GPU suites' shapes (dense and packed, with and without an initial state) is compiled for
sm_90 by Triton's own compiler (``compile_launches`` of benchmarks/cpu/kernel_resources.py, in a process without
the interpreter) and its shared memory compared with the H200's 232,448 bytes a block. A launch over it fails only
on the GPU (OutOfResources), as the packed forward walk from initial states did on the H200 (262,664 bytes at
64/4/3, when it loaded each sequence's initial state inside the walk).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# The launchers pick a launch by the walks side by side (B*H, times the packed sequences), K, V and whether every
# walk has as many chunks as stages, not by T: so dense shapes are checked at shorter T with the same launches
# (equal at the full lengths when this was written): varlen-h200's dense 1x32768x16 at 2048 tokens, the train
# suite's 8x4096x6 at 512 and 1x1024x6 as it is. A packing's launches hang on its shortest sequence, so
# varlen-h200's packing is checked whole (19 sequences, lognormal around 2048, the shortest 123 tokens: 2 chunks),
# and beside it a packing of 16 heads whose every sequence has at least 4 chunks: the tuned pipelined launches.
PACKED = [1034, 1283, 2499, 1128, 5106, 268, 1629, 372, 1178, 929, 927, 151, 1352, 2325, 6661, 2860, 123, 365, 2578]
LONG = [256, 300, 1000, 500]
SHAPES = {
    "packed 1x32768x16": ({"B": 1, "T": sum(PACKED), "H": 16, "K": 128, "V": 128}, PACKED),
    "packed 1x2056x16": ({"B": 1, "T": sum(LONG), "H": 16, "K": 128, "V": 128}, LONG),
    "dense 1x32768x16": ({"B": 1, "T": 2048, "H": 16, "K": 128, "V": 128}, None),
    "dense 8x4096x6": ({"B": 8, "T": 512, "H": 6, "K": 128, "V": 128}, None),
    "dense 1x1024x6": ({"B": 1, "T": 1024, "H": 6, "K": 128, "V": 128}, None),
}
IMPLS = ("triton_chunk", "triton_chunk_split")
# Run in a child process: with TRITON_INTERPRET set (as the tests set it) Triton builds no compilable kernels.
CHILD = """
import json, sys
import torch
sys.path.insert(0, "benchmarks/cpu")
from kernel_resources import SHARED_LIMIT, compile_launches
from deltabench.kernels.gdn.triton import state
cases, overrides = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for table, entries in overrides.items():
    getattr(state, table).update({key: tuple(value) for key, value in entries.items()})
out, done = {"limit": SHARED_LIMIT[90], "cases": []}, {}
for impl, dims, seqlens, h0 in cases:
    launches = compile_launches(impl, dims, torch.bfloat16, seqlens, h0, 90, done=done)
    out["cases"].append([impl, dims, seqlens, h0, launches])
print(json.dumps(out))
"""


def _compile(cases: list, overrides: dict | None = None) -> dict:
    """Compile each ``[impl, dims, seqlens, h0]`` case's launches for sm_90 in a child process; `overrides`: entries
    of state.py's launch tables (``{"BWD_LAUNCH": {"wide": [64, 4, 4]}}``) set there first."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cases), json.dumps(overrides or {})],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def compiled() -> dict:
    """Every impl x shape x (zero, initial) state, compiled in one child process."""
    cases = [[impl, *SHAPES[name], h0] for impl in IMPLS for name in SHAPES for h0 in (False, True)]
    return _compile(cases)


def test_every_launch_fits_a_hopper_block(compiled: dict) -> None:
    limit = compiled["limit"]
    assert len(compiled["cases"]) == len(IMPLS) * len(SHAPES) * 2
    over = []
    for impl, dims, seqlens, h0, launches in compiled["cases"]:
        assert launches, f"{impl}: no launch recorded"
        kinds = {launch["kernel"] for launch in launches}
        assert {"state_fwd_kernel", "local_bwd_kernel"} <= kinds or impl == "triton_chunk_split", kinds
        over += [
            f"{impl} {dims} packed={seqlens is not None} h0={h0}: {x['kernel']} {x['constexprs']} "
            f"{x['warps']}/{x['stages']} {x['shared']} bytes"
            for x in launches
            if x["shared"] > limit
        ]
    assert not over, f"over sm_90's {limit} bytes a block: {over}"


def test_the_check_fails_a_launch_over_the_limit() -> None:
    """The backward walk's wide config in four stages, over the limit (246,528 bytes with Triton 3.6 for the H200,
    state.py's BWD_LAUNCH), on the packing whose walks are long enough to take it."""
    dims, seqlens = SHAPES["packed 1x2056x16"]
    found = _compile([["triton_chunk", dims, seqlens, True]], {"BWD_LAUNCH": {"wide": [64, 4, 4]}})
    shared = [x["shared"] for x in found["cases"][0][4] if x["kernel"] == "state_bwd_kernel"]
    assert len(shared) == 1 and shared[0] > found["limit"]
