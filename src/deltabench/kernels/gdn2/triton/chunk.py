"""Chunked Gated DeltaNet-2 (and KDA, b = w = beta) in Triton: the forward, chunk C = 64, and the autograd entry
whose backward is :mod:`.chunk_bwd`.

Layout: q, k, g, b ``[B, T, H, K]``; v, w ``[B, T, H, V]``; state ``[B, H, K, V]`` fp32; g a per-channel
log-decay (<= 0). Per token: ``S <- Diag(exp g) S; r = S^T (b * k); S <- S + k (w * v - r)^T; o = S^T (scale q)``.
The chunk algebra is :mod:`deltabench.kernels.common.per_channel_chunk`'s: with ``G`` the in-chunk cumulative
log-decay (a K-vector a token),

    A_ij = sum_c b_ic k_ic k_jc exp(G_ic - G_jc)  (i > j),   P_ij = sum_c q_ic k_jc exp(G_ic - G_jc)  (i >= j)
    L = (I + A)^-1,   W = L (b * exp(G) * k),   U = L (w * v)
    v_new = U - W S,   o = scale ((exp(G) * q) S + P v_new),   S <- Diag(exp G_C) S + (exp(G_C - G) * k)^T v_new

Four launches: (1) :func:`scores_kernel`, a program per (16-row block, chunk, batch*head): the block's rows of A
and P, stored; (2) :func:`inverse_kernel`, a program per (chunk, batch*head): L = (I + A)^-1 over A in place
(kernels/common/triton/trisolve.py); (3) :func:`apply_kernel`, a program per (column block, chunk, batch*head): W or
U from the stored L; (4) :func:`walk_kernel`, a program per (V block, batch*head), the chunks in order with the
state in registers: v_new, the output and the next state.

Per-channel decays inside products are bounded ratios, never ``exp(G_i) * exp(-G_j)`` over a whole chunk (in the
strong-decay regime G reaches about -180 within a chunk, and exp(180) overflows fp32): a pair of rows in different
16-row blocks factors through the last row r of the block before row i's, ``exp(G_i - G_r) * exp(G_r - G_j)``,
both factors <= 1; a pair inside one block takes ``exp(G_i - G_j)`` directly, a key row at a time. G is made
once per chunk by torch (a cumulative sum over T padded to whole chunks, the padded rows' g zero, so that G stays
non-increasing there too) and read by every kernel.

Products take the inputs' dtype with fp32 accumulation, as GDN's kernels (kernels/gdn/triton/): the scores and the
inverse in fp32 (IEEE for fp32 inputs, tf32 for 16-bit ones), W and U stored in the inputs' dtype. No autotuning:
every launch config is fixed.

Backward: when a gradient is wanted the entries run through :class:`ChunkGDN2Function`, whose forward also stores
the state at each chunk's start and v_new (the walk's STORE_STATES) and keeps G, L, P, W and the decayed q and
k; its backward is :mod:`.chunk_bwd`'s four launches (a reverse state walk, two per-chunk gradient kernels, then
dg's sums), all Triton, with the same bounded decay ratios. Without a gradient nothing is stored.

Packed sequences (``cu_seqlens``) run on one chunk-aligned row (kernels/common/varlen.chunk_layout: each sequence
on chunks of its own, its last chunk zero-padded): the per-chunk kernels as they are, the two walks (forward and
reverse) a program per (V block, sequence, head) over that sequence's chunks alone (layout.walk_place), from and to
its row of the states.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.checks import check_op_inputs, default_scale
from ...common.triton.mma import dot_precision, mma, mma_acc, padded
from ...common.triton.trisolve import block_unit_lower_inverse, store_row_blocks
from ...common.varlen import ChunkLayout, run_chunk_aligned, state_to_check
from .chunk_bwd import chunk_gdn2_bwd
from .layout import CHUNK, LAUNCH, SUB, grid_place, rows_of, tile_of, walk_place, walk_tables

__all__ = ["CHUNK", "LAUNCH", "chunk_gdn2_fwd", "gdn2_triton_chunk", "kda_triton_chunk"]


@triton.jit
def _far_block(
    q, k, b, G, Pm, t0, a, c, T, Tp, i_b, i_h,
    H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, C: tl.constexpr, SB: tl.constexpr, SBK: tl.constexpr,
    PREC: tl.constexpr, BKF: tl.constexpr,
):  # fmt: skip
    """Block (a, c) of A, returned, and of P, stored (a > c): every pair factored through the last row
    r = t0 + a*BC - 1 of the block before a, ``exp(G_i - G_r) exp(G_r - G_j)``, each factor <= 1 (G does not
    increase along the chunk). BKF channels a step (the [BC, K] tiles of a whole head spilled at K = 128)."""
    row_a, grow_a, m_a = rows_of(t0, a, T, i_b, i_h, H, Tp, BC)
    row_c, grow_c, m_c = rows_of(t0, c, T, i_b, i_h, H, Tp, BC)
    r_ref = (i_b * Tp + t0 + a * BC - 1).to(tl.int64) * H + i_h
    A = tl.zeros([BC, BC], dtype=tl.float32)
    P = tl.zeros([BC, BC], dtype=tl.float32)
    for c0 in range(0, K, BKF):
        rk = c0 + tl.arange(0, BKF)
        G_ref = tl.load(G + r_ref * K + rk, mask=rk < K, other=0.0)
        left = tl.exp(tl.minimum(tile_of(G, grow_a, m_a, rk, K, K, 1) - G_ref[None, :], 0.0))
        right = tl.exp(tl.minimum(G_ref[None, :] - tile_of(G, grow_c, m_c, rk, K, K, 1), 0.0))
        krT = tl.trans(tile_of(k, row_c, m_c, rk, K, K, 1) * right)
        bk = tile_of(b, row_a, m_a, rk, K, SB, SBK) * tile_of(k, row_a, m_a, rk, K, K, 1)
        P = mma_acc(tile_of(q, row_a, m_a, rk, K, K, 1) * left, krT, P, PREC)
        A = mma_acc(bk * left, krT, A, PREC)
    _store_block(Pm, P, row_a, m_a, c, BC, C)
    return A


@triton.jit
def _near_block(
    q, k, b, G, Am, Pm, t0, a, T, Tp, i_b, i_h,
    H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, C: tl.constexpr, SB: tl.constexpr,
    SBK: tl.constexpr,
):  # fmt: skip
    """Diagonal block (a, a) of A (strictly lower) and of P (lower, diagonal included), stored a column at a time:
    ``exp(G_i - G_j)`` taken directly, one key row j a step, the pairs above the diagonal zero (their differences
    clamped to 0 before exp, so that nothing overflows). Each column goes straight to memory: merged into a
    register block instead, every step paid a layout conversion."""
    rk = tl.arange(0, BK)
    rc = tl.arange(0, BC)
    row_a, grow_a, m_a = rows_of(t0, a, T, i_b, i_h, H, Tp, BC)
    Ga = tile_of(G, grow_a, m_a, rk, K, K, 1)
    ka = tile_of(k, row_a, m_a, rk, K, K, 1)
    bk = tile_of(b, row_a, m_a, rk, K, SB, SBK) * ka
    qa = tile_of(q, row_a, m_a, rk, K, K, 1)
    for j in range(BC):
        t_j = t0 + a * BC + j + 0 * rk  # the key row's token, broadcast over the channels
        mj = (rk < K) & (t_j < T)
        k_j = tl.load(k + ((i_b * T + t_j).to(tl.int64) * H + i_h) * K + rk, mask=mj, other=0.0).to(tl.float32)
        G_j = tl.load(G + ((i_b * Tp + t_j).to(tl.int64) * H + i_h) * K + rk, mask=rk < K, other=0.0)
        decayed = tl.exp(tl.minimum(Ga - G_j[None, :], 0.0)) * k_j[None, :]
        col = row_a * C + a * BC + j
        tl.store(Am + col, tl.where(rc > j, tl.sum(bk * decayed, axis=1), 0.0), mask=m_a)
        tl.store(Pm + col, tl.where(rc >= j, tl.sum(qa * decayed, axis=1), 0.0), mask=m_a)


@triton.jit
def _store_block(Pm, P, row, mt, c, BC: tl.constexpr, C: tl.constexpr):
    """Block column `c` of the rows `row` of a chunk's [C, C] matrix (one row of C a token)."""
    rc = tl.arange(0, BC)
    tl.store(Pm + row[:, None] * C + c * BC + rc[None, :], P, mask=mt[:, None])


