"""Gated DeltaNet-2 in JAX: the chunked WY/UT-transform algorithm with per-channel decay, under ``jax.jit``.

Layout: q, k, g, b ``[B, T, H, K]``; v, w ``[B, T, H, V]`` (g a per-channel log-decay <= 0); state
``[B, H, K, V]`` float32. Per token (see references/gdn2.py)::

    S <- Diag(exp g_t) S;  r_t = S^T (b_t * k_t);  S <- S + k_t (w_t * v_t - r_t)^T;  o_t = S^T (scale q_t)

Within a chunk of C = 64 tokens, with ``G`` ``[C, K]`` the cumulative log-decay from the chunk start and ``S0``
the state before it, the writes ``U`` solve ``(I + A) U = W*V - (b*k*exp G) S0`` where
``A_ij = sum_c b_i[c] k_i[c] exp(G_i[c] - G_j[c]) k_j[c]`` (i > j); then
``O = scale ((q*exp G) S0 + P U)`` with ``P_ij = sum_c q_i[c] exp(G_i[c] - G_j[c]) k_j[c]`` (i >= j) and
``S = Diag(exp G_C) S0 + (k*exp(G_C - G))^T U``. The per-channel decays enter pairwise, ``exp(G_i - G_j)`` for
``i >= j`` only (factoring them as ``exp(G_i) * exp(-G_j)`` overflows float32 within a chunk). The pairwise
contraction runs under ``jax.checkpoint`` so that the backward recomputes its ``[C, C, K]`` decays rather than
storing them. Math is float32; o has v's dtype; any T (padding: g = b = w = 0, k = 0). Backward: JAX autodiff.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ...common.jax.jax_bridge import TorchFacingJaxOp
from ...common.jax.jax_wy import causal_mask, from_chunks, masked_exp, pad_time, scan_chunks, to_chunks, ut_transform

__all__ = ["CHUNK", "chunk_gdn2_jax", "gdn2_jax_chunk"]

CHUNK = 64


@functools.partial(jax.checkpoint, static_argnums=(3,))
def _pairwise_scores(G: jax.Array, left: jax.Array, right: jax.Array, strict: bool) -> jax.Array:
    """``sum_c left_i[c] exp(G_i[c] - G_j[c]) right_j[c]`` for ``i > j`` (`strict`) or ``i >= j``, else 0.

    `G`, `left`, `right`: ``[..., C, K]``; returns ``[..., C, C]``. Written as a broadcast product and a sum so
    that XLA fuses exp, product and reduction without materialising the ``[C, C, K]`` decays.
    """
    C = G.shape[-2]
    mask = causal_mask(C, strict=strict)[..., None]
    decay = masked_exp(G[..., :, None, :] - G[..., None, :, :], mask)  # [..., C(i), C(j), K]
    return jnp.sum(left[..., :, None, :] * decay * right[..., None, :, :], axis=-1)


def chunk_gdn2_jax(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    b: jax.Array,
    w: jax.Array,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    chunk_size: int = CHUNK,
) -> tuple[jax.Array, jax.Array]:
    """Chunked Gated DeltaNet-2 in pure JAX (jit it, or use ``gdn2_jax_chunk.jax_fn``).

    Args:
        q, k: ``[B, T, H, K]``.
        v: ``[B, T, H, V]``.
        g: ``[B, T, H, K]`` per-channel log-decay (<= 0).
        b: ``[B, T, H, K]`` erase strength per key channel.
        w: ``[B, T, H, V]`` write strength per value channel.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]``.
        chunk_size: tokens per chunk (default 64).

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in v's dtype and ``[B, H, K, V]`` float32.

    Examples::

        >>> o, ht = jax.jit(chunk_gdn2_jax)(q, k, v, g, b, w)
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    C = chunk_size
    T_pad = -(-T // C) * C
    f32 = jnp.float32
    qc, kc, vc, gc, bc, wc = (to_chunks(pad_time(x.astype(f32), T_pad), C) for x in (q, k, v, g, b, w))

    G = jnp.cumsum(gc, axis=-2)  # [N, B, H, C, K]
    bk = bc * kc
    A = _pairwise_scores(G, bk, kc, True)
    P = _pairwise_scores(G, qc, kc, False)

    expG = jnp.exp(G)
    u_tilde, w_mat = ut_transform(A, wc * vc, bk * expG)
    qd = qc * expG
    kd = kc * jnp.exp(G[..., -1:, :] - G)
    decay = expG[..., -1, :]  # [N, B, H, K]

    h0 = jnp.zeros((B, H, K, V), f32) if initial_state is None else initial_state.astype(f32)
    o, final_state = scan_chunks(u_tilde, w_mat, qd, P, kd, decay, h0, scale)
    return from_chunks(o, T).astype(v.dtype), final_state


gdn2_jax_chunk = TorchFacingJaxOp(chunk_gdn2_jax, name="gdn2/jax_chunk", gates=("g", "b", "w"))
