"""Gated DeltaNet-2 in JAX: the chunked WY/UT-transform algorithm with per-channel decay, under ``jax.jit``.

Layout: q, k, g, b ``[B, T, H, K]``; v, w ``[B, T, H, V]`` (g a per-channel log-decay <= 0); state
``[B, H, K, V]`` float32. Per token (see references/gdn2.py)::

    S <- Diag(exp g_t) S;  r_t = S^T (b_t * k_t);  S <- S + k_t (w_t * v_t - r_t)^T;  o_t = S^T (scale q_t)

Within a chunk of C = 64 tokens, with ``G`` ``[C, K]`` the cumulative log-decay from the chunk start and ``S0``
the state before it, the writes ``U`` solve ``(I + A) U = W*V - (b*k*exp G) S0`` where
``A_ij = sum_c b_i[c] k_i[c] exp(G_i[c] - G_j[c]) k_j[c]`` (i > j); then
``O = scale ((q*exp G) S0 + P U)`` with ``P_ij = sum_c q_i[c] exp(G_i[c] - G_j[c]) k_j[c]`` (i >= j) and
``S = Diag(exp G_C) S0 + (k*exp(G_C - G))^T U``. The per-channel decays enter pairwise, ``exp(G_i - G_j)`` for
``i >= j`` only (factoring them as ``exp(G_i) * exp(-G_j)`` overflows float32 within a chunk); the scores are
built in sub-blocks of 16 rows, a matmul against every earlier sub-block through a reference row between i and j
(both factors <= 1), the elementwise pairwise form on the diagonal sub-blocks only, under ``jax.checkpoint``. Math
is float32; o has v's dtype; any T (padding: g = b = w = 0, k = 0). Backward: JAX autodiff.
"""

from __future__ import annotations

import functools

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

__all__ = ["CHUNK", "chunk_gdn2_jax", "gdn2_jax_chunk"]

CHUNK = 64


# Rows per sub-block of the pairwise scores: the off-diagonal sub-blocks are matmuls, only the diagonal ones take
# the elementwise [S, S, K] form.
SUB_BLOCK = 16


@functools.partial(jax.checkpoint, static_argnums=(3,))
def _pairwise_scores(G: jax.Array, left: jax.Array, right: jax.Array, strict: bool) -> jax.Array:
    """``sum_c left_i[c] exp(G_i[c] - G_j[c]) right_j[c]`` for ``i > j`` (`strict`) or ``i >= j``, else 0.

    `G`, `left`, `right`: ``[..., C, K]``, `G` non-increasing along C (a cumulative sum of log-decays <= 0);
    returns ``[..., C, C]``. The chunk is cut into sub-blocks of ``S = SUB_BLOCK`` rows. For row ``i`` of
    sub-block ``I`` and a column ``j`` of an earlier sub-block, with ``r`` the first row of ``I``,
    ``exp(G_i - G_j) = exp(G_i - G_r) * exp(G_r - G_j)``, both factors in (0, 1] (``i >= r > j``), so row
    block ``I`` against every earlier column is one matmul ``(left_I exp(G_I - G_r)) @ (right exp(G_r - G))^T``
    ``[S, K] x [K, C]``. Only the diagonal sub-blocks keep the elementwise ``[S, S, K]`` form: the largest
    tensor is ``[C/S, C, K]`` rather than the ``[C, C, K]`` of the plain pairwise product. Under
    ``jax.checkpoint``, the backward recomputes the factors rather than storing them.

    Underflow: a factor that rounds to 0 bounds the true ``exp(G_i - G_j)`` from above (the other factor is <= 1),
    so it rounds to 0 only where the exact product is itself below float32's range.
    """
    C, K = G.shape[-2:]
    S = SUB_BLOCK
    Cp = -(-C // S) * S
    if Cp != C:
        # Pad the chunk to whole sub-blocks: repeated last G (a zero log-decay keeps G non-increasing) and zero
        # left/right rows, which add nothing; the padded rows and columns are cut off at the end.
        pad = [(0, 0)] * (G.ndim - 2) + [(0, Cp - C), (0, 0)]
        G = jnp.pad(G, pad, mode="edge")
        left, right = jnp.pad(left, pad), jnp.pad(right, pad)
    n = Cp // S
    batch = G.shape[:-2]
    Gb = G.reshape(*batch, n, S, K)
    G_ref = Gb[..., :1, :]  # [..., n, 1, K]: the first row of each sub-block

    # Row factors: exp(G_i - G_r) <= 1 for every row i of sub-block I.
    left_r = left.reshape(*batch, n, S, K) * jnp.exp(Gb - G_ref)  # [..., n, S, K]
    # Column factors for row block I: exp(G_r - G_j) <= 1 for every column j before I; later columns are
    # masked before exp (their exponent is positive, possibly huge).
    before = jnp.arange(Cp)[None, :] < (jnp.arange(n) * S)[:, None]  # [n, Cp]: column j precedes block I
    right_r = right[..., None, :, :] * masked_exp(G_ref - G[..., None, :, :], before[..., None])  # [..., n, Cp, K]
    off = jnp.einsum("...isk,...ijk->...isj", left_r, right_r, precision=PRECISION)  # [..., n, S, Cp]

    # Diagonal sub-blocks: pairwise within S rows.
    lb, rb = left.reshape(*batch, n, S, K), right.reshape(*batch, n, S, K)
    diag_mask = causal_mask(S, strict=strict)[..., None]
    decay = masked_exp(Gb[..., :, None, :] - Gb[..., None, :, :], diag_mask)  # [..., n, S(i), S(j), K]
    diag = jnp.sum(lb[..., :, None, :] * decay * rb[..., None, :, :], axis=-1)  # [..., n, S, S]

    # Place each diagonal sub-block into its row block's columns I*S .. I*S + S - 1.
    on_diag = jnp.arange(Cp)[None, :] // S == jnp.arange(n)[:, None]  # [n, Cp]
    diag_full = jnp.where(on_diag[:, None, :], jnp.tile(diag, (1,) * (diag.ndim - 1) + (n,)), 0.0)
    scores = (off + diag_full).reshape(*batch, Cp, Cp)
    return scores[..., :C, :C]


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
