"""The backward of the Pallas GDN-2 forward, in plain JAX, from the forward's residual: the chunk-start states.

With the state ``H_n`` entering every chunk known (the fused forward stores it), the chunks are independent:
chunk n maps ``(its inputs, H_n)`` to ``(O_n, H_{n+1})`` by the same chunked WY algebra as the forward
(``kernels/gdn2/jax/jax_chunk.py``'s stages, under one ``jax.vjp`` for all chunks at once). What couples them is the
state's cotangent, which runs backwards through the chunks::

    dU_n     = scale P_n^T dO_n + Kd_n dH_{n+1}
    dH_n     = scale Qd_n^T dO_n + Diag(exp G_C) dH_{n+1} - W_n^T dU_n         (dH_N = d final_state)

a ``lax.scan`` of two small matmuls per chunk. The pull-back of every chunk, fed ``(dO_n, dH_{n+1})``, then gives
the gradients of q, k, v, g, b, w, and ``dH_0`` is the initial state's. Float32 throughout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ....common.jax.jax_wy import PRECISION, from_chunks, pad_time, to_chunks, ut_transform
from ..jax_chunk import _pairwise_scores

__all__ = ["gdn2_chunk_backward"]


def _mm(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.einsum(spec, x, y, precision=PRECISION)


def _chunk_maps(qc, kc, vc, gc, bc, wc, H, *, scale: float):
    """Every chunk at once: ``(O_n, H_{n+1})`` from its inputs ``[N, B, H, C, D]`` and ``H_n`` ``[N, B, H, K, V]``;
    the aux outputs are what the state's reverse scan needs (P, W, Qd, Kd, the chunk decay)."""
    G = jnp.cumsum(gc, axis=-2)
    bk = bc * kc
    A = _pairwise_scores(G, bk, kc, True)
    P = _pairwise_scores(G, qc, kc, False)
    expG = jnp.exp(G)
    u_tilde, w_mat = ut_transform(A, wc * vc, bk * expG)
    qd = qc * expG
    kd = kc * jnp.exp(G[..., -1:, :] - G)
    decay = expG[..., -1, :]  # [N, B, H, K]
    u = u_tilde - _mm("...ck,...kv->...cv", w_mat, H)
    o = scale * (_mm("...ck,...kv->...cv", qd, H) + _mm("...ij,...jv->...iv", P, u))
    H_next = decay[..., None] * H + _mm("...ck,...cv->...kv", kd, u)
    return (o, H_next), (P, w_mat, qd, kd, decay)


def gdn2_chunk_backward(
    inputs: tuple[jax.Array, ...],
    states: jax.Array,
    do: jax.Array,
    d_final: jax.Array,
    *,
    scale: float,
    chunk: int,
) -> tuple[jax.Array, ...]:
    """Gradients of GDN-2 given the state at every chunk start.

    Args:
        inputs: ``(q, k, v, g, b, w)`` in the op's layout ``[B, T, H, *]`` (any T; padded here like the forward).
        states: ``[N, B, H, K, V]`` float32, the state entering each chunk (``N = ceil(T / chunk)``).
        do: ``[B, T, H, V]`` the output's cotangent.
        d_final: ``[B, H, K, V]`` the final state's cotangent.
        scale: query scale.
        chunk: the forward's chunk size.

    Returns:
        ``(dq, dk, dv, dg, db, dw, d_initial_state)``: each in its input's dtype, the last float32.
    """
    T = inputs[0].shape[1]
    T_pad = states.shape[0] * chunk
    f32 = jnp.float32
    chunked = tuple(to_chunks(pad_time(x.astype(f32), T_pad), chunk) for x in inputs)
    do_c = to_chunks(pad_time(do.astype(f32), T_pad), chunk)

    _, pull, (P, w_mat, qd, kd, decay) = jax.vjp(
        lambda *a: _chunk_maps(*a, scale=scale), *chunked, states, has_aux=True
    )

    def back(dH_next: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        do_n, P_n, w_n, qd_n, kd_n, d_n = xs
        du = scale * _mm("...ij,...iv->...jv", P_n, do_n) + _mm("...ck,...kv->...cv", kd_n, dH_next)
        dH = (
            scale * _mm("...ck,...cv->...kv", qd_n, do_n)
            + d_n[..., None] * dH_next
            - _mm("...ck,...cv->...kv", w_n, du)
        )
        return dH, dH_next  # emitted: the cotangent of this chunk's end state

    dH0, d_ends = lax.scan(back, d_final.astype(f32), (do_c, P, w_mat, qd, kd, decay), reverse=True)
    grads = pull((do_c, d_ends))[:-1]  # the last: each chunk's dH_n, already summed up in the scan
    out = tuple(from_chunks(gr, T).astype(x.dtype) for gr, x in zip(grads, inputs, strict=True))
    return (*out, dH0)
