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

The layout is kernels/common/varlen.py's (``run_chunk_aligned``: kept per cu_seqlens tensor; one copy into it and
one out, the pads alone zeroed).
"""

from __future__ import annotations

import torch

from ...common.varlen import run_chunk_aligned
from . import walk
from .inputs import prepare_chunk_inputs
from .local_bwd import local_bwd
from .output import chunk_output
from .state import state_bwd, state_fwd
from .walk import Packing
from .wy import CHUNK, wy_fwd

__all__ = ["packed_chunk_gated_delta_rule"]


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
    return run_chunk_aligned(
        _packed_rows, q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state, chunk_size=CHUNK,
        scale=scale, split=split,
    )  # fmt: skip


def _packed_rows(q, k, v, g, beta, *, scale, initial_state, chunk_size, runs, split):  # type: ignore[no-untyped-def]
    """The chunk-aligned row (varlen.run_chunk_aligned; chunk_size is CHUNK) through :class:`_PackedChunkFunction`,
    each sequence walked on its chunks (walk.Packing)."""
    scale, tensors, initial_state, _ = prepare_chunk_inputs("triton_chunk", q, k, v, g, beta, scale, initial_state)
    packing = Packing(runs.starts, runs.order, len(runs.counts), min(runs.counts))
    return _PackedChunkFunction.apply(*tensors, scale, initial_state, packing, split)
