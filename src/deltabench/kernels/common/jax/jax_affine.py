"""The associative-scan baseline for delta rules in JAX: every token is an affine map of the state.

A delta-rule token maps the state ``S`` ``[K, V]`` to ``A_t S + B_t`` (``A_t`` ``[K, K]``, ``B_t`` ``[K, V]``).
Maps compose associatively, ``(A2, B2) o (A1, B1) = (A2 A1, A2 B1 + B2)``, so ``jax.lax.associative_scan``
computes every prefix in ``O(log T)`` depth, at the price of ``O(T K^2)`` memory and ``O(T K^3)`` work: the
parallel-scan baseline that chunked kernels are measured against. Fine at small shapes; at training shapes
it needs gigabytes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .jax_wy import PRECISION

__all__ = ["affine_scan_outputs"]


def _compose(earlier: tuple[jax.Array, jax.Array], later: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """The map ``later o earlier``."""
    a1, b1 = earlier
    a2, b2 = later
    a = jnp.einsum("...ij,...jk->...ik", a2, a1, precision=PRECISION)
    b = jnp.einsum("...ij,...jv->...iv", a2, b1, precision=PRECISION) + b2
    return a, b


def affine_scan_outputs(
    a: jax.Array,
    b: jax.Array,
    q: jax.Array,
    scale: float,
    initial_state: jax.Array | None,
) -> tuple[jax.Array, jax.Array]:
    """Outputs and final state of the token maps ``S_t = a_t S_{t-1} + b_t``, ``o_t = S_t^T (scale q_t)``.

    Args:
        a: ``[B, T, H, K, K]`` float32 per-token state transitions.
        b: ``[B, T, H, K, V]`` float32 per-token writes.
        q: ``[B, T, H, K]`` float32 queries.
        scale: query scale.
        initial_state: optional ``[B, H, K, V]`` float32.

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` and ``[B, H, K, V]``, float32.
    """
    a_prefix, b_prefix = lax.associative_scan(_compose, (a, b), axis=1)
    states = b_prefix
    if initial_state is not None:
        states = states + jnp.einsum("bthij,bhjv->bthiv", a_prefix, initial_state, precision=PRECISION)
    o = scale * jnp.einsum("bthkv,bthk->bthv", states, q, precision=PRECISION)
    return o, states[:, -1]
