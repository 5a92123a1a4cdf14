"""The fused forward and backward of GDN-2 as Pallas kernels for a GPU (Pallas' Triton lowering).

The TPU kernels (:mod:`.forward`, :mod:`.fused_backward`) walk the chunks as a sequential grid axis with the state
in a VMEM scratch; GPU grid programs share no scratch and run in no set order, so here the chunk loop runs inside
the program (``lax.fori_loop``) and the state is its loop carry, in registers. Grid ``(B, H, V / BV)``: one program
per (batch, head, block of BV value columns), each reading its head's whole sequence through ``[C, K]`` and
``[C, BV]`` tiles. The algebra is the TPU kernels', per chunk of C tokens (:mod:`.forward`'s docstring); the
helpers that do not slice values (cumulative decay, WY solve, the backward's pairwise-score gradients) are shared.

What differs, and why:

* Triton has no slicing or concatenation of register tensors, so the pairwise scores are formed one key row ``j``
  at a time over the whole ``[C, K]`` tile (``exp(min(G_i - G_j, 0))`` for every ``i >= j``: exact, no factoring
  through a reference row), columns put in place by masks; the backward runs the same loop
  (:func:`.fused_backward._diagonal_block_backward` on the whole chunk);
* every tensor a Triton program holds has power-of-two dimensions: the caller pads K and V to powers of two
  (at least 16, the smallest dot), with zero q, k, b, g, v, w, which leaves the padded channels inert;
* value blocks: the forward's writes, outputs and state split by value columns, so BV < V runs more programs (the
  scores and the WY solve are recomputed per block). In the backward the key-side gradients are sums over the value
  columns; each block writes its share to its own slice of a ``[V / BV, ...]`` buffer, summed by the caller.

Float32 math: by default every product is Triton's IEEE float32 dot; ``dots="bf16x3"`` runs them as three bf16
tensor-core products with float32 accumulation (:data:`DOTS`). o in v's dtype, gradients float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from ....common.jax.jax_wy import pad_time
from . import forward as fw
from . import fused_backward as fb

__all__ = ["DOTS", "gdn2_gpu_backward", "gdn2_gpu_forward", "padded_width"]

_F32 = jnp.float32


# How the kernels' matrix products run: "fp32" Triton's IEEE float32 dot (CUDA cores); "bf16x3" each float32
# operand split into a bf16 head and a bf16 remainder, three tensor-core products of those (the remainders' product
# dropped) accumulated in float32: about 16 significant bits a product instead of 24, for a fraction of the time.
# The cumulative decay stays IEEE float32 in both (the decays amplify its error).
DOTS = ("fp32", "bf16x3")


def _split_bf16(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    head = x.astype(jnp.bfloat16)
    return head, (x - head.astype(_F32)).astype(jnp.bfloat16)


def _matmul(x: jax.Array, y: jax.Array, dims, dots: str) -> jax.Array:
    """``lax.dot_general(x, y, dims)`` in float32 by the `dots` scheme (see :data:`DOTS`)."""
    if dots == "fp32":
        return lax.dot_general(x, y, dims, precision=lax.Precision.HIGHEST, preferred_element_type=_F32)
    (xh, xl), (yh, yl) = _split_bf16(x), _split_bf16(y)

    def mul(a, b):
        return lax.dot_general(a, b, dims, preferred_element_type=_F32)

    return mul(xl, yh) + mul(xh, yl) + mul(xh, yh)  # the small terms first


def _products(dots: str):
    """``(x @ y, x @ y^T)`` by the `dots` scheme."""
    if dots not in DOTS:
        raise ValueError(f"dots must be one of {DOTS}, got {dots!r}")
    mm = functools.partial(_matmul, dims=(((1,), (0,)), ((), ())), dots=dots)
    mm_t = functools.partial(_matmul, dims=(((1,), (1,)), ((), ())), dots=dots)
    return mm, mm_t


def padded_width(d: int) -> int:
    """The power of two >= max(d, 16) that a K or V of `d` is padded to (Triton's tensor and dot rules)."""
    return max(16, 1 << (d - 1).bit_length())


def _pairwise_scores(G: jax.Array, q: jax.Array, k: jax.Array, bk: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``A`` (strictly lower) and ``P`` (lower, diagonal included), ``[C, C]``, one key row ``j`` per step:
    column ``j`` is ``sum_c x_i[c] exp(min(G_i[c] - G_j[c], 0)) k_j[c]`` for ``x = b*k`` and ``x = q``."""
    C = G.shape[0]
    rows = fw._iota(G.shape, 0)
    cols = fw._iota((C, C), 1)

    def one_key(j, carry):
        A, P = carry
        at_row = rows == j
        G_j = jnp.sum(jnp.where(at_row, G, 0.0), axis=0, keepdims=True)  # [1, K]
        k_j = jnp.sum(jnp.where(at_row, k, 0.0), axis=0, keepdims=True)
        decay_k = jnp.exp(jnp.minimum(G - G_j, 0.0)) * k_j  # [C, K]
        at_col = cols == j
        A = jnp.where(at_col, jnp.sum(bk * decay_k, axis=1, keepdims=True), A)
        P = jnp.where(at_col, jnp.sum(q * decay_k, axis=1, keepdims=True), P)
        return A, P

    zero = jnp.zeros((C, C), _F32)
    A, P = lax.fori_loop(0, C, one_key, (zero, zero))
    i, j = fw._iota((C, C), 0), cols
    return jnp.where(i > j, A, 0.0), jnp.where(i >= j, P, 0.0)


def _chunk(refs, n, C: int):
    """Chunk `n`'s rows of each ``[T_pad, D]`` block ref, as float32 ``[C, D]`` tiles."""
    rows = pl.ds(pl.multiple_of(n * C, C), C)
    return tuple(r[rows, :].astype(_F32) for r in refs)


def _chunk_forward(q, k, g, b, mm):
    """The chunk's state-free forward quantities (the TPU kernel's, :mod:`.forward`), products by `mm`."""
    G = fw._cumulative_decay(g)
    bk = b * k
    A, P = _pairwise_scores(G, q, k, bk)
    T = fw._unit_lower_inverse(A, fw.SOLVE_BLOCK, dot=mm)
    expG = jnp.exp(G)
    g_last = jnp.sum(g, axis=0, keepdims=True)  # G at the chunk's last token, [1, K]
    return G, bk, P, T, expG, g_last


def _forward_kernel(q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, h0_ref, o_ref, ht_ref, *hs, scale, chunk, n_chunks, dots):
    """One (batch, head, value block): every chunk in order, the state ``S^T`` ``[BV, K]`` the loop's carry."""
    hs_ref = hs[0] if hs else None
    C = chunk
    mm, mm_t = _products(dots)

    def step(n, St):
        q, k, v, g, b, w = _chunk((q_ref, k_ref, v_ref, g_ref, b_ref, w_ref), n, C)
        G, bk, P, T, expG, g_last = _chunk_forward(q, k, g, b, mm)
        if hs_ref is not None:
            hs_ref[n] = St
        u = mm(T, w * v) - mm_t(mm(T, bk * expG), St)
        o = scale * (mm_t(q * expG, St) + mm(P, u))
        o_ref[pl.ds(pl.multiple_of(n * C, C), C), :] = o.astype(o_ref.dtype)
        kd = k * jnp.exp(jnp.minimum(g_last - G, 0.0))
        return St * jnp.exp(g_last) + mm(u.T, kd)

    ht_ref[...] = lax.fori_loop(0, n_chunks, step, h0_ref[...].astype(_F32))


def _backward_kernel(
    q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, do_ref, hs_ref, dht_ref,
    dq_ref, dk_ref, dg_ref, db_ref, dv_ref, dw_ref, dh0_ref,
    *, scale, chunk, n_chunks, dots,
):  # fmt: skip
    """One (batch, head, value block): chunks last to first, the state's cotangent ``dS^T`` the loop's carry; the
    algebra of :func:`.fused_backward._fused_backward_kernel`, key-side gradients as this block's share."""
    C = chunk
    mm, mm_t = _products(dots)

    def step(i, dSt):
        n = n_chunks - 1 - i
        q, k, v, g, b, w, do = _chunk((q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, do_ref), n, C)
        ii, jj = fw._iota((C, C), 0), fw._iota((C, C), 1)
        G, bk, P, T, expG, g_last = _chunk_forward(q, k, g, b, mm)
        decay = jnp.exp(g_last)
        r_v, r_k = w * v, bk * expG
        w_mat = mm(T, r_k)
        qd = q * expG
        e_kd = jnp.exp(jnp.minimum(g_last - G, 0.0))
        kd = k * e_kd
        St = hs_ref[n]  # S^T at the chunk start
        u = mm(T, r_v) - mm_t(w_mat, St)

        du = scale * mm(P.T, do) + mm_t(kd, dSt)
        dP = jnp.where(ii >= jj, scale * mm_t(do, u), 0.0)
        dqd = scale * mm(do, St)
        dkd = mm(u, dSt)
        dD = jnp.sum(St * dSt, axis=0, keepdims=True)
        dW = -mm(du, St)
        dSt_prev = scale * mm(do.T, qd) + dSt * decay - mm(du.T, w_mat)
        T_t = T.T
        dr_v = mm(T_t, du)
        dr_k = mm(T_t, dW)
        dT = mm_t(du, r_v) + mm_t(dW, r_k)
        dA = jnp.where(ii > jj, -mm(mm(T_t, dT), T_t), 0.0)
        dbk = dr_k * expG
        dG = dr_k * r_k + dqd * qd - dkd * kd
        dq = dqd * expG
        dk = dkd * e_kd
        dG_last = jnp.sum(dkd * kd, axis=0, keepdims=True) + dD * decay
        s_dq, s_dk, s_dbk, s_dG = fb._diagonal_block_backward(G, q, k, bk, dA, dP)  # every pair i >= j
        dq, dk, dbk, dG = dq + s_dq, dk + s_dk, dbk + s_dbk, dG + s_dG
        dG = dG + jnp.where(fw._iota(dG.shape, 0) == C - 1, dG_last, 0.0)
        dg = mm(jnp.where(ii <= jj, 1.0, 0.0).astype(_F32), dG)

        rows = pl.ds(pl.multiple_of(n * C, C), C)
        dq_ref[rows, :] = dq
        dk_ref[rows, :] = dk + dbk * b
        db_ref[rows, :] = dbk * k
        dg_ref[rows, :] = dg
        dv_ref[rows, :] = dr_v * w
        dw_ref[rows, :] = dr_v * v
        return dSt_prev

    dh0_ref[...] = lax.fori_loop(0, n_chunks, step, dht_ref[...].astype(_F32))


def _layout(B: int, T: int, H: int, K: int, V: int, chunk: int, block_v: int | None):
    """Padded sizes and the block specs shared by the two kernels."""
    Kp, Vp = padded_width(K), padded_width(V)
    BV = Vp if block_v is None else min(padded_width(block_v), Vp)
    NV = Vp // BV
    N = fw._num_chunks(T, chunk)
    T_pad = -(-T // chunk) * chunk
    specs = {
        "key": pl.BlockSpec((None, T_pad, Kp), lambda bi, hi, vj: (bi, 0, hi)),
        "value": pl.BlockSpec((None, T_pad, BV), lambda bi, hi, vj: (bi, 0, hi * NV + vj)),
        "state": pl.BlockSpec((None, None, BV, Kp), lambda bi, hi, vj: (bi, hi, vj, 0)),
        "states": pl.BlockSpec((None, None, N, BV, Kp), lambda bi, hi, vj: (bi, hi, 0, vj, 0)),
        "key_share": pl.BlockSpec((None, None, T_pad, Kp), lambda bi, hi, vj: (vj, bi, 0, hi)),
    }
    return Kp, Vp, NV, N, T_pad, specs


def _flatten(xs, T_pad: int, width: int) -> list[jax.Array]:
    """``[B, T, H, D]`` -> ``[B, T_pad, H * width]``: time and channels zero-padded, heads side by side."""
    out = []
    for x in xs:
        x = pad_time(x, T_pad)
        if x.shape[-1] != width:
            x = jnp.pad(x, [(0, 0)] * 3 + [(0, width - x.shape[-1])])
        out.append(x.reshape(x.shape[0], T_pad, -1))
    return out


def _pad_state(s: jax.Array, Vp: int, Kp: int) -> jax.Array:
    """``[B, H, V, K]`` float32 -> ``[B, H, Vp, Kp]``, zero-padded."""
    return jnp.pad(s.astype(_F32), [(0, 0), (0, 0), (0, Vp - s.shape[2]), (0, Kp - s.shape[3])])


_STATIC = ("scale", "chunk", "store_states", "block_v", "num_warps", "dots", "interpret")


@functools.partial(jax.jit, static_argnames=_STATIC)
def gdn2_gpu_forward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    b: jax.Array,
    w: jax.Array,
    h0_t: jax.Array,
    *,
    scale: float,
    chunk: int = fw.CHUNK,
    store_states: bool = False,
    block_v: int | None = None,
    num_warps: int = 4,
    dots: str = "fp32",
    interpret: bool = False,
) -> tuple[jax.Array, ...]:
    """Run the fused forward kernel for a GPU.

    Args:
        q, k, g, b: ``[B, T, H, K]``; v, w: ``[B, T, H, V]`` (any T, K, V: padded here).
        h0_t: ``[B, H, V, K]`` float32, the initial state transposed.
        scale: query scale.
        chunk: tokens per chunk (a power of two, >= 16).
        store_states: also return the state at each chunk start, ``[B, H, N, Vp, Kp]`` (transposed, padded).
        block_v: value columns per program (a power of two; None: all of V in one program).
        num_warps: Triton warps per program.
        dots: how the matrix products run, ``"fp32"`` or ``"bf16x3"`` (see :data:`DOTS`).
        interpret: run in Pallas' interpreter (any backend) instead of compiling with Triton.

    Returns:
        ``(o [B, T, H, V] in v's dtype, final_state^T [B, H, V, K] float32)``, then the chunk-start states if
        `store_states`.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    Kp, Vp, NV, N, T_pad, spec = _layout(B, T, H, K, V, chunk, block_v)
    flat = _flatten((q, k, g, b), T_pad, Kp)
    flat_v = _flatten((v, w), T_pad, Vp)
    out_shape = [jax.ShapeDtypeStruct((B, T_pad, H * Vp), v.dtype), jax.ShapeDtypeStruct((B, H, Vp, Kp), _F32)]
    out_specs = [spec["value"], spec["state"]]
    if store_states:
        out_shape.append(jax.ShapeDtypeStruct((B, H, N, Vp, Kp), _F32))
        out_specs.append(spec["states"])
    key, value = spec["key"], spec["value"]
    outs = pl.pallas_call(
        functools.partial(_forward_kernel, scale=float(scale), chunk=chunk, n_chunks=N, dots=dots),
        grid=(B, H, NV),
        in_specs=[key, key, value, key, key, value, spec["state"]],
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="gdn2_gpu_forward",
    )(flat[0], flat[1], flat_v[0], flat[2], flat[3], flat_v[1], _pad_state(h0_t, Vp, Kp))
    o = outs[0].reshape(B, T_pad, H, Vp)[:, :T, :, :V]
    return (o, outs[1][:, :, :V, :K], *outs[2:])


@functools.partial(jax.jit, static_argnames=("scale", "chunk", "block_v", "num_warps", "dots", "interpret"))
def gdn2_gpu_backward(
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
    block_v: int | None = None,
    num_warps: int = 4,
    dots: str = "fp32",
    interpret: bool = False,
) -> tuple[jax.Array, ...]:
    """Run the fused backward kernel for a GPU.

    Args:
        q, k, g, b: ``[B, T, H, K]``; v, w, do: ``[B, T, H, V]``.
        states_t: ``[B, H, N, Vp, Kp]`` float32, the forward's chunk-start states (as it stored them).
        d_final_t: ``[B, H, V, K]`` float32, the final state's cotangent (transposed).
        scale, chunk, block_v, num_warps, dots, interpret: as the forward's (the same chunk and padding).

    Returns:
        ``(dq, dk, dv, dg, db, dw, d_initial_state^T)``, float32; the first six ``[B, T, H, *]``.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    Kp, Vp, NV, N, T_pad, spec = _layout(B, T, H, K, V, chunk, block_v)
    flat = _flatten((q, k, g, b), T_pad, Kp)
    flat_v = _flatten((v, w, do), T_pad, Vp)
    key, value, share = spec["key"], spec["value"], spec["key_share"]
    key_out = jax.ShapeDtypeStruct((NV, B, T_pad, H * Kp), _F32)
    value_out = jax.ShapeDtypeStruct((B, T_pad, H * Vp), _F32)
    dq, dk, dg, db, dv, dw, dh0_t = pl.pallas_call(
        functools.partial(_backward_kernel, scale=float(scale), chunk=chunk, n_chunks=N, dots=dots),
        grid=(B, H, NV),
        in_specs=[key, key, value, key, key, value, value, spec["states"], spec["state"]],
        out_specs=[share, share, share, share, value, value, spec["state"]],
        out_shape=[
            key_out,
            key_out,
            key_out,
            key_out,
            value_out,
            value_out,
            jax.ShapeDtypeStruct((B, H, Vp, Kp), _F32),
        ],
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret,
        name="gdn2_gpu_backward",
    )(flat[0], flat[1], flat_v[0], flat[2], flat[3], flat_v[1], flat_v[2], states_t, _pad_state(d_final_t, Vp, Kp))

    def unflat(x: jax.Array, width: int, keep: int) -> jax.Array:
        return x.reshape(B, T_pad, H, width)[:, :T, :, :keep]

    dq, dk, dg, db = (unflat(x.sum(axis=0), Kp, K) for x in (dq, dk, dg, db))
    dv, dw = (unflat(x, Vp, V) for x in (dv, dw))
    return dq, dk, dv, dg, db, dw, dh0_t[:, :, :V, :K]
