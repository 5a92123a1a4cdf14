"""Product-key top-k in Triton with SDM 2.0.0's selection rule (the rule of :func:`deltabench.references.sdm.pk_topk`).

Layout: ``raw [..., n_0 + .. + n_{F-1}]``; slot ``(..(c_0 n_1 + c_1)..) n_{F-1} + c_{F-1}``. Every comparison is on an
int64 key (the float32 score's total order with NaN as -inf and -0 < +0, then the tie ranks), and a selected entry's
position is the number of candidates whose key is larger: a count, the same whatever order it is taken in, so each
output position has one writer and the result is the oracle's bit for bit. Three kernels: ``rank_factor`` (each
factor's best ``min(k, n_f)`` columns, the larger column first on ties), ``stage`` (one per factor after the first:
the best ``min(k, n m)`` pairs of the stage so far and the factor's ranks with ``(i + 1)(j + 1) <= keep``, exact ties
to the larger ``i + j``, then the larger ``i``), ``ascending`` (the selected slots in increasing order). The backward
is :class:`.pk_topk.PkTopK`'s (a fixed-order sum to the factor columns).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ..torch.pk_topk import PkTopK, check_pk_arguments

__all__ = ["LAUNCH", "pk_topk_triton"]

LAUNCH = {"num_warps": 4, "num_stages": 1}  # pinned
_BLOCK = 32  # candidates per block on each side of the count


@triton.jit
def _order_key(x):
    """int64 keys in [0, 2^32) ordered as SDM 2.0.0 orders float32 scores: NaN counts as -inf, -0 < +0."""
    x = tl.where(x != x, float("-inf"), x)
    bits = x.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(bits >= 0, bits, -2147483649 - bits) + 2147483648


@triton.jit
def _round_bf16(x):
    """Round float32 to the nearest bfloat16 (ties to even), in integer arithmetic so every backend agrees."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def rank_factor_kernel(raw, col_out, val_out, row_stride, start, n, m, K, BLOCK: tl.constexpr):
    """Grid (rows, blocks of the factor's columns): the rank of each column among the factor's n (value, then the
    larger column); columns of rank < m are stored at their rank."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mc = c < n
    x = tl.load(raw + row * row_stride + start + c, mask=mc, other=0.0)
    key = (_order_key(x) << 31) | c.to(tl.int64)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    for o0 in range(0, n, BLOCK):
        o = o0 + tl.arange(0, BLOCK)
        mo = o < n
        xo = tl.load(raw + row * row_stride + start + o, mask=mo, other=0.0)
        ko = (_order_key(xo) << 31) | o.to(tl.int64)
        rank += tl.sum(((ko[None, :] > key[:, None]) & mo[None, :]).to(tl.int32), axis=1)
    keep = mc & (rank < m)
    tl.store(col_out + row * K + rank, c.to(tl.int64), mask=keep)
    tl.store(val_out + row * K + rank, x, mask=keep)


@triton.jit
def _pair(prev_score, prev_slot, col, val, row, e, n, m, keep, width, K, ROUND: tl.constexpr):
    """Candidate e = i m + j of a stage: its score, key (-1 when not a candidate) and slot."""
    i = e // m
    j = e % m
    ok = (e < n * m) & ((i + 1) * (j + 1) <= keep)
    score = tl.load(prev_score + row * K + i, mask=ok, other=0.0) + tl.load(val + row * K + j, mask=ok, other=0.0)
    if ROUND:
        score = _round_bf16(score)
    tie = ((i + j).to(tl.int64) << 16) | i.to(tl.int64)
    key = tl.where(ok, (_order_key(score) << 31) | tie, -1)
    slot = tl.load(prev_slot + row * K + i, mask=ok, other=0) * width + tl.load(col + row * K + j, mask=ok, other=0)
    return score, key, slot, ok


@triton.jit
def stage_kernel(
    prev_score, prev_slot, col, val, next_score, next_slot, n, m, keep, width, K,
    ROUND: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Grid (rows, blocks of the n m pairs): each candidate's rank among the candidates; the best `keep` are stored
    at their rank."""
    row = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    score, key, slot, ok = _pair(prev_score, prev_slot, col, val, row, e, n, m, keep, width, K, ROUND)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    for o0 in range(0, n * m, BLOCK):
        o = o0 + tl.arange(0, BLOCK)
        _, ko, _, _ = _pair(prev_score, prev_slot, col, val, row, o, n, m, keep, width, K, ROUND)
        rank += tl.sum((ko[None, :] > key[:, None]).to(tl.int32), axis=1)
    chosen = ok & (rank < keep)
    tl.store(next_score + row * K + rank, score, mask=chosen)
    tl.store(next_slot + row * K + rank, slot, mask=chosen)


