"""Product-key top-k in PyTorch with SDM 2.0.0's selection rule, vectorised over rows.

Layout: ``raw [..., n_0 + .. + n_{F-1}]`` holds the F factors' scores side by side; slot ``(c_0, .., c_{F-1})`` has
index ``(..(c_0 n_1 + c_1)..) n_{F-1} + c_{F-1}`` and scores the float32 sum of its factor values in factor order.
Every comparison is on an integer key (the float32's total order with NaN as -inf and -0 < +0, then the tie
ranks), so the selection is exact and the same on every device; the backward sums the selected values' gradients
to their factor columns in a fixed order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ....references.sdm import check_factors

__all__ = ["MAX_K", "PkTopK", "check_pk_arguments", "float_order_key", "pk_topk_torch"]

# Bits of the tie ranks packed below a score's 32-bit key: i + j < 2^15 and i < 2^16, so k <= 2^14.
MAX_K = 1 << 14


def float_order_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys in ``[0, 2^32)`` ordered as SDM 2.0.0 orders float32 scores: NaN counts as -inf, -0 < +0."""
    x = torch.where(torch.isnan(x), torch.full_like(x, -math.inf), x.float())
    bits = x.view(torch.int32).long()
    # Negative floats: a larger magnitude has larger bits but is smaller, so mirror them below the positives.
    return torch.where(bits >= 0, bits, -(1 << 31) - 1 - bits) + (1 << 31)


def _rank_columns(values: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The best `keep` columns of one factor ``[N, n]`` and their values, by value, the larger column first on ties."""
    cols = torch.arange(values.shape[-1], device=values.device)
    key = (float_order_key(values) << 31) | cols
    best = key.topk(keep, dim=-1).indices
    return best, values.gather(-1, best)


def _tie_key(i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """Rank key of the pairs (i, j) that score exactly alike: the larger i + j wins, then the larger i."""
    return ((i + j) << 16) | i


def _select(raw: torch.Tensor, factors: tuple[int, ...], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Selected ``(score float32, slot int64)`` per row of ``raw [N, sum(factors)]``, in selection order."""
    values = raw.float()
    bf16_partials = raw.dtype == torch.bfloat16 and len(factors) > 2
    starts = [sum(factors[:f]) for f in range(len(factors))]
    slot, score = _rank_columns(values[:, : factors[0]], min(k, factors[0]))
    for f in range(1, len(factors)):
        n, m = slot.shape[-1], min(k, factors[f])
        keep = min(k, n * m)
        col, val = _rank_columns(values[:, starts[f] : starts[f] + factors[f]], m)
        pair = score[:, :, None] + val[:, None, :]  # [N, n, m], one float32 addition each
        if bf16_partials and f < len(factors) - 1:
            pair = pair.bfloat16().float()
        i = torch.arange(n, device=raw.device)[:, None]
        j = torch.arange(m, device=raw.device)[None, :]
        rank_key = _tie_key(i, j)
        key = (float_order_key(pair) << 31) | rank_key
        key = torch.where((i + 1) * (j + 1) <= keep, key, torch.full_like(key, -1)).flatten(1)
        best = key.topk(keep, dim=-1).indices
        bi, bj = best // m, best % m
        slot = slot.gather(-1, bi) * factors[f] + col.gather(-1, bj)
        score = pair.flatten(1).gather(-1, best)
    return score, slot


Select = Callable[[torch.Tensor, tuple[int, ...], int], tuple[torch.Tensor, torch.Tensor]]


class PkTopK(torch.autograd.Function):
    """Product-key top-k with a given selection (``select(rows [N, sum(factors)], factors, k) -> (score float32,
    slot int64)``, each ``[N, kk]`` in any order) and the deterministic backward to the factor columns."""

    @staticmethod
    def forward(
        ctx, raw: torch.Tensor, factors: tuple[int, ...], k: int, select: Select
    ) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        rows = raw.reshape(-1, raw.shape[-1])
        score, slot = select(rows, factors, k)
        slot, order = slot.sort(dim=-1)
        score = score.gather(-1, order)
        ctx.save_for_backward(slot)
        ctx.factors, ctx.raw_shape = factors, raw.shape
        ctx.mark_non_differentiable(slot)
        lead = raw.shape[:-1]
        return score.to(raw.dtype).reshape(*lead, -1), slot.reshape(*lead, -1)

    @staticmethod
    def backward(ctx, grad_val: torch.Tensor, _grad_idx: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        (slot,) = ctx.saved_tensors
        grad = grad_val.reshape(slot.shape).float()
        parts, rest = [], slot
        for n in reversed(ctx.factors):
            one_hot = torch.nn.functional.one_hot(rest % n, n).float()  # [N, kk, n]
            parts.append((one_hot * grad[..., None]).sum(-2))  # a fixed-order sum over the selected slots
            rest = rest // n
        grad_raw = torch.cat(parts[::-1], dim=-1)
        return grad_raw.to(grad_val.dtype).reshape(ctx.raw_shape), None, None, None


def pk_topk_torch(
    raw: torch.Tensor, factors: Sequence[int], k: int, *, num_slots: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact product-key top-k with SDM 2.0.0's rule (see :func:`deltabench.references.sdm.pk_topk`).

    Args:
        raw: ``[..., sum(factors)]`` float32 or bfloat16 factor scores side by side.
        factors: the widths ``n_0..n_{F-1}`` (their product is the bank's S).
        k: how many slots to select, ``1 <= k <= 16384`` (``min(k, S)`` are returned).
        num_slots: the bank's S, if known: a one-line ValueError unless the widths multiply to it.

    Returns:
        ``(val, idx)``, each ``[..., min(k, S)]``: idx int64 strictly ascending, val the selected slots' scores in
        ``raw.dtype``, differentiable to ``raw`` with a deterministic backward.

    Raises:
        ValueError: a factor width < 1, raw's last dim not their sum, or k out of range.

    Examples::

        >>> val, idx = pk_topk_torch(torch.randn(8, 64 + 64), (64, 64), k=16)
    """
    dims = check_pk_arguments(raw, factors, k, num_slots)
    return PkTopK.apply(raw, dims, int(k), _select)


def check_pk_arguments(
    raw: torch.Tensor, factors: Sequence[int], k: int, num_slots: int | None = None
) -> tuple[int, ...]:
    """The factor widths, or a one-line ValueError (a width < 1, a product other than `num_slots` when given, raw's
    last dim not their sum, k out of range)."""
    dims = check_factors(factors, num_slots)
    if raw.shape[-1] != sum(dims):
        raise ValueError(f"raw's last dim {raw.shape[-1]} is not the sum of the factor widths {list(dims)}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be in 1..{MAX_K}, got {k}")
    return dims
