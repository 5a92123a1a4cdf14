"""The PyTorch implementations of every op (gdn, gdn2, kda) against the float64 oracle: outputs, final states and
every gradient.

One test body serves the three ops: each case backpropagates a random cotangent on o AND on the final state through
the impl and through the op's own float64 oracle (on the same, already rounded, inputs), and compares o, the final
state and each gradient by name with the relative Frobenius error ||x - ref|| / ||ref||. Case ids start with the op
and the impl (``gdn-torch_chunk-B2-T65-...``), so ``-k gdn2`` or ``-k kda-torch_chunk`` selects one subject.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from types import ModuleType

import pytest
import torch

from deltabench.kernels.gdn import gdn_torch_chunk, gdn_torch_recurrent
from deltabench.kernels.gdn2 import gdn2_torch_chunk, gdn2_torch_recurrent
from deltabench.kernels.kda import kda_torch_chunk, kda_torch_recurrent
from deltabench.references import gdn, gdn2, kda

Fn = Callable[..., tuple[torch.Tensor, torch.Tensor]]

# Per op: its reference module (oracle `<op>_recurrent` and `make_inputs`) and its two torch impls.
REFERENCES: dict[str, ModuleType] = {"gdn": gdn, "gdn2": gdn2, "kda": kda}
IMPLS: dict[str, dict[str, Fn]] = {
    "gdn": {"torch_recurrent": gdn_torch_recurrent, "torch_chunk": gdn_torch_chunk},
    "gdn2": {"torch_recurrent": gdn2_torch_recurrent, "torch_chunk": gdn2_torch_chunk},
    "kda": {"torch_recurrent": kda_torch_recurrent, "torch_chunk": kda_torch_chunk},
}
OPS = list(IMPLS)
SUBJECTS = [(op, impl) for op in OPS for impl in IMPLS[op]]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Bounds on the relative Frobenius error, measured over T in {1, 63, 64, 65, 130}, both regimes, with and without an
# initial state, seeds 0-1, all three ops, both impls (B=2, H=3, K=16, V=32):
# - fp32: worst 2.2e-6 (torch_chunk's dg; torch_recurrent's worst 4.8e-7), so 2e-5 leaves a 10x margin.
# - bf16: worst 3.6e-3 (kda torch_chunk's dbeta), the rounding of o and of each gradient to bf16 (2^-9 per element).
# - the final state is float32 whatever the input dtype: worst 1.2e-6 with bf16 inputs, so it gets the fp32 bound.
BOUNDS = {"fp32": 2e-5, "bf16": 1e-2}
STATE_BOUND = 2e-5
# A reference gradient that is exactly zero (dg at T=1 from a zero state: the decay multiplies nothing) has no
# relative error; the impl's must then be zero up to float32 rounding (torch_chunk: 1.2e-7 from the cumsum backward).
ZERO_GRAD_ATOL = 1e-6
B, H, K, V = 2, 3, 16, 32  # odd H, K != V

subjects = pytest.mark.parametrize(("op", "impl"), SUBJECTS, ids=[f"{op}-{impl}" for op, impl in SUBJECTS])


def oracle_fn(op: str) -> Fn:
    """The op's float64 token-serial oracle (``references.<op>.<op>_recurrent``)."""
    return getattr(REFERENCES[op], f"{op}_recurrent")


