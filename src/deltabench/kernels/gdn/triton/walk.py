"""State walk of chunked Gated DeltaNet: the chunk-to-chunk state recurrence alone, one Triton program per
(V block, batch*head).

For chunk n with state S_n [K, V] at its start (G the in-chunk cumulative log-decay, G_C its total, W and U
from wy.py)::

    v_new = U - W S_n
    S_n+1 = exp(G_C) S_n + (k * exp(G_C - G))^T v_new

Each program stores S_n (as ``h``, in the inputs' dtype) and v_new for every chunk, and the final state in
fp32. The outputs are left to a fully parallel kernel (output.py), so only the two products above sit on
the chunk-serial path (state.py's ``state_fwd`` also computes ``q k^T``, ``q S`` and ``M v_new`` there).

Why V blocks only, no K split: column j of S evolves on its own (W and k are shared by every column), so V
blocks are independent programs. Rows are not: every row block of S_n+1 needs the whole v_new, and v_new
needs the full contraction ``W S_n`` over K, so a K split would have to exchange partial sums between
programs once per chunk (a grid-wide barrier per chunk), which Triton does not offer safely. For few heads
the walk splits V finer instead (16-column blocks, see ``launch_config``).

Why h in the inputs' dtype: the state is carried in fp32 across chunks; the stored copy is the one the
products read. state.py's forward already multiplies W and q by the 16-bit-rounded state, so storing it
rounded keeps this path's arithmetic identical to the gated ``triton_chunk`` (same error, measured on the
H200 at 3e-3 to 4e-3 for o in bf16) and halves the bytes written and re-read against fp32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ...common.triton.mma import dot_precision, mma, mma_acc, padded
from .wy import CHUNK, TUNED_K

__all__ = [
    "H200_CLEAN",
    "LAUNCH",
    "SEGMENTS",
    "Packing",
    "compose_segments",
    "launch_config",
    "state_walk",
    "walk_grid",
    "walk_segments",
    "walk_span",
]

# Fixed launch settings (no autotuning), (V block, warps, stages). 16 columns are taken below V = 64, and
# when 64-column blocks would give fewer than `min_programs` programs (an H200 has 132 SMs: at B*H = 16,
# V = 128 only 32 would run), which splits V finer in place of the unsound K split.
# Measured on the H200 (benchmarks/NOTES.md, v1 and v2): at 8x4096x6 (96 programs at 64 columns) 64/4/2
# 0.194 ms, 16/4/2 0.192, 64/8/2 0.216, 64/8/1 (the first choice) 0.255; at 1x32768x16 16/4/2 1.015 ms,
# 16/4/3 1.007, 16/2/2 1.043, 64/4/2 1.338, 64/8/2 1.567, 64/8/1 1.858. The loads of a chunk do not depend
# on the state, so a second stage lets Triton prefetch them a chunk ahead.
# The 16-column block runs with 2 stages: with 1 stage (4 warps) Triton 3.6 compiles this kernel into code
# that reads shared memory out of range on the H200 (compute-sanitizer: "Out-of-range shared or local
# address" at the walk's first tl.dot, every block; garbage h, then an illegal memory access), at every
# shape that picks it (1x1024x6, 4x4096x6, 1x32768x16); 16/4/2 gave bit-identical h, v_new and o to
# state_fwd at 8x4096x6 and 1x32768x16 (benchmarks/NOTES.md, v1). Never 32 columns (state.py's fault).
# v3 (2026-12-03, the step in FLA's form, benchmarks/gpu/gdn_h16.py sweeps): deeper pipelines now pay: walk alone
# at 4x8192x16 64/4/2 0.422 ms, 64/4/3 0.267, 64/4/4 0.248; at 8x4096x6 0.203, 0.141, 0.137; at 1x32768x16
# (16 sequences) 16/4/2 1.032, 16/4/3 0.699, 64/4/4 1.026. Each config's h, v_new and final state bit-identical
# to 64/4/2's there. A walk of fewer chunks than stages takes the 2-stage configs (see launch_config).
LAUNCH = {
    "block_v": 64, "warps": 4, "stages": 4,
    "small_block_v": 16, "small_warps": 4, "small_stages": 3,
    "min_programs": 64,
}  # fmt: skip
# (V block, warps, stages) that gave h, v_new and the final state bit-identical to state_fwd's on the H200
# (8x4096x6, and 1x32768x16 for 16/4/2); launch_config may only return one of these (a CPU test checks it).
# Segments of the chunk-serial walks (this forward walk, state.py's backward walk) walked side by side
# (state_walk and state.state_bwd with `segments`); 1: the serial walks. Off until timed on the H200
# (benchmarks/NOTES.md, "the segmented walk"); benchmarks/gdn_kernels.py sets it to compare.
SEGMENTS = 1
H200_CLEAN = {
    (64, 8, 1),
    (64, 4, 1),
    (64, 8, 2),
    (64, 4, 2),
    (64, 4, 3),
    (64, 4, 4),
    (16, 4, 2),
    (16, 4, 3),
    (16, 2, 2),
}


class Packing(NamedTuple):
    """N packed sequences laid out chunk-aligned in a batch of one (triton/varlen.py), walked one program per
    (sequence, head): sequence i holds chunks ``[starts[i], starts[i + 1])`` (`starts` int32 ``[N + 1]`` on the
    inputs' device), and its initial and final states are row i of ``[N, H, K, V]``; `order` int32 ``[N]``, the
    sequences in launch order (longest first: kernels/common/varlen.ChunkLayout). `shortest`: the fewest chunks
    a sequence has, the walk length the launch configs' stages are held to."""

    starts: torch.Tensor
    order: torch.Tensor
    n: int
    shortest: int


@triton.jit
def _chunk_step(S, kT, wc, uc, gc, dt: tl.constexpr, PREC: tl.constexpr):
    """One chunk of the walk from state S (fp32), with k read transposed (kT ``[BK, C]``): ``(S rounded to dt,
    v_new in dt, the next S)``.

    The update ``(k * exp(G_C - G))^T v_new`` is formed as ``k^T (exp(G_C - G) * v_new)``: the decay scales the
    [C, BV] new values (fp32, rounded to dt once) instead of the [C, K] keys, k is loaded in the layout the product
    reads (no transpose of a register tile on the serial path), and the decayed state enters the product as its
    accumulator (FLA's fwd_h does the same; benchmarks/gpu/gdn_h16.py measured our old step at 2x its time)."""
    G = tl.cumsum(gc, axis=0)
    G_last = tl.sum(gc, axis=0)
    Sd = S.to(dt)
    vn = uc.to(tl.float32) - mma(wc, Sd, PREC)
    # past T: k = 0 and g = 0, so padded rows add nothing to the state
    vs = (vn * tl.exp(G_last - G)[:, None]).to(dt)
    return Sd, vn.to(dt), mma_acc(kT, vs, S * tl.exp(G_last), PREC)


@triton.jit
def walk_span(starts, order, i_bh, NT, rk, rv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, VARLEN: tl.constexpr):
    """The chunks a walk program covers and its state slice: ``(first chunk, one past the last, the offsets of its
    [BK, BV] slice of the states)``. Dense: every chunk of its (batch, head) row `i_bh`, the state row `i_bh`.
    VARLEN: the packed sequence ``order[i]`` for place i of grid axis 2 (:class:`Packing`, a batch of one), its
    chunks from the table `starts`, and head i_h's row of the per-sequence states [N, H, K, V] seen as
    [N*H, K, V]."""
    n0 = 0
    n1 = NT
    state_row = i_bh
    if VARLEN:
        i_s = tl.load(order + tl.program_id(2))
        n0 = tl.load(starts + i_s)
        n1 = tl.load(starts + i_s + 1)
        state_row = i_s * H + i_bh % H
    return n0, n1, state_row.to(tl.int64) * K * V + rk[:, None] * V + rv[None, :]


@triton.jit
def state_walk_kernel(
    k, w, u, g, h0, h, vnew, ht, starts, order,
    T, NT, SEG,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr, PREC: tl.constexpr, SEGMENTED: tl.constexpr = False,
    VARLEN: tl.constexpr = False,
):  # fmt: skip
    """Walk the chunks of one (batch, head) for one block of V columns: h per chunk, v_new, final state.
    SEGMENTED: grid axis 2 is a segment of SEG chunks, h0 holds every segment's start ``[P, B*H, K, V]``
    (fp32, from :func:`state_walk`'s segments) and only the last segment stores the final state. VARLEN (never
    segmented): packed sequences (:class:`Packing`), grid axis 2 the sequence: a program walks only its sequence's
    chunks, from its row of h0 (zeros without one), and stores its row of ht ``[N, H, K, V]``."""
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
    dt = k.dtype.element_ty
    n0, n1, state_off = walk_span(starts, order, i_bh, NT, rk, rv, H, K, V, VARLEN)
    if SEGMENTED:
        i_p = tl.program_id(2)
        n0 = i_p * SEG
        n1 = tl.minimum(n0 + SEG, NT)
        start_off = i_p.to(tl.int64) * tl.num_programs(1) * K * V
        S = tl.load(h0 + start_off + state_off, mask=mkv, other=0.0).to(tl.float32)
        mkv_final = mkv & (rk[:, None] < K * ((i_p + 1) // tl.num_programs(2)))  # the last segment's only
    else:
        mkv_final = mkv
        if HAS_H0:
            S = tl.load(h0 + state_off, mask=mkv, other=0.0).to(tl.float32)
        else:
            S = tl.zeros([BK, BV], dtype=tl.float32)
    for n in range(n0, n1):
        t = n * C + rc
        mt = t < T
        row = (i_b * T + t).to(tl.int64) * H + i_h
        mtk = mt[:, None] & mk[None, :]
        mtv = mt[:, None] & mv[None, :]
        # none of these loads depends on S: with LAUNCH stages > 1 Triton may prefetch them a chunk ahead
        kT = tl.load(k + row[None, :] * K + rk[:, None], mask=mk[:, None] & mt[None, :], other=0.0)
        wc = tl.load(w + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
        uc = tl.load(u + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
        gc = tl.load(g + row, mask=mt, other=0.0).to(tl.float32)
        Sd, vnd, S = _chunk_step(S, kT, wc, uc, gc, dt, PREC)
        h_off = ((i_b * NT + n).to(tl.int64) * H + i_h) * K * V
        tl.store(h + h_off + rk[:, None] * V + rv[None, :], Sd, mask=mkv)
        tl.store(vnew + row[:, None] * V + rv[None, :], vnd, mask=mtv)
    if STORE_FINAL:
        tl.store(ht + state_off, S, mask=mkv_final)


@triton.jit
def map_columns(i_c, rk, K, V, BK: tl.constexpr, BV: tl.constexpr):
    """Column block `i_c` of a segment map ``[M | b]`` (K + V columns; the first BK // BV blocks are M's):
    ``(in_b, columns, their mask, where the walk's input enters (b's columns only), the start [I | 0])``."""
    in_b = tl.minimum(i_c * BV // BK, 1)
    col = i_c * BV - BK * in_b + tl.arange(0, BV)
    mcol = col < K + (V - K) * in_b
    m_input = col < V * in_b
    start = tl.where((rk[:, None] == col[None, :]) & (rk[:, None] < K * (1 - in_b)), 1.0, 0.0)
    return in_b, col, mcol, m_input, start


@triton.jit
def store_map(M, b, S, seg, rk, col, mcol, in_b, K, V):
    """Store a column block of segment `seg`'s map (from :func:`map_columns`) into M ``[., K, K]`` or b
    ``[., K, V]``."""
    mask = (rk[:, None] < K) & mcol[None, :]
    if in_b == 0:
        tl.store(M + seg * K * K + rk[:, None] * K + col[None, :], S, mask=mask)
    else:
        tl.store(b + seg * K * V + rk[:, None] * V + col[None, :], S, mask=mask)


@triton.jit
def segment_summary_kernel(
    k, w, u, g, M, b,
    T, NT, SEG,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """One segment of SEG chunks of one (batch, head) as an affine map of its start state,
    ``S_end = M S_start + b``, for one block of columns of ``[M | b]``: the walk's own step from ``[I | 0]``, with
    U = 0 in the columns of M (the map is linear in U, and each column of the state evolves on its own)."""
    i_c = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_p = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, BK)
    rc = tl.arange(0, C)
    mk = rk < K
    dt = k.dtype.element_ty
    in_b, col, mcol, mu, S = map_columns(i_c, rk, K, V, BK, BV)
    n0 = i_p * SEG
    for n in range(n0, tl.minimum(n0 + SEG, NT)):
        t = n * C + rc
        mt = t < T
        row = (i_b * T + t).to(tl.int64) * H + i_h
        mtk = mt[:, None] & mk[None, :]
        kT = tl.load(k + row[None, :] * K + rk[:, None], mask=mk[:, None] & mt[None, :], other=0.0)
        wc = tl.load(w + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
        uc = tl.load(u + row[:, None] * V + col[None, :], mask=mt[:, None] & mu[None, :], other=0.0)
        gc = tl.load(g + row, mask=mt, other=0.0).to(tl.float32)
        _, _, S = _chunk_step(S, kT, wc, uc, gc, dt, PREC)
    store_map(M, b, S, i_p.to(tl.int64) * tl.num_programs(1) + i_bh, rk, col, mcol, in_b, K, V)


def launch_config(V: int, heads: int, BK: int = TUNED_K, NT: int | None = None) -> tuple[int, int, int]:
    """``(V block, warps, stages)`` of the walk for `heads` walks side by side (B*H, times the segments or packed
    sequences), the shortest of `NT` chunks: LAUNCH's wide block
    (64/4/4), or its small one (16/4/3) below V = 64 or when 64-column blocks give under
    ``LAUNCH["min_programs"]`` programs (never 32 columns, never 16 columns in one stage: see LAUNCH); with fewer
    chunks than that config's stages, the same block in 2 stages (the pipelined walk faulted at one chunk on the
    H200: chunk_split.py). Those were measured at the padded head size `BK` = wy.TUNED_K; at other sizes the walk
    takes state_fwd's gated 64/8/1 (16/4/2 below V = 64)."""
    if BK != TUNED_K:
        return (64, 8, 1) if padded(V) >= 64 else (LAUNCH["small_block_v"], LAUNCH["small_warps"], 2)
    wide = LAUNCH["block_v"]
    if padded(V) >= wide and heads * triton.cdiv(V, wide) >= LAUNCH["min_programs"]:
        cfg = wide, LAUNCH["warps"], LAUNCH["stages"]
    else:
        cfg = LAUNCH["small_block_v"], LAUNCH["small_warps"], LAUNCH["small_stages"]
    return cfg if NT is None or cfg[2] <= NT else (cfg[0], cfg[1], 2)


def walk_segments(NT: int, segments: int) -> tuple[int, int]:
    """``(chunks a segment, segments)`` for at most `segments` segments of whole chunks over `NT` chunks (fewer
    when the chunks run out; ``(NT, 1)``: the serial walk)."""
    seg = triton.cdiv(NT, max(1, segments))
    return seg, triton.cdiv(NT, seg)


def walk_grid(
    packed: Packing | None, B: int, seg: int, P: int
) -> tuple[torch.Tensor | None, torch.Tensor | None, int, int, int]:
    """``(starts, order, walks, shortest, rows)`` of a walk launch: the packed tables (None when dense), the
    programs side by side on grid axis 2 (`P` segments of `seg` chunks, or one per packed sequence), the fewest
    chunks a program walks (which bounds its stages), and the rows of its initial and final states (`B`, or one per
    sequence)."""
    if packed is None:
        return None, None, P, seg, B
    return packed.starts, packed.order, packed.n, packed.shortest, packed.n


def compose_segments(M: torch.Tensor, b: torch.Tensor, first: torch.Tensor, *, reverse: bool) -> torch.Tensor:
    """What enters each of P segments ``[P, B*H, K, V]`` fp32, from `first` (what enters the first segment walked,
    ``[B*H, K, V]``) and the segment maps ``x -> M x + b`` (M ``[P - 1, B*H, K, K]``, b ``[P - 1, B*H, K, V]``):
    forward, map p leads from segment p to p + 1; `reverse` (the backward walk), map p - 1 from segment p to p - 1.
    Composed in float64: tiny products, and no TF32 a caller may have allowed for float32 matmuls."""
    P = M.shape[0] + 1
    entering = b.new_empty(P, *first.shape)
    x = first.double()
    order = range(P - 1, -1, -1) if reverse else range(P)
    for i, p in enumerate(order):
        entering[p] = x
        if i < P - 1:
            m = p - 1 if reverse else p
            x = torch.baddbmm(b[m].double(), M[m].double(), x)
    return entering


def state_walk(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    g: torch.Tensor,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    config: tuple[int, int, int] | None = None,
    segments: int = 1,
    packed: Packing | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launch the state walk.

    With `segments` > 1 the chunks are cut into that many runs walked side by side, for few heads on a long
    sequence (at 1 x 32768 x 16 the serial walk is 512 dependent steps on 128 programs), in three passes: (1) each
    segment's affine map ``S_end = M S_start + b`` (``segment_summary_kernel``: the walk's step over K + V columns,
    all segments at once); (2) the segments' start states (:func:`compose_segments`); (3) the walk of every segment
    from its start, all at once, storing h and v_new as the serial walk does. Three walks' work instead of one, on
    `segments` times the programs. The states at segment starts differ from the serial walk's by rounding only
    (their M carries the step's bf16 state rounding, as the serial walk's own state does).

    Args:
        k: ``[B, T, H, K]``; w: ``[B, T, H, K]`` and u: ``[B, T, H, V]`` from ``wy_fwd``; g: ``[B, T, H]`` fp32
            log-decay; initial_state: ``[B, H, K, V]`` fp32 or None; config: ``(V block, warps, stages)`` in
            place of ``launch_config``'s (for tuning scripts; None in the library); segments: at most this many
            segments (:func:`walk_segments`; 1: the serial walk); packed: N sequences laid out chunk-aligned in a
            batch of one (:class:`Packing`), the initial and final states ``[N, H, K, V]``; each sequence walked
            by programs of its own (grid axis 2), never segmented.

    Returns:
        ``(h, v_new, final_state)``: h ``[B, NT, H, K, V]`` (state at each chunk's start) and v_new
        ``[B, T, H, V]`` in the inputs' dtype; final_state ``[B, H, K, V]`` fp32, or None.
    """
    B, T, H, K = k.shape
    V = u.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    seg, P = walk_segments(NT, segments if packed is None else 1)
    starts, order, walks, shortest, rows = walk_grid(packed, B, seg, P)
    BK = padded(K)
    BV, warps, stages = config or launch_config(V, B * H * walks, BK, shortest)
    h = k.new_empty(B, NT, H, K, V)
    vnew = torch.empty_like(u)
    ht = k.new_empty(rows, H, K, V, dtype=torch.float32) if output_final_state else None
    start = initial_state
    if P > 1:
        BVs = min(BV, BK)  # the summary's column block: a divisor of BK, so that a block is all M or all b
        M = k.new_empty(P - 1, B * H, K, K, dtype=torch.float32)
        b = k.new_empty(P - 1, B * H, K, V, dtype=torch.float32)
        segment_summary_kernel[(BK // BVs + triton.cdiv(V, BVs), B * H, P - 1)](
            k, w, u, g, M, b, T, NT, seg,
            H=H, K=K, V=V, BK=BK, BV=BVs, C=CHUNK, PREC=dot_precision(k.dtype),
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
        first = initial_state.reshape(B * H, K, V) if initial_state is not None else b.new_zeros(B * H, K, V)
        start = compose_segments(M, b, first, reverse=False)
    state_walk_kernel[(triton.cdiv(V, BV), B * H, walks)](
        k, w, u, g, start, h, vnew, ht, starts, order, T, NT, seg,
        H=H, K=K, V=V, BK=BK, BV=BV, C=CHUNK,
        HAS_H0=start is not None, STORE_FINAL=output_final_state, PREC=dot_precision(k.dtype), SEGMENTED=P > 1,
        VARLEN=packed is not None, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return h, vnew, ht
