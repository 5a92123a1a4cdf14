"""Gated DeltaNet in JAX: the chunked WY/UT-transform algorithm under ``jax.jit``.

Layout (FLA's): q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]`` (g a log-decay <= 0);
state ``[B, H, K, V]`` float32. Per token (see references/gdn.py)::

    S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T (scale q_t)

Within a chunk of C = 64 tokens, with ``G`` the cumulative log-decay from the chunk start and ``S0`` the state
before it, the writes ``U`` solve ``(I + A) U = diag(beta) V - diag(beta exp G) K S0`` with
``A_ij = beta_i exp(G_i - G_j) k_i.k_j`` (i > j); then ``O = scale (diag(exp G) Q S0 + P U)`` with
``P_ij = exp(G_i - G_j) q_i.k_j`` (i >= j) and ``S = exp(G_C) S0 + (exp(G_C - G) K)^T U``. Chunks are
solved all at once; ``lax.scan`` carries S. Math is float32 whatever the input dtype; o has v's dtype.
Any T works: the last chunk is padded with g = beta = 0 and k = 0, which leaves the state untouched.
The backward is JAX's autodiff of this function.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ...common.jax.jax_bridge import TorchFacingJaxOp
from ...common.jax.jax_wy import (
    PRECISION,
    causal_mask,
    from_chunks,
    masked_exp,
    pad_time,
    scan_chunks,
    to_chunks,
    ut_transform,
)

__all__ = ["CHUNK", "chunk_gated_delta_rule_jax", "gdn_jax_chunk"]

CHUNK = 64


def chunk_gated_delta_rule_jax(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    chunk_size: int = CHUNK,
) -> tuple[jax.Array, jax.Array]:
    """Chunked Gated DeltaNet in pure JAX (jit it, or use ``gdn_jax_chunk.jax_fn``).

    Args:
        q, k: ``[B, T, H, K]`` queries and keys (used as given; layers L2-normalise them).
        v: ``[B, T, H, V]`` values.
        g: ``[B, T, H]`` log-decay (<= 0).
        beta: ``[B, T, H]`` write strength.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]`` state before the first token.
        chunk_size: tokens per chunk (default 64).

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in v's dtype and ``[B, H, K, V]`` float32.

    Examples::

        >>> o, ht = jax.jit(chunk_gated_delta_rule_jax)(q, k, v, g, beta)
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    C = chunk_size
    T_pad = -(-T // C) * C
    f32 = jnp.float32
    qc, kc, vc = (to_chunks(pad_time(x.astype(f32), T_pad), C) for x in (q, k, v))  # [N, B, H, C, D]
    gc, bc = (to_chunks(pad_time(x.astype(f32), T_pad)[..., None], C)[..., 0] for x in (g, beta))  # [N, B, H, C]

    G = jnp.cumsum(gc, axis=-1)
    decay_pairs = masked_exp(G[..., :, None] - G[..., None, :], causal_mask(C, strict=False))  # [N, B, H, C, C]
    kk = jnp.einsum("...ik,...jk->...ij", kc, kc, precision=PRECISION)
    qk = jnp.einsum("...ik,...jk->...ij", qc, kc, precision=PRECISION)
    A = jnp.where(causal_mask(C, strict=True), bc[..., :, None] * decay_pairs * kk, 0.0)
    P = decay_pairs * qk  # zero above the diagonal already

    expG = jnp.exp(G)
    u_tilde, w = ut_transform(A, bc[..., None] * vc, (bc * expG)[..., None] * kc)
    qd = expG[..., None] * qc
    kd = jnp.exp(G[..., -1:] - G)[..., None] * kc
    decay = jnp.broadcast_to(expG[..., -1:], (*expG.shape[:-1], K))

    h0 = jnp.zeros((B, H, K, V), f32) if initial_state is None else initial_state.astype(f32)
    o, final_state = scan_chunks(u_tilde, w, qd, P, kd, decay, h0, scale)
    return from_chunks(o, T).astype(v.dtype), final_state


gdn_jax_chunk = TorchFacingJaxOp(chunk_gated_delta_rule_jax, name="gdn/jax_chunk", gates=("g", "beta"))
