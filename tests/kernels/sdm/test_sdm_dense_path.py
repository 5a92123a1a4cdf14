"""sdm's Triton impl at its dense limit (W = S, kernels/sdm/triton/dense.py) under TRITON_INTERPRET=1: the op run as
the gated delta rule through deltabench's GDN Triton kernels, against the float64 oracle on y, the final bank and
every gradient, with write slots in a shuffled order per token and read slots that repeat (their weights add);
bitwise the same across two calls; taken exactly where it applies (key-weighted decay and W < S stay sparse)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from test_sdm_torch import errors, run_with_grads

from deltabench.kernels.sdm.triton import dense as dense_module
from deltabench.kernels.sdm.triton import triton_chunk as chunk_module
from deltabench.kernels.sdm.triton.triton_chunk import sdm_triton_chunk
from deltabench.references.sdm import make_inputs, sdm_recurrent

BOUND = {torch.float32: 1e-5, torch.bfloat16: 3e-2}  # fp32: GDN's kernels measure ~1e-7 here; bf16: their rounding


def _dense_inputs(B: int, T: int, H: int, S: int, D: int, *, seed: int, h0: bool) -> dict:
    """Inputs with W = R = S: the write slots a random permutation per token, the read slots drawn with repeats."""
    x = make_inputs(B, T, H, S, D, S, S, seed=seed, regime="typical", initial_bank=h0)
    gen = torch.Generator().manual_seed(seed)
    x["k_idx"] = torch.argsort(torch.rand(B, T, H, S, generator=gen), dim=-1)
    x["q_idx"] = torch.randint(0, S, (B, T, H, S), generator=gen)
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("T", "h0"), [(70, True), (64, False), (5, True)], ids=["ragged", "chunk-multiple", "short"])
def test_dense_limit_matches_the_oracle(T: int, h0: bool, dtype: torch.dtype) -> None:
    x = _dense_inputs(1, T, 3, 16, 8, seed=T, h0=h0)
    ref = run_with_grads(sdm_recurrent, x, torch.float64)
    ours = run_with_grads(sdm_triton_chunk, x, dtype)
    assert ours["y"].dtype == dtype and ours["final_bank"].dtype == torch.float32
    errs = errors(ours, ref)
    assert max(errs.values()) < BOUND[dtype], errs


def test_dense_limit_is_bitwise_reproducible() -> None:
    x = _dense_inputs(1, 40, 2, 16, 8, seed=3, h0=True)
    first = run_with_grads(sdm_triton_chunk, x, torch.float32)
    second = run_with_grads(sdm_triton_chunk, x, torch.float32)
    assert all(torch.equal(first[n], second[n]) for n in first)


@pytest.mark.parametrize(
    ("W", "regime", "dense"), [(16, "typical", True), (16, "key_weighted", False), (8, "typical", False)]
)
def test_taken_exactly_at_the_dense_limit(W: int, regime: str, dense: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = []

    def spy(*args, **kwargs):  # the real dense path, recorded
        taken.append(True)
        return dense_module.sdm_dense_gdn(*args, **kwargs)

    monkeypatch.setattr(chunk_module, "sdm_dense_gdn", spy)
    x = make_inputs(1, 9, 1, 16, 4, W, 4, seed=1, regime=regime, initial_bank=True)
    y, bank = sdm_triton_chunk(**x, chunk_size=8)
    ry, rbank = sdm_recurrent(**x)
    assert bool(taken) == dense
    assert ((y.double() - ry).norm() / ry.norm()).item() < 1e-5
    assert ((bank.double() - rbank).norm() / rbank.norm()).item() < 1e-5


def _set(name: str, where: tuple[int, ...], value) -> Callable[[dict], None]:
    """An edit of one index of an input, the value a number or a function of the inputs."""
    return lambda x: x[name].__setitem__(where, value(x) if callable(value) else value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("k_idx", (0, 6, 1, 3), 16), r"k_idx holds slot 16 outside \[0, 16\) at index \(0, 6, 1, 3\)"),
        (_set("k_idx", (0, 2, 0, 0), -1), r"k_idx holds slot -1 outside \[0, 16\)"),
        (_set("q_idx", (0, 8, 1, 5), 40), r"q_idx holds slot 40 outside \[0, 16\) at index \(0, 8, 1, 5\)"),
        (_set("k_idx", (0, 4, 0, 1), lambda x: int(x["k_idx"][0, 4, 0, 0])), r"k_idx repeats write slot"),
    ],
    ids=["write-slot-past-S", "negative-write-slot", "read-slot-past-S", "repeated-write-slot"],
)
def test_dense_path_refuses_bad_slots(edit: Callable[[dict], None], message: str) -> None:
    """The slot checks the dense path makes on the device, beside its densification: each bad index raises the
    references' one-line error (and the call takes the dense path, so these are that path's checks)."""
    x = _dense_inputs(1, 9, 2, 16, 4, seed=5, h0=True)
    assert dense_module.takes_dense_path(
        x["k_val"], x["q_val"], x["v"], 16, key_weighted_decay=False, allow_repeated_writes=False
    )
    edit(x)
    with pytest.raises(ValueError, match=message):
        sdm_triton_chunk(**x)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's raw bits (torch.equal calls -0.0 and +0.0 equal)."""
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype])


