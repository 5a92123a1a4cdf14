"""Stages of the chunked (WY/UT-transform) delta rule in JAX, shared by gdn and gdn2.

Layout: the ops take FLA's ``[B, T, H, D]``; the chunked pipeline works on ``[N, B, H, C, D]`` (N chunks of C
tokens, the chunk axis first so that ``lax.scan`` walks it). Within a chunk, with state ``S0`` ``[K, V]`` at its
start, every delta-rule variant here reduces to::

    (I + A) U = R_v - R_k S0        A strictly lower-triangular [C, C]  (the UT transform)
    O = scale * (Qd S0 + P U)       P lower-triangular [C, C], diagonal included
    S = diag(d) S0 + Kd^T U         d [K]: the decay over the whole chunk

so the op-specific code only builds ``A, P, R_v, R_k, Qd, Kd, d`` (all decays as ``exp`` of a non-positive
number: pairwise ``exp(G_i - G_j)`` for ``i >= j``, never ``exp(G) / exp(G)``, which overflows), and this module
solves the triangular systems for every chunk at once and scans the state across chunks in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .jax_trisolve import PRECISION, unit_lower_solve

__all__ = [
    "PRECISION",
    "causal_mask",
    "from_chunks",
    "masked_exp",
    "pad_time",
    "scan_chunks",
    "to_chunks",
    "ut_transform",
]


def pad_time(x: jax.Array, T_pad: int) -> jax.Array:
    """Zero-pad ``[B, T, ...]`` along T to ``T_pad``. Zero g, beta/b/w and k make padded tokens a no-op."""
    T = x.shape[1]
    if T_pad == T:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, T_pad - T)
    return jnp.pad(x, widths)


def to_chunks(x: jax.Array, chunk: int) -> jax.Array:
    """``[B, T, H, *D]`` (T a multiple of `chunk`) -> ``[N, B, H, C, *D]``."""
    B, T, H = x.shape[:3]
    rest = x.shape[3:]
    x = x.reshape(B, T // chunk, chunk, H, *rest)
    return jnp.moveaxis(jnp.moveaxis(x, 1, 0), 3, 2)  # [N, B, C, H, *D] -> [N, B, H, C, *D]


def from_chunks(x: jax.Array, T: int) -> jax.Array:
    """``[N, B, H, C, D]`` -> ``[B, T, H, D]``, dropping the padding past `T`."""
    N, B, H, C, D = x.shape
    x = jnp.moveaxis(x, 0, 1)  # [B, N, H, C, D]
    x = jnp.swapaxes(x, 2, 3).reshape(B, N * C, H, D)
    return x[:, :T]


def causal_mask(chunk: int, *, strict: bool) -> jax.Array:
    """``[C, C]`` boolean: ``i > j`` when `strict`, else ``i >= j``."""
    i = jnp.arange(chunk)[:, None]
    j = jnp.arange(chunk)[None, :]
    return i > j if strict else i >= j


def masked_exp(x: jax.Array, mask: jax.Array) -> jax.Array:
    """``exp(x)`` where `mask`, else 0. The masked-out entries (``G_i - G_j`` for ``i < j``, positive, possibly
    huge) never reach ``exp``, so neither the value nor its gradient can be inf or NaN."""
    return jnp.where(mask, jnp.exp(jnp.where(mask, x, 0.0)), 0.0)


def ut_transform(A: jax.Array, *rhs: jax.Array) -> tuple[jax.Array, ...]:
    """Solve ``(I + A) X = R`` for each right-hand side ``R`` ``[..., C, D]``; `A` ``[..., C, C]`` strictly lower.

    A unit-lower-triangular solve (forward substitution; :mod:`.jax_trisolve` says which on each backend), stable
    where the Neumann-series product form of the inverse would grow.
    """
    x = unit_lower_solve(A, jnp.concatenate(rhs, axis=-1))
    splits = []
    at = 0
    for r in rhs[:-1]:
        at += r.shape[-1]
        splits.append(at)
    return tuple(jnp.split(x, splits, axis=-1))


def scan_chunks(
    u_tilde: jax.Array,
    w: jax.Array,
    qd: jax.Array,
    p: jax.Array,
    kd: jax.Array,
    decay: jax.Array,
    initial_state: jax.Array,
    scale: float,
) -> tuple[jax.Array, jax.Array]:
    """Carry the state across chunks: ``U = U~ - W S; O = scale (Qd S + P U); S <- diag(d) S + Kd^T U``.

    Args:
        u_tilde: ``[N, B, H, C, V]`` ``(I + A)^-1 R_v``.
        w: ``[N, B, H, C, K]`` ``(I + A)^-1 R_k``.
        qd: ``[N, B, H, C, K]`` queries decayed to the chunk start.
        p: ``[N, B, H, C, C]`` intra-chunk decayed attention, diagonal included.
        kd: ``[N, B, H, C, K]`` keys decayed to the chunk end.
        decay: ``[N, B, H, K]`` the decay of the whole chunk, per key channel.
        initial_state: ``[B, H, K, V]`` float32.
        scale: query scale.

    Returns:
        ``(o, final_state)``: ``[N, B, H, C, V]`` and ``[B, H, K, V]``, float32.
    """

    def step(S: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        ut, wc, qc, pc, kc, dc = xs
        u = ut - jnp.einsum("bhck,bhkv->bhcv", wc, S, precision=PRECISION)
        o = scale * (
            jnp.einsum("bhck,bhkv->bhcv", qc, S, precision=PRECISION)
            + jnp.einsum("bhij,bhjv->bhiv", pc, u, precision=PRECISION)
        )
        S = dc[..., None] * S + jnp.einsum("bhck,bhcv->bhkv", kc, u, precision=PRECISION)
        return S, o

    final_state, o = lax.scan(step, initial_state, (u_tilde, w, qd, p, kd, decay))
    return o, final_state
