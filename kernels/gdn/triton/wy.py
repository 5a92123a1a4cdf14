"""Chunk-local WY/UT stage of chunked Gated DeltaNet: one Triton program per (chunk, head).

Within a chunk of C = 64 tokens (G = in-chunk cumulative sum of the log-decay g, gamma = exp(G)):

    A = strictly-lower( beta_i * exp(G_i - G_j) * k_i . k_j )        [C, C]
    L = (I + A)^{-1}                                                  (unit lower triangular)
    W = L (beta * gamma * k)                                          [C, K]
    U = L (beta * v)                                                  [C, V]

so that the chunk's new values are ``v_new = U - W S`` for the state ``S`` [K, V] at the chunk's start.
The inverse is computed blockwise: the four 16 x 16 diagonal blocks by forward substitution, the
off-diagonal blocks by ``L_ab = -L_aa sum_c A_ac L_cb``, all in IEEE fp32. ``L`` is stored (fp32, the
backward needs it), with its upper triangle left unwritten: readers mask it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton.mma import mma

__all__ = ["CHUNK", "LAUNCH", "TUNED_K", "wy_fwd"]

CHUNK = 64
_SUB = 16  # row block of the blockwise inverse
# Fixed (no autotuning). 2 warps: 0.270 ms at 8x4096x6 on the H200 against 0.380 for 4 and 0.715 for 8
# (benchmarks/NOTES.md, v2; L, W, U equal to 4 warps' within 8e-9); a second stage changed nothing.
# Only at the head size it was measured at (TUNED_K); elsewhere 4 warps, the config gated on the H200.
LAUNCH = {"warps": 2, "stages": 1, "untuned_warps": 4}
# The padded head size (K) at which the v2 launch configs of every stage were swept and checked on the H200
# (benchmarks/NOTES.md, v2). At other sizes each stage keeps the config the GPU gate passed before v2: a
# v2 config at K = 64 faulted there (an illegal memory access in the gate's second case, Triton 3.6).
TUNED_K = 128


@triton.jit
def _unit_lower_inverse(A, BC: tl.constexpr):
    """(I + A)^{-1} for a strictly lower-triangular fp32 block A [BC, BC], by forward substitution."""
    r = tl.arange(0, BC)
    inv = (r[:, None] == r[None, :]).to(tl.float32)
    for i in tl.static_range(1, BC):
        a_i = tl.sum(tl.where(r[:, None] == i, A, 0.0), axis=0)  # row i of A, indexed by column
        s = tl.sum(a_i[:, None] * inv, axis=0)  # sum_j a_ij inv_j (rows j >= i of inv meet a_ij = 0)
        inv = tl.where(r[:, None] == i, inv - s[None, :], inv)
    return inv


@triton.jit
def _load_block(
    k, g, beta, row0, sub, T, i_b, i_h, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr
):
    """Rows [row0 + sub*BC, +BC) of one head: k [BC, BK], g [BC] (0 past T), beta [BC] (0 past T)."""
    t = row0 + sub * BC + tl.arange(0, BC)
    mt = t < T
    row = (i_b * T + t).to(tl.int64) * H + i_h
    rk = tl.arange(0, BK)
    kb = tl.load(k + row[:, None] * K + rk[None, :], mask=mt[:, None] & (rk[None, :] < K), other=0.0)
    gb = tl.load(g + row, mask=mt, other=0.0).to(tl.float32)
    bb = tl.load(beta + row, mask=mt, other=0.0).to(tl.float32)
    return kb, gb, bb, row, mt


@triton.jit
def _block_a(ka, kb, Ga, Gb, ba, diag: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """Block (a, b) of A: beta_a * exp(G_a - G_b) * k_a k_b^T, strictly lower when on the diagonal."""
    kk = mma(ka, tl.trans(kb), PREC)
    d = Ga[:, None] - Gb[None, :]
    if diag:
        r = tl.arange(0, BC)
        low = r[:, None] > r[None, :]
        return tl.where(low, tl.exp(tl.where(low, d, 0.0)) * kk * ba[:, None], 0.0)
    return tl.exp(d) * kk * ba[:, None]


@triton.jit
def _mm(a, b):
    """IEEE fp32 product of two small fp32 blocks."""
    return mma(a, b, "ieee")


@triton.jit
def _store_out(
    w,
    u,
    L,
    x0,
    x1,
    x2,
    x3,
    y0,
    y1,
    y2,
    y3,
    l0,
    l1,
    l2,
    l3,
    row,
    mt,
    sub: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    C: tl.constexpr,
    PREC: tl.constexpr,
):
    """W and U rows of block `sub` (sum over blocks b <= sub of L_sub,b times the scaled inputs) and its L row."""
    dt = x0.dtype
    wa = mma(l0.to(dt), x0, PREC)
    ua = mma(l0.to(dt), y0, PREC)
    if sub >= 1:
        wa += mma(l1.to(dt), x1, PREC)
        ua += mma(l1.to(dt), y1, PREC)
    if sub >= 2:
        wa += mma(l2.to(dt), x2, PREC)
        ua += mma(l2.to(dt), y2, PREC)
    if sub >= 3:
        wa += mma(l3.to(dt), x3, PREC)
        ua += mma(l3.to(dt), y3, PREC)
    rk = tl.arange(0, BK)
    rv = tl.arange(0, BV)
    rc = tl.arange(0, BC)
    tl.store(w + row[:, None] * K + rk[None, :], wa.to(w.dtype.element_ty), mask=mt[:, None] & (rk[None, :] < K))
    tl.store(u + row[:, None] * V + rv[None, :], ua.to(u.dtype.element_ty), mask=mt[:, None] & (rv[None, :] < V))
    tl.store(L + row[:, None] * C + rc[None, :], l0, mask=mt[:, None])
    if sub >= 1:
        tl.store(L + row[:, None] * C + BC + rc[None, :], l1, mask=mt[:, None])
    if sub >= 2:
        tl.store(L + row[:, None] * C + 2 * BC + rc[None, :], l2, mask=mt[:, None])
    if sub >= 3:
        tl.store(L + row[:, None] * C + 3 * BC + rc[None, :], l3, mask=mt[:, None])


@triton.jit
def wy_fwd_kernel(
    k, v, g, beta, L, w, u,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, C: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """One program per (chunk, batch*head): writes L [C, C] (lower part), W [C, K] and U [C, V]."""
    i_n = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_n * C
    k0, g0, b0, row0, m0 = _load_block(k, g, beta, t0, 0, T, i_b, i_h, H, K, BK, BC)
    k1, g1, b1, row1, m1 = _load_block(k, g, beta, t0, 1, T, i_b, i_h, H, K, BK, BC)
    k2, g2, b2, row2, m2 = _load_block(k, g, beta, t0, 2, T, i_b, i_h, H, K, BK, BC)
    k3, g3, b3, row3, m3 = _load_block(k, g, beta, t0, 3, T, i_b, i_h, H, K, BK, BC)
    # in-chunk cumulative log-decay, block by block
    G0 = tl.cumsum(g0, axis=0)
    G1 = tl.cumsum(g1, axis=0) + tl.sum(g0, axis=0)
    G2 = tl.cumsum(g2, axis=0) + tl.sum(g0, axis=0) + tl.sum(g1, axis=0)
    G3 = tl.cumsum(g3, axis=0) + tl.sum(g0, axis=0) + tl.sum(g1, axis=0) + tl.sum(g2, axis=0)

    # diagonal inverses
    L00 = _unit_lower_inverse(_block_a(k0, k0, G0, G0, b0, True, BC, PREC), BC)
    L11 = _unit_lower_inverse(_block_a(k1, k1, G1, G1, b1, True, BC, PREC), BC)
    L22 = _unit_lower_inverse(_block_a(k2, k2, G2, G2, b2, True, BC, PREC), BC)
    L33 = _unit_lower_inverse(_block_a(k3, k3, G3, G3, b3, True, BC, PREC), BC)
    # off-diagonal blocks: L_ab = -L_aa sum_{c=b}^{a-1} A_ac L_cb
    A10 = _block_a(k1, k0, G1, G0, b1, False, BC, PREC)
    A20 = _block_a(k2, k0, G2, G0, b2, False, BC, PREC)
    A21 = _block_a(k2, k1, G2, G1, b2, False, BC, PREC)
    A30 = _block_a(k3, k0, G3, G0, b3, False, BC, PREC)
    A31 = _block_a(k3, k1, G3, G1, b3, False, BC, PREC)
    A32 = _block_a(k3, k2, G3, G2, b3, False, BC, PREC)
    L10 = -_mm(L11, _mm(A10, L00))
    L21 = -_mm(L22, _mm(A21, L11))
    L20 = -_mm(L22, _mm(A20, L00) + _mm(A21, L10))
    L32 = -_mm(L33, _mm(A32, L22))
    L31 = -_mm(L33, _mm(A31, L11) + _mm(A32, L21))
    L30 = -_mm(L33, _mm(A30, L00) + _mm(A31, L10) + _mm(A32, L20))

    # scaled inputs: x_b = beta gamma k, y_b = beta v
    dt = k.dtype.element_ty
    x0 = (k0 * (b0 * tl.exp(G0))[:, None]).to(dt)
    x1 = (k1 * (b1 * tl.exp(G1))[:, None]).to(dt)
    x2 = (k2 * (b2 * tl.exp(G2))[:, None]).to(dt)
    x3 = (k3 * (b3 * tl.exp(G3))[:, None]).to(dt)
    rv = tl.arange(0, BV)
    mv = rv[None, :] < V
    y0 = (tl.load(v + row0[:, None] * V + rv[None, :], mask=m0[:, None] & mv, other=0.0) * b0[:, None]).to(dt)
    y1 = (tl.load(v + row1[:, None] * V + rv[None, :], mask=m1[:, None] & mv, other=0.0) * b1[:, None]).to(dt)
    y2 = (tl.load(v + row2[:, None] * V + rv[None, :], mask=m2[:, None] & mv, other=0.0) * b2[:, None]).to(dt)
    y3 = (tl.load(v + row3[:, None] * V + rv[None, :], mask=m3[:, None] & mv, other=0.0) * b3[:, None]).to(dt)

    _store_out(w, u, L, x0, x1, x2, x3, y0, y1, y2, y3, L00, L00, L00, L00, row0, m0, 0, K, V, BK, BV, BC, C, PREC)
    _store_out(w, u, L, x0, x1, x2, x3, y0, y1, y2, y3, L10, L11, L11, L11, row1, m1, 1, K, V, BK, BV, BC, C, PREC)
    _store_out(w, u, L, x0, x1, x2, x3, y0, y1, y2, y3, L20, L21, L22, L22, row2, m2, 2, K, V, BK, BV, BC, C, PREC)
    _store_out(w, u, L, x0, x1, x2, x3, y0, y1, y2, y3, L30, L31, L32, L33, row3, m3, 3, K, V, BK, BV, BC, C, PREC)


def dot_precision(dtype: torch.dtype) -> str:
    """IEEE products for fp32 inputs (no silent tf32); tf32 for the fp32 operands of a 16-bit run."""
    return "ieee" if dtype == torch.float32 else "tf32"


def padded(n: int) -> int:
    """Tile width for a head dimension: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(n))


def wy_fwd(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    config: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the WY stage.

    Args:
        k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; g: ``[B, T, H]`` fp32 log-decay; beta: ``[B, T, H]``;
            config: ``(warps, stages)`` in place of LAUNCH's (for tuning scripts; None in the library).

    Returns:
        ``(L, W, U)``: ``[B, T, H, 64]`` fp32 (row t holds its chunk's row of ``(I + A)^{-1}``; the upper
        triangle is unwritten), ``[B, T, H, K]`` and ``[B, T, H, V]`` in k's / v's dtype.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    L = k.new_empty(B, T, H, CHUNK, dtype=torch.float32)
    w = torch.empty_like(k)
    u = torch.empty_like(v)
    grid = (triton.cdiv(T, CHUNK), B * H)
    tuned = padded(K) == TUNED_K
    warps, stages = config or (LAUNCH["warps"] if tuned else LAUNCH["untuned_warps"], LAUNCH["stages"])
    wy_fwd_kernel[grid](
        k, v, g, beta, L, w, u, T,
        H=H, K=K, V=V, BK=padded(K), BV=padded(V), BC=_SUB, C=CHUNK, PREC=dot_precision(k.dtype),
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return L, w, u
