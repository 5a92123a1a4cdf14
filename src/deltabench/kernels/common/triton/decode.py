"""One decode step of the gated delta rule for GDN, GDN-2 and KDA, in Triton: one program a tile, or persistent.

Per token, for each (batch, head), with ``e = exp(g)`` (a scalar for GDN, a K-vector for GDN-2 and KDA), `b` the
erase strength (GDN's and KDA's beta, or a K-vector) and `w` the write strength (beta, or a V-vector)::

    S <- Diag(e) S;   u = w * v - S^T (b * k);   S <- S + k u^T;   o = S^T (scale q)

The state ``[B*H, K, V]`` float32 is cut into tiles of ``[K, BV]`` (a batch*head and a block of V columns: every
column's update reads only that column), one program a tile. Persistent (`PERSIST`): a fixed number of programs,
`per_sm` an SM, each steps tiles ``pid, pid + programs, ...`` in turn, and loads the next tile's state slice and
first token before this tile's tokens are stepped, so that a program's state traffic runs under its arithmetic
(measured slower on an H100: benchmarks/NOTES.md, Decode steps). Within a tile each token's inputs load during the
token before it. The
state is written back into the very buffer it was read from (each tile read whole before it is written, no two
programs sharing one), so the cache is updated in place.

`FUSED`: both of a token's reductions over K read the state before its update, ``S^T (e b k)`` and ``S^T (e q)``,
and ``o = S^T (e q) + (k . q) u``; they run side by side and the update ``S <- Diag(e) S + k u^T`` is one pass over
the slice. Otherwise the token is stepped as written above (decay, reduce, update, reduce).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["delta_decode_kernel", "launch_delta_decode", "sm_count"]


@triton.jit
def _token(q, k, v, g, b, w, tile, t, T, scale, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
           BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr, G_VEC: tl.constexpr, B_VEC: tl.constexpr,
           W_VEC: tl.constexpr):  # fmt: skip
    """Token `t` of `tile` (batch*head * NV + V block): its (batch, token, head) row, its V columns and its inputs in
    float32: k, scale * q, v, g, b, w (each of the last three a vector where declared, else a scalar)."""
    i_bh = tile // NV
    row = ((i_bh // H) * T + t).to(tl.int64) * H + i_bh % H
    rk = tl.arange(0, BK)
    rv = (tile % NV) * BV + tl.arange(0, BV)
    mk, mv = rk < K, rv < V
    kt = tl.load(k + row * K + rk, mask=mk, other=0.0).to(tl.float32)
    qt = tl.load(q + row * K + rk, mask=mk, other=0.0).to(tl.float32) * scale
    vt = tl.load(v + row * V + rv, mask=mv, other=0.0).to(tl.float32)
    if G_VEC:
        gt = tl.load(g + row * K + rk, mask=mk, other=0.0).to(tl.float32)
    else:
        gt = tl.load(g + row).to(tl.float32)
    if B_VEC:
        bt = tl.load(b + row * K + rk, mask=mk, other=0.0).to(tl.float32)
    else:
        bt = tl.load(b + row).to(tl.float32)
    if W_VEC:
        wt = tl.load(w + row * V + rv, mask=mv, other=0.0).to(tl.float32)
    else:
        wt = tl.load(w + row).to(tl.float32)
    return row, rv, kt, qt, vt, gt, bt, wt


@triton.jit
def _state_tile(state, tile, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                NV: tl.constexpr, rows):  # fmt: skip
    """Pointers to `tile`'s ``[BK, BV]`` slice of the ``[B*H, K, V]`` state, and its mask (its first `rows` rows:
    0 masks the whole slice, the load then moving no bytes)."""
    rk = tl.arange(0, BK)
    rv = (tile % NV) * BV + tl.arange(0, BV)
    ptr = state + (tile // NV).to(tl.int64) * K * V + rk[:, None] * V + rv[None, :]
    return ptr, (rk < rows)[:, None] & (rv < V)[None, :]


@triton.jit
def delta_decode_kernel(
    q, k, v, g, b, w, state, o,
    scale, T, n_tiles,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
    G_VEC: tl.constexpr, B_VEC: tl.constexpr, W_VEC: tl.constexpr, FUSED: tl.constexpr, PERSIST: tl.constexpr,
    LAZY: tl.constexpr = False,
):  # fmt: skip
    """A program's tiles in turn, the next tile's state slice and first token loaded before this tile's tokens are
    stepped (module docstring); without `PERSIST` one program a tile, nothing of a next tile loaded. `LAZY` (which
    `FUSED` then leaves alone): the decay kept as a K-vector `a` of row scales beside the slice P (the state is
    ``Diag(a) P``) and applied once a tile, a token's passes over the slice ``P^T (a b k)``, ``P += (k / a) u^T`` and
    ``P^T (a q)``; rows whose scale falls under 2^-50 are rescaled into P, so ``1 / a`` stays in float32's range."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    last_tile = n_tiles - 1
    tile = pid
    ptr, mkv = _state_tile(state, tile, K, V, BK, BV, NV, K)
    S_next = tl.load(ptr, mask=mkv, other=0.0)
    nrow, nrv, kn, qn, vn, gn, bn, wn = _token(q, k, v, g, b, w, tile, 0, T, scale, H, K, V, BK, BV, NV, G_VEC,
                                               B_VEC, W_VEC)  # fmt: skip
    for _ in range(pid, n_tiles, step):
        S = S_next
        cur = tile
        if LAZY:
            a = tl.full([BK], 1.0, tl.float32)
        # past the last tile: that tile's address, its state not loaded (its first token is, and never used)
        if PERSIST:
            rows = tl.where(tile + step <= last_tile, K, 0)
            tile = tl.minimum(tile + step, last_tile)
            ptr, mkv = _state_tile(state, tile, K, V, BK, BV, NV, rows)
            S_next = tl.load(ptr, mask=mkv, other=0.0)
        for t in range(T):
            row, rv, kt, qt, vt, gt, bt, wt = nrow, nrv, kn, qn, vn, gn, bn, wn
            # the next token: this tile's, or past its last the next tile's first (this tile's own when one program
            # steps one tile: loaded, unused)
            last = t + 1 >= T
            nrow, nrv, kn, qn, vn, gn, bn, wn = _token(q, k, v, g, b, w, tl.where(last, tile, cur),
                                                       tl.where(last, 0, t + 1), T, scale, H, K, V, BK, BV, NV, G_VEC,
                                                       B_VEC, W_VEC)  # fmt: skip
            e = tl.exp(gt)
            if G_VEC:
                decay = e[:, None]
            else:
                decay = e
            if LAZY:
                a = a * e
                small = a < 8.881784197001252e-16  # 2^-50
                if tl.max(small.to(tl.int32)) > 0:
                    S = S * tl.where(small, a, 1.0)[:, None]
                    a = tl.where(small, 1.0, a)
                ut = wt * vt - tl.sum(S * (a * bt * kt)[:, None], axis=0)
                S += (kt / a)[:, None] * ut[None, :]
                ot = tl.sum(S * (a * qt)[:, None], axis=0)
            elif FUSED:
                sk = tl.sum(S * (e * bt * kt)[:, None], axis=0)
                sq = tl.sum(S * (e * qt)[:, None], axis=0)
                ut = wt * vt - sk
                ot = sq + tl.sum(kt * qt) * ut
                S = S * decay + kt[:, None] * ut[None, :]
            else:
                S = S * decay
                ut = wt * vt - tl.sum(S * (bt * kt)[:, None], axis=0)
                S += kt[:, None] * ut[None, :]
                ot = tl.sum(S * qt[:, None], axis=0)
            tl.store(o + row * V + rv, ot.to(o.dtype.element_ty), mask=rv < V)
        if LAZY:
            S = S * a[:, None]
        ptr, mkv = _state_tile(state, cur, K, V, BK, BV, NV, K)
        tl.store(ptr, S, mask=mkv)


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device`; on the CPU (the Triton interpreter) 2, so that a program steps
    several tiles in the tests."""
    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch_delta_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    state: torch.Tensor,
    o: torch.Tensor,
    scale: float,
    *,
    BV: int,
    num_warps: int,
    per_sm: int = 0,
    fused: bool = True,
    lazy: bool = False,
) -> None:
    """One decode step on contiguous inputs (q, k ``[B, T, H, K]``, v ``[B, T, H, V]``; g and b ``[B, T, H]`` or
    ``[B, T, H, K]``, w ``[B, T, H]`` or ``[B, T, H, V]``): `state` (``[B, H, K, V]`` float32) updated in place, `o`
    written. `per_sm` programs an SM, each stepping tiles in turn (at most one a tile; 0: one program a tile, the
    next tile never loaded ahead), `BV` state columns a tile; `fused`, `lazy`: a token's form (the kernel's
    ``FUSED``, ``LAZY``)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NV = triton.cdiv(V, BV)
    n_tiles = NV * B * H
    programs = min(n_tiles, per_sm * sm_count(q.device)) if per_sm else n_tiles
    delta_decode_kernel[(programs,)](
        q, k, v, g, b, w, state, o, scale, T, n_tiles,
        H=H, K=K, V=V, BK=max(16, triton.next_power_of_2(K)), BV=BV, NV=NV,
        G_VEC=g.dim() == 4, B_VEC=b.dim() == 4, W_VEC=w.dim() == 4, FUSED=fused, PERSIST=per_sm > 0, LAZY=lazy,
        num_warps=num_warps, num_stages=1,
    )  # fmt: skip
