"""The backward of chunked GDN-2 (and KDA) in Triton: four launches from the forward's saved residuals.

Notation as :mod:`.chunk`'s (C = 64, G the in-chunk cumulative per-channel log-decay, ``gamma = exp(G)``, G_C its
last row, ``X = b * gamma * k``, ``kd = exp(G_C - G) * k``). The forward keeps G, L = (I + A)^-1, P, W, the state
S at each chunk's start (h, in the inputs' dtype) and v_new. Per chunk, with dH the gradient w.r.t. the state at
the chunk's end and dS w.r.t. the state at its start:

    dv_new = scale P^T do + kd dH,       dS = Diag(exp G_C) dH + scale (gamma * q)^T do - W^T dv_new

(:func:`state_bwd_kernel`, the chunks in reverse; dH of each chunk and dv_new stored, dS of the first chunk the
initial state's gradient). Then per chunk (:func:`local_bwd_kernel`), the V-long products first:

    dq  = scale gamma * (do S^T) + dq_P,      dG += q * scale gamma * (do S^T),   dP = scale do v_new^T (i >= j)
    dW  = -dv_new S^T,   dX = L^T dW,         dk += b gamma dX,  db += gamma k dX,  dG += X * dX
    dL  = dv_new (w * v)^T + dW X^T,          dA = -L^T dL L^T (strictly lower)
    d(w * v) = L^T dv_new,                    dv = w * d(w * v),  dw = v * d(w * v)
    Y = v_new dH^T (kd's gradient):           dk += exp(G_C - G) * Y,  dG -= kd * Y,
                                              dG_C = sum_i kd * Y + exp(G_C) * sum_v S * dH

and last (:func:`pair_bwd_kernel`) the pairwise scores' terms, A_ij = sum_c (b k)_ic k_jc exp(G_ic - G_jc) and
P_ij = sum_c q_ic k_jc exp(G_ic - G_jc):

    d(bk)_i = sum_j dA_ij exp(G_i - G_j) k_j,   dq_P,i = sum_j dP_ij exp(G_i - G_j) k_j,
    dk_j   += sum_i (dA_ij (bk)_i + dP_ij q_i) exp(G_i - G_j),   dG_i += (bk)_i d(bk)_i + q_i dq_P,i - k_i dk_AP,i

by 16-row blocks as the forward's scores: a pair of blocks (a > c) factors through the last row r of the block
before a, ``exp(G_i - G_r) exp(G_r - G_j)``, each factor <= 1; a diagonal block takes ``exp(G_i - G_j)`` a key
row at a time. No decay is ever factored over a whole chunk (in the strong regime G reaches about -180 within
one). A program a row block and a block of channels (every term is a sum over rows for one channel, so the
channels split with nothing to join); then :func:`dg_kernel`: G is a per-channel cumulative sum of g, so
``dg_t = sum_{i >= t} dG_i + dG_C`` (a reverse cumulative sum over the chunk's rows, per channel).

dA, dP and the fp32 partial sums of dq, dk, db, dG pass from the local kernel to the pair kernel through memory:
the pair kernel reads dA and dP by blocks, which a register tile cannot be sliced into. Products take the inputs'
dtype (v_new, dv_new, h, the state-side operands) with fp32 accumulation; the [C, C] and [C, K] products after the
V loops keep fp32 operands (IEEE for fp32 inputs, tf32 for 16-bit ones). Launch configs are fixed (no autotuning):
:data:`BWD_LAUNCH`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton.mma import dot_precision, mma, mma_acc, padded
from ...common.varlen import ChunkLayout
from .layout import CHUNK, LAUNCH, SUB, grid_place, rows_of, tile_of, walk_place, walk_tables

__all__ = ["BWD_LAUNCH", "chunk_gdn2_bwd"]

# Fixed launch configs: the reverse walk takes the forward walk's V blocks at 8 warps (4 spilled 56 stack bytes); the
# local kernel loops over V in 64-column blocks and over K in 32-column blocks at 4 warps (6.15 against 5.70 ms for
# the whole fwd+bwd at gdn2 8x4096x6 with 8 warps on the H200, 2026-12-05, though 4 warps spill and 8 do not: 248
# registers on sm_90; the whole K in one pass spilled 1472 stack bytes at 8); the pair kernel a program per 16-row
# block; its channels split over programs, 32 a program at 1 warp (pair_block_k, pair_warps): fwd+bwd 4.25 against
# 4.95 ms with the whole head at 2 warps at gdn2 8x4096x6 on an H100 (2026-12-05, the best of 7 splits at gdn2 and
# kda, 8x4096x6 and 4x8192x16; sm_90, Triton 3.6: 32/1 takes 255 registers and 48 stack bytes, 128/2 960). The
# diagonal block's pairs all at once ([16, 16, 8-32] tiles) lost at every split: 5.9-10.5 ms.
BWD_LAUNCH = {
    "state_warps": 8, "local_block_v": 64, "local_block_k": 32, "local_warps": 4, "pair_warps": 1, "pair_block_k": 32,
}  # fmt: skip


@triton.jit
def _gtile(G, grow, rk, K: tl.constexpr):
    """Rows `grow` of the padded G (every row of a chunk exists there: no row mask), columns >= K zero."""
    return tl.load(G + grow[:, None] * K + rk[None, :], mask=(rk < K)[None, :], other=0.0)


@triton.jit
def _grow(G, r, rk, K: tl.constexpr):
    """Row `r` (an index into the padded G's rows) of G, a K-vector."""
    return tl.load(G + r.to(tl.int64) * K + rk, mask=rk < K, other=0.0)


@triton.jit
def state_bwd_kernel(
    qd, kd, Wm, G, Pm, do, dht, dh, dvn, dh0, starts, order,
    scale, T, Tp, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    HAS_DHT: tl.constexpr, PREC: tl.constexpr, PACKED: tl.constexpr = False,
):  # fmt: skip
    """One program per (V block, batch*head), the chunks in reverse, dH [BK, BV] (fp32) in registers: stores dH
    before each chunk's step (the gradient w.r.t. the state at the chunk's end, in the inputs' dtype) and the
    chunk's dv_new; dS_0 (fp32) at the end. P^T, qd^T and W^T are read transposed from memory; qd and kd
    are the forward's ``exp(G) * q`` and ``exp(G_C - G) * k`` (the walks'). PACKED: one program per (V block,
    sequence*head) over its sequence's chunks alone, as the forward walk's (layout.walk_place)."""
    i_v = tl.program_id(0)
    i_b, i_h, n0, n1, state_row = walk_place(starts, order, NT, H, PACKED)
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    rc = tl.arange(0, C)
    mk = rk < K
    mv = rv < V
    mkv = mk[:, None] & mv[None, :]
    dt = qd.dtype.element_ty
    state_off = state_row.to(tl.int64) * K * V + rk[:, None] * V + rv[None, :]
    if HAS_DHT:
        dH = tl.load(dht + state_off, mask=mkv, other=0.0).to(tl.float32)
    else:
        dH = tl.zeros([BK, BV], dtype=tl.float32)
    anticausal = rc[:, None] <= rc[None, :]
    for i in range(n1 - n0):
        n = n1 - 1 - i
        row, _, mt = rows_of(n * C, 0, T, i_b, i_h, H, Tp, C)
        h_off = ((i_b * NT + n).to(tl.int64) * H + i_h) * K * V
        tl.store(dh + h_off + rk[:, None] * V + rv[None, :], dH.to(dt), mask=mkv)
        mtk = mt[:, None] & mk[None, :]
        mtv = mt[:, None] & mv[None, :]
        mkt = mk[:, None] & mt[None, :]
        G_last = _grow(G, (i_b * Tp + n * C + C - 1) * H + i_h, rk, K)
        kdc = tl.load(kd + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
        qdT = tl.load(qd + row[None, :] * K + rk[:, None], mask=mkt, other=0.0)
        wT = tl.load(Wm + row[None, :] * K + rk[:, None], mask=mkt, other=0.0)
        # P^T[a, b] = P[b, a]: row b of P (token b's row of C) read down its column a, a <= b
        PT = tl.load(Pm + row[None, :] * C + rc[:, None], mask=mt[None, :] & anticausal, other=0.0)
        doc = tl.load(do + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
        dvn_c = mma_acc(kdc, dH.to(dt), mma((PT * scale).to(dt), doc, PREC), PREC)
        tl.store(dvn + row[:, None] * V + rv[None, :], dvn_c.to(dt), mask=mtv)
        dH = dH * tl.exp(G_last)[:, None] + mma(qdT, doc, PREC) * scale
        # - W^T dv_new, negated before the rounding (the interpreter cannot negate 16-bit floats)
        dH = mma_acc(wT, (-dvn_c).to(dt), dH, PREC)
    tl.store(dh0 + state_off, dH, mask=mkv)


@triton.jit
def local_bwd_kernel(
    q, k, v, b, w, G, L, h, dh, vn, dvn, do,
    dqp, dkp, dbp, dGp, dGC, dAs, dPs, dv, dw,
    scale, T, Tp, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    SB: tl.constexpr, SBK: tl.constexpr, SW: tl.constexpr, SWV: tl.constexpr, PREC: tl.constexpr,
    BKL: tl.constexpr,
):  # fmt: skip
    """One program per (chunk, batch*head): the chunk's gradients that need no pairwise decay. Stores dA and dP
    ([C, C] rows, zero outside their triangles), the fp32 partial dq, dk, db and dG (the query side, W's and the
    state update's terms), dG_C (a K-vector per chunk), and dv, dw (complete)."""
    i_n = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_n * C
    row, grow, mt = rows_of(t0, 0, T, i_b, i_h, H, Tp, C)
    rc = tl.arange(0, C)
    dt = q.dtype.element_ty
    h_off = ((i_b * NT + i_n).to(tl.int64) * H + i_h) * K * V

    # Two passes, each over V and by BKL-column blocks of K (the [C, K] sums' columns are independent), each
    # ending in its stores: five [C, K] fp32 tiles live at once spilled 1472 bytes at K = V = 128 on sm_90.
    # First: dP = do v_new^T, then the query side's do S^T and kd's v_new dH^T.
    dP = tl.zeros([C, C], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        rv = i_v * BV + tl.arange(0, BV)
        mtv = mt[:, None] & (rv < V)[None, :]
        vnb = tl.load(vn + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
        dob = tl.load(do + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
        dP += mma(dob, tl.trans(vnb), PREC)
    dP = tl.where((rc[:, None] >= rc[None, :]) & mt[None, :], dP * scale, 0.0)
    tl.store(dPs + row[:, None] * C + rc[None, :], dP, mask=mt[:, None])
    for kb in range(0, K, BKL):
        rkb = kb + tl.arange(0, BKL)
        mkb = rkb < K
        dq_acc = tl.zeros([C, BKL], dtype=tl.float32)  # do S^T
        dkd_acc = tl.zeros([C, BKL], dtype=tl.float32)  # v_new dH^T
        gC = tl.zeros([BKL], dtype=tl.float32)  # sum_v S * dH
        for i_v in range(tl.cdiv(V, BV)):
            rv = i_v * BV + tl.arange(0, BV)
            mv = rv < V
            mkv = mkb[:, None] & mv[None, :]
            mtv = mt[:, None] & mv[None, :]
            Sb = tl.load(h + h_off + rkb[:, None] * V + rv[None, :], mask=mkv, other=0.0)
            dHb = tl.load(dh + h_off + rkb[:, None] * V + rv[None, :], mask=mkv, other=0.0)
            vnb = tl.load(vn + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
            dob = tl.load(do + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
            dq_acc += mma(dob, tl.trans(Sb), PREC)
            dkd_acc += mma(vnb, tl.trans(dHb), PREC)
            gC += tl.sum(Sb.to(tl.float32) * dHb.to(tl.float32), axis=1)
        # the state update's kd = exp(G_C - G) * k: its gradient v_new dH^T
        G_last = _grow(G, (i_b * Tp + t0 + C - 1) * H + i_h, rkb, K)
        Gc = _gtile(G, grow, rkb, K)
        ed = tl.exp(tl.minimum(G_last[None, :] - Gc, 0.0))
        kd = tile_of(k, row, mt, rkb, K, K, 1) * ed
        # the output's inter-chunk term scale (gamma * q) S
        dq_p = dq_acc * tl.exp(Gc) * scale
        offs = row[:, None] * K + rkb[None, :]
        mtkb = mt[:, None] & mkb[None, :]
        tl.store(dqp + offs, dq_p, mask=mtkb)
        tl.store(dkp + offs, dkd_acc * ed, mask=mtkb)
        tl.store(dGp + offs, dq_p * tile_of(q, row, mt, rkb, K, K, 1) - dkd_acc * kd, mask=mtkb)
        dGC_c = tl.sum(dkd_acc * kd, axis=0) + tl.exp(G_last) * gC
        tl.store(dGC + ((i_b * NT + i_n).to(tl.int64) * H + i_h) * K + rkb, dGC_c, mask=mkb)

    # Second: U's part of dL, dv_new (w * v)^T, then W's by BKL-column blocks of K (dW = -dv_new S^T, its
    # columns independent): dL -= dW's block times X's, dX's block = -L^T dW's block
    dL = tl.zeros([C, C], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        rv = i_v * BV + tl.arange(0, BV)
        mtv = mt[:, None] & (rv < V)[None, :]
        dvnb = tl.load(dvn + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
        # w * v rounded to the inputs' dtype, as the forward's apply kernel took it
        wv = (tile_of(v, row, mt, rv, V, V, 1) * tile_of(w, row, mt, rv, V, SW, SWV)).to(dt)
        dL += mma(dvnb, tl.trans(wv), PREC)
    Lm = tl.load(L + row[:, None] * C + rc[None, :], mask=mt[:, None] & (rc[None, :] <= rc[:, None]), other=0.0)
    LT = tl.trans(Lm)
    # the first pass's partial dk and dG are read back below: a barrier first (other threads' stores)
    tl.debug_barrier()
    for kb in range(0, K, BKL):
        rkb = kb + tl.arange(0, BKL)
        mkb = rkb < K
        mtkb = mt[:, None] & mkb[None, :]
        dWn = tl.zeros([C, BKL], dtype=tl.float32)  # dv_new S^T (= -dW), columns rkb
        for i_v in range(tl.cdiv(V, BV)):
            rv = i_v * BV + tl.arange(0, BV)
            mv = rv < V
            Sb = tl.load(h + h_off + rkb[:, None] * V + rv[None, :], mask=mkb[:, None] & mv[None, :], other=0.0)
            dvnb = tl.load(dvn + row[:, None] * V + rv[None, :], mask=mt[:, None] & mv[None, :], other=0.0)
            dWn += mma(dvnb, tl.trans(Sb), PREC)
        gam = tl.exp(_gtile(G, grow, rkb, K))
        kc = tile_of(k, row, mt, rkb, K, K, 1)
        bc = tile_of(b, row, mt, rkb, K, SB, SBK)
        X = bc * gam * kc
        # W = L X: dL += dW X^T = -dWn X^T; dX = L^T dW = -L^T dWn
        dL -= mma(dWn, tl.trans(X), PREC)
        dX = -mma(LT, dWn, PREC)
        offs = row[:, None] * K + rkb[None, :]
        tl.store(dkp + offs, tl.load(dkp + offs, mask=mtkb, other=0.0) + bc * gam * dX, mask=mtkb)
        tl.store(dGp + offs, tl.load(dGp + offs, mask=mtkb, other=0.0) + X * dX, mask=mtkb)
        tl.store(dbp + offs, gam * kc * dX, mask=mtkb)
    # L = (I + A)^-1: dA = -L^T dL L^T, strictly lower (A's support)
    dA = -mma(mma(LT, dL, PREC), LT, PREC)
    dA = tl.where((rc[:, None] > rc[None, :]) & mt[None, :], dA, 0.0)
    tl.store(dAs + row[:, None] * C + rc[None, :], dA, mask=mt[:, None])

    # U = L (w * v): d(w * v) = L^T dv_new, by V blocks
    LTd = LT.to(dt)
    for i_v in range(tl.cdiv(V, BV)):
        rv = i_v * BV + tl.arange(0, BV)
        mtv = mt[:, None] & (rv < V)[None, :]
        dvnb = tl.load(dvn + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
        dwv = mma(LTd, dvnb, PREC)
        vb = tile_of(v, row, mt, rv, V, V, 1)
        wb = tile_of(w, row, mt, rv, V, SW, SWV)
        tl.store(dv + row[:, None] * V + rv[None, :], (dwv * wb).to(dv.dtype.element_ty), mask=mtv)
        tl.store(dw + row[:, None] * V + rv[None, :], dwv * vb, mask=mtv)


@triton.jit
def pair_bwd_kernel(
    q, k, b, G, dAs, dPs, dqp, dkp, dbp, dGp, dq, dk, db, dg,
    T, Tp,
    H: tl.constexpr, K: tl.constexpr, BKP: tl.constexpr, NKB: tl.constexpr, BC: tl.constexpr, C: tl.constexpr,
    SB: tl.constexpr, SBK: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """One program per (16-row block and BKP-channel block, chunk, batch*head), axis 0 the row block times NKB
    plus the channel block: the pairwise scores' terms of the block's dq, dk, db and dG, added to the local
    kernel's partials; dq, dk, db stored, and dG (fp32) into `dg`, which :func:`dg_kernel` turns into dg. Every
    term is a sum over rows, channel by channel, so the channels split across programs with nothing to join (each
    channel block re-reads the row block's dA and dP)."""
    blk, t0, i_b, i_h = grid_place(H, C)
    a = blk // NKB
    rk = (blk % NKB) * BKP + tl.arange(0, BKP)
    rc = tl.arange(0, BC)
    mk = rk < K
    NB: tl.constexpr = C // BC
    row_a, grow_a, m_a = rows_of(t0, a, T, i_b, i_h, H, Tp, BC)
    mak = m_a[:, None] & mk[None, :]
    Ga = _gtile(G, grow_a, rk, K)
    ka = tile_of(k, row_a, m_a, rk, K, K, 1)
    qa = tile_of(q, row_a, m_a, rk, K, K, 1)
    ba = tile_of(b, row_a, m_a, rk, K, SB, SBK)
    bka = ba * ka
    dQ = tl.zeros([BC, BKP], dtype=tl.float32)  # sum_j dP_ij exp(G_i - G_j) k_j
    dBK = tl.zeros([BC, BKP], dtype=tl.float32)  # sum_j dA_ij exp(G_i - G_j) k_j
    dK = tl.zeros([BC, BKP], dtype=tl.float32)  # sum_i (dA_ij (bk)_i + dP_ij q_i) exp(G_i - G_j)
    # block a as the query side of blocks c < a, through r = the last row of block a - 1 (no c when a = 0:
    # r is then clamped into the chunk and unused)
    G_r = _grow(G, (i_b * Tp + t0 + tl.maximum(a * BC - 1, 0)) * H + i_h, rk, K)
    accQ = tl.zeros([BC, BKP], dtype=tl.float32)
    accB = tl.zeros([BC, BKP], dtype=tl.float32)
    for c in range(a):
        row_c, grow_c, m_c = rows_of(t0, c, T, i_b, i_h, H, Tp, BC)
        kr = tile_of(k, row_c, m_c, rk, K, K, 1) * tl.exp(tl.minimum(G_r[None, :] - _gtile(G, grow_c, rk, K), 0.0))
        dPb = tl.load(dPs + row_a[:, None] * C + c * BC + rc[None, :], mask=m_a[:, None], other=0.0)
        dAb = tl.load(dAs + row_a[:, None] * C + c * BC + rc[None, :], mask=m_a[:, None], other=0.0)
        accQ = mma_acc(dPb, kr, accQ, PREC)
        accB = mma_acc(dAb, kr, accB, PREC)
    left = tl.exp(tl.minimum(Ga - G_r[None, :], 0.0))
    dQ += left * accQ
    dBK += left * accB
    # block a as the key side of blocks p > a, through the last row of block p - 1
    for p in range(a + 1, NB):
        row_p, grow_p, m_p = rows_of(t0, p, T, i_b, i_h, H, Tp, BC)
        G_s = _grow(G, (i_b * Tp + t0 + p * BC - 1) * H + i_h, rk, K)
        left_p = tl.exp(tl.minimum(_gtile(G, grow_p, rk, K) - G_s[None, :], 0.0))
        qp = tile_of(q, row_p, m_p, rk, K, K, 1) * left_p
        bkp = tile_of(b, row_p, m_p, rk, K, SB, SBK) * tile_of(k, row_p, m_p, rk, K, K, 1) * left_p
        # block (p, a) read transposed: [j in a, i in p]
        dPT = tl.load(dPs + row_p[None, :] * C + a * BC + rc[:, None], mask=m_p[None, :], other=0.0)
        dAT = tl.load(dAs + row_p[None, :] * C + a * BC + rc[:, None], mask=m_p[None, :], other=0.0)
        dK += tl.exp(tl.minimum(G_s[None, :] - Ga, 0.0)) * mma_acc(dAT, bkp, mma(dPT, qp, PREC), PREC)
    # the diagonal block, a key row j at a time: exp(G_i - G_j) directly (pairs i < j meet dA = dP = 0; their
    # differences clamped to 0, so that nothing overflows)
    for j in range(BC):
        t_j = t0 + a * BC + j + 0 * rk
        k_j = tl.load(k + ((i_b * T + t_j).to(tl.int64) * H + i_h) * K + rk, mask=mk & (t_j < T), other=0.0)
        G_j = tl.load(G + ((i_b * Tp + t_j).to(tl.int64) * H + i_h) * K + rk, mask=mk, other=0.0)
        e = tl.exp(tl.minimum(Ga - G_j[None, :], 0.0))
        dPcol = tl.load(dPs + row_a * C + a * BC + j, mask=m_a, other=0.0)
        dAcol = tl.load(dAs + row_a * C + a * BC + j, mask=m_a, other=0.0)
        ek = e * k_j.to(tl.float32)[None, :]
        dQ += dPcol[:, None] * ek
        dBK += dAcol[:, None] * ek
        dK_j = tl.sum((dPcol[:, None] * qa + dAcol[:, None] * bka) * e, axis=0)
        dK = tl.where(rc[:, None] == j, dK + dK_j[None, :], dK)
    off = row_a[:, None] * K + rk[None, :]
    dq_a = tl.load(dqp + off, mask=mak, other=0.0) + dQ
    dk_a = tl.load(dkp + off, mask=mak, other=0.0) + ba * dBK + dK
    db_a = tl.load(dbp + off, mask=mak, other=0.0) + ka * dBK
    dG_a = tl.load(dGp + off, mask=mak, other=0.0) + bka * dBK + qa * dQ - ka * dK
    tl.store(dq + off, dq_a.to(dq.dtype.element_ty), mask=mak)
    tl.store(dk + off, dk_a.to(dk.dtype.element_ty), mask=mak)
    tl.store(db + off, db_a, mask=mak)
    tl.store(dg + off, dG_a, mask=mak)


@triton.jit
def dg_kernel(
    dg, dGC, T, NT,
    H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, C: tl.constexpr,
):  # fmt: skip
    """One program per (K block, chunk, batch*head): dg from dG in place. G is a per-channel cumulative sum of g
    within the chunk, so ``dg_t = sum_{i >= t} dG_i + dG_C``: a reverse cumulative sum over the chunk's rows (rows
    past T zero)."""
    i_k = tl.program_id(0)
    i_n = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    t = i_n * C + tl.arange(0, C)
    mt = t < T
    row = (i_b * T + t).to(tl.int64) * H + i_h
    rk = i_k * BK + tl.arange(0, BK)
    mk = rk < K
    mtk = mt[:, None] & mk[None, :]
    dG = tl.load(dg + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
    dG_C = tl.load(dGC + ((i_b * NT + i_n).to(tl.int64) * H + i_h) * K + rk, mask=mk, other=0.0)
    total = tl.sum(dG, axis=0)
    tl.store(dg + row[:, None] * K + rk[None, :], dG_C[None, :] + total[None, :] - tl.cumsum(dG, axis=0) + dG, mask=mtk)


def chunk_gdn2_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    scale: float,
    saved: tuple[torch.Tensor, ...],
    do: torch.Tensor,
    dht: torch.Tensor | None,
    packed: ChunkLayout | None = None,
) -> tuple[torch.Tensor, ...]:
    """The three backward launches: ``(dq, dk, dv, dg, db, dw, dh0)``; dq, dk, dv in the inputs' dtype, the others
    fp32 (db ``[B, T, H, K]``, dw ``[B, T, H, V]``: the callers reduce them to a strided b's or w's shape).

    Args:
        q, k, v, b, w, scale: the forward's (b and w with its strides: contiguous, or stride-0 views).
        saved: the forward's ``(G, L, P, W, h, v_new, Qd, Kd)`` (:func:`.chunk.chunk_gdn2_fwd` with ``keep=True``).
        do: the output's gradient, contiguous ``[B, T, H, V]`` in v's dtype.
        dht: the final state's gradient, ``[B, H, K, V]`` fp32 contiguous, or None.
        packed: packed sequences on a chunk-aligned row, the forward's layout (:func:`.chunk.chunk_gdn2_fwd`); dht
            and dh0 then ``[N, H, K, V]``.
    """
    G, L, Pm, Wm, h, vn, Qd, Kd = saved
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    Tp = NT * CHUNK
    prec = dot_precision(q.dtype)
    BK = padded(K)
    sb, sw = (b.stride(2), b.stride(3)), (w.stride(2), w.stride(3))
    dh = torch.empty_like(h)
    dvn = torch.empty_like(v)
    rows = B if packed is None else len(packed.counts)
    dh0 = q.new_empty(rows, H, K, V, dtype=torch.float32)
    BV = LAUNCH["walk_block_v"] if padded(V) >= 64 else 16
    state_bwd_kernel[(triton.cdiv(V, BV), rows * H)](
        Qd, Kd, Wm, G, Pm, do, dht, dh, dvn, dh0, *walk_tables(packed), scale, T, Tp, NT,
        H=H, K=K, V=V, BK=BK, BV=BV, C=CHUNK, HAS_DHT=dht is not None, PREC=prec, PACKED=packed is not None,
        num_warps=BWD_LAUNCH["state_warps"] if BV >= 64 else 4, num_stages=1,
    )  # fmt: skip
    f32 = {"dtype": torch.float32, "device": q.device}
    dqp, dkp, dbp, dGp = (torch.empty(B, T, H, K, **f32) for _ in range(4))
    dGC = torch.empty(B, NT, H, K, **f32)
    dAs, dPs = torch.empty(B, T, H, CHUNK, **f32), torch.empty(B, T, H, CHUNK, **f32)
    dv = torch.empty_like(v)
    dw = torch.empty(B, T, H, V, **f32)
    local_bwd_kernel[(NT, B * H)](
        q, k, v, b, w, G, L, h, dh, vn, dvn, do, dqp, dkp, dbp, dGp, dGC, dAs, dPs, dv, dw, scale, T, Tp, NT,
        H=H, K=K, V=V, BK=BK, BV=min(BWD_LAUNCH["local_block_v"], padded(V)), C=CHUNK,
        SB=sb[0], SBK=sb[1], SW=sw[0], SWV=sw[1], PREC=prec, BKL=min(BWD_LAUNCH["local_block_k"], BK),
        num_warps=BWD_LAUNCH["local_warps"], num_stages=1,
    )  # fmt: skip
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    db, dg = torch.empty(B, T, H, K, **f32), torch.empty(B, T, H, K, **f32)
    bkp = min(BWD_LAUNCH["pair_block_k"], BK)
    nkb = triton.cdiv(K, bkp)
    pair_bwd_kernel[(CHUNK // SUB * nkb, NT, B * H)](
        q, k, b, G, dAs, dPs, dqp, dkp, dbp, dGp, dq, dk, db, dg, T, Tp,
        H=H, K=K, BKP=bkp, NKB=nkb, BC=SUB, C=CHUNK, SB=sb[0], SBK=sb[1], PREC=prec,
        num_warps=BWD_LAUNCH["pair_warps"], num_stages=1,
    )  # fmt: skip
    dg_kernel[(triton.cdiv(K, 32), NT, B * H)](dg, dGC, T, NT, H=H, K=K, BK=32, C=CHUNK, num_warps=4)
    return dq, dk, dv, dg, db, dw, dh0
