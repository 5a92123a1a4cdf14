"""The backward of deltabench's Triton chunked GDN-2 and KDA (kernels/gdn2/triton/chunk_bwd.py) against the float64
oracle's autograd, under TRITON_INTERPRET=1.

Every gradient (q, k, v, g, b, w or KDA's beta, the initial state), from random output and final-state gradients
(and from either output alone: autograd then passes None for the other's), every gate regime (``strong`` is where a
decay factored over a whole chunk overflows), T within one chunk, at one and two chunks, and ragged past them (70,
130), H = 3, K != V (not powers of two too), with and without an initial state, fp32 and bf16; the local kernel's V
loop in several blocks; packed sequences against each sequence alone; the registered impl through the harness's
fwd+bwd gate; three bugs planted in the kernels' source (a dropped decay factor in dk, two off-by-ones in the
reverse walk), each rejected; and every launch compiled for sm_90. fp32 gradients measure under 1e-6 against a 1e-5
bound; bf16 bounds are the interpreter's, as the forward's tests (its fp32 to bf16 casts truncate).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from deltabench.kernels.gdn2.triton import chunk as chunk_mod
from deltabench.kernels.gdn2.triton import chunk_bwd
from deltabench.kernels.gdn2.triton.chunk import gdn2_triton_chunk, kda_triton_chunk
from deltabench.references import gdn2, kda

BOUND = {torch.float32: 1e-5, torch.bfloat16: 2.5e-2}
OPS: dict[str, tuple[Callable, Callable, Callable]] = {
    "gdn2": (gdn2_triton_chunk, gdn2.gdn2_recurrent, gdn2.make_inputs),
    "kda": (kda_triton_chunk, kda.kda_recurrent, kda.make_inputs),
}
CASES = [  # (op, B, T, K, V, dtype, regime, initial_state)
    ("gdn2", 1, 20, 32, 16, torch.float32, "strong", True),  # within one chunk
    ("gdn2", 1, 64, 16, 32, torch.float32, "long", False),  # one whole chunk, K < V
    ("gdn2", 1, 128, 32, 16, torch.float32, "typical", False),  # two whole chunks
    ("gdn2", 1, 70, 32, 16, torch.float32, "strong", True),  # ragged
    ("gdn2", 1, 130, 24, 40, torch.float32, "typical", True),  # ragged, K and V not powers of two
    ("gdn2", 2, 70, 16, 24, torch.float32, "long", True),
    ("gdn2", 1, 130, 32, 16, torch.float32, "strong", False),
    ("gdn2", 1, 70, 48, 24, torch.float32, "strong", True),  # K past one of the local kernel's 32-column blocks
    ("gdn2", 1, 70, 32, 16, torch.bfloat16, "strong", True),
    ("gdn2", 1, 40, 16, 24, torch.bfloat16, "typical", False),
    ("kda", 1, 70, 32, 16, torch.float32, "strong", True),
    ("kda", 1, 130, 16, 24, torch.float32, "typical", False),
    ("kda", 1, 64, 32, 16, torch.float32, "long", True),
    ("kda", 1, 33, 16, 24, torch.bfloat16, "long", False),
]


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error in float64."""
    return ((x.double() - ref).norm() / ref.norm()).item()


