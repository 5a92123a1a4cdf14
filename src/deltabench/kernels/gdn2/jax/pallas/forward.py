"""The fused forward of GDN-2 as one Pallas kernel, written for the TPU (Mosaic).

Grid ``(B, H, N)``: one program per (batch, head, chunk of C tokens), the chunk axis walked in order
(``"arbitrary"``) with the state carried in a VMEM scratch, the batch and head axes ``"parallel"``. Inputs are
read in their own layout, viewed as ``[B, T, H*K]`` (a free reshape), so a block is ``[C, K]``: on the TPU this
needs ``K`` and ``V`` multiples of 128 (Mosaic's block rule: the last two dims multiples of ``(8, 128)`` or whole).
Each program, for its chunk (``G`` the in-chunk cumulative log-decay, ``S`` the state at the chunk start)::

    scores      A_ij = sum_c b_i k_i exp(G_i - G_j) k_j  (i > j),  P_ij = sum_c q_i exp(G_i - G_j) k_j  (i >= j)
    WY solve    T = (I + A)^-1 (blocked forward substitution, 16 x 16 diagonal blocks, all on the MXU)
    recompute   U~ = T (w*v),  W = T (b*k*exp G),  Qd = q*exp G,  Kd = k*exp(G_C - G)
    scan        U = U~ - W S,  O = scale (Qd S + P U),  S <- Diag(exp G_C) S + Kd^T U

The pairwise decays ``exp(G_i - G_j)`` (``i >= j``) never go through ``exp(G_i) exp(-G_j)``, which overflows
float32 within a chunk when a channel forgets fast: within a 16-token block they are formed per pair, as
``exp(min(G_i - G_j, 0))``; across blocks they factor through the later block's first token, both factors <= 1.
The state lives transposed, ``S^T`` ``[V, K]``, so that ``Diag(exp G_C) S`` is a row broadcast and every matmul
is ``X @ Y`` or ``X @ Y^T``. Math is float32 (``Precision.HIGHEST``); o has
v's dtype. The kernel can also store the state at each chunk start (the backward's residual).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ....common.jax.jax_wy import pad_time

__all__ = ["CHUNK", "SOLVE_BLOCK", "gdn2_fused_forward"]

CHUNK = 64
SOLVE_BLOCK = 16  # the diagonal blocks of the WY solve, and the rows of the pairwise-decay tensor formed at once
_HI = lax.Precision.HIGHEST
_F32 = jnp.float32


def _dot(x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.dot(x, y, precision=_HI, preferred_element_type=_F32)


def _dot_t(x: jax.Array, y: jax.Array) -> jax.Array:
    """``x @ y^T`` without forming the transpose (the MXU's transposed-operand form)."""
    return lax.dot_general(x, y, (((1,), (1,)), ((), ())), precision=_HI, preferred_element_type=_F32)


def _iota(shape: tuple[int, int], axis: int) -> jax.Array:
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def _num_chunks(T: int, chunk: int) -> int:
    """Chunks that cover T tokens, the last one partial (its padding: g = b = w = 0, k = 0, a no-op)."""
    return pl.cdiv(T, chunk)


def _cumulative_decay(g: jax.Array) -> jax.Array:
    """``G_i = sum_{t <= i} g_t`` over the chunk, ``[C, K]``: a lower-triangular ones matrix on the MXU."""
    C = g.shape[0]
    return _dot(jnp.where(_iota((C, C), 0) >= _iota((C, C), 1), 1.0, 0.0).astype(_F32), g)


def _scores(G: jax.Array, q: jax.Array, k: jax.Array, bk: jax.Array, rows: int) -> tuple[jax.Array, jax.Array]:
    """``A`` (strictly lower) and ``P`` (lower, diagonal included), both ``[C, C]``, `rows` rows at a time.

    For the rows ``i`` of a block starting at ``r``, the columns ``j < r`` factor through row ``r``:
    ``exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j)``, both factors <= 1 there, so they are two matmuls; only the
    ``rows x rows`` diagonal block forms its decays pairwise (``[rows, rows, K]``), a quarter of the exps of the
    whole ``[C, C, K]`` at C = 64, rows = 16. Its columns are put in place by a matmul with a 0/1 matrix (exact),
    which keeps every lane offset aligned.
    """
    C = G.shape[0]
    i, j = _iota((C, C), 0), _iota((C, C), 1)
    a_parts, p_parts = [], []
    for r0 in range(0, C, rows):
        G_blk, q_blk, bk_blk, k_blk = (x[r0 : r0 + rows] for x in (G, q, bk, k))
        pairwise = jnp.exp(jnp.minimum(G_blk[:, None, :] - G_blk[None, :, :], 0.0))  # [rows, rows, K]
        k_pair = pairwise * k_blk[None, :, :]
        place = jnp.where(_iota((rows, C), 1) == _iota((rows, C), 0) + r0, 1.0, 0.0).astype(_F32)
        a_blk = _dot(jnp.sum(bk_blk[:, None, :] * k_pair, axis=-1), place)  # [rows, C], columns r0 .. r0+rows
        p_blk = _dot(jnp.sum(q_blk[:, None, :] * k_pair, axis=-1), place)
        if r0:
            G_r = G_blk[:1]  # [1, K]
            to_r = jnp.exp(jnp.minimum(G_blk - G_r, 0.0))
            earlier = jnp.where(_iota(G.shape, 0) < r0, k * jnp.exp(jnp.minimum(G_r - G, 0.0)), 0.0)  # rows j < r0
            a_blk = a_blk + _dot_t(bk_blk * to_r, earlier)
            p_blk = p_blk + _dot_t(q_blk * to_r, earlier)
        a_parts.append(a_blk)
        p_parts.append(p_blk)
    A = jnp.where(i > j, jnp.concatenate(a_parts, axis=0), 0.0)
    P = jnp.where(i >= j, jnp.concatenate(p_parts, axis=0), 0.0)
    return A, P


def _unit_lower_inverse(A: jax.Array, block: int, dot=_dot) -> jax.Array:
    """``(I + A)^-1`` for ``A`` ``[C, C]`` strictly lower, by blocked forward substitution (products by `dot`).

    First the inverse ``D`` of the block-diagonal part, all diagonal blocks at once, one row of each block per step
    (row ``i`` of a block's inverse is ``e_i - A_i D``); then the block rows in order, ``T_m = D_mm (E_m - A_m T)``,
    with the block rows not yet solved still zero in ``T``. Only whole-matrix products and masks: no slicing
    across lanes, so Mosaic lays it out as is.
    """
    C = A.shape[0]
    i, j = _iota((C, C), 0), _iota((C, C), 1)
    eye = jnp.where(i == j, 1.0, 0.0).astype(_F32)
    # lax.div/rem: jnp's // and % on ints add a sign correction, whose Mosaic lowering asks for the TPU generation
    i_block, i_row = lax.div(i, block), lax.rem(i, block)
    same_block = i_block == lax.div(j, block)
    A_diag = jnp.where(same_block, A, 0.0)

    def diag_row(s: int, D: jax.Array) -> jax.Array:
        at_row = i_row == s
        new = eye - dot(jnp.where(at_row, A_diag, 0.0), D)
        return jnp.where(at_row, new, D)

    D = lax.fori_loop(0, block, diag_row, jnp.zeros((C, C), _F32))
    T = jnp.zeros((C, C), _F32)
    for m in range(C // block):
        in_block = i_block == m
        T = T + dot(D, jnp.where(in_block, eye - dot(A, T), 0.0))
    return T


def _fused_forward_kernel(
    q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, h0_ref, o_ref, ht_ref, *rest, scale: float, rows: int, block: int
):
    """One chunk of one (batch, head): scores, WY solve, recompute, then the state step (see module docstring)."""
    hs_ref, st_ref = (rest[0], rest[1]) if len(rest) == 2 else (None, rest[0])
    n = pl.program_id(2)

    @pl.when(n == 0)
    def _():
        st_ref[...] = h0_ref[...]

    q, k, v, g, b, w = (r[...].astype(_F32) for r in (q_ref, k_ref, v_ref, g_ref, b_ref, w_ref))
    G = _cumulative_decay(g)
    bk = b * k
    A, P = _scores(G, q, k, bk, rows)
    T = _unit_lower_inverse(A, block)

    expG = jnp.exp(G)
    g_last = jnp.sum(g, axis=0, keepdims=True)  # G at the chunk's last token, [1, K]
    u_tilde = _dot(T, w * v)
    w_mat = _dot(T, bk * expG)
    qd = q * expG
    kd = k * jnp.exp(jnp.minimum(g_last - G, 0.0))

    St = st_ref[...]  # S^T [V, K] at the chunk start
    if hs_ref is not None:
        hs_ref[...] = St
    u = u_tilde - _dot_t(w_mat, St)
    o_ref[...] = (scale * (_dot_t(qd, St) + _dot(P, u))).astype(o_ref.dtype)
    St = St * jnp.exp(g_last) + _dot(u.T, kd)
    st_ref[...] = St

    @pl.when(n == pl.num_programs(2) - 1)
    def _():
        ht_ref[...] = St


@functools.partial(jax.jit, static_argnames=("scale", "chunk", "store_states", "interpret"))
def gdn2_fused_forward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    b: jax.Array,
    w: jax.Array,
    h0_t: jax.Array,
    *,
    scale: float,
    chunk: int = CHUNK,
    store_states: bool = False,
    interpret: bool = False,
) -> tuple[jax.Array, ...]:
    """Run the fused forward kernel.

    Args:
        q, k, g, b: ``[B, T, H, K]`` (any T: padded to whole chunks here).
        v, w: ``[B, T, H, V]``.
        h0_t: ``[B, H, V, K]`` float32, the initial state transposed.
        scale: query scale.
        chunk: tokens per chunk (a multiple of 16).
        store_states: also return the state at each chunk start, ``[B, H, N, V, K]`` (transposed).
        interpret: run in Pallas' interpreter (any backend) instead of compiling for the TPU.

    Returns:
        ``(o [B, T, H, V] in v's dtype, final_state^T [B, H, V, K] float32)``, then the chunk-start states if
        `store_states`.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk
    N = _num_chunks(T, C)
    T_pad = -(-T // C) * C
    flat = [pad_time(x, T_pad).reshape(B, T_pad, H * x.shape[-1]) for x in (q, k, v, g, b, w)]
    key_block = pl.BlockSpec((None, C, K), lambda bi, hi, ni: (bi, ni, hi))
    value_block = pl.BlockSpec((None, C, V), lambda bi, hi, ni: (bi, ni, hi))
    state_block = pl.BlockSpec((None, None, V, K), lambda bi, hi, ni: (bi, hi, 0, 0))
    out_shape = [jax.ShapeDtypeStruct((B, T_pad, H * V), v.dtype), jax.ShapeDtypeStruct((B, H, V, K), _F32)]
    out_specs = [value_block, state_block]
    if store_states:
        out_shape.append(jax.ShapeDtypeStruct((B, H, N, V, K), _F32))
        out_specs.append(pl.BlockSpec((None, None, None, V, K), lambda bi, hi, ni: (bi, hi, ni, 0, 0)))
    kernel = functools.partial(_fused_forward_kernel, scale=float(scale), rows=SOLVE_BLOCK, block=SOLVE_BLOCK)
    outs = pl.pallas_call(
        kernel,
        grid=(B, H, N),
        in_specs=[key_block, key_block, value_block, key_block, key_block, value_block, state_block],
        out_specs=out_specs,
        out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((V, K), _F32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name="gdn2_fused_forward",
    )(*flat, h0_t.astype(_F32))
    o = outs[0].reshape(B, T_pad, H, V)[:, :T]
    return (o, *outs[1:])
