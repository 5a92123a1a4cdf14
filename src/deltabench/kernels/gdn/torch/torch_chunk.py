"""Chunked Gated DeltaNet in PyTorch (WY representation / UT transform), float32 inside.

Layout: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]``; state ``[B, H, K, V]``; g is a
log-decay (<= 0) in float32.

Derivation. In a chunk starting from state ``S0``, with ``G_i = g_1 + ... + g_i`` (cumulative within the chunk),
the recurrence unrolls to ``S_i = exp(G_i) S0 + sum_{j<=i} exp(G_i - G_j) k_j u_j^T`` and the corrections obey
``u_i = beta_i (v_i - exp(G_i) S0^T k_i - sum_{j<i} exp(G_i - G_j) (k_i . k_j) u_j)``, i.e.

    (I + A) U = beta V - beta exp(G) K S0,    A = tril(diag(beta) (K K^T * exp(G_i - G_j)), -1)

so ``U = U0 - W S0`` with ``U0 = (I + A)^-1 (beta V)`` and ``W = (I + A)^-1 (beta exp(G) K)``; then

    O = (Q exp(G)) S0 scale + tril(Q K^T * exp(G_i - G_j)) U scale,    S <- exp(G_C) S0 + (K exp(G_C - G))^T U.

Everything but the scan over chunks is computed for all chunks, batches and heads at once.
"""

from __future__ import annotations

import torch

from ...common import chunk_scan, merge_chunks, pairwise_decay, split_chunks, ut_solve
from ...common.varlen import ChunkLayout, run_chunked

__all__ = ["gdn_torch_chunk"]


def gdn_torch_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet by chunks of `chunk_size` tokens, any T (a partial last chunk is zero-padded, exactly).

    Computes the same as :func:`deltabench.kernels.gdn.torch.torch_recurrent.gdn_torch_recurrent`; inputs are upcast
    to float32, the output is cast to ``v.dtype``. Backward is autograd.

    Args:
        q, k: ``[B, T, H, K]`` queries and keys.
        v: ``[B, T, H, V]`` values.
        g: ``[B, T, H]`` log-decay (<= 0).
        beta: ``[B, T, H]`` write strength.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]``.
        chunk_size: C, default 64.
        cu_seqlens: int32 ``[N + 1]`` offsets of N sequences packed along T (B = 1); the states are then
            ``[N, H, K, V]``, each sequence on chunks of its own (kernels/common/varlen.run_chunk_aligned).

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in ``v.dtype`` and ``[B, H, K, V]`` float32.

    Examples::

        >>> from deltabench.references.gdn import make_inputs
        >>> x = make_inputs(2, 200, 4, 64, 64, dtype=torch.bfloat16)
        >>> o, ht = gdn_torch_chunk(**x)
    """
    return run_chunked("gdn", _gdn_chunk, q, k, v, {"g": g, "beta": beta}, scale, initial_state, chunk_size, cu_seqlens)


def _gdn_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    chunk_size: int,
    runs: ChunkLayout | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked rule on checked inputs (scale resolved): float32 ``(o [B, T, H, V], final_state)``; with
    `runs`, packed sequences on a chunk-aligned row, each from its own state row (delta_chunk.chunk_scan)."""
    T = q.shape[1]
    qc, kc, vc = (split_chunks(x, chunk_size) for x in (q, k, v))  # [B, H, N, C, K|V]
    gc, bc = split_chunks(g, chunk_size), split_chunks(beta, chunk_size)  # [B, H, N, C]
    G = gc.cumsum(-1)
    decay = pairwise_decay(G, per_channel=False)  # [B, H, N, C, C]
    a_kk = bc[..., None] * (kc @ kc.transpose(-1, -2) * decay).tril(-1)
    u0, w = ut_solve(a_kk, bc[..., None] * vc, (bc * G.exp())[..., None] * kc)
    qs = qc * scale
    a_qk = qs @ kc.transpose(-1, -2) * decay
    q_dec = G.exp()[..., None] * qs
    k_dec = (G[..., -1:] - G).exp()[..., None] * kc
    decay_last = G[..., -1].exp()[..., None, None]  # [B, H, N, 1, 1]
    o, final_state = chunk_scan(u0, w, q_dec, a_qk, k_dec, decay_last, initial_state, runs)
    return merge_chunks(o, T), final_state
