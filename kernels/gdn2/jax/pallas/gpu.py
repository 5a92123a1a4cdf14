"""The forward and backward of GDN-2 as Pallas kernels for a GPU (Pallas' Triton lowering).

A chunk's work splits into what does not depend on the state (the pairwise scores, the WY solve, the decayed keys
and queries: most of its arithmetic) and the few products that carry the state from one chunk to the next. The
first runs for every chunk at once, a program per (batch, head, chunk): :func:`_prepare_kernel` in the forward,
:func:`_grads_kernel` for the gradients. Only the second walks the chunks in order, a program per (batch, head,
block of BV value columns) with the state as its loop carry in registers (GPU grid programs share no scratch and
run in no set order, so the walk is a ``lax.fori_loop`` inside the program): :func:`_walk_kernel` forward,
storing the state at every chunk start; :func:`_dstate_walk_kernel` backward, storing the state's cotangent at
every chunk end. The algebra is the TPU kernels' (:mod:`.forward`'s docstring); the helpers that do not slice
values (cumulative decay, WY solve, the backward's pairwise-score gradients) are shared.

What differs, and why:

* Triton has no slicing or concatenation of register tensors, so the pairwise scores are formed one key row ``j``
  at a time over the whole ``[C, K]`` tile (``exp(min(G_i - G_j, 0))`` for every ``i >= j``: exact, no factoring
  through a reference row), columns put in place by masks; the backward runs the same loop
  (:func:`.fused_backward._diagonal_block_backward` on the whole chunk);
* every tensor a Triton program holds has power-of-two dimensions: the caller pads K and V to powers of two
  (at least 16, the smallest dot), with zero q, k, b, g, v, w, which leaves the padded channels inert;
* value blocks split only the walks (BV < V runs more of them); the per-chunk kernels hold all of V, so the
  key-side gradients, sums over the value columns, are whole in one program.

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

__all__ = ["DOTS", "gdn2_gpu_backward", "gdn2_gpu_forward", "gdn2_gpu_prepare", "padded_width"]

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


def _chunk_decays(k, g, b):
    """The chunk's cumulative decay ``G``, ``b*k``, ``exp G`` and ``G`` at its last token (``[1, K]``)."""
    G = fw._cumulative_decay(g)
    return G, b * k, jnp.exp(G), jnp.sum(g, axis=0, keepdims=True)


def _chunk_forward(q, k, g, b, mm):
    """The chunk's state-free forward quantities (the TPU kernel's, :mod:`.forward`), products by `mm`."""
    G, bk, expG, g_last = _chunk_decays(k, g, b)
    A, P = _pairwise_scores(G, q, k, bk)
    T = fw._unit_lower_inverse(A, fw.SOLVE_BLOCK, dot=mm)
    return G, bk, P, T, expG, g_last


def _prepare_kernel(
    q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, wm_ref, um_ref, qd_ref, kd_ref, p_ref, t_ref, *, dots
):  # fmt: skip
    """One (batch, head, chunk): what the walk needs of the chunk that does not depend on the state, all chunks at
    once. ``W = T (b*k*exp G)``, ``U = T (w*v)`` (the WY form), ``q*exp G``, ``k*exp(G_last - G)`` and the scores
    ``P``; the pairwise scores and the WY solve, most of a chunk's work, leave the sequential walk. The WY inverse
    ``T`` too, for the gradients (:func:`_grads_kernel`), so that they need neither the scores' loop nor the solve
    again."""
    mm, _ = _products(dots)
    # each input loaded where it is first used and each output stored once made: a [C, K] float32 tile is 64
    # registers a thread at 4 warps, so what is live at once decides whether the program spills
    q, k, g, b = (r[...].astype(_F32) for r in (q_ref, k_ref, g_ref, b_ref))
    G, bk, P, T, expG, g_last = _chunk_forward(q, k, g, b, mm)
    p_ref[...] = P
    t_ref[...] = T
    qd_ref[...] = q * expG
    kd_ref[...] = k * jnp.exp(jnp.minimum(g_last - G, 0.0))
    wm_ref[...] = mm(T, bk * expG)
    um_ref[...] = mm(T, w_ref[...].astype(_F32) * v_ref[...].astype(_F32))