@triton.jit
def ascending_kernel(score, slot, val_out, idx_out, kk, K, BLOCK: tl.constexpr):
    """Grid (rows, blocks of the kk selected): each slot's position in increasing slot order (slots are distinct)."""
    row = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    me = e < kk
    s = tl.load(slot + row * K + e, mask=me, other=0)
    x = tl.load(score + row * K + e, mask=me, other=0.0)
    pos = tl.zeros([BLOCK], dtype=tl.int32)
    for o0 in range(0, kk, BLOCK):
        o = o0 + tl.arange(0, BLOCK)
        so = tl.load(slot + row * K + o, mask=o < kk, other=0)
        pos += tl.sum(((so[None, :] < s[:, None]) & (o < kk)[None, :]).to(tl.int32), axis=1)
    tl.store(idx_out + row * kk + pos, s, mask=me)
    tl.store(val_out + row * kk + pos, x, mask=me)


def _select_triton(rows: torch.Tensor, factors: tuple[int, ...], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(score float32, slot int64), each [N, kk], slots ascending, for rows [N, sum(factors)]."""
    N, dev = rows.shape[0], rows.device
    values = rows.float().contiguous()
    round_partials = rows.dtype == torch.bfloat16 and len(factors) > 2
    K = k
    starts = [sum(factors[:f]) for f in range(len(factors))]
    cols = torch.zeros(len(factors), N, K, dtype=torch.int64, device=dev)
    vals = torch.zeros(len(factors), N, K, dtype=torch.float32, device=dev)
    for f, (start, n) in enumerate(zip(starts, factors, strict=True)):
        rank_factor_kernel[(N, triton.cdiv(n, _BLOCK))](
            values, cols[f], vals[f], values.shape[1], start, n, min(k, n), K, _BLOCK, **LAUNCH
        )
    score, slot = vals[0].clone(), cols[0].clone()
    n = min(k, factors[0])
    for f in range(1, len(factors)):
        m = min(k, factors[f])
        keep = min(k, n * m)
        next_score = torch.zeros(N, K, dtype=torch.float32, device=dev)
        next_slot = torch.zeros(N, K, dtype=torch.int64, device=dev)
        stage_kernel[(N, triton.cdiv(n * m, _BLOCK))](
            score, slot, cols[f], vals[f], next_score, next_slot, n, m, keep, factors[f], K,
            round_partials and f < len(factors) - 1, _BLOCK, **LAUNCH,
        )  # fmt: skip
        score, slot, n = next_score, next_slot, keep
    val_out = torch.empty(N, n, dtype=torch.float32, device=dev)
    idx_out = torch.empty(N, n, dtype=torch.int64, device=dev)
    ascending_kernel[(N, triton.cdiv(n, _BLOCK))](score, slot, val_out, idx_out, n, K, _BLOCK, **LAUNCH)
    return val_out, idx_out


def pk_topk_triton(
    raw: torch.Tensor, factors: Sequence[int], k: int, *, num_slots: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact product-key top-k with SDM 2.0.0's rule, in Triton; bitwise the selection of
    :func:`deltabench.references.sdm.pk_topk` and of :func:`.pk_topk.pk_topk_torch`.

    Args:
        raw: ``[..., sum(factors)]`` float32 or bfloat16 factor scores side by side.
        factors: the widths ``n_0..n_{F-1}`` (their product is the bank's S).
        k: how many slots to select, ``1 <= k <= 16384`` (``min(k, S)`` are returned).
        num_slots: the bank's S, if known: a one-line ValueError unless the widths multiply to it.

    Returns:
        ``(val, idx)``, each ``[..., min(k, S)]``: idx int64 strictly ascending, val the scores in ``raw.dtype``,
        differentiable to ``raw`` with a deterministic backward.

    Examples::

        >>> val, idx = pk_topk_triton(torch.randn(8, 64 + 64, device="cuda"), (64, 64), k=16)
    """
    dims = check_pk_arguments(raw, factors, k, num_slots)
    return PkTopK.apply(raw, dims, int(k), _select_triton)
