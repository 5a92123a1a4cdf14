"""deltabench's Pallas GDN-2 (and KDA through it): two fused kernels under one ``jax.custom_vjp``.

Layout: q, k, g, b ``[B, T, H, K]``; v, w ``[B, T, H, V]``; state ``[B, H, K, V]`` float32; g a per-channel
log-decay (<= 0). Per token: ``S <- Diag(exp g) S; r = S^T (b * k); S <- S + k (w * v - r)^T; o = S^T (scale q)``.

* forward: :func:`.forward.gdn2_fused_forward`, one Pallas kernel per (batch, head, chunk) that computes the
  chunk's scores, solves its WY system, recomputes the writes and steps the state (written for the TPU: ``[C, K]``
  blocks of the inputs in place, float32 accumulation on the MXU); under differentiation it also stores the state
  at every chunk start, the backward's residual;
* backward: :func:`.fused_backward.gdn2_fused_backward`, the twin kernel, chunks last to first, carrying the
  state's cotangent in VMEM and recomputing each chunk's forward from the residual state. ``backward="jax"`` runs
  :func:`.backward.gdn2_chunk_backward` instead: the same algebra in plain JAX, kept as its reference.

Where it runs: compiled by Mosaic on a TPU; in Pallas' interpreter on the CPU (the same kernel body, run as XLA
operations: for checking, not for speed); ``interpret=None`` picks per platform when the program is lowered.
Any T (padding: g = b = w = 0, k = 0 make padded tokens no-ops). On a TPU, K and V must be multiples of 128.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ....common.jax.jax_bridge import TorchFacingJaxOp
from .backward import gdn2_chunk_backward
from .forward import CHUNK, gdn2_fused_forward
from .fused_backward import gdn2_fused_backward

__all__ = ["chunk_gdn2_pallas", "chunk_kda_pallas", "gdn2_pallas_chunk", "kda_pallas_chunk"]


def _per_platform(kernel, *args, interpret: bool | None, **params):
    """Call a Pallas launcher compiled (Mosaic) or interpreted; ``interpret=None`` picks by platform."""
    if interpret is not None:
        return kernel(*args, interpret=interpret, **params)
    # Mosaic compiles for the TPU only; the CPU runs the same body in the interpreter. Each branch is lowered only
    # for its own platform, so a TPU export never sees the interpreter and the CPU never sees Mosaic.
    return lax.platform_dependent(
        *args,
        cpu=lambda *a: kernel(*a, interpret=True, **params),
        default=lambda *a: kernel(*a, interpret=False, **params),
    )


def _forward(inputs, h0, *, scale, chunk, store_states, interpret):
    """The fused forward; o, the final state ``[B, H, K, V]`` and (if asked) the chunk-start states, transposed."""
    h0_t = jnp.swapaxes(h0.astype(jnp.float32), -1, -2)
    outs = _per_platform(
        gdn2_fused_forward, *inputs, h0_t, interpret=interpret, scale=scale, chunk=chunk, store_states=store_states
    )
    return outs[0], jnp.swapaxes(outs[1], -1, -2), (outs[2] if store_states else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10))
def _gdn2_pallas(q, k, v, g, b, w, h0, scale, chunk, interpret, backward):
    o, final, _ = _forward((q, k, v, g, b, w), h0, scale=scale, chunk=chunk, store_states=False, interpret=interpret)
    return o, final


def _gdn2_pallas_fwd(q, k, v, g, b, w, h0, scale, chunk, interpret, backward):
    inputs = (q, k, v, g, b, w)
    o, final, states_t = _forward(inputs, h0, scale=scale, chunk=chunk, store_states=True, interpret=interpret)
    return (o, final), (inputs, states_t, h0)


def _gdn2_pallas_bwd(scale, chunk, interpret, backward, residuals, cotangents):
    inputs, states_t, h0 = residuals
    do, d_final = cotangents
    if backward == "jax":
        states = jnp.transpose(states_t, (2, 0, 1, 4, 3))  # [B, H, N, V, K] -> [N, B, H, K, V]
        *grads, dh0 = gdn2_chunk_backward(inputs, states, do, d_final, scale=scale, chunk=chunk)
    else:
        d_final_t = jnp.swapaxes(d_final.astype(jnp.float32), -1, -2)
        *grads, dh0_t = _per_platform(
            gdn2_fused_backward, *inputs, do, states_t, d_final_t, interpret=interpret, scale=scale, chunk=chunk
        )
        dh0 = jnp.swapaxes(dh0_t, -1, -2)
    grads = tuple(gr.astype(x.dtype) for gr, x in zip(grads, inputs, strict=True))
    return (*grads, dh0.astype(h0.dtype))


_gdn2_pallas.defvjp(_gdn2_pallas_fwd, _gdn2_pallas_bwd)


def chunk_gdn2_pallas(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    b: jax.Array,
    w: jax.Array,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    *,
    chunk_size: int = CHUNK,
    interpret: bool | None = None,
    backward: str = "pallas",
) -> tuple[jax.Array, jax.Array]:
    """Gated DeltaNet-2 through deltabench's fused Pallas kernels; differentiable (``jax.custom_vjp``).

    Args:
        q, k: ``[B, T, H, K]``.
        v: ``[B, T, H, V]``.
        g: ``[B, T, H, K]`` per-channel log-decay (<= 0).
        b: ``[B, T, H, K]`` erase strength per key channel.
        w: ``[B, T, H, V]`` write strength per value channel.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]``.
        chunk_size: tokens per chunk (default 64; a multiple of 16).
        interpret: True runs Pallas' interpreter, False compiles with Mosaic (TPU), None (default) picks by
            platform: the interpreter on the CPU, Mosaic elsewhere.
        backward: ``"pallas"`` (default) the fused backward kernel; ``"jax"`` the same algebra in plain JAX (its
            reference).

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in v's dtype and ``[B, H, K, V]`` float32.

    Examples::

        >>> o, ht = jax.jit(chunk_gdn2_pallas)(q, k, v, g, b, w)
    """
    B, _, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else float(scale)
    h0 = jnp.zeros((B, H, K, V), jnp.float32) if initial_state is None else initial_state
    if backward not in ("pallas", "jax"):
        raise ValueError(f"backward must be 'pallas' or 'jax', got {backward!r}")
    return _gdn2_pallas(q, k, v, g, b, w, h0, scale, chunk_size, interpret, backward)


def chunk_kda_pallas(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    *,
    chunk_size: int = CHUNK,
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Kimi Delta Attention through the GDN-2 Pallas kernel, with ``b = w = beta`` broadcast over the channels.

    Args:
        q, k, g: ``[B, T, H, K]`` (g a per-channel log-decay <= 0); v ``[B, T, H, V]``; beta ``[B, T, H]``.
        scale, initial_state, chunk_size, interpret: as :func:`chunk_gdn2_pallas`.

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in v's dtype and ``[B, H, K, V]`` float32.
    """
    # broadcast in float32 (the values are beta's exactly): the broadcast's gradient sums db over K and dw over V,
    # which in bf16 rounded each term and the running sum (kda dbeta 1.1e-2 at bf16, 3x torch_chunk's)
    beta32 = beta.astype(jnp.float32)
    b = jnp.broadcast_to(beta32[..., None], k.shape)
    w = jnp.broadcast_to(beta32[..., None], v.shape)
    return chunk_gdn2_pallas(q, k, v, g, b, w, scale, initial_state, chunk_size=chunk_size, interpret=interpret)


gdn2_pallas_chunk = TorchFacingJaxOp(chunk_gdn2_pallas, name="gdn2/pallas_chunk", gates=("g", "b", "w"))
kda_pallas_chunk = TorchFacingJaxOp(chunk_kda_pallas, name="kda/pallas_chunk", gates=("g", "beta"))