def _gradients(
    fn: Callable, x: dict[str, torch.Tensor], do: torch.Tensor | None, dht: torch.Tensor | None, **kwargs: object
) -> dict[str, torch.Tensor]:
    """Every input's gradient of ``sum(o * do) + sum(final_state * dht)`` (a term left out where its gradient is
    None: no gradient reaches that output)."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
    o, ht = fn(**leaves, **kwargs)
    loss = 0.0
    if do is not None:
        loss = loss + (o.to(do.dtype) * do).sum()
    if dht is not None:
        loss = loss + (ht.to(dht.dtype) * dht).sum()
    loss.backward()
    return {n: t.grad for n, t in leaves.items()}


def _check(op: str, x: dict[str, torch.Tensor], seed: int, terms: str = "both") -> dict[str, float]:
    """Asserts every gradient finite, of its input's dtype and shape, and within BOUND of the oracle's (float64
    autograd on the same rounded inputs) in relative Frobenius norm; returns the errors. `terms`: the loss's
    ("both", or "o" / "final_state" alone)."""
    fn, oracle, _ = OPS[op]
    B, T, H, V = x["v"].shape
    K = x["q"].shape[-1]
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(B, T, H, V, generator=gen) if terms != "final_state" else None
    dht = torch.randn(B, H, K, V, generator=gen) if terms != "o" else None
    got = _gradients(fn, x, do, dht)
    ref = _gradients(
        oracle, {n: t.double() for n, t in x.items()}, *(None if d is None else d.double() for d in (do, dht))
    )
    for n, t in got.items():
        assert t is not None and t.dtype == x[n].dtype and t.shape == x[n].shape, n
        assert torch.isfinite(t).all(), n
    # an input the loss does not reach (q, when the final state alone is differentiated) has no oracle gradient:
    # the kernels' must then be exactly zero
    unreached = [n for n in x if ref[n] is None]
    assert all(not got[n].any() for n in unreached), unreached
    errors = {n: _rel(got[n], ref[n]) for n in x if n not in unreached}
    assert all(e < BOUND[x["q"].dtype] for e in errors.values()), errors
    return errors


@pytest.mark.parametrize(
    "op,B,T,K,V,dtype,regime,h0",
    CASES,
    ids=[f"{c[0]}-B{c[1]}-T{c[2]}-K{c[3]}-V{c[4]}-{str(c[5])[6:]}-{c[6]}-h0{int(c[7])}" for c in CASES],
)
def test_gradients_match_oracle(
    op: str, B: int, T: int, K: int, V: int, dtype: torch.dtype, regime: str, h0: bool
) -> None:
    """Every input's gradient, from random output and final-state gradients, against the float64 recurrence's."""
    x = OPS[op][2](B, T, 3, K, V, dtype=dtype, seed=T + K, regime=regime, initial_state=h0)
    errors = _check(op, x, seed=T + V)
    assert set(errors) >= {"q", "k", "v", "g"} | ({"initial_state"} if h0 else set())


def test_gradients_with_the_local_kernels_v_loop_in_several_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local kernel's V loops in 16-column blocks (V = 40: three, the last partial; at the tests' V the default
    64-column block is one pass), as V > 64 runs them on a GPU."""
    monkeypatch.setitem(chunk_bwd.BWD_LAUNCH, "local_block_v", 16)
    x = gdn2.make_inputs(1, 70, 3, 24, 40, seed=9, regime="strong", initial_state=True)
    _check("gdn2", x, seed=10)