@triton.jit
def scores_kernel(
    q, k, b, G, Am, Pm,
    T, Tp,
    H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, C: tl.constexpr,
    SB: tl.constexpr, SBK: tl.constexpr, PREC: tl.constexpr, BKF: tl.constexpr,
):  # fmt: skip
    """One program per (row block, chunk, batch*head): the row block's blocks of A (into Am) and of P (into Pm),
    the diagonal one (:func:`_near_block`) and those left of it (:func:`_far_block`); one row of C a token, the
    blocks above the diagonal unwritten."""
    i_a, t0, i_b, i_h = grid_place(H, C)
    row_a, _, m_a = rows_of(t0, i_a, T, i_b, i_h, H, Tp, BC)
    _near_block(q, k, b, G, Am, Pm, t0, i_a, T, Tp, i_b, i_h, H, K, BK, BC, C, SB, SBK)
    for c in range(0, i_a):
        A = _far_block(q, k, b, G, Pm, t0, i_a, c, T, Tp, i_b, i_h, H, K, BC, C, SB, SBK, PREC, BKF)
        _store_block(Am, A, row_a, m_a, c, BC, C)


@triton.jit
def _load_block(Am, row, mt, c: tl.constexpr, BC: tl.constexpr, C: tl.constexpr):
    """Block column `c` of the rows `row` of a chunk's [C, C] fp32 matrix (rows past T zero)."""
    rc = tl.arange(0, BC)
    return tl.load(Am + row[:, None] * C + c * BC + rc[None, :], mask=mt[:, None], other=0.0)


