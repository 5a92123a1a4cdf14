"""Chunked Gated DeltaNet in Triton with its forward path picked by shape (impl ``triton_chunk_auto``).

Two forwards compute the same function and store the same tensors for the same backward (chunk.py's):

- ``fused``: chunk.py's, the outputs inside the chunk-serial walk (3 launches: WY inverse, WY apply, walk);
- ``split``: chunk_split.py's, walk then a fully parallel output kernel (4 launches), optionally with the walks
  (forward and backward) cut into ``segments`` runs walked side by side (walk.py ``state_walk``).

The rule (:func:`pick`), from one process on the H200 (benchmarks/gpu/gdn_h16.py, 2026-12-03 21:44 UTC; bf16,
K = V = 128, every impl checked against torch_chunk fp32 first; ms fwd, best of two do_bench medians), in the
programs of the fused walk's 64-column V blocks, ``B * H * ceil(V / 64)``:

- at the head size the fused walk was tuned at (``RULE["fused_head_size"]`` = wy.TUNED_K) with at least
  ``RULE["fused_min_programs"]`` programs, or a single chunk: ``fused``. 8x4096x6 (96 programs): fused 0.339
  against split 0.375; 4x8192x16 (128): 0.785 against 0.874 (the fused walk writes no per-chunk states without
  gradients, and never reads them back).
- otherwise ``split``: 1x32768x16 (32 programs): split 1.316 against fused 1.990; 4x4096x6 (48): 0.259 against
  0.289; 1x1024x6 (12): 0.171 against 0.209, launch-bound and within the spread between processes there (the same
  pair read 0.158 / 0.124 in an earlier process). At other head sizes the fused walk keeps its gated 64/8/1
  launch, which lost to the split forward before (8x4096x6: 0.678 against 0.577).
- walk segments (split only) for few sequences over many chunks (B*H <= ``RULE["segment_max_heads"]``, at least
  ``RULE["segment_min_chunks"]`` chunks): ``RULE["segments"]``. Off (``segment_max_heads`` 0): with the v3 walks
  the serial walks won at 1x32768x16, the one train shape where segments had paid (fwd 1.311 / fwd+bwd 4.974 ms
  serial against 1.383 / 5.408 with 8 segments, 1.292 / 5.200 with 4; before v3 8 segments 1.671 / 5.267 against
  2.071 / 5.879). Kept as a rule for longer sequences, to be measured there.

The backward is the same for both forwards (chunk.py's), so fwd+bwd moves with the forward alone.
"""

from __future__ import annotations

import torch

from ...common.triton.mma import padded
from .chunk import ChunkGatedDeltaRuleFunction, chunk_gdn_bwd, chunk_gdn_fwd, save_for_chunk_bwd
from .chunk_split import chunk_split_fwd
from .inputs import prepare_chunk_inputs
from .wy import CHUNK, TUNED_K

__all__ = ["RULE", "chunk_gated_delta_rule_auto", "gdn_triton_chunk_auto", "pick"]

RULE = {
    "fused_head_size": TUNED_K, "fused_min_programs": 96,
    "segment_max_heads": 0, "segment_min_chunks": 256, "segments": 8,
}  # fmt: skip


def pick(B: int, T: int, H: int, K: int = 128, V: int = 128) -> tuple[str, int]:
    """``(path, segments)`` for B sequences of T tokens, H heads, head sizes K and V (see the module's docstring)."""
    NT = -(-T // CHUNK)
    programs = B * H * -(-V // 64)
    if NT <= 1 or (padded(K) == RULE["fused_head_size"] and programs >= RULE["fused_min_programs"]):
        return "fused", 1
    if RULE["segment_max_heads"] >= B * H and RULE["segment_min_chunks"] <= NT:
        return "split", RULE["segments"]
    return "split", 1


def _forward(path, segments, q, k, v, g, beta, scale, initial_state, output_final_state, keep):
    if path == "fused":
        return chunk_gdn_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, keep)
    return chunk_split_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, segments=segments)


class ChunkGatedDeltaRuleAutoFunction(ChunkGatedDeltaRuleFunction):
    """autograd wrapper: the picked forward, then chunk.py's backward with the same walk segments."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, output_final_state, path, segments):
        o, ht, saved = _forward(path, segments, q, k, v, g, beta, scale, initial_state, output_final_state, True)
        save_for_chunk_bwd(ctx, (q, k, v, g, beta), saved, scale, initial_state)
        ctx.segments = segments
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, *saved = ctx.saved_tensors
        dq, dk, dv, dg, dbeta, dh0 = chunk_gdn_bwd(
            q, k, v, g, beta, ctx.scale, saved, do.contiguous(), None if dht is None else dht.contiguous(),
            segments=ctx.segments,
        )  # fmt: skip
        return dq, dk, dv, dg, dbeta.to(ctx.beta_dtype), None, dh0 if ctx.has_h0 else None, None, None, None


def chunk_gated_delta_rule_auto(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked Gated DeltaNet (Triton), the forward path picked by shape (:func:`pick`); differentiable in every
    input. Arguments and results as ``chunk.chunk_gated_delta_rule`` (FLA's order and layout)."""
    scale, (q, k, v, g, beta), initial_state, needs_grad = prepare_chunk_inputs(
        "chunk_gated_delta_rule_auto", q, k, v, g, beta, scale, initial_state
    )
    B, T, H, K = q.shape
    path, segments = pick(B, T, H, K, v.shape[-1])
    if needs_grad:
        return ChunkGatedDeltaRuleAutoFunction.apply(
            q, k, v, g, beta, scale, initial_state, output_final_state, path, segments
        )
    o, ht, _ = _forward(path, segments, q, k, v, g, beta, scale, initial_state, output_final_state, False)
    return o, ht


def gdn_triton_chunk_auto(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Registry entry (impl ``triton_chunk_auto``): ``chunk_gated_delta_rule_auto`` with the final state.
    ``cu_seqlens``: packed sequences, each on chunks of its own (triton/varlen.py), in the split forward: a packed
    walk ends with its longest sequence, and the split walk's steps are the lighter (H100, 2026-12-05, varlen-h200's
    19 lognormal sequences of 32768 tokens at 16 heads, fwd+bwd: split 5.14 ms, fused 5.49, though :func:`pick`
    takes fused for 19 dense rows of the longest length)."""
    if cu_seqlens is not None:
        from .varlen import packed_chunk_gated_delta_rule

        return packed_chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, cu_seqlens, split=True)
    return chunk_gated_delta_rule_auto(q, k, v, g, beta, scale, initial_state, output_final_state=True)
