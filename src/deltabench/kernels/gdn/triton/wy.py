"""Chunk-local WY/UT stage of chunked Gated DeltaNet, in two Triton launches.

Within a chunk of C = 64 tokens (G = in-chunk cumulative sum of the log-decay g, gamma = exp(G)):

    A = strictly-lower( beta_i * exp(G_i - G_j) * k_i . k_j )        [C, C]
    L = (I + A)^{-1}                                                  (unit lower triangular)
    W = L (beta * gamma * k)                                          [C, K]
    U = L (beta * v)                                                  [C, V]

so that the chunk's new values are ``v_new = U - W S`` for the state ``S`` [K, V] at the chunk's start.
The inverse is computed blockwise: the four 16 x 16 diagonal blocks by forward substitution, the
off-diagonal blocks by ``L_ab = -L_aa sum_c A_ac L_cb``, all in IEEE fp32. ``L`` is stored (fp32, the
backward needs it), with its upper triangle left unwritten: readers mask it.

1. ``wy_inverse_kernel``, one program per (chunk, head): A and L, stored to the L buffer;
2. ``wy_apply_kernel``, one program per (column block, chunk, head): W or U from the stored L.

One program doing both held the four k tiles, the inverse's blocks and the eight scaled-input tiles at once
and spilled at K = V = 128 (255 registers, 776 stack bytes at 2 warps, sm_90a). Split, neither spills there.
The arithmetic is the single kernel's, in the same order: L goes through memory as exact fp32 and each row
block of W, U is still ``sum_b L_ab x_b`` accumulated over b = 0, 1, ... as before.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton.mma import dot_precision, mma, padded
from ...common.triton.trisolve import block_unit_lower_inverse, store_row_blocks

__all__ = ["CHUNK", "LAUNCH", "TUNED_K", "wy_fwd"]

CHUNK = 64
_SUB = 16  # row block of the blockwise inverse
# Fixed (no autotuning). The inverse kernel's: 2 warps was the fastest for the single kernel it came out of
# (0.270 ms at 8x4096x6 on the H200 against 0.380 for 4 and 0.715 for 8: benchmarks/NOTES.md, v2), and
# keeps it at 246 registers without spills; at other head sizes 4 warps, the config gated on the H200.
# v3 (2026-12-03, benchmarks/gpu/gdn_h16.py, wy_fwd whole): 1 warp 0.440 ms at 4x8192x16 against 0.537 for 2
# (0.172 / 0.209 at 8x4096x6); with the off-diagonal merges in tf32 (FLA's precision there; 16-bit inputs only:
# the apply kernel rounds L to bf16, and the backward's fp32 reads of L see tf32's ~5e-4 under bf16's ~4e-3)
# 0.365 / 0.142. The whole op with each checked against
# torch_chunk fp32 at the five train shapes on the H200: errors unchanged (worst 3.3e-3, dk).
LAUNCH = {"warps": 1, "stages": 1, "untuned_warps": 4, "merge_tf32": True}
# The apply kernel's, not yet timed on a GPU: 128-column blocks (W and U of a chunk in two programs, so L is
# read twice) at 4 warps: 96 registers, no spills at K = V = 128 (64-column blocks: 62 registers).
APPLY = {"cols": 128, "warps": 4, "stages": 1}
# The padded head size (K) at which the v2 launch configs of every stage were swept and checked on the H200
# (benchmarks/NOTES.md, v2). At other sizes each stage keeps the config the GPU gate passed before v2: a
# v2 config at K = 64 faulted there (an illegal memory access in the gate's second case, Triton 3.6).
TUNED_K = 128


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
def wy_inverse_kernel(
    k, g, beta, L,
    T,
    H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, C: tl.constexpr, PREC: tl.constexpr,
    MP: tl.constexpr = "ieee",
):  # fmt: skip
    """One program per (chunk, batch*head): writes L = (I + A)^{-1} [C, C] (its lower part). MP: the precision of
    the off-diagonal blocks' products."""
    i_n = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_n * C
    k0, g0, b0, row0, m0 = _load_block(k, g, beta, t0, 0, T, i_b, i_h, H, K, BK, BC)
    k1, g1, b1, row1, m1 = _load_block(k, g, beta, t0, 1, T, i_b, i_h, H, K, BK, BC)
    k2, g2, b2, row2, m2 = _load_block(k, g, beta, t0, 2, T, i_b, i_h, H, K, BK, BC)
    k3, g3, b3, row3, m3 = _load_block(k, g, beta, t0, 3, T, i_b, i_h, H, K, BK, BC)
    G0, G1, G2, G3 = _cum_decay(g0, g1, g2, g3)

    # every block of A first, so that the k tiles are dead before the inverse begins (with the off-diagonal
    # blocks of A after the diagonal inverses, as in the product order below, it spilled 144 bytes at K = 128)
    A00 = _block_a(k0, k0, G0, G0, b0, True, BC, PREC)
    A11 = _block_a(k1, k1, G1, G1, b1, True, BC, PREC)
    A22 = _block_a(k2, k2, G2, G2, b2, True, BC, PREC)
    A33 = _block_a(k3, k3, G3, G3, b3, True, BC, PREC)
    A10 = _block_a(k1, k0, G1, G0, b1, False, BC, PREC)
    A20 = _block_a(k2, k0, G2, G0, b2, False, BC, PREC)
    A21 = _block_a(k2, k1, G2, G1, b2, False, BC, PREC)
    A30 = _block_a(k3, k0, G3, G0, b3, False, BC, PREC)
    A31 = _block_a(k3, k1, G3, G1, b3, False, BC, PREC)
    A32 = _block_a(k3, k2, G3, G2, b3, False, BC, PREC)
    # diagonal inverses, then the off-diagonal blocks: L_ab = -L_aa sum_{c=b}^{a-1} A_ac L_cb
    L00, L10, L11, L20, L21, L22, L30, L31, L32, L33 = block_unit_lower_inverse(
        A00, A11, A22, A33, A10, A20, A21, A30, A31, A32, BC, MP
    )

    store_row_blocks(L, L00, L00, L00, L00, row0, m0, 0, BC, C)
    store_row_blocks(L, L10, L11, L11, L11, row1, m1, 1, BC, C)
    store_row_blocks(L, L20, L21, L22, L22, row2, m2, 2, BC, C)
    store_row_blocks(L, L30, L31, L32, L33, row3, m3, 3, BC, C)


