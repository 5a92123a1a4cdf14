"""Packed sequences (FLA's ``cu_seqlens``) through the chunked Triton GDN kernels, each sequence on chunks of its
own.

The N sequences of a batch of one are laid out chunk-aligned: sequence i starts at chunk ``c_i`` (the chunks of the
ones before it, each ``ceil(len / 64)``), its last chunk zero-padded, so no chunk holds two sequences. The chunk-local
stages (wy.py's WY/UT factors, local_bwd.py's gradients) then run as they are: a zero token has no decay and writes
nothing. The sequential stages (state.py, walk.py) run one program per (V block, head, sequence), each walking only
its sequence's chunks ``[c_i, c_(i+1))`` (walk.Packing) from its row of the initial state (the backward: from its row
of the final state's gradient, back to its row of the initial state's), so a walk is as long as the longest
sequence, not the row. The layout wastes at most 63 tokens a sequence, where a dense batch padded to the longest
sequence (kernels/common/varlen.py) wastes up to ``N * max - T``.

Moving into and out of the layout costs one copy of each input and of the output (a gather), and the same for
their gradients: the padding rows alone are zeroed, not the whole row first (:class:`_ToChunks`,
:class:`_FromChunks`). The layout of a `cu_seqlens` tensor is kept for the next call given the same tensor
unchanged (:func:`chunk_layout`), as the L layers of a model's step are: reading the offsets to the host waits for
the GPU, and a step would otherwise wait once a layer.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from . import walk
from .inputs import prepare_chunk_inputs
from .local_bwd import local_bwd
from .output import chunk_output
from .state import state_bwd, state_fwd
from .walk import Packing
from .wy import CHUNK, wy_fwd

__all__ = ["ChunkLayout", "chunk_layout", "packed_chunk_gated_delta_rule"]

# The most recent layouts, newest first, each with the cu_seqlens tensor it came from (held, so that its identity
# cannot pass to another tensor) and that tensor's version (an in-place change makes the entry stale)
_RECENT: list[tuple[torch.Tensor, int, int, ChunkLayout]] = []
_RECENT_KEPT = 4


class ChunkLayout(NamedTuple):
    """Where a packing's tokens sit in the chunk-aligned row: `positions` (int64 [T], on the inputs' device) the
    row index of each packed token, `pads` (int64) the row indices no token takes, `packing` each sequence's chunks
    (walk.Packing), `NT` the row's chunks."""

    positions: torch.Tensor
    pads: torch.Tensor
    packing: Packing
    NT: int