def make_inputs(op: str, *args, **kwargs) -> dict[str, torch.Tensor]:
    """The op's seeded inputs (``references.<op>.make_inputs``)."""
    return REFERENCES[op].make_inputs(*args, **kwargs)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative Frobenius error of `actual` against `expected`, in float64."""
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cotangents(T: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + seed)
    return (
        torch.randn(B, T, H, V, generator=gen, dtype=torch.float64),
        torch.randn(B, H, K, V, generator=gen, dtype=torch.float64),
    )


def _forward_backward(fn: Fn, inputs: dict[str, torch.Tensor], T: int, seed: int, **kw) -> dict[str, torch.Tensor]:
    """Run `fn`, backpropagate the seeded cotangents, return o, ht and d<input> for every input."""
    leaves = {name: x.detach().clone().requires_grad_() for name, x in inputs.items()}
    o, ht = fn(**leaves, **kw)
    d_o, d_ht = _cotangents(T, seed)
    ((o.double() * d_o).sum() + (ht.double() * d_ht).sum()).backward()
    return {"o": o.detach(), "ht": ht.detach(), **{f"d{name}": x.grad for name, x in leaves.items()}}


def _oracle_forward_backward(op: str, inputs: dict[str, torch.Tensor], T: int, seed: int, **kw):
    """`_forward_backward` through the op's oracle, on the inputs promoted to float64."""
    return _forward_backward(oracle_fn(op), {n: x.double() for n, x in inputs.items()}, T, seed, **kw)


_ORACLE_CACHE: dict[tuple, dict[str, torch.Tensor]] = {}


def _oracle(key: tuple, op: str, inputs: dict[str, torch.Tensor], T: int, seed: int) -> dict[str, torch.Tensor]:
    """The oracle's results for a case of an op, computed once for both impls."""
    if key not in _ORACLE_CACHE:
        _ORACLE_CACHE[key] = _oracle_forward_backward(op, inputs, T, seed)
    return _ORACLE_CACHE[key]


def compare(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], dtype: str) -> dict[str, str]:
    """Every quantity that misses its bound, with its error and bound (empty when all pass)."""
    failures = {}
    for name, expected in ref.items():
        actual = got[name]
        assert actual is not None, f"{name} has no gradient"
        assert torch.isfinite(actual).all(), f"{name} is not finite"
        if expected.norm() == 0:
            if actual.double().norm() > ZERO_GRAD_ATOL:
                failures[name] = f"|x|={actual.double().norm():.2e} where the reference is exactly 0"
            continue
        bound = STATE_BOUND if name == "ht" else BOUNDS[dtype]
        err = rel_err(actual, expected)
        if not err <= bound:
            failures[name] = f"{err:.2e} > {bound:.0e}"
    return failures


CASES = [
    (T, dtype, regime, h0, i % 3)
    for i, (T, dtype, regime, h0) in enumerate(
        itertools.product((1, 63, 64, 65, 130), DTYPES, ("typical", "long"), (False, True))
    )
]


def case_id(case: tuple) -> str:
    """B2-T65-H3-K16-V32-bf16-long-h0-s1."""
    T, dtype, regime, h0, seed = case
    return f"B{B}-T{T}-H{H}-K{K}-V{V}-{dtype}-{regime}-{'h0' if h0 else 'noh0'}-s{seed}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
@subjects
def test_matches_oracle(op: str, impl: str, case: tuple) -> None:
    """o, the final state and every gradient (q, k, v, gates, initial_state) within the dtype's bound."""
    T, dtype, regime, h0, seed = case
    inputs = make_inputs(op, B, T, H, K, V, dtype=DTYPES[dtype], seed=seed, regime=regime, initial_state=h0)
    got = _forward_backward(IMPLS[op][impl], inputs, T, seed)
    assert got["o"].dtype == DTYPES[dtype] and got["ht"].dtype == torch.float32
    assert got["o"].shape == (B, T, H, V) and got["ht"].shape == (B, H, K, V)
    assert not (failures := compare(got, _oracle((op, *case), op, inputs, T, seed), dtype)), failures


@pytest.mark.parametrize("seed", [3, 4, 5, 6])
@subjects
def test_several_seeds_with_a_custom_scale(op: str, impl: str, seed: int) -> None:
    """More seeds at a long partial-chunk case, with a non-default scale passed to both sides."""
    T = 97
    inputs = make_inputs(op, B, T, H, K, V, seed=seed, regime="long", initial_state=True)
    got = _forward_backward(IMPLS[op][impl], inputs, T, seed, scale=0.3)
    ref = _oracle_forward_backward(op, inputs, T, seed, scale=0.3)
    assert not (failures := compare(got, ref, "fp32")), failures


