"""deltabench's Triton chunked GDN-2 and KDA forward (kernels/gdn2/triton/chunk.py) against the float64 oracle,
under TRITON_INTERPRET=1.

Output and final state, every gate regime (``strong`` is where a decay factored over a whole chunk overflows),
T within one chunk, at a chunk multiple and past one, H = 3, K != V (not powers of two too), with and without an
initial state, fp32 and bf16; a packed batch against its sequences run one by one; the registered impl through the
harness's gate; and every launch compiled for sm_90 by Triton's own compiler (what the interpreter cannot check:
that the kernels lower, and fit a Hopper block's shared memory). bf16 bounds are the interpreter's (its fp32 to
bf16 casts truncate, about doubling the rounding error: kernels/gdn tests the same way); fp32 errors measure under
1e-6 against a 1e-4 bound.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from deltabench.kernels.gdn2.triton.chunk import gdn2_triton_chunk, kda_triton_chunk
from deltabench.references import gdn2, kda

BOUND = {torch.float32: 1e-4, torch.bfloat16: 2.5e-2}
OPS: dict[str, tuple[Callable, Callable, Callable]] = {
    "gdn2": (gdn2_triton_chunk, gdn2.gdn2_recurrent, gdn2.make_inputs),
    "kda": (kda_triton_chunk, kda.kda_recurrent, kda.make_inputs),
}
CASES = [  # (op, B, T, K, V, dtype, regime, initial_state)
    ("gdn2", 2, 20, 32, 16, torch.float32, "strong", True),
    ("gdn2", 1, 64, 32, 16, torch.float32, "long", False),
    ("gdn2", 1, 70, 32, 16, torch.float32, "strong", False),
    ("gdn2", 1, 40, 24, 40, torch.float32, "typical", True),
    ("gdn2", 1, 70, 32, 16, torch.bfloat16, "strong", True),
    ("kda", 1, 70, 32, 16, torch.float32, "strong", True),
    ("kda", 1, 33, 16, 24, torch.bfloat16, "long", False),
]


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error in float64."""
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize(
    "op,B,T,K,V,dtype,regime,h0",
    CASES,
    ids=[f"{c[0]}-B{c[1]}-T{c[2]}-K{c[3]}-V{c[4]}-{str(c[5])[6:]}-{c[6]}-h0{int(c[7])}" for c in CASES],
)
def test_forward_matches_oracle(
    op: str, B: int, T: int, K: int, V: int, dtype: torch.dtype, regime: str, h0: bool
) -> None:
    """o and the final state against the float64 recurrence on the same rounded inputs."""
    fn, oracle, make_inputs = OPS[op]
    x = make_inputs(B, T, 3, K, V, dtype=dtype, seed=T + K, regime=regime, initial_state=h0)
    o, ht = fn(**x)
    ro, rht = oracle(**{n: t.double() if n != "initial_state" else t for n, t in x.items()})
    assert o.dtype == dtype and o.shape == (B, T, 3, V)
    assert ht.dtype == torch.float32 and ht.shape == (B, 3, K, V)
    errors = {"o": _rel(o, ro), "final_state": _rel(ht, rht)}
    assert all(e < BOUND[dtype] for e in errors.values()), errors


