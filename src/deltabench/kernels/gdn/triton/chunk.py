"""Chunked Gated DeltaNet in Triton: forward and backward, chunk C = 64.

Layout (FLA's): q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]`` (g a log-decay <= 0,
kept in fp32); state ``[B, H, K, V]`` fp32. Per token, for each (b, h)::

    S <- exp(g_t) S;   u = beta_t (v_t - S^T k_t);   S <- S + k_t u^T;   o_t = S^T (scale q_t)

The forward runs two kernels: wy.py (per chunk and head: in-chunk decay, the triangular solve
``(I + A)^{-1}`` in IEEE fp32, and the W/U factors) and state.py (per head and V block, chunk by chunk:
the state recurrence and the output in the same pass). The backward runs two more: state.py's reverse
walk (state gradients and the new values' gradient) and local_bwd.py (every input gradient of a chunk in
one program). Products take the inputs' dtype with fp32 accumulation; fp32 inputs use IEEE products.
"""

from __future__ import annotations

import torch

from . import walk
from .inputs import prepare_chunk_inputs
from .local_bwd import local_bwd
from .state import state_bwd, state_fwd
from .wy import wy_fwd

__all__ = ["chunk_gated_delta_rule", "gdn_triton_chunk"]


def chunk_gdn_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, keep_for_backward):
    """Forward orchestrator: returns ``(o, final_state, saved)``; `saved` holds what the backward reads."""
    L, w, u = wy_fwd(k, v, g, beta)
    o, ht, h, vnew = state_fwd(q, k, w, u, g, scale, initial_state, output_final_state, keep_for_backward)
    return o, ht, (L, w, h, vnew)


def chunk_gdn_bwd(q, k, v, g, beta, scale, saved, do, dht, segments=None):
    """Backward orchestrator: returns ``(dq, dk, dv, dg, dbeta, dh0)``. `segments`: the backward walk's
    (walk.SEGMENTS when None)."""
    L, w, h, vnew = saved
    segments = walk.SEGMENTS if segments is None else segments
    dh, dvnew, dh0 = state_bwd(q, k, w, g, do, dht, scale, segments=segments)
    dq, dk, dv, dg, dbeta = local_bwd(q, k, v, g, beta, L, h, dh, vnew, dvnew, do, scale)
    return dq, dk, dv, dg, dbeta, dh0


def save_for_chunk_bwd(ctx, inputs, saved, scale, initial_state) -> None:  # type: ignore[no-untyped-def]
    """Keep what :meth:`ChunkGatedDeltaRuleFunction.backward` reads: the inputs, the forward's saved stages (L, W,
    per-chunk states, new values), the scale, beta's dtype and whether an initial state was given."""
    ctx.save_for_backward(*inputs, *saved)
    ctx.scale = scale
    ctx.beta_dtype = inputs[-1].dtype
    ctx.has_h0 = initial_state is not None


class ChunkGatedDeltaRuleFunction(torch.autograd.Function):
    """autograd wrapper: stores L, W, per-chunk states and new values; recomputes nothing else."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, output_final_state):
        o, ht, saved = chunk_gdn_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, True)
        save_for_chunk_bwd(ctx, (q, k, v, g, beta), saved, scale, initial_state)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, *saved = ctx.saved_tensors
        dq, dk, dv, dg, dbeta, dh0 = chunk_gdn_bwd(
            q, k, v, g, beta, ctx.scale, saved, do.contiguous(), None if dht is None else dht.contiguous()
        )
        return dq, dk, dv, dg, dbeta.to(ctx.beta_dtype), None, dh0 if ctx.has_h0 else None, None


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked Gated DeltaNet (Triton), differentiable in every input.

    Args:
        q: ``[B, T, H, K]`` queries, used as given (no L2 normalisation inside).
        k: ``[B, T, H, K]`` keys, used as given.
        v: ``[B, T, H, V]`` values.
        g: ``[B, T, H]`` log-decay (<= 0), fp32 recommended.
        beta: ``[B, T, H]`` write strength.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]`` state before the first token (fp32).
        output_final_state: return the ``[B, H, K, V]`` fp32 state after the last token.

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in v's dtype; final_state or None.

    K and V may be any size up to 256 (tiles are padded to a power of two, at least 16); any B, T, H.

    Examples::

        >>> B, T, H, K, V = 2, 100, 4, 64, 64
        >>> q = torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).bfloat16()
        >>> k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).bfloat16()
        >>> v = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)
        >>> g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda"))
        >>> beta = torch.rand(B, T, H, device="cuda", dtype=torch.bfloat16)
        >>> o, ht = chunk_gated_delta_rule(q, k, v, g, beta)
    """
    scale, (q, k, v, g, beta), initial_state, needs_grad = prepare_chunk_inputs(
        "chunk_gated_delta_rule", q, k, v, g, beta, scale, initial_state
    )
    if needs_grad:
        return ChunkGatedDeltaRuleFunction.apply(q, k, v, g, beta, scale, initial_state, output_final_state)
    o, ht, _ = chunk_gdn_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, False)
    return o, ht


def gdn_triton_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Registry entry (impl ``triton_chunk``): ``chunk_gated_delta_rule`` with the final state returned.
    ``cu_seqlens``: packed sequences, each on chunks of its own (triton/varlen.py)."""
    if cu_seqlens is not None:
        from .varlen import packed_chunk_gated_delta_rule

        return packed_chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, cu_seqlens)
    return chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state=True)