@triton.jit
def _cum_decay(g0, g1, g2, g3):
    """In-chunk cumulative log-decay G of the four row blocks, block by block (the same sums in every kernel)."""
    G0 = tl.cumsum(g0, axis=0)
    G1 = tl.cumsum(g1, axis=0) + tl.sum(g0, axis=0)
    G2 = tl.cumsum(g2, axis=0) + tl.sum(g0, axis=0) + tl.sum(g1, axis=0)
    G3 = tl.cumsum(g3, axis=0) + tl.sum(g0, axis=0) + tl.sum(g1, axis=0) + tl.sum(g2, axis=0)
    return G0, G1, G2, G3


@triton.jit
def _apply_side(
    L, x, out, g, beta, T, i_b, i_h, t0, c0,
    DECAY: tl.constexpr, H: tl.constexpr, N: tl.constexpr, BN: tl.constexpr, C: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Columns [c0, c0 + BN) of L (beta gamma x) (DECAY) or of L (beta x), for one chunk of one head: one
    [C, C] x [C, BN] product of L's lower triangle (rounded to x's dtype, as the products always took it) and the
    scaled inputs."""
    rc = tl.arange(0, C)
    t = t0 + rc
    mt = t < T
    row = (i_b * T + t).to(tl.int64) * H + i_h
    rn = c0 + tl.arange(0, BN)
    mtn = mt[:, None] & (rn[None, :] < N)
    dt = x.dtype.element_ty
    xb = tl.load(x + row[:, None] * N + rn[None, :], mask=mtn, other=0.0)
    bb = tl.load(beta + row, mask=mt, other=0.0).to(tl.float32)
    if DECAY:
        gb = tl.load(g + row, mask=mt, other=0.0).to(tl.float32)
        bb = bb * tl.exp(tl.cumsum(gb, axis=0))
    sx = (xb * bb[:, None]).to(dt)
    # L's upper triangle is never written: masked
    Lm = tl.load(L + row[:, None] * C + rc[None, :], mask=mt[:, None] & (rc[None, :] <= rc[:, None]), other=0.0)
    acc = mma(Lm.to(dt), sx, PREC)
    tl.store(out + row[:, None] * N + rn[None, :], acc.to(out.dtype.element_ty), mask=mtn)


@triton.jit
def wy_apply_kernel(
    k, v, g, beta, L, w, u,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BNK: tl.constexpr, BNV: tl.constexpr, NK: tl.constexpr, BC: tl.constexpr, C: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """One program per (column block, chunk, batch*head): the first NK programs on axis 0 write a BNK-column
    block of W = L (beta gamma k), the others a BNV-column block of U = L (beta v). The column blocks of a
    chunk are on the fastest grid axis so that they run together and its L is read from L2 after the first."""
    i_c = tl.program_id(0)
    i_n = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_n * C
    if i_c < NK:
        _apply_side(L, k, w, g, beta, T, i_b, i_h, t0, i_c * BNK, True, H, K, BNK, C, PREC)
    else:
        _apply_side(L, v, u, g, beta, T, i_b, i_h, t0, (i_c - NK) * BNV, False, H, V, BNV, C, PREC)


def wy_fwd(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    config: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the WY stage (the inverse kernel, then the apply kernel).

    Args:
        k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; g: ``[B, T, H]`` fp32 log-decay; beta: ``[B, T, H]``;
            config: the inverse kernel's ``(warps, stages)`` in place of LAUNCH's (for tuning scripts; None
            in the library).

    Returns:
        ``(L, W, U)``: ``[B, T, H, 64]`` fp32 (row t holds its chunk's row of ``(I + A)^{-1}``; the upper
        triangle is unwritten), ``[B, T, H, K]`` and ``[B, T, H, V]`` in k's / v's dtype.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    L = k.new_empty(B, T, H, CHUNK, dtype=torch.float32)
    w = torch.empty_like(k)
    u = torch.empty_like(v)
    tuned = padded(K) == TUNED_K
    warps, stages = config or (LAUNCH["warps"] if tuned else LAUNCH["untuned_warps"], LAUNCH["stages"])
    prec = dot_precision(k.dtype)
    NT = triton.cdiv(T, CHUNK)
    wy_inverse_kernel[(NT, B * H)](
        k, g, beta, L, T,
        H=H, K=K, BK=padded(K), BC=_SUB, C=CHUNK, PREC=prec,
        MP="tf32" if LAUNCH["merge_tf32"] and prec == "tf32" else "ieee",
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    bnk, bnv = min(APPLY["cols"], padded(K)), min(APPLY["cols"], padded(V))
    nk = triton.cdiv(K, bnk)
    wy_apply_kernel[(nk + triton.cdiv(V, bnv), NT, B * H)](
        k, v, g, beta, L, w, u, T,
        H=H, K=K, V=V, BNK=bnk, BNV=bnv, NK=nk, BC=_SUB, C=CHUNK, PREC=prec,
        num_warps=APPLY["warps"], num_stages=APPLY["stages"],
    )  # fmt: skip
    return L, w, u