@pytest.mark.parametrize("launch", [{"scores_far_cols": 16}])
@pytest.mark.parametrize("op,dtype", [("gdn2", torch.float32), ("kda", torch.bfloat16)])
def test_launch_variants_match_oracle(
    op: str, dtype: torch.dtype, launch: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other launch settings: the blocks left of the diagonal in narrower channel steps (three at K = 48), against
    the oracle in the strong regime past one chunk."""
    from deltabench.kernels.gdn2.triton.layout import LAUNCH

    for key, value in launch.items():
        monkeypatch.setitem(LAUNCH, key, value)
    fn, oracle, make_inputs = OPS[op]
    x = make_inputs(1, 90, 3, 48, 16, dtype=dtype, seed=5, regime="strong", initial_state=True)
    o, ht = fn(**x)
    ro, rht = oracle(**{n: t.double() if n != "initial_state" else t for n, t in x.items()})
    errors = {"o": _rel(o, ro), "final_state": _rel(ht, rht)}
    assert all(e < BOUND[dtype] for e in errors.values()), errors


# Packed sequences of 1, 70, 129 and 63 tokens: 1, 2, 3 and 1 chunks, each walked alone
PACKED_BOUNDS = [0, 1, 71, 200, 263]


@pytest.mark.parametrize("op", ["gdn2", "kda"])
def test_packed_sequences_match_one_by_one(op: str) -> None:
    """``cu_seqlens`` on the chunk-aligned row, each sequence walked by programs of its own (kda: its beta read
    through stride-0 views): each packed sequence's output and final state are those of the sequence run alone."""
    fn, _, make_inputs = OPS[op]
    bounds = PACKED_BOUNDS
    x = make_inputs(1, bounds[-1], 2, 16, 8, seed=11, regime="strong", initial_state=True)
    gen = torch.Generator().manual_seed(13)
    h0 = torch.randn(len(bounds) - 1, 2, 16, 8, generator=gen)  # one state per sequence
    o, ht = fn(**{**x, "initial_state": h0}, cu_seqlens=torch.tensor(bounds, dtype=torch.int32))
    for i, (t0, t1) in enumerate(itertools.pairwise(bounds)):
        part = {n: t[:, t0:t1] for n, t in x.items() if n != "initial_state"}
        oi, hi = fn(**part, initial_state=h0[i : i + 1])
        torch.testing.assert_close(o[:, t0:t1], oi, rtol=0, atol=0)
        torch.testing.assert_close(ht[i : i + 1], hi, rtol=0, atol=0)


def test_through_the_verification_engine() -> None:
    """The registered gdn2 impl passes the harness gate (fwd, fp32) in the strong regime on the CPU interpreter
    (kda's registration, the same declaration, is gated by `deltabench verify --op kda`: a minute more here)."""
    op = "gdn2"
    from deltabench.correctness.engine import verify_case
    from deltabench.harness.cases import Case
    from deltabench.harness.registry import get_impl

    case = Case(op, 1, 70, 3, 16, 24, dtype="fp32", mode="fwd", initial_state=True)
    report = verify_case(get_impl(op, "triton_chunk"), case, seeds=1, extra_seed=False, regimes="strong")
    assert report.passed, [r for r in report.records if not r.passed]
    assert any(r.check == "output" for r in report.records)


# Run in a child process: with TRITON_INTERPRET set (as the tests set it) Triton builds no compilable kernels. The
# kernels are swapped for kernel_resources' recorder while the entry runs, then each recorded launch is compiled.
CHILD = """
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
sys.path.insert(0, "benchmarks/cpu")
from kernel_resources import LAUNCH_OPTIONS, SHARED_LIMIT, _Recorder, signature_of
from deltabench.kernels.gdn2.triton import chunk
from deltabench.references.gdn2 import make_inputs
calls = []
kernels = [(n, f) for n, f in vars(chunk).items() if isinstance(f, triton.runtime.jit.JITFunction)]
for n, f in kernels:
    setattr(chunk, n, _Recorder(f, calls))
chunk.gdn2_triton_chunk(**make_inputs(1, 200, 2, 128, 128, dtype=torch.bfloat16, initial_state=True))
for n, f in kernels:
    setattr(chunk, n, f)
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
out = {"limit": SHARED_LIMIT[90], "launches": []}
for fn, args, kwargs in calls:
    options = {o: kwargs.pop(o) for o in LAUNCH_OPTIONS if o in kwargs}
    signature, constexprs, hints = signature_of(fn, args, kwargs)
    attrs = {(fn.arg_names.index(n),): backend.parse_attr(h) for n, h in hints.items()}
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options)
    out["launches"].append([fn.__name__, compiled.metadata.shared])
print(json.dumps(out))
"""


def test_every_launch_compiles_for_hopper() -> None:
    """The three launches at K = V = 128 (the GPU suites' head size), bf16, from an initial state, compiled for
    sm_90 without a GPU, each within the H200's shared memory a block."""
    root = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert [name for name, _ in found["launches"]] == ["scores_kernel", "inverse_kernel", "apply_kernel", "walk_kernel"]
    assert all(shared <= found["limit"] for _, shared in found["launches"]), found