def chunk_layout(cu_seqlens: torch.Tensor, T: int) -> ChunkLayout:
    """The chunk-aligned layout of the packed sequences at `cu_seqlens` (:class:`ChunkLayout`); the same object
    for the same tensor, unchanged, at the same T (the last few are kept)."""
    for held, version, held_T, layout in _RECENT:
        if held is cu_seqlens and version == cu_seqlens._version and held_T == T:
            return layout
    from ...common.varlen import seq_offsets

    offsets = seq_offsets(cu_seqlens, T, 1)
    counts = [-(-(eos - bos) // CHUNK) for bos, eos in itertools.pairwise(offsets)]
    starts = list(itertools.accumulate(counts, initial=0))
    bounds = itertools.pairwise(offsets)
    positions = torch.cat(
        [torch.arange(eos - bos) + c * CHUNK for (bos, eos), c in zip(bounds, starts[:-1], strict=True)]
    )
    taken = torch.zeros(starts[-1] * CHUNK, dtype=torch.bool)
    taken[positions] = True
    device = cu_seqlens.device
    packing = Packing(torch.tensor(starts, dtype=torch.int32, device=device), len(counts), min(counts))
    layout = ChunkLayout(positions.to(device), (~taken).nonzero().flatten().to(device), packing, starts[-1])
    _RECENT.insert(0, (cu_seqlens, cu_seqlens._version, T, layout))
    del _RECENT[_RECENT_KEPT:]
    return layout


def _scatter_rows(x: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """`x` ``[1, T, ...]`` in the chunk-aligned row ``[1, NT * C, ...]``: token i at ``positions[i]``, zeros at
    the pads (written there only)."""
    out = x.new_empty(1, layout.NT * CHUNK, *x.shape[2:])
    out.index_copy_(1, layout.positions, x)
    return out.index_fill_(1, layout.pads, 0)


class _ToChunks(torch.autograd.Function):
    """A packed input into the chunk-aligned row; its gradient gathered back."""

    @staticmethod
    def forward(ctx, x, layout):  # type: ignore[no-untyped-def]
        ctx.layout = layout
        return _scatter_rows(x, layout)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad.index_select(1, ctx.layout.positions), None


class _FromChunks(torch.autograd.Function):
    """The chunk-aligned output back to the packed tokens; its gradient scattered, zero at the pads."""

    @staticmethod
    def forward(ctx, y, layout):  # type: ignore[no-untyped-def]
        ctx.layout = layout
        return y.index_select(1, layout.positions)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return _scatter_rows(grad.contiguous(), ctx.layout), None


class _PackedChunkFunction(torch.autograd.Function):
    """The chunked forward and backward on the chunk-aligned row, the states one row per sequence. `split`: the
    forward in chunk_split.py's stages (the walk, then the outputs all at once) when every sequence has more than
    one chunk; with a sequence of one chunk, state.py's fused walk (same arithmetic): on the H200 the split walk's
    pipelined launch faulted on a walk of one chunk (chunk_split.py), and each sequence is a walk of its own."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, packing, split):  # type: ignore[no-untyped-def]
        L, w, u = wy_fwd(k, v, g, beta)
        if split and packing.shortest > 1:
            h, vnew, ht = walk.state_walk(k, w, u, g, initial_state, True, packed=packing)
            o = chunk_output(q, k, g, h, vnew, scale)
        else:
            o, ht, h, vnew = state_fwd(q, k, w, u, g, scale, initial_state, True, True, packed=packing)
        ctx.save_for_backward(q, k, v, g, beta, L, w, h, vnew)
        ctx.scale, ctx.packing, ctx.has_h0, ctx.beta_dtype = scale, packing, initial_state is not None, beta.dtype
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):  # type: ignore[no-untyped-def]
        q, k, v, g, beta, L, w, h, vnew = ctx.saved_tensors
        do = do.contiguous()
        dht = None if dht is None else dht.contiguous()
        dh, dvnew, dh0 = state_bwd(q, k, w, g, do, dht, ctx.scale, packed=ctx.packing)
        dq, dk, dv, dg, dbeta = local_bwd(q, k, v, g, beta, L, h, dh, vnew, dvnew, do, ctx.scale)
        dh0 = dh0 if ctx.has_h0 else None
        return dq, dk, dv, dg, dbeta.to(ctx.beta_dtype), None, dh0, None, None


def packed_chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    split: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked Triton GDN over packed sequences: q, k ``[1, T, H, K]`` ..., int32 `cu_seqlens` ``[N + 1]``, the
    initial state ``[N, H, K, V]`` or None; `split`: chunk_split.py's forward. Returns ``(o [1, T, H, V],
    final_state [N, H, K, V] fp32)``."""
    layout = chunk_layout(cu_seqlens, q.shape[1])
    if initial_state is not None and initial_state.shape[0] != layout.packing.n:
        raise ValueError(f"initial_state has {initial_state.shape[0]} rows for {layout.packing.n} packed sequences")
    scale, tensors, initial_state, _ = prepare_chunk_inputs(
        "triton_chunk", *(_ToChunks.apply(x, layout) for x in (q, k, v, g, beta)), scale, initial_state
    )
    o, ht = _PackedChunkFunction.apply(*tensors, scale, initial_state, layout.packing, split)
    return _FromChunks.apply(o, layout), ht