def _walk_kernel(
    wm_ref, um_ref, qd_ref, kd_ref, p_ref, g_ref, h0_ref, o_ref, ht_ref, *hs, scale, chunk, n_chunks, dots
):  # fmt: skip
    """One (batch, head, value block): every chunk in order, the state ``S^T`` ``[BV, K]`` the loop's carry; four
    products a chunk on what :func:`_prepare_kernel` left (``u = U - W S``, ``o = q_d S + P u``, the update)."""
    hs_ref = hs[0] if hs else None
    C = chunk
    mm, mm_t = _products(dots)

    def step(n, St):
        wm, qd, kd, g = _chunk((wm_ref, qd_ref, kd_ref, g_ref), n, C)
        (um,) = _chunk((um_ref,), n, C)
        if hs_ref is not None:
            hs_ref[n] = St
        u = um - mm_t(wm, St)
        o = scale * (mm_t(qd, St) + mm(p_ref[n], u))
        o_ref[pl.ds(pl.multiple_of(n * C, C), C), :] = o.astype(o_ref.dtype)
        g_last = jnp.sum(g, axis=0, keepdims=True)  # G at the chunk's last token, [1, K]
        return St * jnp.exp(g_last) + mm(u.T, kd)

    ht_ref[...] = lax.fori_loop(0, n_chunks, step, h0_ref[...].astype(_F32))


def _dstate_walk_kernel(
    wm_ref, qd_ref, kd_ref, p_ref, g_ref, do_ref, dht_ref, dhs_ref, dh0_ref, *, scale, chunk, n_chunks, dots
):  # fmt: skip
    """One (batch, head, value block): chunks last to first, the state's cotangent ``dS^T`` ``[BV, K]`` the loop's
    carry, stored at each chunk's end (what :func:`_grads_kernel` reads); four products a chunk on what
    :func:`_prepare_kernel` left."""
    C = chunk
    mm, mm_t = _products(dots)

    def step(i, dSt):
        n = n_chunks - 1 - i
        wm, qd, kd, g = _chunk((wm_ref, qd_ref, kd_ref, g_ref), n, C)
        (do,) = _chunk((do_ref,), n, C)
        dhs_ref[n] = dSt
        du = scale * mm(p_ref[n].T, do) + mm_t(kd, dSt)
        decay = jnp.exp(jnp.sum(g, axis=0, keepdims=True))
        return scale * mm(do.T, qd) + dSt * decay - mm(du.T, wm)

    dh0_ref[...] = lax.fori_loop(0, n_chunks, step, dht_ref[...].astype(_F32))


