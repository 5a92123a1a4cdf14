"""Product-key top-k in PyTorch (kernels/sdm/torch/pk_topk.py) and Triton (kernels/sdm/triton/pk_topk_triton.py)
against the oracle: bitwise the same selection and values, planted ties of every kind (equal factor values, equal
pair sums at different ranks, -0 against +0, NaN), 1 to 4 factors, float32 and bf16, and the backward; a wrong tie
order is rejected."""

from __future__ import annotations

import pytest
import torch

from deltabench.kernels.sdm.torch import pk_topk as pk_module
from deltabench.kernels.sdm.torch.pk_topk import float_order_key, pk_topk_torch
from deltabench.references.sdm import pk_topk

SHAPES = [((8, 8), 5), ((16, 16), 16), ((4, 5, 6), 7), ((30,), 9), ((3, 3), 20), ((2, 3, 2, 2), 11), ((5, 7), 1)]


def planted(factors: tuple[int, ...], rows: int, seed: int) -> torch.Tensor:
    """Scores with many exact ties: half-integers (equal factor values and equal pair sums), -0 and +0, NaN, -inf."""
    gen = torch.Generator().manual_seed(seed)
    raw = (torch.randn(rows, sum(factors), generator=gen) * 2).round() / 2
    raw[0, 0], raw[1, 1], raw[1, 0] = float("nan"), -0.0, 0.0
    raw[2, :] = 0.0
    raw[3, ::2] = -0.0
    raw[4, -1] = -float("inf")
    return raw


def assert_same(ours: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert torch.equal(ours[1], ref[1])
    torch.testing.assert_close(ours[0], ref[0].to(ours[0].dtype), rtol=0, atol=0, equal_nan=True)
    # -0 and +0 are told apart, so compare signs as well.
    assert torch.equal(torch.signbit(ours[0]), torch.signbit(ref[0].to(ours[0].dtype)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("factors,k", SHAPES, ids=[f"{'x'.join(map(str, f))}-k{k}" for f, k in SHAPES])
def test_matches_oracle_bitwise(factors: tuple[int, ...], k: int, dtype: torch.dtype) -> None:
    """Random and planted-tie rows: the same slots and the same score bits as the oracle."""
    for seed in range(3):
        for raw in (
            torch.randn(5, sum(factors), generator=torch.Generator().manual_seed(seed)),
            planted(factors, 6, seed),
        ):
            assert_same(pk_topk_torch(raw.to(dtype), factors, k), pk_topk(raw.to(dtype), factors, k))


def test_backward_matches_oracle_and_is_deterministic() -> None:
    """The gradient to raw is the oracle's (1 to each factor column of each selected slot), bitwise twice."""
    raw = planted((6, 5, 4), 6, 1).requires_grad_(True)
    grad_out = torch.randn(6, 9, generator=torch.Generator().manual_seed(2))
    val, _ = pk_topk_torch(raw, (6, 5, 4), 9)
    (ours,) = torch.autograd.grad(val, raw, grad_out)
    (again,) = torch.autograd.grad(pk_topk_torch(raw, (6, 5, 4), 9)[0], raw, grad_out)
    ref_val, _ = pk_topk(raw, (6, 5, 4), 9)
    (ref,) = torch.autograd.grad(ref_val, raw, grad_out.double())
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)
    assert torch.equal(ours, again)


def test_float_order_key() -> None:
    """NaN ties -inf below everything; -0 is below +0; otherwise the float order."""
    x = torch.tensor([float("nan"), -float("inf"), -3.0, -1e-30, -0.0, 0.0, 1e-30, 2.0, float("inf")])
    key = float_order_key(x)
    assert key[0] == key[1] and bool((key[1:-1] < key[2:]).all())


def test_wrong_tie_order_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """A selection that sends exact ties to the smaller i + j picks other slots than the oracle on planted ties."""
    monkeypatch.setattr(pk_module, "_tie_key", lambda i, j: ((1 << 15) - 1 - (i + j)) << 16 | i)
    raw = torch.tensor([[2.0, 1.0, 0.5, 1.0, 0.5, 0.0]])
    assert not torch.equal(pk_topk_torch(raw, (3, 3), 3)[1], pk_topk(raw, (3, 3), 3)[1])


@pytest.mark.parametrize(
    "factors,k,message",
    [((4, 0), 2, "positive widths"), ((), 2, "positive widths"), ((4, 4), 0, "k must be"), ((3, 4), 2, "sum")],
)
def test_bad_arguments(factors: tuple[int, ...], k: int, message: str) -> None:
    raw = torch.randn(2, 8)
    with pytest.raises(ValueError, match=message):
        pk_topk_torch(raw, factors, k)


def test_factors_that_do_not_address_the_bank_are_refused() -> None:
    """S not the product of the factor widths: the same one-line error from the oracle and the PyTorch selection."""
    raw = torch.randn(2, 11)
    for fn in (pk_topk, pk_topk_torch):
        with pytest.raises(ValueError, match=r"factors \[5, 6\] address 30 slots, not S=32"):
            fn(raw, (5, 6), 3, num_slots=32)
    assert pk_topk_torch(raw, (5, 6), 3, num_slots=30)[1].shape == (2, 3)


TRITON_SHAPES = [((8, 8), 5), ((4, 5, 6), 7), ((30,), 9)]


@pytest.mark.parametrize("factors,k", TRITON_SHAPES, ids=[f"{'x'.join(map(str, f))}-k{k}" for f, k in TRITON_SHAPES])
def test_triton_matches_oracle_bitwise(factors: tuple[int, ...], k: int) -> None:
    """The Triton selection (under the interpreter) is the oracle's on planted ties, float32 and bf16 (three factors:
    bf16 partial sums rounded to nearest even), and repeats its bits."""
    from deltabench.kernels.sdm.triton.pk_topk_triton import pk_topk_triton

    raw = planted(factors, 6, 0)
    for dtype in (torch.float32, torch.bfloat16):
        x = (raw * 1.37).to(dtype)  # * 1.37: bf16 partial sums that need rounding
        ours = pk_topk_triton(x, factors, k)
        assert_same(ours, pk_topk(x, factors, k))
        again = pk_topk_triton(x, factors, k)
        bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
        assert torch.equal(ours[1], again[1]) and torch.equal(ours[0].view(bits), again[0].view(bits))
    # The backward is the shared deterministic one: the same gradient as the PyTorch selection's.
    leaf = raw.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(pk_topk_triton(leaf, factors, k)[0].sum(), leaf)
    (expected,) = torch.autograd.grad(pk_topk_torch(leaf, factors, k)[0].sum(), leaf)
    assert torch.equal(grad, expected)
