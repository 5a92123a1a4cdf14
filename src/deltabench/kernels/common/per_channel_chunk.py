"""The chunked delta rule with a per-channel decay, an erase strength per key channel and a write strength per
value channel (GDN-2's form; KDA is the case b = w = beta). Float32 inside.

Derivation. Per token ``S_t = Diag(exp g_t) S_{t-1} + k_t u_t^T`` with ``u_t = w_t * v_t - r_t`` and
``r_t = (Diag(exp g_t) S_{t-1})^T (b_t * k_t)``. In a chunk from state ``S0``, with per-channel cumulative
log-decay ``G_i`` (a K-vector), ``S_i = Diag(exp G_i) S0 + sum_{j<=i} Diag(exp(G_i - G_j)) k_j u_j^T``, so

    r_i = S0^T (exp(G_i) * b_i * k_i) + sum_{j<i} A_ij u_j,    A_ij = sum_c b_ic k_ic k_jc exp(G_ic - G_jc)

and ``(I + A) U = (w * V) - (exp(G) * b * K) S0``: ``U = U0 - W S0`` with ``U0 = (I + A)^-1 (w * V)`` and
``W = (I + A)^-1 (exp(G) * b * K)``. Then

    O = (exp(G) * Q) S0 scale + A_qk U,   A_qk[i, j] = scale sum_c q_ic k_jc exp(G_ic - G_jc)  (i >= j)
    S <- Diag(exp G_C) S0 + (exp(G_C - G) * K)^T U.

The pairwise decays ``exp(G_ic - G_jc)`` are formed explicitly (``[C, C, K]`` per chunk) rather than factored
into ``exp(G) q`` and ``exp(-G) k``, which overflows when the decay is strong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .chunking import merge_chunks, pairwise_decay, split_chunks
from .delta_chunk import chunk_scan, ut_solve

if TYPE_CHECKING:
    from .varlen import ChunkLayout

__all__ = ["per_channel_delta_chunk"]


def per_channel_delta_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    chunk_size: int,
    runs: ChunkLayout | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel chunked delta rule; arguments as GDN-2's (shapes already checked, scale resolved).

    Args:
        q, k, g, b: ``[B, T, H, K]`` (b may be an expanded view).
        v, w: ``[B, T, H, V]`` (w may be an expanded view).
        scale: the query scale.
        initial_state: ``[B, H, K, V]`` or None.
        chunk_size: C.
        runs: packed sequences on a chunk-aligned row (varlen.run_chunk_aligned): each walked from its own row
            of the initial state ``[S, H, K, V]``.

    Returns:
        ``(o, final_state)``: float32 ``[B, T, H, V]`` and ``[B, H, K, V]`` (``[S, H, K, V]`` with `runs`).
    """
    T = q.shape[1]
    qc, kc, gc, bc = (split_chunks(x, chunk_size) for x in (q, k, g, b))  # [B, H, N, C, K]
    vc, wc = split_chunks(v, chunk_size), split_chunks(w, chunk_size)  # [B, H, N, C, V]
    G = gc.cumsum(-2)
    decay = pairwise_decay(G, per_channel=True)  # [B, H, N, C, C, K]
    qs = qc * scale
    # Both score matrices contract the same decayed keys, Dk[i, j, c] = exp(G_ic - G_jc) k_jc, with a row vector of
    # token i (b_i * k_i for the UT transform, scale * q_i for the output): one batched matmul over (.., i) reads
    # the [C, C, K] tensor once for the two (measured ~1.6x faster than two three-operand einsums, fwd+bwd).
    decayed_keys = decay * kc[..., None, :, :]  # [B, H, N, C, C, K]
    scores = decayed_keys @ torch.stack((bc * kc, qs), dim=-1)  # [B, H, N, C, C, 2]
    a_kk, a_qk = scores[..., 0].tril(-1), scores[..., 1]
    u0, w_corr = ut_solve(a_kk, wc * vc, G.exp() * bc * kc)
    q_dec = G.exp() * qs
    k_dec = (G[..., -1:, :] - G).exp() * kc
    decay_last = G[..., -1, :].exp()[..., None]  # [B, H, N, K, 1]
    o, final_state = chunk_scan(u0, w_corr, q_dec, a_qk, k_dec, decay_last, initial_state, runs)
    return merge_chunks(o, T), final_state