def _densify_inputs(rows: int, S: int, R: int, *, seed: int) -> dict:
    """``[rows, S]`` write slots (a permutation per row) and ``[rows, R]`` read slots in three kinds of row, by
    ``row % 3``: distinct (where R <= S), repeated with no slot read more than twice (a float32 sum of two terms is
    the same in any order), and one slot read by five m among uniform draws. Weights N(0, 1) in float32, with a
    -0.0 among the write weights and among a distinct row's read weights (a sum gives +0.0 there)."""
    gen = torch.Generator().manual_seed(seed)

    def perm(n: int) -> torch.Tensor:
        return torch.randperm(n, generator=gen)

    q_idx = torch.empty(rows, R, dtype=torch.int64)
    for r in range(rows):
        if r % 3 == 0 and R <= S:
            q_idx[r] = perm(S)[:R]
        elif r % 3 != 2:
            twice = torch.cat([perm(S), perm(S)])[perm(2 * S)][:R] if R > S else perm(S)[:R]
            if R <= S:  # pairs: a quarter of the entries copy another quarter's slots
                at = perm(R)
                twice[at[: R // 4]] = twice[at[R // 4 : 2 * (R // 4)]]
            q_idx[r] = twice
        else:
            q_idx[r] = torch.randint(0, S, (R,), generator=gen)
            q_idx[r, perm(R)[:5]] = int(q_idx[r, 0])
    k_val = torch.randn(rows, S, generator=gen)
    q_val = torch.randn(rows, R, generator=gen)
    k_val[0, 1] = -0.0
    q_val[0, 2] = -0.0
    k_idx = torch.stack([perm(S) for _ in range(rows)])
    return {"k_idx": k_idx, "k_val": k_val, "q_idx": q_idx, "q_val": q_val}


def _densify_reference(x: dict, S: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain torch on the CPU: the key by a scatter-add into zeros (one term a slot), the query's float32 sum in
    order m = 0..R-1 and its float64 sum."""
    k = torch.zeros(x["k_idx"].shape[0], S).scatter_add_(-1, x["k_idx"], x["k_val"].float())
    q32 = torch.zeros(k.shape)
    for m in range(x["q_idx"].shape[-1]):
        q32.scatter_add_(-1, x["q_idx"][:, m : m + 1], x["q_val"][:, m : m + 1].float())
    q64 = torch.zeros(k.shape, dtype=torch.float64).scatter_add_(-1, x["q_idx"], x["q_val"].double())
    return k, q32, q64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("S", "R"), [(12, 9), (12, 20), (16, 16), (100, 70)], ids=lambda v: str(v))
def test_densify_matches_plain_torch(S: int, R: int, dtype: torch.dtype) -> None:
    """The densification alone, bit for bit: the key (every slot written once, -0.0 summed to +0.0) and the query
    where no slot is read more than twice; where one is read five times, the float32 sum within its rounding of the
    float64 sum. S not a power of two, R below and above S; (100, 70) runs the summing rows in several blocks of
    slots and of m."""
    x = _densify_inputs(9, S, R, seed=S + R)
    x["k_val"], x["q_val"] = x["k_val"].to(dtype), x["q_val"].to(dtype)
    k_ref, q32, q64 = _densify_reference(x, S)
    k, q, bad = dense_module._Densify.apply(x["k_idx"], x["k_val"], x["q_idx"], x["q_val"], S)
    assert int(bad) == 0 and k.dtype == q.dtype == dtype and k.shape == q.shape == (9, S)
    assert torch.equal(_bits(k), _bits(k_ref.to(dtype)))
    assert _bits(k)[0, int(x["k_idx"][0, 1])] == 0  # the -0.0 weight's slot holds +0.0
    counts = torch.zeros(9, S, dtype=torch.int64).scatter_add_(-1, x["q_idx"], torch.ones_like(x["q_idx"]))
    order_free = counts.amax(-1) <= 2
    assert order_free.sum() >= 6 and (counts.amax(-1) >= 5).sum() == 3
    assert torch.equal(_bits(q[order_free]), _bits(q32[order_free].to(dtype)))
    if R <= S:
        assert _bits(q)[0, int(x["q_idx"][0, 2])] == 0  # a distinct row's -0.0 read weight: +0.0
    rounding = {torch.float32: 2e-7 * R, torch.bfloat16: 2.0**-8}[dtype]
    scale = torch.zeros(9, S, dtype=torch.float64).scatter_add_(-1, x["q_idx"], x["q_val"].double().abs())
    assert ((q[~order_free].double() - q64[~order_free]).abs() <= rounding * scale[~order_free]).all()


@pytest.mark.parametrize(
    ("edit", "flagged"),
    [
        (_set("k_idx", (2, 1), lambda x: int(x["k_idx"][2, 0])), True),
        (_set("k_idx", (1, 4), 12), True),
        (_set("k_idx", (0, 0), -1), True),
        (_set("q_idx", (3, 5), 12), True),
        (_set("q_idx", (1, 0), -3), True),
        (_set("q_idx", (0, 1), lambda x: int(x["q_idx"][0, 0])), False),
        (lambda x: None, False),
    ],
    ids=["repeated-write", "write-past-S", "negative-write", "read-past-S", "negative-read", "repeated-read", "none"],
)
def test_densify_flags_exactly_the_bad_slots(edit: Callable[[dict], None], flagged: bool) -> None:
    """The kernel's own checks: a row whose write entries name one slot twice (so with W = S another slot goes
    unwritten) or any out-of-range slot sets ``bad``; a repeated read slot, which the op allows, does not, and
    its query is still the sum. Rows 0 and 3 read distinct slots (the branch that stores), rows 1 and 2 repeat
    some (the branch that sums)."""
    x = _densify_inputs(4, 12, 9, seed=7)
    edit(x)
    k, q, bad = dense_module._Densify.apply(x["k_idx"], x["k_val"], x["q_idx"], x["q_val"], 12)
    assert (int(bad) != 0) == flagged
    if not flagged:  # row 2 reads one slot five times: its float32 sum depends on the order
        k_ref, q32, _ = _densify_reference(x, 12)
        assert torch.equal(_bits(k), _bits(k_ref)) and torch.equal(_bits(q[:2]), _bits(q32[:2]))
        assert torch.equal(_bits(q[3]), _bits(q32[3]))


_COMPILE_DENSIFY = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from deltabench.kernels.sdm.triton.dense import _densify_kernel as fn

for idx, val, S, R in (("*i64", "*bf16", 128, 128), ("*i32", "*fp32", 100, 70)):
    blocks = dict(BLOCK_W=triton.next_power_of_2(S), BLOCK_R=triton.next_power_of_2(R), SUM_R=32, SUM_S=64)
    const = dict(W=S, R=R, S=S, **blocks)
    types = dict(k_idx=idx, q_idx=idx, k_val=val, q_val=val, k_out=val, q_out="*fp32")
    sig = {a: "constexpr" if a in const else types.get(a, "*i32") for a in fn.arg_names}
    triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    print("compiled", val, flush=True)
"""


def test_densify_kernel_compiles_for_sm90() -> None:
    """The interpreter runs the kernel as NumPy; this takes it through Triton's real pipeline to sm_90 code (its
    data-dependent branch, the barrier and the loops of the summing branch), in bf16 with int64 slots at the
    flagship's S = 128 and in fp32 with int32 slots at an S that is no power of two, in a fresh process without
    the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE_DENSIFY], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("compiled ") == 2, done.stdout
