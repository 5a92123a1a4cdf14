"""The forward and backward of GDN-2 as Pallas kernels for a GPU (Pallas' Triton lowering).

A chunk's work splits into what does not depend on the state (the pairwise scores, the WY solve, the decayed keys
and queries: most of its arithmetic) and the few products that carry the state from one chunk to the next. The
first runs for every chunk at once, a program per (batch, head, chunk): :func:`_prepare_kernel` in the forward,
:func:`_grads_kernel` for the gradients (the pairwise scores' share of them in :func:`_scores_grads_kernel`, a
program per block of key columns too). Only the second walks the chunks in order, a program per (batch, head,
block of BV value columns) with the state as its loop carry in registers (GPU grid programs share no scratch and
run in no set order, so the walk is a ``lax.fori_loop`` inside the program): :func:`_walk_kernel` forward,
storing the state at every chunk start; :func:`_dstate_walk_kernel` backward, storing the state's cotangent at
every chunk end. The algebra is the TPU kernels' (:mod:`.forward`'s docstring); the helpers that do not slice
values (cumulative decay, WY solve) are shared.

What differs, and why:

* Triton has no slicing or concatenation of register tensors, so the pairwise scores are formed over the whole
  ``[C, K]`` tile with masks: the pairs in different sub-blocks of ``SUB`` rows through a reference row, a
  product per sub-block; the pairs inside one sub-block exactly, ``SUB`` steps each over every sub-block at once,
  their key rows gathered from the chunk's blocks in memory (:func:`_pairwise_scores`; the backward's
  :func:`_scores_backward` the same way). So the chunk's cumulative decay ``G`` comes in as an input, made by
  XLA before the kernels (:func:`_chunk_cumulative_decay`);
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

__all__ = ["DOTS", "gdn2_gpu_backward", "gdn2_gpu_forward", "gdn2_gpu_prepare", "padded_width"]

_F32 = jnp.float32


# How the kernels' matrix products run: "fp32" Triton's IEEE float32 dot (CUDA cores); "bf16x3" each float32
# operand split into a bf16 head and a bf16 remainder, three tensor-core products of those (the remainders' product
# dropped) accumulated in float32: about 16 significant bits a product instead of 24, for a fraction of the time.
# "bf16" one tensor-core product of the operands rounded to bf16, float32 accumulation: the precision of FLA's
# bf16 kernels (8 significant bits an operand), for bf16 inputs. The cumulative decay stays IEEE float32 in every
# scheme (the decays amplify its error).
DOTS = ("fp32", "bf16x3", "bf16")
# Rows of a sub-block of the chunk: pairs of tokens in one sub-block form their decays exactly, pairs across
# sub-blocks factor through a reference row (:func:`_far_factors`).
SUB = fw.SOLVE_BLOCK
# Key columns the pairwise scores (:func:`_pairwise_scores`) and their gradients (a program of
# :func:`_scores_grads_kernel`) take at a time: [C, 32] float32 tiles are 16 registers a thread at 4 warps.
SCORES_BLOCK_K = 32


def _scores_block_k(Kp: int) -> int:
    """The key columns taken at a time for a padded key width `Kp` (:data:`SCORES_BLOCK_K`, or all of a narrower
    one)."""
    return min(SCORES_BLOCK_K, Kp)


def _split_bf16(x: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """``x`` as a bf16 head and remainder; a bf16 `x` is its own head, with no remainder (None)."""
    if x.dtype == jnp.bfloat16:
        return x, None
    head = x.astype(jnp.bfloat16)
    return head, (x - head.astype(_F32)).astype(jnp.bfloat16)


def _matmul(x: jax.Array, y: jax.Array, dims, dots: str) -> jax.Array:
    """``lax.dot_general(x, y, dims)`` in float32 by the `dots` scheme (see :data:`DOTS`). An operand that is
    bf16 already (a bf16 input, as loaded) is exact as a head alone: its remainder's product, zero, is skipped."""
    if dots == "fp32":
        x, y = x.astype(_F32), y.astype(_F32)
        return lax.dot_general(x, y, dims, precision=lax.Precision.HIGHEST, preferred_element_type=_F32)
    if dots == "bf16":
        x, y = x.astype(jnp.bfloat16), y.astype(jnp.bfloat16)
        return lax.dot_general(x, y, dims, preferred_element_type=_F32)
    (xh, xl), (yh, yl) = _split_bf16(x), _split_bf16(y)

    def mul(a, b):
        return lax.dot_general(a, b, dims, preferred_element_type=_F32)

    small = [mul(a, b) for a, b in ((xl, yh), (xh, yl)) if a is not None and b is not None]
    return functools.reduce(lambda acc, term: acc + term, [*small, mul(xh, yh)])  # the small terms first


def _products(dots: str):
    """``(x @ y, x @ y^T, x^T @ y)`` by the `dots` scheme."""
    if dots not in DOTS:
        raise ValueError(f"dots must be one of {DOTS}, got {dots!r}")
    mm = functools.partial(_matmul, dims=(((1,), (0,)), ((), ())), dots=dots)
    mm_t = functools.partial(_matmul, dims=(((1,), (1,)), ((), ())), dots=dots)
    mm_tn = functools.partial(_matmul, dims=(((0,), (0,)), ((), ())), dots=dots)
    return mm, mm_t, mm_tn


