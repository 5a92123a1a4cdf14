"""Chunk-sequential stages of chunked Gated DeltaNet: one Triton program per (V block, batch*head).

Forward (``state_fwd``), for chunk n with state S_n [K, V] at its start (G, gamma as in wy.py, G_C the
chunk's total log-decay):

    v_new = U - W S_n
    o     = scale * ( gamma * (q S_n) + M v_new ),   M_ij = exp(G_i - G_j) q_i . k_j  for j <= i
    S_n+1 = exp(G_C) S_n + (k * exp(G_C - G))^T v_new

The output is produced in the same pass, so the forward needs no per-chunk state in memory unless the
backward will (then S_n and v_new are stored, in the inputs' dtype).

Backward (``state_bwd``), chunks in reverse, dH the gradient w.r.t. S_n+1:

    dv_new = scale * M^T do + (k * exp(G_C - G)) dH
    dS_n   = exp(G_C) dH + scale * (gamma * q)^T do - W^T dv_new

storing dH per chunk and dv_new, and returning dS_0 (the initial state's gradient).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton.mma import dot_precision, mma, mma_acc, padded
from .walk import Packing, compose_segments, map_columns, store_map, walk_grid, walk_segments, walk_span
from .wy import CHUNK, TUNED_K

__all__ = ["BWD_LAUNCH", "FWD_LAUNCH", "LAUNCH", "bwd_launch_config", "fwd_launch_config", "state_bwd", "state_fwd"]


@triton.jit
def _chunk_gates(g, row, mt):
    """In-chunk cumulative log-decay G [C] (0 past T) and the chunk total G_C."""
    gc = tl.load(g + row, mask=mt, other=0.0).to(tl.float32)
    return tl.cumsum(gc, axis=0), tl.sum(gc, axis=0)


@triton.jit
def state_fwd_kernel(
    q, k, w, u, g, h0, h, vnew, o, ht, starts, order,
    scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    HAS_H0: tl.constexpr, STORE_STATES: tl.constexpr, STORE_FINAL: tl.constexpr, PREC: tl.constexpr,
    VARLEN: tl.constexpr = False,
):  # fmt: skip
    """Walk the chunks of one (batch, head) for one block of V columns: outputs, states, final state. VARLEN:
    packed sequences (walk.Packing), grid axis 2 the sequence: a program walks only its sequence's chunks, from its
    row of h0 (zeros without one), and stores its row of ht ``[N, H, K, V]``."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    rc = tl.arange(0, C)
    mk = rk < K
    mv = rv < V
    mkv = mk[:, None] & mv[None, :]
    dt = q.dtype.element_ty
    n0, n1, state_off = walk_span(starts, order, i_bh, NT, rk, rv, H, K, V, VARLEN)
    if HAS_H0:
        S = tl.load(h0 + state_off, mask=mkv, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    causal = rc[:, None] >= rc[None, :]
    for n in range(n0, n1):
        t = n * C + rc
        mt = t < T
        row = (i_b * T + t).to(tl.int64) * H + i_h
        if STORE_STATES:
            h_off = ((i_b * NT + n).to(tl.int64) * H + i_h) * K * V
            tl.store(h + h_off + rk[:, None] * V + rv[None, :], S.to(dt), mask=mkv)
        mtk = mt[:, None] & mk[None, :]
        mtv = mt[:, None] & mv[None, :]
        kT = tl.load(k + row[None, :] * K + rk[:, None], mask=mk[:, None] & mt[None, :], other=0.0)
        qc = tl.load(q + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
        wc = tl.load(w + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
        uc = tl.load(u + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
        G, G_last = _chunk_gates(g, row, mt)
        Sd = S.to(dt)
        vn = uc.to(tl.float32) - mma(wc, Sd, PREC)
        vnd = vn.to(dt)
        if STORE_STATES:
            tl.store(vnew + row[:, None] * V + rv[None, :], vnd, mask=mtv)
        qk = mma(qc, kT, PREC)
        dG = G[:, None] - G[None, :]
        M = tl.where(causal, qk * tl.exp(tl.where(causal, dG, 0.0)), 0.0)
        oc = mma(qc, Sd, PREC) * tl.exp(G)[:, None]
        oc += mma(M.to(dt), vnd, PREC)
        tl.store(o + row[:, None] * V + rv[None, :], (oc * scale).to(o.dtype.element_ty), mask=mtv)
        # walk.py's update, the same arithmetic: k^T (exp(G_C - G) * v_new), k read transposed
        vs = (vn * tl.exp(G_last - G)[:, None]).to(dt)
        S = mma_acc(kT, vs, S * tl.exp(G_last), PREC)
    if STORE_FINAL:
        tl.store(ht + state_off, S, mask=mkv)


@triton.jit
def _bwd_step(dH, kc, qT, wT, doc, G, G_last, anticausal, scale, dt: tl.constexpr, PREC: tl.constexpr):
    """One chunk of the backward walk from dH (fp32, the gradient w.r.t. the state after the chunk), with q and W
    read transposed (qT, wT ``[BK, C]``): ``(dv_new in dt, the gradient w.r.t. the state at the chunk's start)``.

    As walk.py's step: the decays scale rows of a product or of ``do`` rather than [C, K] key and query tiles,
    the transposed operands come from memory in the layout their products read, and the state-side products
    accumulate into the decayed dH (FLA's bwd_dhu does the same)."""
    # M^T computed directly (k q^T) from loaded operands, never as the transpose of a product (a Triton
    # miscompile on Hopper)
    kq = mma(kc, qT, PREC)
    dG = G[None, :] - G[:, None]
    MT = tl.where(anticausal, kq * tl.exp(tl.where(anticausal, dG, 0.0)), 0.0) * scale
    # (k * exp(G_C - G)) dH = exp(G_C - G) * (k dH), row by row
    dvn = mma(MT.to(dt), doc, PREC) + tl.exp(G_last - G)[:, None] * mma(kc, dH.to(dt), PREC)
    dvnd = dvn.to(dt)
    # (gamma q)^T do = q^T (gamma * do), then - W^T dv_new (negated before the rounding, which is symmetric: the
    # same value as -dvnd; the interpreter holds 16-bit floats as integers and cannot negate them)
    dog = (doc * (tl.exp(G) * scale)[:, None]).to(dt)
    dH = mma_acc(qT, dog, dH * tl.exp(G_last), PREC)
    dH = mma_acc(wT, (-dvn).to(dt), dH, PREC)
    return dvnd, dH


@triton.jit
def state_bwd_kernel(
    q, k, w, g, do, dht, dh, dvnew, dh0, starts, order,
    scale, T, NT, SEG,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    HAS_DHT: tl.constexpr, PREC: tl.constexpr, SEGMENTED: tl.constexpr = False, VARLEN: tl.constexpr = False,
):  # fmt: skip
    """Walk the chunks of one (batch, head) backwards for one block of V columns. SEGMENTED: grid axis 2 is a
    segment of SEG chunks, dht holds the gradient entering each segment ``[P, B*H, K, V]`` (fp32, from
    :func:`state_bwd`'s segments) and only the first segment stores dh0. VARLEN (never segmented): as
    :func:`state_fwd_kernel`'s, a program walks its sequence's chunks back from its row of dht (zeros without one)
    and stores its row of dh0."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    rc = tl.arange(0, C)
    mk = rk < K
    mv = rv < V
    mkv = mk[:, None] & mv[None, :]
    dt = q.dtype.element_ty
    n0, n1, state_off = walk_span(starts, order, i_bh, NT, rk, rv, H, K, V, VARLEN)
    if SEGMENTED:
        i_p = tl.program_id(2)
        n0 = i_p * SEG
        n1 = tl.minimum(n0 + SEG, NT)
        dH = tl.load(dht + i_p.to(tl.int64) * tl.num_programs(1) * K * V + state_off, mask=mkv, other=0.0)
        mkv_first = mkv & (rk[:, None] < K * (1 - tl.minimum(i_p, 1)))  # the first segment's only
    else:
        mkv_first = mkv
        if HAS_DHT:
            dH = tl.load(dht + state_off, mask=mkv, other=0.0).to(tl.float32)
        else:
            dH = tl.zeros([BK, BV], dtype=tl.float32)
    anticausal = rc[:, None] <= rc[None, :]
    for i in range(n1 - n0):
        n = n1 - 1 - i
        t = n * C + rc
        mt = t < T
        row = (i_b * T + t).to(tl.int64) * H + i_h
        h_off = ((i_b * NT + n).to(tl.int64) * H + i_h) * K * V
        tl.store(dh + h_off + rk[:, None] * V + rv[None, :], dH.to(dt), mask=mkv)
        mtk = mt[:, None] & mk[None, :]
        mtv = mt[:, None] & mv[None, :]
        mkt = mk[:, None] & mt[None, :]
        kc = tl.load(k + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
        qT = tl.load(q + row[None, :] * K + rk[:, None], mask=mkt, other=0.0)
        wT = tl.load(w + row[None, :] * K + rk[:, None], mask=mkt, other=0.0)
        doc = tl.load(do + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
        G, G_last = _chunk_gates(g, row, mt)
        dvnd, dH = _bwd_step(dH, kc, qT, wT, doc, G, G_last, anticausal, scale, dt, PREC)
        tl.store(dvnew + row[:, None] * V + rv[None, :], dvnd, mask=mtv)
    tl.store(dh0 + state_off, dH, mask=mkv_first)


@triton.jit
def bwd_segment_summary_kernel(
    q, k, w, g, do, M, b,
    scale, T, NT, SEG,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """The backward walk over segment ``program_id(2) + 1`` (segment 0's map is never needed) as an affine map
    of the gradient entering it, ``dS_start = M dH_end + b``, for one block of columns of ``[M | b]``: the
    walk's own step from ``[I | 0]``, with do = 0 in M's columns (the map is linear in do)."""
    i_c = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_p = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, BK)
    rc = tl.arange(0, C)
    mk = rk < K
    dt = q.dtype.element_ty
    in_b, col, mcol, mdo, dH = map_columns(i_c, rk, K, V, BK, BV)
    n0 = (i_p + 1) * SEG
    n1 = tl.minimum(n0 + SEG, NT)
    anticausal = rc[:, None] <= rc[None, :]
    for i in range(n1 - n0):
        n = n1 - 1 - i
        t = n * C + rc
        mt = t < T
        row = (i_b * T + t).to(tl.int64) * H + i_h
        mtk = mt[:, None] & mk[None, :]
        mkt = mk[:, None] & mt[None, :]
        kc = tl.load(k + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
        qT = tl.load(q + row[None, :] * K + rk[:, None], mask=mkt, other=0.0)
        wT = tl.load(w + row[None, :] * K + rk[:, None], mask=mkt, other=0.0)
        doc = tl.load(do + row[:, None] * V + col[None, :], mask=mt[:, None] & mdo[None, :], other=0.0)
        G, G_last = _chunk_gates(g, row, mt)
        _, dH = _bwd_step(dH, kc, qT, wT, doc, G, G_last, anticausal, scale, dt, PREC)
    store_map(M, b, dH, i_p.to(tl.int64) * tl.num_programs(1) + i_bh, rk, col, mcol, in_b, K, V)


# Fixed launch settings (no autotuning: the gate must cover every config a run can pick).
# Measured on the H200 with Triton 3.6 (benchmarks/NOTES.md): a 32-column V block hit an illegal memory
# access in state_fwd (4 warps at K = 64; 8 warps at K = 128), so V blocks are 64 columns (8 warps), or
# 16 (4 warps) when V is under 64; 64/8 and 16/4 ran clean. `stages` = 1: no software-pipelined loads.
LAUNCH = {"block_v": 64, "warps": 8, "stages": 1}
# The backward walk's (V block, warps, stages) per class of B*H, measured at 8x4096x6 and 1x32768x16
# (benchmarks/NOTES.md, v2; each config's dh, dv_new and dh0 bit-identical to 64/8/1's):
# - "wide" (64-column blocks give at least 64 programs, e.g. 8x4096x6: 96): 64/4/2 0.331 ms against 0.497
#   for 64/8/1 (64/8/2 0.371, 16/4/2 0.476; 32/4/2 0.311 but 32 columns faulted in state_fwd);
# - "narrow" (fewer, e.g. 1x32768x16: 32 programs at 64 columns, 128 at 16): 16/4/3 1.40 ms against 3.88
#   for 64/8/1 (16/4/2 1.70, 64/4/2 2.85, 16/2/2 4.06). 16 columns never in one stage (walk.py's fault).
# - fewer chunks than stages: the forward walk's single-stage LAUNCH config. On the H200 the narrow config
#   returned dh0 37% off at T = 64 (one chunk, B*H = 2, bf16; the gate's length sweep), where the interpreter,
#   which does not pipeline, agreed with the oracle (benchmarks/NOTES.md, "state_bwd at one chunk").
# v3 (2026-12-03, _bwd_step in FLA's form, same configs; benchmarks/gpu/gdn_h16.py, torch.profiler): 8x4096x6
# 0.362 -> 0.300 ms, 4x8192x16 0.679 -> 0.553, 1x32768x16 (narrow) 1.421 -> 1.271. Deeper pipelines not yet:
# 64/4/3 0.299 ms at 8x4096x6; 64/4/4 asks 246,528 bytes of shared memory (232,448 on the H200) and does not launch.
BWD_LAUNCH = {"wide": (64, 4, 2), "narrow": (16, 4, 3), "min_programs": 64}


# The fused forward walk's (state_fwd) tuned configs at wy.TUNED_K (v3, 2026-12-03, the step in FLA's form; o
# bit-identical to 64/8/1's in each): at 1x1024x6 (12 programs at 64 columns) 16/4/3 0.050 ms, 64/4/3 0.061,
# 64/8/1 0.097; at 4x4096x6 (48) 64/4/3 0.212, 16/4/3 0.321, 64/8/1 0.375. 16 columns below FWD_LAUNCH's
# min_programs at 64; fewer chunks than stages, or another head size: LAUNCH's gated config.
# Packed sequences load their rows of h0 before the walk as the dense walk does, into no more shared memory
# (197,120 bytes at 64/4/3 with or without h0, Triton 3.9 for sm_90; loaded inside the walk at each sequence's
# first chunk, 262,664 at 64/4/3 failed on the H200 with OutOfResources).
FWD_LAUNCH = {"wide": (64, 4, 3), "narrow": (16, 4, 3), "min_programs": 32}


def fwd_launch_config(V: int, heads: int, BK: int, NT: int) -> tuple[int, int, int]:
    """``(V block, warps, stages)`` of ``state_fwd`` for `heads` walks side by side (B*H, times the packed
    sequences), the shortest of `NT` chunks (FWD_LAUNCH at BK = wy.TUNED_K and V >= 64 with at least as many chunks
    as stages; LAUNCH's gated config otherwise)."""
    gated = _block_v(V), _warps(BK, _block_v(V)), LAUNCH["stages"]
    if BK != TUNED_K or padded(V) < 64:
        return gated
    wide = FWD_LAUNCH["wide"]
    tuned = wide if heads * triton.cdiv(V, wide[0]) >= FWD_LAUNCH["min_programs"] else FWD_LAUNCH["narrow"]
    return tuned if tuned[2] <= NT else gated


def bwd_launch_config(V: int, heads: int, BK: int, NT: int) -> tuple[int, int, int]:
    """``(V block, warps, stages)`` of ``state_bwd`` for `heads` walks side by side (B*H, times the segments or
    packed sequences), the shortest of `NT` chunks (see BWD_LAUNCH), at the padded head size `BK` = wy.TUNED_K; at
    other sizes, or when a walk has fewer chunks than the tuned config has stages, the forward walk's gated LAUNCH
    config."""
    gated = _block_v(V), _warps(BK, _block_v(V)), LAUNCH["stages"]
    if BK != TUNED_K:
        return gated
    wide = BWD_LAUNCH["wide"]
    if padded(V) >= wide[0] and heads * triton.cdiv(V, wide[0]) >= BWD_LAUNCH["min_programs"]:
        tuned = wide
    else:
        tuned = BWD_LAUNCH["narrow"]
    return tuned if tuned[2] <= NT else gated


def _block_v(V: int) -> int:
    """V block of the forward walk: LAUNCH's (64), or 16 when V is under 64 (never 32: see LAUNCH)."""
    return LAUNCH["block_v"] if padded(V) >= 64 else 16


def _warps(BK: int, BV: int) -> int:
    """Warps of a forward-walk program: LAUNCH's for 64-column blocks, 4 for 16-column ones."""
    return LAUNCH["warps"] if BV >= 64 else 4


def state_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    store_states: bool,
    packed: Packing | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Launch the forward sequential stage.

    Returns ``(o, final_state, h, v_new)``: o ``[B, T, H, V]``; final_state ``[B, H, K, V]`` fp32 or None;
    h ``[B, NT, H, K, V]`` (state at each chunk's start) and v_new ``[B, T, H, V]`` when `store_states`.
    `packed`: N sequences laid out chunk-aligned in a batch of one (walk.Packing), the initial and final states
    ``[N, H, K, V]``, each sequence walked by programs of its own (grid axis 2).
    """
    B, T, H, K = q.shape
    V = u.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    o = torch.empty_like(u)
    h = q.new_empty(B, NT, H, K, V) if store_states else None
    vnew = torch.empty_like(u) if store_states else None
    starts, order, walks, shortest, rows = walk_grid(packed, B, NT, 1)
    ht = q.new_empty(rows, H, K, V, dtype=torch.float32) if output_final_state else None
    BK = padded(K)
    BV, warps, stages = fwd_launch_config(V, B * H * walks, BK, shortest)
    state_fwd_kernel[(triton.cdiv(V, BV), B * H, walks)](
        q, k, w, u, g, initial_state, h, vnew, o, ht, starts, order, scale, T, NT,
        H=H, K=K, V=V, BK=BK, BV=BV, C=CHUNK,
        HAS_H0=initial_state is not None, STORE_STATES=store_states, STORE_FINAL=output_final_state,
        PREC=dot_precision(q.dtype), VARLEN=packed is not None, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return o, ht, h, vnew


def state_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    g: torch.Tensor,
    do: torch.Tensor,
    dht: torch.Tensor | None,
    scale: float,
    config: tuple[int, int, int] | None = None,
    segments: int = 1,
    packed: Packing | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward sequential stage. Returns ``(dh, dv_new, dh0)`` ([B, NT, H, K, V], [B, T, H, V],
    [B, H, K, V] fp32). `config` ``(V block, warps, stages)`` replaces LAUNCH's (for tuning scripts).

    With `segments` > 1 the chunks are cut into that many runs walked side by side (walk.state_walk's segments,
    in reverse): (1) each segment's affine map of the gradient entering it, ``dS_start = M dH_end + b``
    (``bwd_segment_summary_kernel``, segments 1.. at once); (2) the gradient entering each segment, from the last
    down (walk.compose_segments); (3) every segment's walk at once, storing dh and dv_new, the first segment dh0.
    `packed` as :func:`state_fwd`'s (dht and dh0 ``[N, H, K, V]``): never segmented."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    seg, P = walk_segments(NT, 1 if packed is not None else segments)
    starts, order, walks, shortest, rows = walk_grid(packed, B, seg, P)
    BK = padded(K)
    BV, warps, stages = config or bwd_launch_config(V, B * H * walks, BK, shortest)
    dh = q.new_empty(B, NT, H, K, V)
    dvnew = torch.empty_like(do)
    dh0 = q.new_empty(rows, H, K, V, dtype=torch.float32)
    entering = dht
    if P > 1:
        BVs = min(BV, BK)  # the summary's column block: a divisor of BK, so that a block is all M or all b
        M = q.new_empty(P - 1, B * H, K, K, dtype=torch.float32)
        b = q.new_empty(P - 1, B * H, K, V, dtype=torch.float32)
        bwd_segment_summary_kernel[(BK // BVs + triton.cdiv(V, BVs), B * H, P - 1)](
            q, k, w, g, do, M, b, scale, T, NT, seg,
            H=H, K=K, V=V, BK=BK, BV=BVs, C=CHUNK, PREC=dot_precision(q.dtype),
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
        last = dht.reshape(B * H, K, V) if dht is not None else b.new_zeros(B * H, K, V)
        entering = compose_segments(M, b, last, reverse=True)
    state_bwd_kernel[(triton.cdiv(V, BV), B * H, walks)](
        q, k, w, g, do, entering, dh, dvnew, dh0, starts, order, scale, T, NT, seg,
        H=H, K=K, V=V, BK=BK, BV=BV, C=CHUNK, HAS_DHT=entering is not None, PREC=dot_precision(q.dtype),
        SEGMENTED=P > 1, VARLEN=packed is not None, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return dh, dvnew, dh0
