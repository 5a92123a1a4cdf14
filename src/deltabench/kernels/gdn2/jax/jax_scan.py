"""Gated DeltaNet-2 in JAX by an associative scan over tokens: the parallel-scan baseline.

Layout: q, k, g, b ``[B, T, H, K]``; v, w ``[B, T, H, V]``; state ``[B, H, K, V]``. Each token is the affine
map ``S -> (I - k_t (b_t * k_t)^T) Diag(exp g_t) S + k_t (w_t * v_t)^T`` (the update ``S <- Diag(exp g) S;
S <- S + k (w*v - S^T (b*k))^T`` rewritten), and ``jax.lax.associative_scan`` composes them (see
kernels/common/jax/jax_affine.py). It holds a ``[K, K]`` matrix per token: memory-heavy by design.
Math is float32; o has v's dtype. The backward is JAX's autodiff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ...common.jax.jax_affine import affine_scan_outputs
from ...common.jax.jax_bridge import TorchFacingJaxOp

__all__ = ["gdn2_jax_scan", "scan_gdn2_jax"]


def scan_gdn2_jax(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    b: jax.Array,
    w: jax.Array,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Gated DeltaNet-2 by ``lax.associative_scan`` over per-token affine state maps (pure JAX).

    Args:
        q, k: ``[B, T, H, K]``.
        v: ``[B, T, H, V]``.
        g: ``[B, T, H, K]`` per-channel log-decay (<= 0).
        b: ``[B, T, H, K]`` erase strength per key channel.
        w: ``[B, T, H, V]`` write strength per value channel.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]``.

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in v's dtype and ``[B, H, K, V]`` float32.

    Examples::

        >>> o, ht = jax.jit(scan_gdn2_jax)(q, k, v, g, b, w)
    """
    K = q.shape[-1]
    scale = K**-0.5 if scale is None else scale
    f32 = jnp.float32
    q32, k32, v32, g32, b32, w32 = (x.astype(f32) for x in (q, k, v, g, b, w))
    eye = jnp.eye(K, dtype=f32)
    # (I - k (b*k)^T) Diag(exp g): column j of the erase is scaled by channel j's decay.
    erase = eye - k32[..., :, None] * (b32 * k32)[..., None, :]
    a = erase * jnp.exp(g32)[..., None, :]
    b_write = k32[..., :, None] * (w32 * v32)[..., None, :]
    h0 = None if initial_state is None else initial_state.astype(f32)
    o, final_state = affine_scan_outputs(a, b_write, q32, scale, h0)
    return o.astype(v.dtype), final_state


gdn2_jax_scan = TorchFacingJaxOp(scan_gdn2_jax, name="gdn2/jax_scan", gates=("g", "b", "w"))