def _stored(dots: str):
    """The dtype of what the kernels store for each other that only enters products (W, q_d, k_d, P, T, u, the
    states and their cotangents): bf16 under ``dots="bf16"``, which rounds every operand to bf16 anyway (half the
    bytes moved, the same products), float32 otherwise."""
    return jnp.bfloat16 if dots == "bf16" else _F32


def padded_width(d: int) -> int:
    """The power of two >= max(d, 16) that a K or V of `d` is padded to (Triton's tensor and dot rules)."""
    return max(16, 1 << (d - 1).bit_length())


def _sub_starts(shape: tuple[int, ...]) -> jax.Array:
    """For each row ``i`` of a ``[C]`` or ``[C, *]`` tile, the first row of its sub-block (``SUB`` rows),
    broadcast."""
    return lax.div(fw._iota(shape, 0), SUB) * SUB


_ALL = slice(None)


def _key_rows(ref, at: jax.Array, cols=_ALL) -> jax.Array:
    """``ref[at[i], cols]`` for every row ``i``: a gather of rows from the chunk's block (``at`` ``[C]``)."""
    return ref[at, cols].astype(_F32)


def _far_factors(G: jax.Array, G_ref, cols=_ALL):
    """The sub-blocks' reference decays: the left factor ``f_i = exp(G_i - G_{r(i)-1})`` (``r(i)`` the first row of
    row ``i``'s sub-block; ``[C, K]``) and, for each sub-block ``m >= 1``, ``(m, right_m)`` with
    ``right_m[j] = exp(G_{mS-1} - G_j)`` for the rows ``j < mS`` before it, zero from there on. Both factors are
    <= 1 where they are used (``G`` does not increase along the chunk), so the far pairs ``i``, ``j < r(i)`` are
    products: ``exp(G_i - G_j) = f_i right_m[j]``. `G` is ``G_ref[:, cols]``."""
    C, K = G.shape
    start = _sub_starts((C,))
    f = jnp.exp(jnp.minimum(G - _key_rows(G_ref, jnp.maximum(start - 1, 0), cols), 0.0))
    rows = fw._iota((C, K), 0)
    right = []
    for m in range(1, C // SUB):
        ref_row = G_ref[pl.ds(m * SUB - 1, 1), cols]  # [1, K]
        right.append((m, jnp.where(rows < m * SUB, jnp.exp(jnp.minimum(ref_row - G, 0.0)), 0.0)))
    return f, right


def _pairwise_scores(refs, mm_t, block_k: int) -> tuple[jax.Array, jax.Array]:
    """``A`` (strictly lower) and ``P`` (lower, diagonal included), ``[C, C]``, where
    ``A_ij = sum_c bk_i[c] exp(G_i[c] - G_j[c]) k_j[c]`` and ``P`` the same with ``q`` for ``bk``; `refs` the
    chunk's ``(G, q, k, b)`` blocks.

    `block_k` key columns at a time (their sums added up: the tiles a program holds are ``[C, block_k]``). Pairs
    in different sub-blocks (``SUB`` rows) through the reference factors of :func:`_far_factors`, a product per
    sub-block; pairs inside one sub-block exactly (``exp(min(G_i - G_j, 0))``), ``SUB`` steps, each over every
    sub-block at once: step ``s`` takes key row ``r(i) + s`` for row ``i``, gathered from the refs (rows read from
    memory, not reduced out of register tiles)."""
    G_ref, q_ref, k_ref = refs[:3]
    C, width = q_ref.shape
    rows_cc, cols_cc = fw._iota((C, C), 0), fw._iota((C, C), 1)
    in_sub = lax.div(fw._iota((C, block_k), 0), SUB)
    start = _sub_starts((C,))
    start_cc = _sub_starts((C, C))
    A = jnp.zeros((C, C), _F32)
    P = jnp.zeros((C, C), _F32)
    for c0 in range(0, width, block_k):
        cols = pl.ds(c0, block_k)
        G, q, k, b = (r[:, cols].astype(_F32) for r in refs)
        bk = b * k
        f, right = _far_factors(G, G_ref, cols)
        left_a, left_q = bk * f, q * f
        for m, r_m in right:
            r_m = r_m * k
            A = A + mm_t(jnp.where(in_sub == m, left_a, 0.0), r_m)
            P = P + mm_t(jnp.where(in_sub == m, left_q, 0.0), r_m)

        def one_key(s, carry, G=G, q=q, bk=bk, cols=cols):
            A, P = carry
            at = start + s
            decay_k = jnp.exp(jnp.minimum(G - _key_rows(G_ref, at, cols), 0.0)) * _key_rows(k_ref, at, cols)
            at_col = cols_cc == start_cc + s
            A = A + jnp.where(at_col, jnp.sum(bk * decay_k, axis=1, keepdims=True), 0.0)
            P = P + jnp.where(at_col, jnp.sum(q * decay_k, axis=1, keepdims=True), 0.0)
            return A, P

        A, P = lax.fori_loop(0, SUB, one_key, (A, P))
    return jnp.where(rows_cc > cols_cc, A, 0.0), jnp.where(rows_cc >= cols_cc, P, 0.0)


def _scores_backward(G, q, k, bk, dA, dP, refs, products, init):
    """The gradients of ``A`` and ``P`` (:func:`_pairwise_scores`; cotangents `dA`, `dP`, ``[C, C]``, zero off
    their triangles) with respect to ``q``, ``k``, ``b*k`` and ``G``, added onto `init` (four ``[C, K]`` tiles):
    the far pairs (:func:`_far_pairs_backward`), then the near ones (:func:`_near_pairs_backward`).

    With ``M_ij = (dA_ij bk_i + dP_ij q_i) exp(G_i - G_j) k_j``: ``dG_i += sum_j M_ij`` and ``dG_j -= sum_i M_ij``.
    `refs`: the chunk's ``(G, q, k, b)`` blocks; `products`: ``(x @ y, x^T @ y)``."""
    grads = _far_pairs_backward(G, q, k, bk, dA, dP, refs[0], products, init)
    return _near_pairs_backward(G, q, k, bk, dA, dP, refs, grads)


def _far_pairs_backward(G, q, k, bk, dA, dP, G_ref, products, init):
    """The pairs in different sub-blocks through the factors of :func:`_far_factors`, as products (their reference
    rows get nothing: the two factors' shares cancel), added onto `init` ``(dq, dk, dbk, dG)``."""
    mm, mm_tn = products
    C, K = G.shape
    dq, dk, dbk, dG = init
    f, right = _far_factors(G, G_ref)
    left_a, left_q = bk * f, q * f
    rows_cc, cols = fw._iota((C, C), 0), fw._iota((C, C), 1)
    in_sub_cc = lax.div(rows_cc, SUB)
    d_left_a = jnp.zeros((C, K), _F32)
    d_left_q = jnp.zeros((C, K), _F32)
    for m, r_m in right:
        far = (in_sub_cc == m) & (cols < m * SUB)
        dA_m, dP_m = jnp.where(far, dA, 0.0), jnp.where(far, dP, 0.0)
        kr = k * r_m
        d_left_a = d_left_a + mm(dA_m, kr)
        d_left_q = d_left_q + mm(dP_m, kr)
        d_right = (mm_tn(dA_m, left_a) + mm_tn(dP_m, left_q)) * r_m  # rows j < mS, zero after
        dk = dk + d_right
        dG = dG - d_right * k
    dbk = dbk + d_left_a * f
    dq = dq + d_left_q * f
    return dq, dk, dbk, dG + (d_left_a * bk + d_left_q * q) * f


def _near_pairs_backward(G, q, k, bk, dA, dP, refs, init):
    """The pairs inside one sub-block, added onto `init` ``(dq, dk, dbk, dG)``: two loops of ``SUB`` steps over
    every sub-block at once, one for the rows' side (key rows gathered), one for the columns' side (query rows
    gathered, the cotangents transposed), so that no step sums across rows."""
    G_ref, q_ref, k_ref, b_ref = refs
    C = G.shape[0]
    dq, dk, dbk, dG = init
    rows_cc, cols = fw._iota((C, C), 0), fw._iota((C, C), 1)
    start = _sub_starts((C,))
    start_cc = _sub_starts((C, C))
    near = lax.div(rows_cc, SUB) == lax.div(cols, SUB)
    dA_near, dP_near = jnp.where(near, dA, 0.0), jnp.where(near, dP, 0.0)

    def rows_side(s, carry):  # row i, key row j = r(i) + s
        dq, dbk, dG = carry
        at = start + s
        decay_k = jnp.exp(jnp.minimum(G - _key_rows(G_ref, at), 0.0)) * _key_rows(k_ref, at)
        at_col = cols == start_cc + s
        dA_j = jnp.sum(jnp.where(at_col, dA_near, 0.0), axis=1, keepdims=True)  # [C, 1]
        dP_j = jnp.sum(jnp.where(at_col, dP_near, 0.0), axis=1, keepdims=True)
        dbk = dbk + dA_j * decay_k
        dq = dq + dP_j * decay_k
        return dq, dbk, dG + (dA_j * bk + dP_j * q) * decay_k

    dq, dbk, dG = lax.fori_loop(0, SUB, rows_side, (dq, dbk, dG))
    dA_t, dP_t = dA_near.T, dP_near.T  # [j, i]

    def columns_side(s, carry):  # row j, query row i = r(j) + s
        dk, dG = carry
        at = start + s
        k_i = _key_rows(k_ref, at)
        bk_i = _key_rows(b_ref, at) * k_i
        decay = jnp.exp(jnp.minimum(_key_rows(G_ref, at) - G, 0.0))
        at_col = cols == start_cc + s
        dA_i = jnp.sum(jnp.where(at_col, dA_t, 0.0), axis=1, keepdims=True)  # dA[r(j) + s, j], [C, 1]
        dP_i = jnp.sum(jnp.where(at_col, dP_t, 0.0), axis=1, keepdims=True)
        n = (dA_i * bk_i + dP_i * _key_rows(q_ref, at)) * decay
        return dk + n, dG - n * k

    dk, dG = lax.fori_loop(0, SUB, columns_side, (dk, dG))
    return dq, dk, dbk, dG


def _chunk_rows(n, C: int):
    """Chunk `n`'s rows of a ``[T_pad, D]`` block ref."""
    return pl.ds(pl.multiple_of(n * C, C), C)


def _chunk(refs, n, C: int):
    """Chunk `n`'s rows of each ``[T_pad, D]`` block ref, as float32 ``[C, D]`` tiles."""
    return tuple(r[_chunk_rows(n, C), :].astype(_F32) for r in refs)


def _as_operand(x: jax.Array) -> jax.Array:
    """A loaded tile that only enters products: kept bf16 when it is (exact as one bf16 head, see
    :func:`_matmul`), float32 otherwise."""
    return x if x.dtype == jnp.bfloat16 else x.astype(_F32)


def _last_row(G_ref, row0: int | jax.Array, C: int) -> jax.Array:
    """``G`` at the chunk's last token, ``[1, K]``: the row ``row0 + C - 1`` of the cumulative decay's block."""
    return G_ref[pl.ds(row0 + C - 1, 1), :]


def _prepare_kernel(
    q_ref, k_ref, v_ref, G_ref, b_ref, w_ref, wm_ref, um_ref, qd_ref, kd_ref, p_ref, t_ref, *, dots
):  # fmt: skip
    """One (batch, head, chunk): what the walk needs of the chunk that does not depend on the state, all chunks at
    once. ``W = T (b*k*exp G)``, ``U = T (w*v)`` (the WY form), ``q*exp G``, ``k*exp(G_last - G)`` and the scores
    ``P``; the pairwise scores and the WY solve, most of a chunk's work, leave the sequential walk. The WY inverse
    ``T`` too, for the gradients (:func:`_grads_kernel`), so that they need neither the scores nor the solve
    again. ``G`` is the chunk's cumulative decay (:func:`_chunk_cumulative_decay`)."""
    mm, mm_t, _ = _products(dots)
    # each input loaded where it is first used and each output stored once made: a [C, K] float32 tile is 64
    # registers a thread at 4 warps, so what is live at once decides whether the program spills
    A, P = _pairwise_scores((G_ref, q_ref, k_ref, b_ref), mm_t, _scores_block_k(q_ref.shape[1]))
    T = fw._unit_lower_inverse(A, fw.SOLVE_BLOCK, dot=mm)
    q, k, G, b = (r[...].astype(_F32) for r in (q_ref, k_ref, G_ref, b_ref))
    C = q.shape[0]
    bk = b * k
    p_ref[...] = P.astype(p_ref.dtype)
    t_ref[...] = T.astype(t_ref.dtype)
    expG = jnp.exp(G)
    qd_ref[...] = (q * expG).astype(qd_ref.dtype)
    kd_ref[...] = (k * jnp.exp(jnp.minimum(_last_row(G_ref, 0, C) - G, 0.0))).astype(kd_ref.dtype)
    wm_ref[...] = mm(T, bk * expG).astype(wm_ref.dtype)
    um_ref[...] = mm(T, w_ref[...].astype(_F32) * v_ref[...].astype(_F32))


def _walk_kernel(wm_ref, um_ref, kd_ref, G_ref, h0_ref, u_ref, ht_ref, hs_ref, *, chunk, n_chunks, dots):
    """One (batch, head, value block): every chunk in order, the state ``S^T`` ``[BV, K]`` the loop's carry; the
    two products a chunk that the next state needs (``u = U - W S``, the update), on what :func:`_prepare_kernel`
    left. The state at each chunk start and ``u`` are stored: the output, which nothing in the walk waits for, is
    made from them by :func:`_output_kernel`, every chunk at once."""
    C = chunk
    mm, mm_t, _ = _products(dots)

    def step(n, St):
        wm, kd = (_as_operand(r[_chunk_rows(n, C), :]) for r in (wm_ref, kd_ref))
        (um,) = _chunk((um_ref,), n, C)
        hs_ref[n] = St.astype(hs_ref.dtype)
        u = um - mm_t(wm, St)
        u_ref[_chunk_rows(n, C), :] = u.astype(u_ref.dtype)
        return St * jnp.exp(_last_row(G_ref, n * C, C)) + mm(u.T, kd)

    ht_ref[...] = lax.fori_loop(0, n_chunks, step, h0_ref[...].astype(_F32))


def _output_kernel(qd_ref, p_ref, u_ref, hs_ref, o_ref, *, scale, dots):
    """One (batch, head, chunk), all chunks at once: ``o = scale (q_d S + P u)`` from the chunk-start state and the
    ``u`` that :func:`_walk_kernel` stored."""
    mm, mm_t, _ = _products(dots)
    o_ref[...] = (scale * (mm_t(qd_ref[...], hs_ref[...]) + mm(p_ref[...], u_ref[...]))).astype(o_ref.dtype)


def _dstate_walk_kernel(
    wm_ref, qd_ref, kd_ref, p_ref, G_ref, do_ref, dht_ref, dhs_ref, dh0_ref, *, scale, chunk, n_chunks, dots
):  # fmt: skip
    """One (batch, head, value block): chunks last to first, the state's cotangent ``dS^T`` ``[BV, K]`` the loop's
    carry, stored at each chunk's end (what :func:`_grads_kernel` reads); four products a chunk on what
    :func:`_prepare_kernel` left."""
    C = chunk
    mm, mm_t, _ = _products(dots)

    def step(i, dSt):
        n = n_chunks - 1 - i
        wm, qd, kd, do = (_as_operand(r[_chunk_rows(n, C), :]) for r in (wm_ref, qd_ref, kd_ref, do_ref))
        dhs_ref[n] = dSt.astype(dhs_ref.dtype)
        du = scale * mm(p_ref[n].T, do) + mm_t(kd, dSt)
        decay = jnp.exp(_last_row(G_ref, n * C, C))
        return scale * mm(do.T, qd) + dSt * decay - mm(du.T, wm)

    dh0_ref[...] = lax.fori_loop(0, n_chunks, step, dht_ref[...].astype(_F32))


def _grads_kernel(
    q_ref, k_ref, v_ref, G_ref, b_ref, w_ref, do_ref, hs_ref, dhs_ref, p_ref, t_ref, u_ref,
    dv_ref, dw_ref, dA_ref, dP_ref, dq_ref, dk_ref, dbk_ref, dG_ref,
    *, scale, dots,
):  # fmt: skip
    """One (batch, head, chunk), all chunks at once: from the chunk's start state and its end cotangent (the two
    walks'), the scores ``P`` and the WY inverse ``T`` that :func:`_prepare_kernel` kept and the forward walk's
    ``u``, all of V in one program
    (the algebra of :func:`.fused_backward._fused_backward_kernel`): v's and w's gradients, the cotangents of the
    scores ``dA``, ``dP`` and the direct terms of q's, k's, (b*k)'s and G's, which
    :func:`_scores_grads_kernel` finishes."""
    mm, mm_t, mm_tn = _products(dots)
    # loads where first used and the value-side gradients stored as soon as made (as in _prepare_kernel: fewer
    # tiles live at once, the [V, K] states 128 registers a thread each at 4 warps)
    q, k, G, b = (r[...].astype(_F32) for r in (q_ref, k_ref, G_ref, b_ref))
    P, T = _as_operand(p_ref[...]), _as_operand(t_ref[...])
    C = q.shape[0]
    ii, jj = fw._iota((C, C), 0), fw._iota((C, C), 1)
    g_last = _last_row(G_ref, 0, C)
    bk, expG = b * k, jnp.exp(G)
    r_k = bk * expG
    e_kd = jnp.exp(jnp.minimum(g_last - G, 0.0))
    kd = k * e_kd
    v, w = v_ref[...].astype(_F32), w_ref[...].astype(_F32)
    r_v = w * v
    St, u = _as_operand(hs_ref[...]), _as_operand(u_ref[...])  # S^T at the chunk start, u = U - W S

    do, dSt = _as_operand(do_ref[...]), _as_operand(dhs_ref[...])  # dS^T at the chunk's end
    du = scale * mm_tn(P, do) + mm_t(kd, dSt)
    dP = jnp.where(ii >= jj, scale * mm_t(do, u), 0.0)
    dqd = scale * mm(do, St)
    dkd = mm(u, dSt)
    state_products = jnp.sum(St.astype(_F32) * dSt.astype(_F32), axis=0, keepdims=True)
    dG_last = jnp.sum(dkd * kd, axis=0, keepdims=True) + state_products * jnp.exp(g_last)
    dW = -mm(du, St)
    dr_v = mm_tn(T, du)
    dv_ref[...] = dr_v * w
    dw_ref[...] = dr_v * v
    dr_k = mm_tn(T, dW)
    dT = mm_t(du, r_v) + mm_t(dW, r_k)
    T_t = T.T
    dA_ref[...] = jnp.where(ii > jj, -mm(mm(T_t, dT), T_t), 0.0)
    dP_ref[...] = dP
    # the direct terms; the scores' own gradients are added by _scores_grads_kernel
    dq_ref[...] = dqd * expG
    dk_ref[...] = dkd * e_kd
    dbk_ref[...] = dr_k * expG
    dG = dr_k * r_k + dqd * q * expG - dkd * kd
    dG_ref[...] = dG + jnp.where(fw._iota(dG.shape, 0) == C - 1, dG_last, 0.0)


def _scores_grads_kernel(
    q_ref, k_ref, G_ref, b_ref, dA_ref, dP_ref, dq_ref, dk_ref, dbk_ref, dG_ref,
    dq_out, dk_out, dg_out, db_out, *, dots,
):  # fmt: skip
    """One (batch, chunk, head and block of key columns): the scores' gradients (:func:`_scores_backward`) added
    onto the direct terms :func:`_grads_kernel` stored, then the chain rule to k, b and g. Every step of it is
    column by column in K (the products contract over the chunk's rows), so a program holds ``[C, BK]`` tiles:
    a few registers a thread where the whole ``[C, K]`` chunk spilled."""
    mm, _, mm_tn = _products(dots)
    q, k, G, b = (r[...].astype(_F32) for r in (q_ref, k_ref, G_ref, b_ref))
    bk = b * k
    init = tuple(r[...] for r in (dq_ref, dk_ref, dbk_ref, dG_ref))
    refs = (G_ref, q_ref, k_ref, b_ref)
    dq, dk, dbk, dG = _scores_backward(G, q, k, bk, dA_ref[...], dP_ref[...], refs, (mm, mm_tn), init=init)
    C = q.shape[0]
    dq_out[...] = dq
    dk_out[...] = dk + dbk * b
    db_out[...] = dbk * k
    # g's gradient is dG's reverse cumulative sum, whose terms cancel: a sum that rounds dG to bf16 first fails
    # the gate (grad:g up to 2x its bound), so it takes at least bf16x3's two products (the 0/1 matrix is exact)
    cumsum = mm if dots != "bf16" else _products("bf16x3")[0]
    dg_out[...] = cumsum(jnp.where(fw._iota((C, C), 0) <= fw._iota((C, C), 1), 1.0, 0.0).astype(jnp.bfloat16), dG)


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


def _chunk_cumulative_decay(g_flat: jax.Array, chunk: int) -> jax.Array:
    """``[B, T_pad, W]`` log-decays -> float32 ``G``, each chunk's own cumulative sum (:func:`.forward.
    _cumulative_decay`, a batched product): the kernels read its rows, not only its tiles."""
    B, T_pad, W = g_flat.shape
    per_chunk = g_flat.astype(_F32).reshape(B * (T_pad // chunk), chunk, W)
    return jax.vmap(fw._cumulative_decay)(per_chunk).reshape(B, T_pad, W)


def _params(num_warps: int, num_stages: int, own_warps: int | None = None) -> pltriton.CompilerParams:
    """A kernel's Triton parameters: its own warps where given (the walks', the gradient kernel's), else
    `num_warps`."""
    return pltriton.CompilerParams(num_warps=own_warps or num_warps, num_stages=num_stages)


def _pad_state(s: jax.Array, Vp: int, Kp: int) -> jax.Array:
    """``[B, H, V, K]`` float32 -> ``[B, H, Vp, Kp]``, zero-padded."""
    return jnp.pad(s.astype(_F32), [(0, 0), (0, 0), (0, Vp - s.shape[2]), (0, Kp - s.shape[3])])


def _prepare(flat, flat_v, spec, sizes, chunk: int, dots: str, params, interpret: bool) -> list[jax.Array]:
    """:func:`_prepare_kernel` over every chunk at once, grid (B, H, N): ``[W, U, q_d, k_d, P, T]`` (W, q_d, k_d
    ``[B, T_pad, H * Kp]``, U ``[B, T_pad, H * Vp]`` float32, P and T ``[B, H, N, C, C]``; all but U in
    :func:`_stored`'s dtype). `flat`: q, k, G
    (:func:`_chunk_cumulative_decay`), b; `flat_v`: v, w."""
    B, H, N, T_pad, Kp, Vp = sizes
    key_c, value_c, scores_c = spec["key_chunk"], spec["value_chunk"], spec["scores_chunk"]
    key_st = jax.ShapeDtypeStruct((B, T_pad, H * Kp), _stored(dots))
    scores_st = jax.ShapeDtypeStruct((B, H, N, chunk, chunk), _stored(dots))
    return pl.pallas_call(
        functools.partial(_prepare_kernel, dots=dots),
        grid=(B, H, N),
        in_specs=[key_c, key_c, value_c, key_c, key_c, value_c],
        out_specs=[key_c, value_c, key_c, key_c, scores_c, scores_c],
        out_shape=[key_st, jax.ShapeDtypeStruct((B, T_pad, H * Vp), _F32), key_st, key_st, scores_st, scores_st],
        compiler_params=params,
        interpret=interpret,
        name="gdn2_gpu_prepare",
    )(flat[0], flat[1], flat_v[0], flat[2], flat[3], flat_v[1])


def _flatten_inputs(keys, values, T_pad: int, Kp: int, Vp: int, chunk: int):
    """The kernels' flat inputs: q, k, g, b (``keys``) with g's place taken by its chunks' cumulative decay ``G``;
    ``values`` (v, w, and do in the backward) flattened alone."""
    flat = _flatten(keys, T_pad, Kp)
    flat[2] = _chunk_cumulative_decay(flat[2], chunk)
    return flat, _flatten(values, T_pad, Vp)


_STATIC = ("scale", "chunk", "store_states", "block_v", "num_warps", "num_stages", "dots", "interpret", "walk_warps")


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
    flat, flat_v = _flatten_inputs((q, k, g, b), (v, w), T_pad, Kp, Vp, chunk)
    params = _params(num_warps, num_stages)
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
    walk_warps: int | None = None,
) -> tuple[jax.Array, ...]:
    """Run the forward for a GPU: the chunks' state-free work in parallel (``gdn2_gpu_prepare``, a program per
    chunk), then the state's walk over them in order (``gdn2_gpu_forward``, a program per value block of a head),
    then every chunk's output in parallel (``gdn2_gpu_output``) from the chunk-start states the walk stored
    (``[B, H, N, Vp, Kp]`` in :func:`_stored`'s dtype, kept whether or not they are returned).

    Args:
        q, k, g, b: ``[B, T, H, K]``; v, w: ``[B, T, H, V]`` (any T, K, V: padded here).
        h0_t: ``[B, H, V, K]`` float32, the initial state transposed.
        scale: query scale.
        chunk: tokens per chunk (a power of two, >= 16).
        store_states: also return the state at each chunk start, ``[B, H, N, Vp, Kp]`` (transposed, padded), and
            what the backward reads (``prepared``: :func:`_prepare`'s W, q_d, k_d, P and T, and the walk's
            ``u = U - W S``), so that the backward need not make it again.
        block_v: value columns per program (a power of two; None: all of V in one program).
        num_warps: Triton warps per program.
        num_stages: Triton's software pipelining depth (1: none): at 2 or more the walks' loads of a chunk can be
            issued while the chunk before it computes (their loads do not depend on the state they carry).
        dots: how the matrix products run, ``"fp32"`` or ``"bf16x3"`` (see :data:`DOTS`).
        interpret: run in Pallas' interpreter (any backend) instead of compiling with Triton.
        walk_warps: Triton warps of the walk alone (``gdn2_gpu_forward``; its state is the one carry that
            crosses chunks); None: `num_warps`.

    Returns:
        ``(o [B, T, H, V] in v's dtype, final_state^T [B, H, V, K] float32)``, then the chunk-start states and
        ``prepared`` if `store_states`.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    Kp, Vp, NV, N, T_pad, spec = _layout(B, T, H, K, V, chunk, block_v)
    flat, flat_v = _flatten_inputs((q, k, g, b), (v, w), T_pad, Kp, Vp, chunk)
    params = _params(num_warps, num_stages)
    # 1. every chunk's state-free work at once, grid (B, H, N)
    wm, um, qd, kd, p, t = _prepare(flat, flat_v, spec, (B, H, N, T_pad, Kp, Vp), chunk, dots, params, interpret)
    # 2. the chunks in order, grid (B, H, V / BV): the state's walk, storing the chunk-start states and u
    value_st = jax.ShapeDtypeStruct((B, T_pad, H * Vp), _stored(dots))
    states_st = jax.ShapeDtypeStruct((B, H, N, Vp, Kp), _stored(dots))
    key, value = spec["key"], spec["value"]
    u, ht_t, states_t = pl.pallas_call(
        functools.partial(_walk_kernel, chunk=chunk, n_chunks=N, dots=dots),
        grid=(B, H, NV),
        in_specs=[key, value, key, key, spec["state"]],
        out_specs=[value, spec["state"], spec["states"]],
        out_shape=[value_st, jax.ShapeDtypeStruct((B, H, Vp, Kp), _F32), states_st],
        compiler_params=_params(num_warps, num_stages, walk_warps),
        interpret=interpret,
        name="gdn2_gpu_forward",
    )(wm, um, kd, flat[2], _pad_state(h0_t, Vp, Kp))
    # 3. every chunk's output at once, grid (B, H, N)
    value_c = spec["value_chunk"]
    o = pl.pallas_call(
        functools.partial(_output_kernel, scale=float(scale), dots=dots),
        grid=(B, H, N),
        in_specs=[spec["key_chunk"], spec["scores_chunk"], value_c, spec["state_chunk"]],
        out_specs=value_c,
        out_shape=jax.ShapeDtypeStruct((B, T_pad, H * Vp), v.dtype),
        compiler_params=params,
        interpret=interpret,
        name="gdn2_gpu_output",
    )(qd, p, u, states_t)
    o = o.reshape(B, T_pad, H, Vp)[:, :T, :, :V]
    if not store_states:
        return o, ht_t[:, :, :V, :K]
    return o, ht_t[:, :, :V, :K], states_t, (wm, qd, kd, p, t, u)


@functools.partial(
    jax.jit,
    static_argnames=(
        "scale", "chunk", "block_v", "num_warps", "num_stages", "dots", "interpret", "dstate_only", "grads_warps",
        "walk_warps",
    ),
)  # fmt: skip
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
    prepared: tuple[jax.Array, ...],
    *,
    scale: float,
    chunk: int = fw.CHUNK,
    block_v: int | None = None,
    num_warps: int = 4,
    num_stages: int = 1,
    dots: str = "fp32",
    interpret: bool = False,
    dstate_only: bool = False,
    grads_warps: int | None = None,
    walk_warps: int | None = None,
) -> tuple[jax.Array, ...]:
    """Run the backward for a GPU: the state's cotangent walked back over the chunks' state-free work
    (``gdn2_gpu_dstate``, a program per value block of a head; that work is the forward's `prepared`), then every
    chunk's gradients at once (``gdn2_gpu_backward``, a program per chunk, all of V), the pairwise scores' share of
    q's, k's, b's and g's last (``gdn2_gpu_scores_backward``, a program per chunk and block of key columns).

    Args:
        q, k, g, b: ``[B, T, H, K]``; v, w, do: ``[B, T, H, V]``.
        states_t: ``[B, H, N, Vp, Kp]``, the forward's chunk-start states (as it stored them).
        d_final_t: ``[B, H, V, K]`` float32, the final state's cotangent (transposed).
        prepared: the forward's ``prepared`` (with `store_states`: W, q_d, k_d, P, T and u).
        scale, chunk, block_v, num_warps, num_stages, dots, interpret: as the forward's (the same chunk and
            padding).
        dstate_only: stop after the cotangent's walk and return ``(dstates^T, d_initial_state^T)`` padded: for
            timing the kernels one by one (``benchmarks/gpu/gdn2_pallas.py --stages``).
        grads_warps: Triton warps of the gradient kernel alone (``gdn2_gpu_backward``, the one that holds the
            chunk's start state and end cotangent, ``[V, K]`` each); None: `num_warps`.
        walk_warps: Triton warps of the cotangent's walk alone (``gdn2_gpu_dstate``); None: `num_warps`.

    Returns:
        ``(dq, dk, dv, dg, db, dw, d_initial_state^T)``, float32; the first six ``[B, T, H, *]``.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    Kp, Vp, NV, N, T_pad, spec = _layout(B, T, H, K, V, chunk, block_v)
    flat, flat_v = _flatten_inputs((q, k, g, b), (v, w, do), T_pad, Kp, Vp, chunk)
    params = _params(num_warps, num_stages)
    walk_params = _params(num_warps, num_stages, walk_warps)
    wm, qd, kd, p, t, u = prepared
    # the state's cotangent walked back, grid (B, H, V / BV), stored at every chunk's end
    key, value, state = spec["key"], spec["value"], spec["state"]
    dstates_t, dh0_t = pl.pallas_call(
        functools.partial(_dstate_walk_kernel, scale=float(scale), chunk=chunk, n_chunks=N, dots=dots),
        grid=(B, H, NV),
        in_specs=[key, key, key, spec["scores"], key, value, state],
        out_specs=[spec["states"], state],
        out_shape=[jax.ShapeDtypeStruct((B, H, N, Vp, Kp), _stored(dots)), jax.ShapeDtypeStruct((B, H, Vp, Kp), _F32)],
        compiler_params=walk_params,
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
    scores_out = jax.ShapeDtypeStruct((B, H, N, chunk, chunk), _F32)
    dv, dw, dA, dP, *direct = pl.pallas_call(
        functools.partial(_grads_kernel, scale=float(scale), dots=dots),
        grid=(B, H, N),
        in_specs=[key_c, key_c, value_c, key_c, key_c, value_c, value_c, state_c, state_c, scores_c, scores_c, value_c],
        out_specs=[value_c, value_c, scores_c, scores_c, key_c, key_c, key_c, key_c],
        out_shape=[value_out, value_out, scores_out, scores_out, key_out, key_out, key_out, key_out],
        compiler_params=_params(num_warps, num_stages, grads_warps),
        interpret=interpret,
        name="gdn2_gpu_backward",
    )(flat[0], flat[1], flat_v[0], flat[2], flat[3], flat_v[1], flat_v[2], states_t, dstates_t, p, t, u)
    # the scores' gradients, grid (B, H * K / BK, N): a program per block of BK key columns of a chunk
    BK = _scores_block_k(Kp)
    NK = Kp // BK
    key_kb = pl.BlockSpec((None, chunk, BK), lambda bi, hk, n: (bi, n, hk))
    scores_kb = pl.BlockSpec((None, None, None, chunk, chunk), lambda bi, hk, n: (bi, hk // NK, n, 0, 0))
    dq, dk, dg, db = pl.pallas_call(
        functools.partial(_scores_grads_kernel, dots=dots),
        grid=(B, H * NK, N),
        in_specs=[key_kb] * 4 + [scores_kb] * 2 + [key_kb] * 4,
        out_specs=[key_kb] * 4,
        out_shape=[key_out] * 4,
        input_output_aliases={6: 0, 7: 1, 9: 2, 8: 3},  # each program reads its direct terms' block, then writes it
        compiler_params=params,
        interpret=interpret,
        name="gdn2_gpu_scores_backward",
    )(flat[0], flat[1], flat[2], flat[3], dA, dP, *direct)

    def unflat(x: jax.Array, width: int, keep: int) -> jax.Array:
        return x.reshape(B, T_pad, H, width)[:, :T, :, :keep]

    dq, dk, dg, db = (unflat(x, Kp, K) for x in (dq, dk, dg, db))
    dv, dw = (unflat(x, Vp, V) for x in (dv, dw))
    return dq, dk, dv, dg, db, dw, dh0_t[:, :, :V, :K]