@pytest.mark.parametrize("op", ["gdn2", "kda"])
def test_gradients_with_the_pair_kernels_channels_in_several_blocks(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pair kernel's channels split over programs of 16 (K = 40: three blocks, the last partial), as a GPU
    launch splits K = 128; every row block, diagonal and off-diagonal terms, in each."""
    monkeypatch.setitem(chunk_bwd.BWD_LAUNCH, "pair_block_k", 16)
    x = OPS[op][2](1, 70, 3, 40, 24, seed=11, regime="strong", initial_state=True)
    _check(op, x, seed=12)


@pytest.mark.parametrize("op,term", [("gdn2", "o"), ("kda", "o"), ("gdn2", "final_state")])
def test_gradients_from_one_output(op: str, term: str) -> None:
    """A loss of one output alone: autograd passes None for the other's gradient (the reverse walk then starts
    from zero, or reads no output gradient)."""
    x = OPS[op][2](1, 100, 3, 16, 24, seed=3, regime="long", initial_state=True)
    _check(op, x, seed=4, terms=term)


@pytest.mark.parametrize("op", ["gdn2", "kda"])
def test_packed_sequences_gradients_match_one_by_one(op: str) -> None:
    """``cu_seqlens``: the gradients of a packed batch on the chunk-aligned row (kda, beta through stride-0 views)
    are those of each sequence run alone, initial states included; sequences of 1, 70, 129 and 63 tokens (1 to 3
    chunks), each reverse-walked by programs of its own."""
    fn, _, make_inputs = OPS[op]
    bounds = [0, 1, 71, 200, 263]
    x = make_inputs(1, bounds[-1], 2, 16, 8, seed=11, regime="strong", initial_state=True)
    x["initial_state"] = torch.randn(len(bounds) - 1, 2, 16, 8, generator=torch.Generator().manual_seed(14))
    gen = torch.Generator().manual_seed(12)
    do = torch.randn_like(x["v"])
    dht = torch.randn(x["initial_state"].shape, generator=gen)
    packed = _gradients(fn, x, do, dht, cu_seqlens=torch.tensor(bounds, dtype=torch.int32))
    for i, (t0, t1) in enumerate(itertools.pairwise(bounds)):
        part = {n: t[:, t0:t1] for n, t in x.items() if n != "initial_state"}
        part["initial_state"] = x["initial_state"][i : i + 1]
        alone = _gradients(fn, part, do[:, t0:t1], dht[i : i + 1])
        for n, t in alone.items():
            got = packed[n][i : i + 1] if n == "initial_state" else packed[n][:, t0:t1]
            torch.testing.assert_close(got, t, rtol=1e-6, atol=1e-6)


def test_through_the_verification_engine() -> None:
    """The registered gdn2 impl passes the harness gate in mode fwd+bwd (fp32, strong regime) on the CPU
    interpreter (kda's, the same declaration, is gated by `deltabench verify --op kda --mode fwd+bwd`)."""
    from deltabench.correctness.engine import verify_case
    from deltabench.harness.cases import Case
    from deltabench.harness.registry import get_impl

    case = Case("gdn2", 1, 70, 3, 16, 24, dtype="fp32", mode="fwd+bwd", initial_state=True)
    report = verify_case(get_impl("gdn2", "triton_chunk"), case, seeds=1, extra_seed=False, regimes="strong")
    assert report.passed, [r for r in report.records if not r.passed]
    checks = {r.check for r in report.records}
    assert checks >= {f"grad:{n}" for n in ("q", "k", "v", "g", "b", "w", "initial_state")}, checks


# --- planted bugs: chunk_bwd.py's source with one edit, loaded as a module of its own ----------------------------
PLANTED = {
    # the state update's decay exp(G_C - G) dropped from dk's term v_new dH^T
    "dropped_decay_dk": ("tl.store(dkp + offs, dkd_acc * ed, mask=mtkb)", "tl.store(dkp + offs, dkd_acc, mask=mtkb)"),
    # the reverse walk one chunk off: the last chunk never visited (its dH never stored), the first twice
    "walk_off_by_one": ("n = n1 - 1 - i", "n = tl.maximum(n1 - 2 - i, n0)"),
    # the reverse walk's chunk decay exp(G_C) read one row early
    "walk_decay_row_early": ("n * C + C - 1) * H", "n * C + C - 2) * H"),
}


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str], None]:
    """``plant(bug)``: the backward's launches replaced by those of chunk_bwd.py with `bug`'s edit (undone after)."""

    def plant(bug: str) -> None:
        old, new = PLANTED[bug]
        source = Path(chunk_bwd.__file__).read_text()
        assert source.count(old) == 1, bug
        path = tmp_path / f"chunk_bwd_{bug}.py"  # Triton reads a kernel's source from its file
        path.write_text(source.replace(old, new))
        name = f"{chunk_mod.__package__}.chunk_bwd_{bug}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        # ChunkGDN2Function.backward calls the chunk_gdn2_bwd that chunk.py imported
        monkeypatch.setattr(chunk_mod, "chunk_gdn2_bwd", module.chunk_gdn2_bwd)

    return plant


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_is_rejected(planted: Callable[[str], None], bug: str) -> None:
    """The check of :func:`test_gradients_match_oracle` fails on each planted bug, on the inputs of its case
    gdn2-B1-T70-K32-V16-float32-strong-h01 (which passes: a chunk and a ragged second)."""
    x = gdn2.make_inputs(1, 70, 3, 32, 16, seed=70 + 32, regime="strong", initial_state=True)
    planted(bug)
    with pytest.raises(AssertionError):
        _check("gdn2", x, seed=70 + 16)


# Run in a child process: with TRITON_INTERPRET set (as the tests set it) Triton builds no compilable kernels.
# benchmarks/cpu/kernel_resources.py records each launch of a forward and backward and compiles it.
CHILD = """
import json, sys
import torch
sys.path.insert(0, "benchmarks/cpu")
from kernel_resources import SHARED_LIMIT, compile_launches
out, done = {"limit": SHARED_LIMIT[90], "cases": []}, {}
dims = {"B": 1, "T": 200, "H": 2, "K": 128, "V": 128}
for op, seqlens in (("gdn2", None), ("kda", [17, 64, 1, 118])):
    launches = compile_launches("triton_chunk", dims, torch.bfloat16, seqlens, True, 90, done=done, op=op)
    out["cases"].append([op, seqlens, [[u["kernel"], u["shared"], u["constexprs"]] for u in launches]])
print(json.dumps(out))
"""


def test_every_backward_launch_compiles_for_hopper() -> None:
    """The forward's launches with the states kept and the backward's at K = V = 128 (the GPU suites' head size),
    bf16, from initial states, compiled for sm_90 without a GPU, each within the H200's shared memory a block:
    gdn2 dense and kda packed (the walks' PACKED variants)."""
    root = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=root, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    names = ["scores_kernel", "inverse_kernel", "apply_kernel", "walk_kernel"]
    names += ["state_bwd_kernel", "local_bwd_kernel", "pair_bwd_kernel", "dg_kernel"]
    for op, seqlens, launches in found["cases"]:
        assert [name for name, _, _ in launches] == names, op
        assert all(shared <= found["limit"] for _, shared, _ in launches), (op, launches)
        walks = [constexprs for name, _, constexprs in launches if name in ("walk_kernel", "state_bwd_kernel")]
        assert all(f"PACKED={seqlens is not None}" in c for c in walks), walks
