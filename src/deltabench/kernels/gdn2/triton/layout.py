"""What GDN-2's Triton forward (:mod:`.chunk`) and backward (:mod:`.chunk_bwd`) share: the chunk and row-block
sizes, the forward's launch table (the backward's reverse walk takes the forward walk's), and the two row helpers.
A module of its own so that the backward reads them without importing the forward, which imports the backward."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.varlen import ChunkLayout

__all__ = ["CHUNK", "LAUNCH", "SUB", "grid_place", "rows_of", "tile_of", "walk_place", "walk_tables"]

CHUNK = 64
SUB = 16  # row block of the scores and of the blockwise inverse
# Fixed launch configs (no autotuning), the best of each setting varied alone on the H200 (2026-12-05,
# benchmarks/gpu/gdn2_triton.py --sweep [--bwd]). scores: a program per 16-row block at 1 warp (2.85 / 1.17 / 2.95 ms
# against 3.06 / 1.38 / 3.46 at 2 for gdn2 4x8192x16, kda 8x4096x6 and 4x8192x16, 1.19 against 1.17 at gdn2 8x4096x6)
# (the diagonal block key row by key row, its columns stored as made; the blocks left of it 32 channels a step: a
# whole head's tiles spilled); inverse: 1 warp, as GDN's inverse kernel; apply: GDN's apply kernel's (128-column
# blocks, 4 warps); walk: 64-column V blocks at 4 warps (16 columns when V is under 64: 32-column blocks faulted in
# GDN's walk on the H200, kernels/gdn/triton/state.py), reading exp(G) q and exp(G_C - G) k made by the apply kernel
# (not G's two [C, K] fp32 tiles and their exponentials every chunk: 1.50 against 1.73 ms at gdn2
# 8x4096x6). The scores and the inverse were one kernel until 2026-12-05: 2.17 of the forward's 3.04 ms there, 255
# registers and 992 stack bytes; every pair of the diagonal block at once ([16, 16, 32] tiles) was 2.04 against 1.50
# ms; its 16 key-row steps unrolled 1.81 against 1.32 ms at gdn2 8x4096x6 (H100, 2026-12-05).
LAUNCH = {
    "scores_warps": 1,
    "scores_far_cols": 32,
    "inverse_warps": 1,
    "apply_cols": 128,
    "apply_warps": 4,
    "walk_block_v": 64,
    "walk_warps": 4,
}


@triton.jit
def grid_place(H: tl.constexpr, C: tl.constexpr):
    """A program's place on a (block, chunk, batch*head) grid: ``(block, chunk's first token, batch, head)``."""
    i_bh = tl.program_id(2)
    return tl.program_id(0), tl.program_id(1) * C, i_bh // H, i_bh % H


def walk_tables(packed: ChunkLayout | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The walks' ``(starts, order)`` arguments (:func:`walk_place`): the packed layout's tables, or None twice."""
    return (None, None) if packed is None else (packed.starts, packed.order)


@triton.jit
def walk_place(starts, order, NT, H: tl.constexpr, PACKED: tl.constexpr):
    """A walk program's ``(batch row, head, first chunk, end chunk, state row)`` on a (V block, batch*head) grid,
    the state row its row of the states seen as ``[rows*H, K, V]``; PACKED: axis 1 is (place, head) over one
    chunk-aligned row, the place's sequence ``s = order[place]`` (longest first) walking chunks
    ``[starts[s], starts[s + 1])`` from and to row s of the states."""
    i_bh = tl.program_id(1)
    if PACKED:
        s = tl.load(order + i_bh // H)
        return 0, i_bh % H, tl.load(starts + s), tl.load(starts + s + 1), s * H + i_bh % H
    else:
        return i_bh // H, i_bh % H, 0, NT, i_bh


@triton.jit
def rows_of(t0, sub, T, i_b, i_h, H: tl.constexpr, Tp, BC: tl.constexpr):
    """Rows [t0 + sub*BC, +BC) of one head: ``(row in [B, T, H], row in the padded G [B, Tp, H], t < T)``."""
    t = t0 + sub * BC + tl.arange(0, BC)
    row = (i_b * T + t).to(tl.int64) * H + i_h
    grow = (i_b * Tp + t).to(tl.int64) * H + i_h
    return row, grow, t < T


@triton.jit
def tile_of(x, row, mt, rk, K: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr):
    """fp32 tile ``x[row, rk]`` (rows t >= T and columns >= K zero) with row and column strides SR, SC."""
    return tl.load(x + row[:, None] * SR + rk[None, :] * SC, mask=mt[:, None] & (rk[None, :] < K), other=0.0).to(
        tl.float32
    )
