"""Chunked Gated DeltaNet in Triton with its forward path picked by shape (impl ``triton_chunk_auto``).

Two forwards compute the same function and store the same tensors for the same backward (chunk.py's):

- ``fused``: chunk.py's, the outputs inside the chunk-serial walk (3 launches: WY inverse, WY apply, walk);
- ``split``: chunk_split.py's, walk then a fully parallel output kernel (4 launches), optionally with the walks
  (forward and backward) cut into ``segments`` runs walked side by side (walk.py ``state_walk``).

The rule (:func:`pick`), from one process on the H200 each (benchmarks/gpu/gdn_h16.py, 2026-12-03; bf16,
K = V = 128), in chunk-heads ``B * H * ceil(T / 64)`` and sequences ``B * H``:

- few chunk-heads (<= ``RULE["fused_max_chunk_heads"]``) or one chunk: ``fused``. At 1x1024x6 (96 chunk-heads)
  the fused forward took 0.124 ms against the split's 0.158-0.44 (launch-bound, noisy between processes: its
  launches are the cost there); at 4x4096x6 (1536) the split took 0.345 against the fused 0.541. The threshold
  sits between the two measured points (nothing measured between 96 and 1536).
- few sequences over many chunks (B*H <= ``RULE["segment_max_heads"]``, at least ``RULE["segment_min_chunks"]``
  chunks): ``split`` with ``RULE["segments"]`` segments. Off (``segment_max_heads`` 0): with the v3 walks (FLA's
  step form, deeper pipelines) the serial walks won at 1x32768x16, the one shape where segments had paid
  (fwd 1.311 / fwd+bwd 4.974 ms serial against 1.383 / 5.408 with 8 segments, 1.292 / 5.200 with 4; before v3,
  8 segments 1.671 / 5.267 against 2.071 / 5.879). Kept as a rule for longer sequences, to be measured there.
- everything else: ``split``, serial walks.
"""

from __future__ import annotations

import torch

from .chunk import ChunkGatedDeltaRuleFunction, chunk_gdn_bwd, chunk_gdn_fwd, prepare_chunk_inputs, save_for_chunk_bwd
from .chunk_split import chunk_split_fwd
from .wy import CHUNK

__all__ = ["RULE", "chunk_gated_delta_rule_auto", "gdn_triton_chunk_auto", "pick"]

RULE = {"fused_max_chunk_heads": 384, "segment_max_heads": 0, "segment_min_chunks": 256, "segments": 8}


def pick(B: int, T: int, H: int) -> tuple[str, int]:
    """``(path, segments)`` for a call with B sequences of T tokens and H heads (see the module's docstring)."""
    NT = -(-T // CHUNK)
    if B * H * NT <= RULE["fused_max_chunk_heads"] or NT <= 1:
        return "fused", 1
    if B * H <= RULE["segment_max_heads"] and NT >= RULE["segment_min_chunks"]:
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
    B, T, H, _ = q.shape
    path, segments = pick(B, T, H)
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Registry entry (impl ``triton_chunk_auto``): ``chunk_gated_delta_rule_auto`` with the final state."""
    return chunk_gated_delta_rule_auto(q, k, v, g, beta, scale, initial_state, output_final_state=True)