def _grads_kernel(
    q_ref, k_ref, v_ref, g_ref, b_ref, w_ref, do_ref, hs_ref, dhs_ref, p_ref, t_ref,
    dq_ref, dk_ref, dg_ref, db_ref, dv_ref, dw_ref,
    *, scale, dots,
):  # fmt: skip
    """One (batch, head, chunk), all chunks at once: every input's gradient from the chunk's start state and its
    end cotangent (the two walks'), the scores ``P`` and the WY inverse ``T`` that :func:`_prepare_kernel` kept, all
    of V in one program; the algebra of :func:`.fused_backward._fused_backward_kernel`."""
    mm, mm_t = _products(dots)
    # loads where first used and the value-side gradients stored as soon as made (as in _prepare_kernel: fewer
    # tiles live at once, the [V, K] states 128 registers a thread each at 4 warps)
    q, k, g, b = (r[...].astype(_F32) for r in (q_ref, k_ref, g_ref, b_ref))
    P, T = p_ref[...], t_ref[...]
    C = q.shape[0]
    ii, jj = fw._iota((C, C), 0), fw._iota((C, C), 1)
    G, bk, expG, g_last = _chunk_decays(k, g, b)
    r_k = bk * expG
    e_kd = jnp.exp(jnp.minimum(g_last - G, 0.0))
    kd = k * e_kd
    v, w = v_ref[...].astype(_F32), w_ref[...].astype(_F32)
    r_v = w * v
    St = hs_ref[...]  # S^T at the chunk start
    u = mm(T, r_v) - mm_t(mm(T, r_k), St)

    do, dSt = do_ref[...].astype(_F32), dhs_ref[...]  # dS^T at the chunk's end
    du = scale * mm(P.T, do) + mm_t(kd, dSt)
    dP = jnp.where(ii >= jj, scale * mm_t(do, u), 0.0)
    dqd = scale * mm(do, St)
    dkd = mm(u, dSt)
    dG_last = jnp.sum(dkd * kd, axis=0, keepdims=True) + jnp.sum(St * dSt, axis=0, keepdims=True) * jnp.exp(g_last)
    dW = -mm(du, St)
    T_t = T.T
    dr_v = mm(T_t, du)
    dv_ref[...] = dr_v * w
    dw_ref[...] = dr_v * v
    dr_k = mm(T_t, dW)
    dT = mm_t(du, r_v) + mm_t(dW, r_k)
    dA = jnp.where(ii > jj, -mm(mm(T_t, dT), T_t), 0.0)
    direct = (dqd * expG, dkd * e_kd, dr_k * expG, dr_k * r_k + dqd * q * expG - dkd * kd)  # dq, dk, dbk, dG
    # every pair i >= j of the scores, added onto the direct terms in the loop's carry
    dq, dk, dbk, dG = fb._diagonal_block_backward(G, q, k, bk, dA, dP, init=direct)
    dG = dG + jnp.where(fw._iota(dG.shape, 0) == C - 1, dG_last, 0.0)
    dq_ref[...] = dq
    dk_ref[...] = dk + dbk * b
    db_ref[...] = dbk * k
    dg_ref[...] = mm(jnp.where(ii <= jj, 1.0, 0.0).astype(_F32), dG)


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
        "scores": pl.BlockSpec((None, None, N, chunk, chunk), lambda bi, hi, vj: (bi, hi, 0, 0, 0)),
        # grid (B, H, N): a chunk a program
        "key_chunk": pl.BlockSpec((None, chunk, Kp), lambda bi, hi, n: (bi, n, hi)),
        "value_chunk": pl.BlockSpec((None, chunk, Vp), lambda bi, hi, n: (bi, n, hi)),
        "scores_chunk": pl.BlockSpec((None, None, None, chunk, chunk), lambda bi, hi, n: (bi, hi, n, 0, 0)),
        "state_chunk": pl.BlockSpec((None, None, None, Vp, Kp), lambda bi, hi, n: (bi, hi, n, 0, 0)),
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


def _prepare(flat, flat_v, spec, sizes, chunk: int, dots: str, params, interpret: bool) -> list[jax.Array]:
    """:func:`_prepare_kernel` over every chunk at once, grid (B, H, N): ``[W, U, q_d, k_d, P, T]``, float32 (W,
    q_d, k_d ``[B, T_pad, H * Kp]``, U ``[B, T_pad, H * Vp]``, P and T ``[B, H, N, C, C]``)."""
    B, H, N, T_pad, Kp, Vp = sizes
    key_c, value_c, scores_c = spec["key_chunk"], spec["value_chunk"], spec["scores_chunk"]
    key_f32 = jax.ShapeDtypeStruct((B, T_pad, H * Kp), _F32)
    scores_f32 = jax.ShapeDtypeStruct((B, H, N, chunk, chunk), _F32)
    return pl.pallas_call(
        functools.partial(_prepare_kernel, dots=dots),
        grid=(B, H, N),
        in_specs=[key_c, key_c, value_c, key_c, key_c, value_c],
        out_specs=[key_c, value_c, key_c, key_c, scores_c, scores_c],
        out_shape=[key_f32, jax.ShapeDtypeStruct((B, T_pad, H * Vp), _F32), key_f32, key_f32, scores_f32, scores_f32],
        compiler_params=params,
        interpret=interpret,
        name="gdn2_gpu_prepare",
    )(flat[0], flat[1], flat_v[0], flat[2], flat[3], flat_v[1])


_STATIC = ("scale", "chunk", "store_states", "block_v", "num_warps", "num_stages", "dots", "interpret")


