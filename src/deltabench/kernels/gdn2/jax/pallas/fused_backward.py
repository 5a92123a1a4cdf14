"""The fused backward of GDN-2 as one Pallas kernel, written for the TPU (Mosaic): the forward's twin.

Grid ``(B, H, N)`` with the chunks walked last to first; the state's cotangent ``dS`` (transposed, ``[V, K]``) is
carried in a VMEM scratch, starting from the final state's. Each program recomputes its chunk's forward quantities
(scores, WY solve, writes: :mod:`.forward`'s own functions) from its inputs and the residual ``S`` (the state at the
chunk start, stored by the forward), then, with ``dO`` and ``dS'`` (the cotangent of the state after the chunk)::

    dU   = scale P^T dO + Kd dS'             dP  = scale dO U^T (i >= j)        dQd = scale dO S^T
    dKd  = U dS'^T                           dW  = -dU S^T                      dD  = sum_v S * dS'
    dS   = scale Qd^T dO + Diag(D) dS' - W^T dU   (carried to the chunk before)
    dR_v = T^T dU,  dR_k = T^T dW,  dA = -T^T (dU R_v^T + dW R_k^T) T^T (i > j)

then the element-wise chain rule to q, k, v, b, w and the in-chunk cumulative decay, the pairwise scores'
gradients split as the forward splits them (16 x 16 diagonal blocks one key row ``j`` at a time, ``dG_i +=
M_ij``, ``dG_j -= sum_i M_ij`` with ``M_ij = (dA_ij b_i k_i + dP_ij q_i) exp(G_i - G_j) k_j``; the rest through
the two factors, as matmuls), and ``dg`` as the reverse cumulative sum of ``dG`` (a
triangular matmul). Gradients are written in float32 (the caller casts them to the inputs' dtypes).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ....common.jax.jax_wy import pad_time
from . import forward as fw

__all__ = ["gdn2_fused_backward"]

_F32 = jnp.float32


def _diagonal_block_backward(G, q, k, bk, dA, dP, init=None):
    """The gradients of one ``rows x rows`` diagonal block of the scores (`dA`, `dP` its ``[rows, rows]`` part), one
    key row ``j`` at a time on ``[rows, K]`` tiles: ``(dq, dk, d(b*k), dG)`` for the block's rows, added onto
    `init` (four ``[rows, K]`` tiles; zeros when None). Rows ``i < j`` carry ``dA = dP = 0``;
    ``exp(min(G_i - G_j, 0))`` as in the forward."""
    R, K = G.shape
    rows_rk = fw._iota((R, K), 0)
    cols_rr = fw._iota((R, R), 1)

    def one_key(j, carry):
        dq, dk, dbk, dG = carry
        at_row = rows_rk == j
        G_j = jnp.sum(jnp.where(at_row, G, 0.0), axis=0, keepdims=True)  # [1, K]
        k_j = jnp.sum(jnp.where(at_row, k, 0.0), axis=0, keepdims=True)
        at_col = cols_rr == j
        dA_j = jnp.sum(jnp.where(at_col, dA, 0.0), axis=1, keepdims=True)  # [rows, 1]
        dP_j = jnp.sum(jnp.where(at_col, dP, 0.0), axis=1, keepdims=True)
        decay = jnp.exp(jnp.minimum(G - G_j, 0.0))
        decay_k = decay * k_j
        dbk = dbk + dA_j * decay_k
        dq = dq + dP_j * decay_k
        n = (dA_j * bk + dP_j * q) * decay
        m = n * k_j
        dG = dG + m - jnp.where(at_row, jnp.sum(m, axis=0, keepdims=True), 0.0)
        dk = dk + jnp.where(at_row, jnp.sum(n, axis=0, keepdims=True), 0.0)
        return dq, dk, dbk, dG

    if init is None:
        zero = jnp.zeros((R, K), _F32)
        init = (zero, zero, zero, zero)
    return lax.fori_loop(0, R, one_key, tuple(init))


def _scores_backward(G, q, k, bk, dA, dP, rows: int):
    """The gradients of ``A`` (from `dA`) and ``P`` (from `dP`) with respect to q, k, b*k and G, ``[C, K]`` each,
    split as the forward's :func:`.forward._scores`: each block of `rows` rows, from ``r``, has its diagonal block
    pairwise and its columns ``j < r`` through the two factors ``f_i = exp(G_i - G_r)`` and
    ``h_j = exp(G_r - G_j)`` (matmuls; the factors' own gradients land on ``G_i``, ``G_j`` and ``G_r``)."""
    C, K = G.shape
    first_row = fw._iota((rows, K), 0) == 0
    dk_far = jnp.zeros((C, K), _F32)
    dG_far = jnp.zeros((C, K), _F32)
    parts: list[tuple[jax.Array, ...]] = []
    for r0 in range(0, C, rows):
        G_b, q_b, k_b, bk_b = (x[r0 : r0 + rows] for x in (G, q, k, bk))
        dA_b, dP_b = dA[r0 : r0 + rows], dP[r0 : r0 + rows]  # [rows, C]
        place = jnp.where(fw._iota((rows, C), 1) == fw._iota((rows, C), 0) + r0, 1.0, 0.0).astype(_F32)
        dq_b, dk_b, dbk_b, dG_b = _diagonal_block_backward(
            G_b, q_b, k_b, bk_b, fw._dot_t(dA_b, place), fw._dot_t(dP_b, place)
        )
        if r0:
            G_r = G_b[:1]
            f = jnp.exp(jnp.minimum(G_b - G_r, 0.0))  # [rows, K]
            h = jnp.where(fw._iota((C, K), 0) < r0, jnp.exp(jnp.minimum(G_r - G, 0.0)), 0.0)  # [C, K], rows j < r0
            earlier = fw._iota((rows, C), 1) < r0
            dA_far, dP_far = jnp.where(earlier, dA_b, 0.0), jnp.where(earlier, dP_b, 0.0)
            right = k * h
            d_left_a, d_left_q = fw._dot(dA_far, right), fw._dot(dP_far, right)
            dbk_b = dbk_b + d_left_a * f
            dq_b = dq_b + d_left_q * f
            x = (d_left_a * bk_b + d_left_q * q_b) * f  # d f * f
            d_right = fw._dot(dA_far.T, bk_b * f) + fw._dot(dP_far.T, q_b * f)  # [C, K]
            y = d_right * right  # d h * h
            dk_far = dk_far + d_right * h
            dG_far = dG_far - y
            to_r = jnp.sum(y, axis=0, keepdims=True) - jnp.sum(x, axis=0, keepdims=True)
            dG_b = dG_b + x + jnp.where(first_row, to_r, 0.0)
        parts.append((dq_b, dk_b, dbk_b, dG_b))
    dq, dk, dbk, dG = (jnp.concatenate(p, axis=0) for p in zip(*parts, strict=True))
    return dq, dk + dk_far, dbk, dG + dG_far


def _fused_backward_kernel(
    q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, do_ref, hs_ref, dht_ref,
    dq_ref, dk_ref, dv_ref, dg_ref, db_ref, dw_ref, dh0_ref, ds_ref,
    *, scale: float, rows: int, block: int,
):  # fmt: skip
    """One chunk of one (batch, head), last chunk first (see the module docstring)."""
    n = pl.program_id(2)

    @pl.when(n == 0)
    def _():
        ds_ref[...] = dht_ref[...]

    q, k, v, g, b, w, do = (r[...].astype(_F32) for r in (q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, do_ref))
    C = q.shape[0]
    i, j = fw._iota((C, C), 0), fw._iota((C, C), 1)
    # the forward's chunk, recomputed
    G = fw._cumulative_decay(g)
    bk = b * k
    A, P = fw._scores(G, q, k, bk, rows)
    T = fw._unit_lower_inverse(A, block)
    expG = jnp.exp(G)
    g_last = jnp.sum(g, axis=0, keepdims=True)
    decay = jnp.exp(g_last)
    r_v, r_k = w * v, bk * expG
    w_mat = fw._dot(T, r_k)
    qd = q * expG
    e_kd = jnp.exp(jnp.minimum(g_last - G, 0.0))
    kd = k * e_kd
    St, dSt = hs_ref[...], ds_ref[...]  # S^T at the chunk start, dS'^T after it
    u = fw._dot(T, r_v) - fw._dot_t(w_mat, St)

    # through the state step and the output
    du = scale * fw._dot(P.T, do) + fw._dot_t(kd, dSt)
    dP = jnp.where(i >= j, scale * fw._dot_t(do, u), 0.0)
    dqd = scale * fw._dot(do, St)
    dkd = fw._dot(u, dSt)
    dD = jnp.sum(St * dSt, axis=0, keepdims=True)
    dW = -fw._dot(du, St)
    ds_ref[...] = scale * fw._dot(do.T, qd) + dSt * decay - fw._dot(du.T, w_mat)
    # through the WY solve
    T_t = T.T
    dr_v = fw._dot(T_t, du)
    dr_k = fw._dot(T_t, dW)
    dT = fw._dot_t(du, r_v) + fw._dot_t(dW, r_k)
    dA = jnp.where(i > j, -fw._dot(fw._dot(T_t, dT), T_t), 0.0)
    # element-wise, then the pairwise scores
    dbk = dr_k * expG
    dG = dr_k * r_k + dqd * qd - dkd * kd
    dq = dqd * expG
    dk = dkd * e_kd
    dG_last = jnp.sum(dkd * kd, axis=0, keepdims=True) + dD * decay
    s_dq, s_dk, s_dbk, s_dG = _scores_backward(G, q, k, bk, dA, dP, rows)
    dq, dk, dbk, dG = dq + s_dq, dk + s_dk, dbk + s_dbk, dG + s_dG
    dG = dG + jnp.where(fw._iota(dG.shape, 0) == C - 1, dG_last, 0.0)  # G_C is the last row of G
    dg = fw._dot(jnp.where(i <= j, 1.0, 0.0).astype(_F32), dG)  # dg_t = sum_{s >= t} dG_s

    dq_ref[...] = dq
    dk_ref[...] = dk + dbk * b
    db_ref[...] = dbk * k
    dg_ref[...] = dg
    dv_ref[...] = dr_v * w
    dw_ref[...] = dr_v * v

    @pl.when(n == pl.num_programs(2) - 1)
    def _():
        dh0_ref[...] = ds_ref[...]


@functools.partial(jax.jit, static_argnames=("scale", "chunk", "interpret"))
def gdn2_fused_backward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    b: jax.Array,
    w: jax.Array,
    do: jax.Array,
    states_t: jax.Array,
    d_final_t: jax.Array,
    *,
    scale: float,
    chunk: int = fw.CHUNK,
    interpret: bool = False,
) -> tuple[jax.Array, ...]:
    """Run the fused backward kernel.

    Args:
        q, k, g, b: ``[B, T, H, K]``; v, w, do: ``[B, T, H, V]`` (any T: padded to whole chunks here).
        states_t: ``[B, H, N, V, K]`` float32, the forward's chunk-start states (transposed).
        d_final_t: ``[B, H, V, K]`` float32, the final state's cotangent (transposed).
        scale, chunk, interpret: as the forward's.

    Returns:
        ``(dq, dk, dv, dg, db, dw, d_initial_state^T)``, float32; the first six ``[B, T, H, *]``.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk
    N = fw._num_chunks(T, C)
    T_pad = -(-T // C) * C
    flat = [pad_time(x, T_pad).reshape(B, T_pad, H * x.shape[-1]) for x in (q, k, v, g, b, w, do)]

    def last_first(bi, hi, ni):
        return (bi, N - 1 - ni, hi)

    key_block = pl.BlockSpec((None, C, K), last_first)
    value_block = pl.BlockSpec((None, C, V), last_first)
    state_block = pl.BlockSpec((None, None, V, K), lambda bi, hi, ni: (bi, hi, 0, 0))
    states_block = pl.BlockSpec((None, None, None, V, K), lambda bi, hi, ni: (bi, hi, N - 1 - ni, 0, 0))
    gate_blocks = [key_block, key_block, value_block, key_block, key_block, value_block]
    dh0_out = jax.ShapeDtypeStruct((B, H, V, K), _F32)
    key_out = jax.ShapeDtypeStruct((B, T_pad, H * K), _F32)
    value_out = jax.ShapeDtypeStruct((B, T_pad, H * V), _F32)
    kernel = functools.partial(_fused_backward_kernel, scale=float(scale), rows=fw.SOLVE_BLOCK, block=fw.SOLVE_BLOCK)
    dq, dk, dv, dg, db, dw, dh0_t = pl.pallas_call(
        kernel,
        grid=(B, H, N),
        in_specs=[*gate_blocks, value_block, states_block, state_block],  # q k v g b w, do, S^T, dS_final^T
        out_specs=[*gate_blocks, state_block],  # dq dk dv dg db dw, dS_0^T
        out_shape=[*(key_out if spec is key_block else value_out for spec in gate_blocks), dh0_out],
        scratch_shapes=[pltpu.VMEM((V, K), _F32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name="gdn2_fused_backward",
    )(*flat, states_t, d_final_t.astype(_F32))
    unflat = tuple(x.reshape(B, T_pad, H, x.shape[-1] // H)[:, :T] for x in (dq, dk, dv, dg, db, dw))
    return (*unflat, dh0_t)
