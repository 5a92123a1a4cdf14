"""Chunked Gated DeltaNet in Triton with the forward split in three stages (lever 1 of benchmarks/NOTES.md).

Same contract, layout and arithmetic as chunk.py's ``chunk_gated_delta_rule``; only the forward's stages
differ. chunk.py runs the outputs inside the chunk-serial walk (state.py's ``state_fwd``); here:

1. wy.py ``wy_fwd``: per (chunk, head), L = (I + A)^{-1}, then W and U (chunk.py's, two launches);
2. walk.py ``state_walk``: per (V block, head), chunk by chunk, only ``v_new = U - W S`` and the state
   update, storing the state at each chunk's start (h) and v_new;
3. output.py ``chunk_output``: per (chunk, V block, head), all at once, ``o`` from q, k, h and v_new.

The forward stores exactly what chunk.py's forward stores for its backward (L, W, h, v_new), so the
backward is chunk.py's, unchanged (state.py's reverse walk, then local_bwd.py).
"""

from __future__ import annotations

import torch

from . import walk
from .chunk import ChunkGatedDeltaRuleFunction, chunk_gdn_fwd, save_for_chunk_bwd
from .inputs import prepare_chunk_inputs
from .output import chunk_output
from .wy import CHUNK, wy_fwd

__all__ = ["chunk_gated_delta_rule_split", "gdn_triton_chunk_split"]


def chunk_split_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, segments=None):
    """Forward orchestrator: returns ``(o, final_state, saved)``; `saved` is chunk.py's ``(L, W, h, v_new)``.
    `segments`: the walk's (walk.SEGMENTS when None).

    A sequence of one chunk takes chunk.py's forward: there is no walk to split, and on the H200 the walk's
    pipelined launch faulted at one chunk (T = 64, B*H = 2; benchmarks/NOTES.md, "state_bwd at one chunk")."""
    if q.shape[1] <= CHUNK:
        return chunk_gdn_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, keep_for_backward=True)
    L, w, u = wy_fwd(k, v, g, beta)
    segments = walk.SEGMENTS if segments is None else segments
    h, vnew, ht = walk.state_walk(k, w, u, g, initial_state, output_final_state, segments=segments)
    o = chunk_output(q, k, g, h, vnew, scale)
    return o, ht, (L, w, h, vnew)


class ChunkGatedDeltaRuleSplitFunction(ChunkGatedDeltaRuleFunction):
    """autograd wrapper: the split forward stores L, W, per-chunk states and new values; the backward is chunk.py's."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, output_final_state):
        o, ht, saved = chunk_split_fwd(q, k, v, g, beta, scale, initial_state, output_final_state)
        save_for_chunk_bwd(ctx, (q, k, v, g, beta), saved, scale, initial_state)
        return o, ht


def chunk_gated_delta_rule_split(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked Gated DeltaNet (Triton, split forward), differentiable in every input.

    Arguments and results as ``chunk.chunk_gated_delta_rule`` (FLA's order): q, k ``[B, T, H, K]``,
    v ``[B, T, H, V]``, g (log-decay <= 0) and beta ``[B, T, H]``, scale (default ``K ** -0.5``), optional
    fp32 initial_state ``[B, H, K, V]``; returns ``(o, final_state)`` with o in v's dtype and the fp32 final
    state (or None). K and V up to 256; any B, T, H.

    Unlike chunk.py, the forward always keeps the per-chunk states h (``[B, ceil(T/64), H, K, V]`` in the
    inputs' dtype) and v_new in memory, gradients or not: the output stage reads them.

    Examples::

        >>> q = torch.nn.functional.normalize(torch.randn(2, 100, 4, 64, device="cuda"), dim=-1).bfloat16()
        >>> k = torch.nn.functional.normalize(torch.randn(2, 100, 4, 64, device="cuda"), dim=-1).bfloat16()
        >>> v = torch.randn(2, 100, 4, 64, device="cuda", dtype=torch.bfloat16)
        >>> g = torch.nn.functional.logsigmoid(torch.randn(2, 100, 4, device="cuda"))
        >>> beta = torch.rand(2, 100, 4, device="cuda", dtype=torch.bfloat16)
        >>> o, ht = chunk_gated_delta_rule_split(q, k, v, g, beta)
    """
    scale, (q, k, v, g, beta), initial_state, needs_grad = prepare_chunk_inputs(
        "chunk_gated_delta_rule_split", q, k, v, g, beta, scale, initial_state
    )
    if needs_grad:
        return ChunkGatedDeltaRuleSplitFunction.apply(q, k, v, g, beta, scale, initial_state, output_final_state)
    o, ht, _ = chunk_split_fwd(q, k, v, g, beta, scale, initial_state, output_final_state)
    return o, ht


def gdn_triton_chunk_split(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Registry entry (impl ``triton_chunk_split``): ``chunk_gated_delta_rule_split`` with the final state.
    ``cu_seqlens``: packed sequences, each on chunks of its own, walked in one launch (triton/varlen.py)."""
    if cu_seqlens is not None:
        from .varlen import packed_chunk_gated_delta_rule

        return packed_chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, cu_seqlens, split=True)
    return chunk_gated_delta_rule_split(q, k, v, g, beta, scale, initial_state, output_final_state=True)
