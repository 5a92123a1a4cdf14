"""Gated DeltaNet in JAX by an associative scan over tokens: the parallel-scan baseline.

Layout (FLA's): q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]``; state ``[B, H, K, V]``.
Each token is the affine map ``S -> exp(g_t) (I - beta_t k_t k_t^T) S + beta_t k_t v_t^T`` (the update
``S <- exp(g) S; S <- S + k (beta (v - S^T k))^T`` rewritten), and ``jax.lax.associative_scan`` composes them
(see kernels/common/jax/jax_affine.py). It holds a ``[K, K]`` matrix per token: memory-heavy by design.
Math is float32; o has v's dtype. The backward is JAX's autodiff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ...common.jax.jax_affine import affine_scan_outputs
from ...common.jax.jax_bridge import TorchFacingJaxOp

__all__ = ["gdn_jax_scan", "scan_gated_delta_rule_jax"]


def scan_gated_delta_rule_jax(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Gated DeltaNet by ``lax.associative_scan`` over per-token affine state maps (pure JAX).

    Args:
        q, k: ``[B, T, H, K]``.
        v: ``[B, T, H, V]``.
        g: ``[B, T, H]`` log-decay (<= 0).
        beta: ``[B, T, H]`` write strength.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]``.

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in v's dtype and ``[B, H, K, V]`` float32.

    Examples::

        >>> o, ht = jax.jit(scan_gated_delta_rule_jax)(q, k, v, g, beta)
    """
    K = q.shape[-1]
    scale = K**-0.5 if scale is None else scale
    f32 = jnp.float32
    q32, k32, v32, g32, b32 = (x.astype(f32) for x in (q, k, v, g, beta))
    eye = jnp.eye(K, dtype=f32)
    outer_kk = k32[..., :, None] * k32[..., None, :]
    a = jnp.exp(g32)[..., None, None] * (eye - b32[..., None, None] * outer_kk)
    b = (b32[..., None] * k32)[..., :, None] * v32[..., None, :]
    h0 = None if initial_state is None else initial_state.astype(f32)
    o, final_state = affine_scan_outputs(a, b, q32, scale, h0)
    return o.astype(v.dtype), final_state


gdn_jax_scan = TorchFacingJaxOp(scan_gated_delta_rule_jax, name="gdn/jax_scan", gates=("g", "beta"))