@pytest.mark.parametrize("chunk_size", [16, 37, 128])
@pytest.mark.parametrize("op", OPS)
def test_chunk_size_does_not_change_the_result(op: str, chunk_size: int) -> None:
    """The chunk length (and so how much of the last chunk is padding) only moves float32 rounding."""
    T = 130
    inputs = make_inputs(op, B, T, H, K, V, seed=2, regime="typical", initial_state=True)
    chunk = IMPLS[op]["torch_chunk"]
    base = _forward_backward(chunk, inputs, T, 2)
    other = _forward_backward(chunk, inputs, T, 2, chunk_size=chunk_size)
    assert not (failures := compare(other, base, "fp32")), failures


@subjects
def test_streaming_equals_one_call(op: str, impl: str) -> None:
    """T1 tokens, then T - T1 tokens from the returned state, equal T tokens at once (outputs and state)."""
    T, T1 = 150, 70
    x = make_inputs(op, B, T, H, K, V, seed=7, regime="long", initial_state=True)
    fn = IMPLS[op][impl]
    o_all, ht_all = fn(**x)
    first = {n: (t[:, :T1] if n != "initial_state" else t) for n, t in x.items()}
    o1, ht1 = fn(**first)
    rest = {n: t[:, T1:] for n, t in x.items() if n != "initial_state"}
    o2, ht2 = fn(**rest, initial_state=ht1)
    assert rel_err(torch.cat([o1, o2], dim=1), o_all) < BOUNDS["fp32"]
    assert rel_err(ht2, ht_all) < STATE_BOUND


@subjects
def test_strong_decay_stays_finite(op: str, impl: str) -> None:
    """A log-decay of -30 a token (exp(-G) over a chunk would be exp(1920)) must not overflow, forward or back."""
    T = 130
    inputs = make_inputs(op, B, T, H, K, V, seed=8, regime="typical", initial_state=True)
    strong = torch.rand(inputs["g"].shape, generator=torch.Generator().manual_seed(8)) < 0.5
    inputs["g"] = torch.where(strong, torch.full_like(inputs["g"], -30.0), inputs["g"])
    got = _forward_backward(IMPLS[op][impl], inputs, T, 8)
    ref = _oracle_forward_backward(op, inputs, T, 8)
    assert not (failures := compare(got, ref, "fp32")), failures


@subjects
def test_fp16_and_empty_sequence(op: str, impl: str) -> None:
    """fp16 inputs give an fp16 output and a float32 state; T=0 returns an empty output and the initial state."""
    x = make_inputs(op, B, 20, H, K, V, dtype=torch.float16, seed=9, initial_state=True)
    o, ht = IMPLS[op][impl](**x)
    assert o.dtype == torch.float16 and ht.dtype == torch.float32
    o_ref, ht_ref = oracle_fn(op)(**x)
    assert rel_err(o, o_ref) < BOUNDS["bf16"] and rel_err(ht, ht_ref) < STATE_BOUND
    empty = make_inputs(op, B, 0, H, K, V, seed=9, initial_state=True)
    o, ht = IMPLS[op][impl](**empty)
    assert o.shape == (B, 0, H, V)
    torch.testing.assert_close(ht, empty["initial_state"], rtol=0, atol=0)


@subjects
def test_shape_errors_name_the_argument(op: str, impl: str) -> None:
    """An input of the wrong shape is refused with a ValueError that names it."""
    x = make_inputs(op, 1, 5, 2, 4, 6, seed=0)
    x["v"] = x["v"][:, :4]
    with pytest.raises(ValueError, match="v must be"):
        IMPLS[op][impl](**x)
