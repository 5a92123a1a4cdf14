"""Every launch of the Triton GDN impls fits a Hopper block's shared memory, checked without a GPU: each launch the
launchers choose at the GPU suites' shapes (dense and packed, with and without an initial state) is compiled for
sm_90 by Triton's own compiler (``compile_launches`` of benchmarks/cpu/kernel_resources.py, in a process without
the interpreter) and its shared memory compared with the H200's 232,448 bytes a block. A launch over it fails only
on the GPU (OutOfResources), as the packed forward walk from initial states did on the H200 (262,664 bytes at
64/4/3) before its launch config took a stage less.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# The launchers pick a launch by B*H, K, V and whether a walk has as many chunks as stages, not by T: so the
# suites' shapes are checked at shorter T with the same launches (equal at the full lengths when this was written):
# varlen-h200's packed 1x32768x16 (19 sequences, lognormal around 2048) with each length an eighth, its dense
# 1x32768x16 at 2048 tokens, the train suite's 8x4096x6 at 512 and 1x1024x6 as it is.
PACKED = [129, 160, 312, 141, 638, 33, 203, 46, 147, 116, 115, 18, 169, 290, 832, 357, 15, 45, 322]
SHAPES = {
    "packed 1x32768x16": ({"B": 1, "T": sum(PACKED), "H": 16, "K": 128, "V": 128}, PACKED),
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
cases, stages = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if stages is not None:
    state.FWD_LAUNCH["packed_h0_stages"] = stages
out, done = {"limit": SHARED_LIMIT[90], "cases": []}, {}
for impl, dims, seqlens, h0 in cases:
    launches = compile_launches(impl, dims, torch.bfloat16, seqlens, h0, 90, done=done)
    out["cases"].append([impl, dims, seqlens, h0, launches])
print(json.dumps(out))
"""


def _compile(cases: list, packed_h0_stages: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cases), json.dumps(packed_h0_stages)],
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
    """The packed forward walk from initial states at the wide config's three stages: what failed on the H200."""
    dims, seqlens = SHAPES["packed 1x32768x16"]
    found = _compile([["triton_chunk", dims, seqlens, True]], packed_h0_stages=3)
    shared = [x["shared"] for x in found["cases"][0][4] if x["kernel"] == "state_fwd_kernel"]
    assert shared == [262664] and shared[0] > found["limit"]