@triton.jit
def inverse_kernel(
    L, T, Tp,
    H: tl.constexpr, BC: tl.constexpr, C: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """One program per (chunk, batch*head): L = (I + A)^-1 from the ten lower blocks of A that
    :func:`scores_kernel` left in `L`, written over them (every block is read before any is written)."""
    i_n = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_n * C
    row0, _, m0 = rows_of(t0, 0, T, i_b, i_h, H, Tp, BC)
    row1, _, m1 = rows_of(t0, 1, T, i_b, i_h, H, Tp, BC)
    row2, _, m2 = rows_of(t0, 2, T, i_b, i_h, H, Tp, BC)
    row3, _, m3 = rows_of(t0, 3, T, i_b, i_h, H, Tp, BC)
    L00, L10, L11, L20, L21, L22, L30, L31, L32, L33 = block_unit_lower_inverse(
        _load_block(L, row0, m0, 0, BC, C),
        _load_block(L, row1, m1, 1, BC, C),
        _load_block(L, row2, m2, 2, BC, C),
        _load_block(L, row3, m3, 3, BC, C),
        _load_block(L, row1, m1, 0, BC, C),
        _load_block(L, row2, m2, 0, BC, C),
        _load_block(L, row2, m2, 1, BC, C),
        _load_block(L, row3, m3, 0, BC, C),
        _load_block(L, row3, m3, 1, BC, C),
        _load_block(L, row3, m3, 2, BC, C),
        BC,
        PREC,
    )
    store_row_blocks(L, L00, L00, L00, L00, row0, m0, 0, BC, C)
    store_row_blocks(L, L10, L11, L11, L11, row1, m1, 1, BC, C)
    store_row_blocks(L, L20, L21, L22, L22, row2, m2, 2, BC, C)
    store_row_blocks(L, L30, L31, L32, L33, row3, m3, 3, BC, C)


@triton.jit
def _apply_side(
    L, x, s, G, out, T, Tp, i_b, i_h, t0, c0,
    DECAY: tl.constexpr, H: tl.constexpr, N: tl.constexpr, BN: tl.constexpr, C: tl.constexpr,
    SS: tl.constexpr, SSC: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Columns [c0, c0 + BN) of ``L (s * exp(G) * x)`` (DECAY) or ``L (s * x)``, for one chunk of one head: L's
    lower triangle and the scaled inputs rounded to x's dtype, one [C, C] x [C, BN] product."""
    rc = tl.arange(0, C)
    row, grow, mt = rows_of(t0, 0, T, i_b, i_h, H, Tp, C)
    rn = c0 + tl.arange(0, BN)
    mtn = mt[:, None] & (rn[None, :] < N)
    dt = x.dtype.element_ty
    sx = tile_of(x, row, mt, rn, N, N, 1) * tile_of(s, row, mt, rn, N, SS, SSC)
    if DECAY:
        sx = sx * tl.exp(tile_of(G, grow, mt, rn, N, N, 1))
    Lm = tl.load(L + row[:, None] * C + rc[None, :], mask=mt[:, None] & (rc[None, :] <= rc[:, None]), other=0.0)
    acc = mma(Lm.to(dt), sx.to(dt), PREC)
    tl.store(out + row[:, None] * N + rn[None, :], acc.to(out.dtype.element_ty), mask=mtn)


@triton.jit
def _decayed_side(
    q, k, G, Qd, Kd, T, Tp, i_b, i_h, t0, c0, H: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, C: tl.constexpr
):
    """Columns [c0, c0 + BN) of the walk's decayed operands for one chunk of one head, in q's dtype:
    ``exp(G) * q`` into Qd and ``exp(G_C - G) * k`` into Kd (G_C the chunk's last row of G)."""
    row, grow, mt = rows_of(t0, 0, T, i_b, i_h, H, Tp, C)
    rn = c0 + tl.arange(0, BN)
    mtn = mt[:, None] & (rn[None, :] < K)
    dt = q.dtype.element_ty
    Gt = tile_of(G, grow, mt, rn, K, K, 1)
    G_last = tl.load(G + ((i_b * Tp + t0 + C - 1).to(tl.int64) * H + i_h) * K + rn, mask=rn < K, other=0.0)
    qd = tile_of(q, row, mt, rn, K, K, 1) * tl.exp(Gt)
    kd = tile_of(k, row, mt, rn, K, K, 1) * tl.exp(tl.minimum(G_last[None, :] - Gt, 0.0))
    tl.store(Qd + row[:, None] * K + rn[None, :], qd.to(dt), mask=mtn)
    tl.store(Kd + row[:, None] * K + rn[None, :], kd.to(dt), mask=mtn)


@triton.jit
def apply_kernel(
    q, k, v, b, w, G, L, Wm, Um, Qd, Kd,
    T, Tp,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BNK: tl.constexpr, BNV: tl.constexpr, NK: tl.constexpr,
    C: tl.constexpr, SB: tl.constexpr, SBK: tl.constexpr, SW: tl.constexpr, SWV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """One program per (column block, chunk, batch*head): the first NK programs on axis 0 write a BNK-column block
    of W = L (b * exp(G) * k) and of the walks' decayed q and k (:func:`_decayed_side`), the others a BNV-column
    block of U = L (w * v)."""
    i_c, t0, i_b, i_h = grid_place(H, C)
    if i_c < NK:
        _apply_side(L, k, b, G, Wm, T, Tp, i_b, i_h, t0, i_c * BNK, True, H, K, BNK, C, SB, SBK, PREC)
        _decayed_side(q, k, G, Qd, Kd, T, Tp, i_b, i_h, t0, i_c * BNK, H, K, BNK, C)
    else:
        _apply_side(L, v, w, G, Um, T, Tp, i_b, i_h, t0, (i_c - NK) * BNV, False, H, V, BNV, C, SW, SWV, PREC)


@triton.jit
def walk_kernel(
    qd, kd, Wm, Um, G, Pm, h0, o, ht, h, vn, starts, order,
    scale, T, Tp, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    HAS_H0: tl.constexpr, PREC: tl.constexpr, STORE_STATES: tl.constexpr = False, PACKED: tl.constexpr = False,
):  # fmt: skip
    """One program per (V block, batch*head): the chunks in order, the state [BK, BV] (fp32) in registers; each
    chunk's v_new, output and next state, the final state stored at the end. STORE_STATES (for the backward): the
    state at each chunk's start into h ``[B, NT, H, K, V]`` and v_new into vn ``[B, T, H, V]``, in the inputs'
    dtype. qd and kd are the apply kernel's ``exp(G) * q`` and ``exp(G_C - G) * k`` (made once a chunk there, not in
    each V block's program here). PACKED: the batch is one chunk-aligned row of sequences and axis 1 is
    (place, head), the place's sequence s (longest first, `order`): the program walks only its chunks
    ``[starts[s], starts[s + 1])``, from and to its rows of h0 and ht (layout.walk_place)."""
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
    if HAS_H0:
        S = tl.load(h0 + state_off, mask=mkv, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    causal = rc[:, None] >= rc[None, :]
    for n in range(n0, n1):
        row, _, mt = rows_of(n * C, 0, T, i_b, i_h, H, Tp, C)
        mtk = mt[:, None] & mk[None, :]
        mtv = mt[:, None] & mv[None, :]
        mkt = mk[:, None] & mt[None, :]
        G_last = tl.load(G + ((i_b * Tp + n * C + C - 1).to(tl.int64) * H + i_h) * K + rk, mask=mk, other=0.0)
        qdc = tl.load(qd + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
        kdT = tl.load(kd + row[None, :] * K + rk[:, None], mask=mkt, other=0.0)
        wc = tl.load(Wm + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
        uc = tl.load(Um + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
        Pc = tl.load(Pm + row[:, None] * C + rc[None, :], mask=mt[:, None] & causal, other=0.0)
        Sd = S.to(dt)
        vnd = (uc.to(tl.float32) - mma(wc, Sd, PREC)).to(dt)
        if STORE_STATES:
            h_off = ((i_b * NT + n).to(tl.int64) * H + i_h) * K * V
            tl.store(h + h_off + rk[:, None] * V + rv[None, :], Sd, mask=mkv)
            tl.store(vn + row[:, None] * V + rv[None, :], vnd, mask=mtv)
        oc = mma_acc(Pc.to(dt), vnd, mma(qdc, Sd, PREC), PREC)
        tl.store(o + row[:, None] * V + rv[None, :], (oc * scale).to(o.dtype.element_ty), mask=mtv)
        S = mma_acc(kdT, vnd, S * tl.exp(G_last)[:, None], PREC)
    tl.store(ht + state_off, S, mask=mkv)


def chunk_cumulative_decay(g: torch.Tensor) -> torch.Tensor:
    """The in-chunk cumulative log-decay G, fp32 ``[B, Tp, H, K]`` with T padded to whole chunks (Tp): the padded
    rows' g taken as 0, so G stays non-increasing along every chunk and every ratio the kernels form is <= 1."""
    B, T, H, K = g.shape
    NT = max(1, triton.cdiv(T, CHUNK))
    padded = g.new_zeros(B, NT * CHUNK, H, K, dtype=torch.float32)
    padded[:, :T] = g
    return padded.view(B, NT, CHUNK, H, K).cumsum(2).view(B, NT * CHUNK, H, K).contiguous()


def chunk_gdn2_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    keep: bool = False,
    packed: ChunkLayout | None = None,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """The four launches on checked inputs: ``(o, final_state, saved)``, ``[B, T, H, V]`` in v's dtype,
    ``[B, H, K, V]`` fp32, and with `keep` what the backward (chunk_bwd.py) reads, ``(G, L, P, W, h, v_new, Qd,
    Kd)``: h ``[B, NT, H, K, V]`` the state at each chunk's start, v_new ``[B, T, H, V]``, both in the inputs'
    dtype, and the walks' decayed q and k (None without `keep`).

    Args:
        q, k, v, g: contiguous, q/k/v of one dtype.
        b: ``[B, T, H, K]`` with (batch, token, head) rows evenly strided by ``b.stride(2)``, channels by
            ``b.stride(3)``: canonical contiguous strides, or KDA's contiguous beta expanded along K (1 and 0).
        w: ``[B, T, H, V]``, the same way.
        scale: the query scale.
        initial_state: ``[B, H, K, V]`` fp32 contiguous, or None.
        keep: store the per-chunk states and v_new, and return the saved residuals.
        packed: packed sequences on a chunk-aligned row (B = 1), their layout (kernels/common/varlen.chunk_layout):
            sequence s on chunks ``[starts[s], starts[s + 1])``, walked (in the layout's `order`, longest first)
            from its row of the initial state ``[N, H, K, V]`` to its row of the final state.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    Tp = NT * CHUNK
    G = chunk_cumulative_decay(g)
    prec = dot_precision(q.dtype)
    BK = padded(K)
    L = q.new_empty(B, T, H, CHUNK, dtype=torch.float32)
    Pm = torch.empty_like(L)
    sb, sw = (b.stride(2), b.stride(3)), (w.stride(2), w.stride(3))
    scores_kernel[(CHUNK // SUB, NT, B * H)](
        q, k, b, G, L, Pm, T, Tp,
        H=H, K=K, BK=BK, BC=SUB, C=CHUNK, SB=sb[0], SBK=sb[1], PREC=prec, BKF=min(LAUNCH["scores_far_cols"], BK),
        num_warps=LAUNCH["scores_warps"], num_stages=1,
    )  # fmt: skip
    inverse_kernel[(NT, B * H)](
        L, T, Tp, H=H, BC=SUB, C=CHUNK, PREC=prec, num_warps=LAUNCH["inverse_warps"], num_stages=1
    )  # fmt: skip
    Wm = torch.empty_like(k)
    Um = torch.empty_like(v)
    bnk, bnv = min(LAUNCH["apply_cols"], BK), min(LAUNCH["apply_cols"], padded(V))
    nk = triton.cdiv(K, bnk)
    Qd, Kd = torch.empty_like(q), torch.empty_like(k)
    apply_kernel[(nk + triton.cdiv(V, bnv), NT, B * H)](
        q, k, v, b, w, G, L, Wm, Um, Qd, Kd, T, Tp,
        H=H, K=K, V=V, BNK=bnk, BNV=bnv, NK=nk, C=CHUNK, SB=sb[0], SBK=sb[1], SW=sw[0], SWV=sw[1], PREC=prec,
        num_warps=LAUNCH["apply_warps"], num_stages=1,
    )  # fmt: skip
    o = torch.empty_like(v)
    rows = B if packed is None else len(packed.counts)
    ht = q.new_empty(rows, H, K, V, dtype=torch.float32)
    h = q.new_empty(B, NT, H, K, V) if keep else None
    vn = torch.empty_like(v) if keep else None
    BV = LAUNCH["walk_block_v"] if padded(V) >= 64 else 16
    walk_kernel[(triton.cdiv(V, BV), rows * H)](
        Qd, Kd, Wm, Um, G, Pm, initial_state, o, ht, h, vn, *walk_tables(packed), scale, T, Tp, NT,
        H=H, K=K, V=V, BK=BK, BV=BV, C=CHUNK, HAS_H0=initial_state is not None, PREC=prec, STORE_STATES=keep,
        PACKED=packed is not None,
        num_warps=LAUNCH["walk_warps"] if BV >= 64 else 4, num_stages=1,
    )  # fmt: skip
    return o, ht, ((G, L, Pm, Wm, h, vn, Qd, Kd) if keep else None)


def _canonical(x: torch.Tensor) -> torch.Tensor:
    """`x` contiguous with the canonical strides even along its size-1 dims (``contiguous()`` may keep a slice's
    stride there), which the kernels' row strides of b and w are read from."""
    return x.contiguous().view(-1).view(x.shape)


class ChunkGDN2Function(torch.autograd.Function):
    """autograd wrapper of the Triton forward and backward: keeps the forward's G, L, P, W, per-chunk states, v_new and
    decayed q and k; the backward (chunk_bwd.py) recomputes nothing else. b and w may be stride-0 views (KDA's
    beta): their gradients come back full-shaped and autograd sums them through the expand."""

    @staticmethod
    def forward(ctx, q, k, v, g, b, w, scale, initial_state, packed):  # type: ignore[no-untyped-def]
        """``(o, final_state)``, the residuals saved for :meth:`backward`."""
        o, ht, saved = chunk_gdn2_fwd(q, k, v, g, b, w, scale, initial_state, keep=True, packed=packed)
        ctx.save_for_backward(q, k, v, b, w, *saved)
        ctx.scale, ctx.packed = scale, packed
        ctx.dtypes = (g.dtype, b.dtype, w.dtype, None if initial_state is None else initial_state.dtype)
        ctx.set_materialize_grads(False)  # an unused final state's gradient stays None: the walk starts from zero
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):  # type: ignore[no-untyped-def]
        """Gradients of q, k, v, g, b, w and the initial state (None for the scale)."""
        q, k, v, b, w, *saved = ctx.saved_tensors
        do = torch.zeros_like(v) if do is None else do.contiguous()
        dht = None if dht is None else dht.float().contiguous()
        dq, dk, dv, dg, db, dw, dh0 = chunk_gdn2_bwd(q, k, v, b, w, ctx.scale, tuple(saved), do, dht, ctx.packed)
        g_dt, b_dt, w_dt, h0_dt = ctx.dtypes
        dh0 = None if h0_dt is None else dh0.to(h0_dt)
        return dq, dk, dv, dg.to(g_dt), db.to(b_dt), dw.to(w_dt), None, dh0, None


def _forward(q, k, v, g, b, w, scale, initial_state, packed=None):  # type: ignore[no-untyped-def]
    """Contiguous q, k, v, g (fp32) and initial state, then :func:`chunk_gdn2_fwd`: through
    :class:`ChunkGDN2Function` when a gradient is wanted, else without autograd (nothing kept). `packed`: packed
    sequences on a chunk-aligned row (:func:`chunk_gdn2_fwd`)."""
    if initial_state is not None:
        initial_state = initial_state.float().contiguous()
    args = (q.contiguous(), k.contiguous(), v.contiguous(), g.float().contiguous(), b, w)
    tensors = (*args, initial_state)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return ChunkGDN2Function.apply(*args, scale, initial_state, packed)
    with torch.no_grad():
        return chunk_gdn2_fwd(*args, scale, initial_state, packed=packed)[:2]


def _packed_rows(q, k, v, g, b, w=None, *, scale, initial_state, chunk_size, runs):  # type: ignore[no-untyped-def]
    """The chunk-aligned row of packed sequences (varlen.run_chunk_aligned; chunk_size is CHUNK): GDN-2's b and w,
    or KDA's beta alone as `b` (w None), read through stride-0 views as in the dense case."""
    b, w = _beta_views(b, q, v) if w is None else (_canonical(b), _canonical(w))
    return _forward(q, k, v, g, b, w, scale, initial_state, runs)


def _beta_views(beta: torch.Tensor, q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA's erase and write strengths: beta ``[B, T, H]`` as stride-0 views over q's K and v's V channels."""
    beta = _canonical(beta)
    return beta[..., None].expand(*q.shape), beta[..., None].expand(*v.shape)


def _check_kv(name: str, K: int, V: int) -> None:
    """The kernels hold a key row and a value row in one tile: K and V up to 256."""
    if max(K, V) > 256:
        raise ValueError(f"{name} supports K and V up to 256, got K={K}, V={V}")


def gdn2_triton_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Registry entry (op ``gdn2``, impl ``triton_chunk``): GDN-2 by chunks of 64 tokens in Triton,
    differentiable (backward in Triton, chunk_bwd.py).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; g: ``[B, T, H, K]`` per-channel log-decay (<= 0);
            b: ``[B, T, H, K]`` erase strength; w: ``[B, T, H, V]`` write strength.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]``.
        cu_seqlens: packed sequences (B = 1) on a chunk-aligned row, each walked on programs of its own
            (kernels/common/varlen.run_chunk_aligned); the states are then ``[N, H, K, V]``.

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in v's dtype, ``[B, H, K, V]`` fp32. Differentiable in q, k, v, g,
        b, w and the initial state (:class:`ChunkGDN2Function`); without a gradient wanted, computed under
        ``torch.no_grad`` with nothing kept.

    Examples::

        >>> from deltabench.references.gdn2 import make_inputs
        >>> x = make_inputs(2, 200, 4, 64, 64, dtype=torch.bfloat16, device="cuda")
        >>> o, ht = gdn2_triton_chunk(**x)
    """
    gates = {"g": g, "b": b, "w": w}
    K, V = check_op_inputs("gdn2", q, k, v, gates, state_to_check(initial_state, cu_seqlens))[3:]
    _check_kv("gdn2 triton_chunk", K, V)
    scale = default_scale(scale, K)
    if cu_seqlens is not None:
        return run_chunk_aligned(
            _packed_rows, q, k, v, g, b, w, cu_seqlens=cu_seqlens, initial_state=initial_state, chunk_size=CHUNK,
            scale=scale,
        )  # fmt: skip
    return _forward(q, k, v, g, _canonical(b), _canonical(w), scale, initial_state)


def kda_triton_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Registry entry (op ``kda``, impl ``triton_chunk``): GDN-2's kernels with b = w = beta, forward and
    backward (beta's gradient: autograd sums b's and w's through their stride-0 views).

    Args:
        q, k, g: ``[B, T, H, K]``; v: ``[B, T, H, V]``; beta: ``[B, T, H]`` write strength (read in place, a
            stride-0 view along K and V: nothing is expanded in memory).
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]``.
        cu_seqlens: packed sequences (B = 1) on a chunk-aligned row, each walked on programs of its own
            (kernels/common/varlen.run_chunk_aligned); the states are then ``[N, H, K, V]``.

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in v's dtype, ``[B, H, K, V]`` fp32; differentiable in every input.

    Examples::

        >>> from deltabench.references.kda import make_inputs
        >>> x = make_inputs(2, 200, 4, 64, 64, dtype=torch.bfloat16, device="cuda")
        >>> o, ht = kda_triton_chunk(**x)
    """
    gates = {"g": g, "beta": beta}
    K, V = check_op_inputs("kda", q, k, v, gates, state_to_check(initial_state, cu_seqlens))[3:]
    _check_kv("kda triton_chunk", K, V)
    if cu_seqlens is not None:
        return run_chunk_aligned(
            _packed_rows, q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state, chunk_size=CHUNK,
            scale=default_scale(scale, K),
        )  # fmt: skip
    return _forward(q, k, v, g, *_beta_views(beta, q, v), default_scale(scale, K), initial_state)