@functools.partial(jax.jit, static_argnames=("chunk", "num_warps", "num_stages", "dots", "interpret"))
def gdn2_gpu_prepare(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    b: jax.Array,
    w: jax.Array,
    *,
    chunk: int = fw.CHUNK,
    num_warps: int = 4,
    num_stages: int = 1,
    dots: str = "fp32",
    interpret: bool = False,
) -> list[jax.Array]:
    """The forward's first kernel alone (``gdn2_gpu_prepare``, a program per chunk): ``[W, U, q_d, k_d, P, T]``
    padded and flattened: the forward's first step, callable alone to time the kernels one by one
    (``benchmarks/gpu/gdn2_pallas.py --stages``); the arguments are the forward's."""
    B, T, H, K = q.shape
    Kp, Vp, _, N, T_pad, spec = _layout(B, T, H, K, v.shape[-1], chunk, None)
    flat = _flatten((q, k, g, b), T_pad, Kp)
    flat_v = _flatten((v, w), T_pad, Vp)
    params = pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    return _prepare(flat, flat_v, spec, (B, H, N, T_pad, Kp, Vp), chunk, dots, params, interpret)


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
    num_stages: int = 1,
    dots: str = "fp32",
    interpret: bool = False,
) -> tuple[jax.Array, ...]:
    """Run the forward for a GPU: the chunks' state-free work in parallel (``gdn2_gpu_prepare``, a program per
    chunk), then the state's walk over them in order (``gdn2_gpu_forward``, a program per value block of a head).

    Args:
        q, k, g, b: ``[B, T, H, K]``; v, w: ``[B, T, H, V]`` (any T, K, V: padded here).
        h0_t: ``[B, H, V, K]`` float32, the initial state transposed.
        scale: query scale.
        chunk: tokens per chunk (a power of two, >= 16).
        store_states: also return the state at each chunk start, ``[B, H, N, Vp, Kp]`` (transposed, padded), and
            what the chunks' prepare made that the backward reads (``prepared``, :func:`_prepare`'s W, q_d, k_d, P
            and T), so that the backward need not make it again.
        block_v: value columns per program (a power of two; None: all of V in one program).
        num_warps: Triton warps per program.
        num_stages: Triton's software pipelining depth (1: none): at 2 or more the walks' loads of a chunk can be
            issued while the chunk before it computes (their loads do not depend on the state they carry).
        dots: how the matrix products run, ``"fp32"`` or ``"bf16x3"`` (see :data:`DOTS`).
        interpret: run in Pallas' interpreter (any backend) instead of compiling with Triton.

    Returns:
        ``(o [B, T, H, V] in v's dtype, final_state^T [B, H, V, K] float32)``, then the chunk-start states and
        ``prepared`` if `store_states`.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    Kp, Vp, NV, N, T_pad, spec = _layout(B, T, H, K, V, chunk, block_v)
    tiling = {"chunk": chunk, "num_warps": num_warps, "num_stages": num_stages, "dots": dots, "interpret": interpret}
    wm, um, qd, kd, p, t = gdn2_gpu_prepare(q, k, v, g, b, w, **tiling)
    (g_flat,) = _flatten((g,), T_pad, Kp)
    params = pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    # 2. the chunks in order, grid (B, H, V / BV): the state's walk and the output
    out_shape = [jax.ShapeDtypeStruct((B, T_pad, H * Vp), v.dtype), jax.ShapeDtypeStruct((B, H, Vp, Kp), _F32)]
    out_specs = [spec["value"], spec["state"]]
    if store_states:
        out_shape.append(jax.ShapeDtypeStruct((B, H, N, Vp, Kp), _F32))
        out_specs.append(spec["states"])
    key, value = spec["key"], spec["value"]
    outs = pl.pallas_call(
        functools.partial(_walk_kernel, scale=float(scale), chunk=chunk, n_chunks=N, dots=dots),
        grid=(B, H, NV),
        in_specs=[key, value, key, key, spec["scores"], key, spec["state"]],
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=params,
        interpret=interpret,
        name="gdn2_gpu_forward",
    )(wm, um, qd, kd, p, g_flat, _pad_state(h0_t, Vp, Kp))
    o = outs[0].reshape(B, T_pad, H, Vp)[:, :T, :, :V]
    if not store_states:
        return o, outs[1][:, :, :V, :K]
    return o, outs[1][:, :, :V, :K], outs[2], (wm, qd, kd, p, t)


@functools.partial(
    jax.jit,
    static_argnames=("scale", "chunk", "block_v", "num_warps", "num_stages", "dots", "interpret", "dstate_only"),
)
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
    prepared: tuple[jax.Array, ...] | None = None,
    *,
    scale: float,
    chunk: int = fw.CHUNK,
    block_v: int | None = None,
    num_warps: int = 4,
    num_stages: int = 1,
    dots: str = "fp32",
    interpret: bool = False,
    dstate_only: bool = False,
) -> tuple[jax.Array, ...]:
    """Run the backward for a GPU: the state's cotangent walked back over the chunks' state-free work
    (``gdn2_gpu_dstate``, a program per value block of a head; that work is the forward's `prepared`, else
    ``gdn2_gpu_prepare`` makes it again), then every chunk's gradients at once (``gdn2_gpu_backward``, a program
    per chunk, all of V).

    Args:
        q, k, g, b: ``[B, T, H, K]``; v, w, do: ``[B, T, H, V]``.
        states_t: ``[B, H, N, Vp, Kp]`` float32, the forward's chunk-start states (as it stored them).
        d_final_t: ``[B, H, V, K]`` float32, the final state's cotangent (transposed).
        prepared: the forward's ``prepared`` (with `store_states`: W, q_d, k_d, P, T); None makes it here.
        scale, chunk, block_v, num_warps, num_stages, dots, interpret: as the forward's (the same chunk and
            padding).
        dstate_only: stop after the cotangent's walk and return ``(dstates^T, d_initial_state^T)`` padded: for
            timing the kernels one by one (``benchmarks/gpu/gdn2_pallas.py --stages``).

    Returns:
        ``(dq, dk, dv, dg, db, dw, d_initial_state^T)``, float32; the first six ``[B, T, H, *]``.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    Kp, Vp, NV, N, T_pad, spec = _layout(B, T, H, K, V, chunk, block_v)
    flat = _flatten((q, k, g, b), T_pad, Kp)
    flat_v = _flatten((v, w, do), T_pad, Vp)
    params = pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    sizes = (B, H, N, T_pad, Kp, Vp)
    if prepared is None:
        wm, _, qd, kd, p, t = _prepare(flat, flat_v[:2], spec, sizes, chunk, dots, params, interpret)
    else:
        wm, qd, kd, p, t = prepared
    # the state's cotangent walked back, grid (B, H, V / BV), stored at every chunk's end
    key, value, state = spec["key"], spec["value"], spec["state"]
    dstates_t, dh0_t = pl.pallas_call(
        functools.partial(_dstate_walk_kernel, scale=float(scale), chunk=chunk, n_chunks=N, dots=dots),
        grid=(B, H, NV),
        in_specs=[key, key, key, spec["scores"], key, value, state],
        out_specs=[spec["states"], state],
        out_shape=[jax.ShapeDtypeStruct((B, H, N, Vp, Kp), _F32), jax.ShapeDtypeStruct((B, H, Vp, Kp), _F32)],
        compiler_params=params,
        interpret=interpret,
        name="gdn2_gpu_dstate",
    )(wm, qd, kd, p, flat[2], flat_v[2], _pad_state(d_final_t, Vp, Kp))
    if dstate_only:
        return dstates_t, dh0_t
    # every chunk's gradients at once, grid (B, H, N)
    key_c, value_c, state_c, scores_c = (
        spec["key_chunk"],
        spec["value_chunk"],
        spec["state_chunk"],
        spec["scores_chunk"],
    )
    key_out = jax.ShapeDtypeStruct((B, T_pad, H * Kp), _F32)
    value_out = jax.ShapeDtypeStruct((B, T_pad, H * Vp), _F32)
    dq, dk, dg, db, dv, dw = pl.pallas_call(
        functools.partial(_grads_kernel, scale=float(scale), dots=dots),
        grid=(B, H, N),
        in_specs=[key_c, key_c, value_c, key_c, key_c, value_c, value_c, state_c, state_c, scores_c, scores_c],
        out_specs=[key_c, key_c, key_c, key_c, value_c, value_c],
        out_shape=[key_out, key_out, key_out, key_out, value_out, value_out],
        compiler_params=params,
        interpret=interpret,
        name="gdn2_gpu_backward",
    )(flat[0], flat[1], flat_v[0], flat[2], flat[3], flat_v[1], flat_v[2], states_t, dstates_t, p, t)

    def unflat(x: jax.Array, width: int, keep: int) -> jax.Array:
        return x.reshape(B, T_pad, H, width)[:, :T, :, :keep]

    dq, dk, dg, db = (unflat(x, Kp, K) for x in (dq, dk, dg, db))
    dv, dw = (unflat(x, Vp, V) for x in (dv, dw))
    return dq, dk, dv, dg, db, dw, dh0_t[:, :, :V, :K]
