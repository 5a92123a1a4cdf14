"""Chunked Sparse Delta Memory forward in Triton, deterministic: the WY form of :mod:`.torch_chunk` in four kernels.

Layout: ``k_idx, k_val [B, T, H, W]``; ``q_idx, q_val [B, T, H, R]``; ``v [B, T, H, D]``; ``g, beta [B, T, H]``;
bank ``[B, H, S, D]`` float32. Inside, a stream is one (b, h); a chunk's write entries are ``e = t W + n`` and its read
entries ``p = t R + m`` (token-major).

Phase 1, for every chunk at once (it does not depend on the bank):

- ``slot_decay``: each entry's log-decay since the chunk start ``L`` (the sum of the write log-decays of its slot at
  tokens up to its own), each write slot's chunk total, and whether a write entry is its slot's first (the one that
  writes the slot's new row);
- ``gram``: ``A [C, C]`` (writes x writes, strictly causal), ``QK [C, C]`` (reads x writes, causal) and
  ``Z [E, C]``, the weight of token t' in the new row of write entry e's slot;
- ``solve``: ``X = (I + tril(beta A, -1))^-1`` by forward substitution in float32.

``slot_decay`` and ``gram`` compare every pair of a chunk's entries, and so do the backward's ``gather_weights``,
``gram_bwd`` and ``decay_bwd``. With :data:`PHASE1` = "sort" the entries are sorted into slot runs instead (entries
of one slot, in token order) and each meets only its run, in all five: the forward's (:mod:`.phase1_sorted`), the
backward's on the forward's sort (:mod:`.phase1_sorted_bwd`), and the replay's Z. The same tensors and gradients up
to float32 rounding; bitwise repeatable. Expected saving (benchmarks/NOTES.md section 6, H200, the flagship
B1-T8192-H2-S65536-D1024-W64-R64, fwd+bwd 155 ms): those five took 61.6 ms (slot_decay 3.9, gram 15.9;
gather_weights 15.9, gram_bwd 18.6, decay_bwd 7.3); by runs a program of 32 positions walks as many steps as its
longest run (at most ~4 there: ~16K lane steps a stream-chunk and kernel against 67M pair compares,
benchmarks/cpu/sdm_run_walks.py), so the plan expects fwd+bwd ~155 -> ~97 ms. Not timed on a GPU yet.

Phase 2, chunk after chunk, two launches a chunk: ``gather`` (one program per stream, token and column slice)
sums each token's decay-weighted chunk-start bank rows into ``Kdec M0`` and ``Qdec M0``; ``update`` (one per stream,
column slice and group of write entries) computes ``U = X beta (V - Kdec M0)`` and ``Y = Qdec M0 + QK U``, then each
slot's first write entry writes its new row ``exp(L_total) M0[s] + Z U``. The gathers are parallel over the
chunk's tokens and the writes over its entries; only the chunks follow one another.

Determinism: no atomics; every bank row (column slice) has exactly one writer per launch; every sum runs in a fixed
order (a loop over fixed blocks, a fixed reduction tree, float32 products: IEEE, or in the update and the walk
:data:`.triton_chunk_bwd.DOT_PRECISION`'s three TF32 products when set so, a fixed tensor-core order); the launch
configuration is pinned (:data:`LAUNCH`, block sizes a function of the shapes). Two calls give the same bits.
The backward (:mod:`.triton_chunk_bwd`, the same rules) walks the chunks in reverse from what the forward keeps:
the chunk-start bank rows it gathered and U, with the Phase 1 tensors (:class:`.triton_chunk_bwd.Saved`). Where
those rows would outweigh the bank many times over (the flagship op: 8 GiB of rows at 8K tokens, 32 GiB at 32K), it
keeps instead the bank at the start of every segment of chunks and the backward replays one segment's steps at a
time to gather them again (:func:`replay_segment`): the same arithmetic on the same bank, the same bits.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ....references.sdm import check_sdm_shapes, check_slots, first_write_mask
from ...common.triton.mma import mma
from . import triton_chunk_bwd as _bwd
from .dense import sdm_dense_gdn, takes_dense_path
from .phase1_sorted import phase1_sorted, run_gram
from .triton_chunk_bwd import BLOCK_ENTRIES, Saved, entry_groups, sdm_chunk_backward, sum_in_order

__all__ = ["LAUNCH", "SUPPORTS_BACKWARD", "sdm_triton_chunk"]

LAUNCH = {"num_warps": 4, "num_stages": 1}  # pinned: no autotuning, so every call runs the same programs
SUPPORTS_BACKWARD = True
_BLOCK_D = 32  # bank columns per update program
_GATHER_D = 128  # bank columns per gather program, at most
# Phase 1's slot decays and Gram matrices and their backward, read at each call: "pairs" (slot_decay_kernel,
# gram_kernel and the backward's gather_weights, gram_bwd and decay_bwd: every pair of a chunk's entries compared) or
# "sort" (:mod:`.phase1_sorted` and :mod:`.phase1_sorted_bwd`: entries sorted into slot runs, each meeting only its
# run; the same values up to float32 rounding, not the same bits). Not timed on a GPU yet: "pairs" stays.
PHASE1 = "pairs"


def _pow2(n: int, least: int = 16) -> int:
    """The block size covering n: a power of two, at least `least` (tl.dot needs 16)."""
    return max(least, triton.next_power_of_2(n))


@triton.jit
def slot_decay_kernel(
    slot_w, ld, slot_r, L_w, L_tot, L_r, first,
    E: tl.constexpr, P: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
    BLOCK_ROW: tl.constexpr, BLOCK_COL: tl.constexpr,
):  # fmt: skip
    """One program per (stream-chunk, block of rows); rows are the chunk's write entries then its read entries."""
    sc = tl.program_id(0).to(tl.int64)
    row = tl.program_id(1) * BLOCK_ROW + tl.arange(0, BLOCK_ROW)
    is_w = row < E
    is_r = (row >= E) & (row < E + P)
    rw = tl.where(is_w, row, 0)
    rr = tl.where(is_r, row - E, 0)
    s_row = tl.where(is_w, tl.load(slot_w + sc * E + rw, mask=is_w, other=-1), -1)
    s_row = tl.where(is_r, tl.load(slot_r + sc * P + rr, mask=is_r, other=-1), s_row)
    t_row = tl.where(is_w, rw // W, rr // R)
    acc = tl.zeros([BLOCK_ROW], dtype=tl.float32)
    tot = tl.zeros([BLOCK_ROW], dtype=tl.float32)
    earlier = tl.zeros([BLOCK_ROW], dtype=tl.int32)
    for f0 in range(0, E, BLOCK_COL):
        f = f0 + tl.arange(0, BLOCK_COL)
        mf = f < E
        s_f = tl.load(slot_w + sc * E + f, mask=mf, other=-2)
        match = (s_row[:, None] == s_f[None, :]) & mf[None, :]
        if tl.max(match.to(tl.int32)) > 0:  # else exact zeros for every sum: skipped, as in gram_kernel
            ld_f = tl.load(ld + sc * E + f, mask=mf, other=0.0)
            before = (f[None, :] // W) <= t_row[:, None]
            acc += tl.sum(tl.where(match & before, ld_f[None, :], 0.0), axis=1)
            tot += tl.sum(tl.where(match, ld_f[None, :], 0.0), axis=1)
            earlier += tl.sum((match & (f[None, :] < row[:, None])).to(tl.int32), axis=1)
    tl.store(L_w + sc * E + rw, acc, mask=is_w)
    tl.store(L_tot + sc * E + rw, tot, mask=is_w)
    tl.store(first + sc * E + rw, (earlier == 0).to(tl.int32), mask=is_w)
    tl.store(L_r + sc * P + rr, acc, mask=is_r)


@triton.jit
def gram_kernel(
    slot_w, k_val, L_w, L_tot, slot_r, q_val, L_r, A, QK, Z, N, seg_n, seg_c0,
    C: tl.constexpr, E: tl.constexpr, P: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
    BLOCK_W: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_COL: tl.constexpr, BLOCK_C: tl.constexpr,
    AQK: tl.constexpr,
):  # fmt: skip
    """One program per (stream-chunk, token t): row t of A and QK (with AQK), and the rows of Z of token t's write
    entries. The programs cover `seg_n` chunks a stream from chunk `seg_c0` on (all N from 0 in the forward; one
    segment in the backward's replay, which needs Z alone), and the outputs hold those chunks; the inputs hold all N.
    Without AQK, A and QK are neither computed nor stored and a block is skipped when no write entry of token t
    meets it: Z gets the same bits, since a block with a read match only adds exact zeros to it."""
    so = tl.program_id(0).to(tl.int64)  # this stream-chunk in the outputs
    sc = (so // seg_n) * N + seg_c0 + so % seg_n  # and in the inputs
    t = tl.program_id(1)
    n = tl.arange(0, BLOCK_W)
    mn = n < W
    e = t * W + n
    s_e = tl.load(slot_w + sc * E + e, mask=mn, other=-1)
    kv_e = tl.load(k_val + sc * E + e, mask=mn, other=0.0)
    L_e = tl.load(L_w + sc * E + e, mask=mn, other=0.0)
    T_e = tl.load(L_tot + sc * E + e, mask=mn, other=0.0)
    m = tl.arange(0, BLOCK_R)
    mm = m < R
    p = t * R + m
    s_p = tl.load(slot_r + sc * P + p, mask=mm, other=-1)
    qv_p = tl.load(q_val + sc * P + p, mask=mm, other=0.0)
    L_p = tl.load(L_r + sc * P + p, mask=mm, other=0.0)
    c = tl.arange(0, BLOCK_C)
    a_row = tl.zeros([BLOCK_C], dtype=tl.float32)
    qk_row = tl.zeros([BLOCK_C], dtype=tl.float32)
    z_rows = tl.zeros([BLOCK_W, BLOCK_C], dtype=tl.float32)
    for f0 in range(0, E, BLOCK_COL):
        f = f0 + tl.arange(0, BLOCK_COL)
        mf = f < E
        s_f = tl.load(slot_w + sc * E + f, mask=mf, other=-2)
        t_f = f // W
        mw = (s_e[:, None] == s_f[None, :]) & mn[:, None] & mf[None, :]
        mr = (s_p[:, None] == s_f[None, :]) & mm[:, None] & mf[None, :] & (t_f[None, :] <= t)
        # A block in which no entry of token t shares a slot adds exact zeros to every sum: skipped, with the same
        # bits (the sums start at +0 and never become -0). With S much larger than a chunk's entries (the flagship
        # op: 4096 write entries a chunk over 65536 slots) that is most blocks, and their exponentials.
        hits = tl.max(mw.to(tl.int32))
        if AQK:
            hits += tl.max(mr.to(tl.int32))
        if hits > 0:
            kv_f = tl.load(k_val + sc * E + f, mask=mf, other=0.0)
            L_f = tl.load(L_w + sc * E + f, mask=mf, other=0.0)
            to_token = ((t_f[:, None] == c[None, :]) & mf[:, None]).to(tl.float32)  # [BLOCK_COL, BLOCK_C]
            # Masked pairs get a zero exponent before exp, so no overflow can reach the sums.
            if AQK:
                ww = tl.where(mw & (t_f[None, :] < t), L_e[:, None] - L_f[None, :], 0.0)
                pw = tl.where(mw & (t_f[None, :] < t), kv_e[:, None] * kv_f[None, :] * tl.exp(ww), 0.0)
                a_row += tl.sum(tl.sum(pw, axis=0)[:, None] * to_token, axis=0)
            zz = tl.where(mw, T_e[:, None] - L_f[None, :], 0.0)
            pz = tl.where(mw, kv_f[None, :] * tl.exp(zz), 0.0)  # [BLOCK_W, BLOCK_COL]
            z_rows += mma(pz, to_token, "ieee")  # to_token is 0/1: exact products, a fixed-order sum
            if AQK:
                rr = tl.where(mr, L_p[:, None] - L_f[None, :], 0.0)
                pr = tl.where(mr, qv_p[:, None] * kv_f[None, :] * tl.exp(rr), 0.0)
                qk_row += tl.sum(tl.sum(pr, axis=0)[:, None] * to_token, axis=0)
    mc = c < C
    if AQK:
        tl.store(A + (so * C + t) * C + c, a_row, mask=mc)
        tl.store(QK + (so * C + t) * C + c, qk_row, mask=mc)
    tl.store(Z + (so * E + e)[:, None] * C + c[None, :], z_rows, mask=mn[:, None] & mc[None, :])


@triton.jit
def solve_kernel(A, beta, X, C: tl.constexpr, BLOCK_C: tl.constexpr):
    """One program per stream-chunk: ``X = (I + tril(beta A, -1))^-1`` by forward substitution in float32."""
    sc = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK_C)
    mr = r < C
    b = tl.load(beta + sc * C + r, mask=mr, other=0.0)
    a = tl.load(A + (sc * C + r)[:, None] * C + r[None, :], mask=mr[:, None] & mr[None, :], other=0.0)
    a = tl.where(r[None, :] < r[:, None], b[:, None] * a, 0.0)
    inv = (r[:, None] == r[None, :]).to(tl.float32)
    for i in range(1, C):
        a_i = tl.sum(tl.where(r[:, None] == i, a, 0.0), axis=0)  # row i of the strictly lower matrix
        s = tl.sum(a_i[:, None] * inv, axis=0)  # sum_j a_ij X_j (rows j >= i meet a_ij = 0)
        inv = tl.where(r[:, None] == i, inv - s[None, :], inv)
    tl.store(X + (sc * C + r)[:, None] * C + r[None, :], inv, mask=mr[:, None] & mr[None, :])


@triton.jit
def _token_sum(
    base, slot, val, L, rows_out, sc, sr, t, col, mcol,
    D: tl.constexpr, TOTAL: tl.constexpr, PER: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
    SAVE: tl.constexpr,
):  # fmt: skip
    """Token t's decay-weighted sum of the bank rows (`base`, a stream's bank) at its `PER` entries of a chunk of
    `TOTAL`: ``sum_n val[n] exp(L[n]) M0[slot[n]]`` over the columns `col` (blocks of entries in order, a fixed tree
    within a block); with SAVE, the rows also go to `rows_out` at the chunk's place `sr`."""
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(0, PER, BLOCK):
        e = t * PER + n0 + tl.arange(0, BLOCK)
        me = e < (t + 1) * PER
        s_e = tl.load(slot + sc * TOTAL + e, mask=me, other=0)
        wt = tl.load(val + sc * TOTAL + e, mask=me, other=0.0) * tl.exp(tl.load(L + sc * TOTAL + e, mask=me, other=0.0))
        m2 = me[:, None] & mcol[None, :]
        rows = tl.load(base + s_e.to(tl.int64)[:, None] * D + col[None, :], mask=m2, other=0.0)
        if SAVE:
            tl.store(rows_out + (sr * TOTAL + e)[:, None] * D + col[None, :], rows, mask=m2)
        acc += tl.sum(wt[:, None] * rows, axis=0)
    return acc


@triton.jit
def gather_kernel(
    bank, slot_w, k_val, L_w, slot_r, q_val, L_r, km, qm, rows_w, rows_r, chunk, N, rows_n, rows_c0,
    S: tl.constexpr, D: tl.constexpr, E: tl.constexpr, P: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
    BLOCK_W: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, SAVE: tl.constexpr,
):  # fmt: skip
    """One program per (stream, token t, column slice) of one chunk: row t of ``Kdec M0`` and ``Qdec M0``, the
    decay-weighted sums of the chunk-start bank rows at t's write and read slots (:func:`_token_sum`), into `km`
    and `qm` ``[BH, C, D]``. With SAVE, also the rows themselves for the backward, into buffers holding `rows_n`
    chunks a stream from chunk `rows_c0` on."""
    st = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1)
    col = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    mcol = col < D
    sc = st * N + chunk
    sr = st * rows_n + (chunk - rows_c0)  # this chunk in the rows buffers
    base = bank + st * S * D
    C = E // W
    k_m0 = _token_sum(base, slot_w, k_val, L_w, rows_w, sc, sr, t, col, mcol, D, E, W, BLOCK_W, BLOCK_D, SAVE)
    tl.store(km + (st * C + t) * D + col, k_m0, mask=mcol)
    q_m0 = _token_sum(base, slot_r, q_val, L_r, rows_r, sc, sr, t, col, mcol, D, P, R, BLOCK_R, BLOCK_D, SAVE)
    tl.store(qm + (st * C + t) * D + col, q_m0, mask=mcol)


@triton.jit
def update_kernel(
    bank, slot_w, L_tot, first, v, beta, X, QK, Z, km, qm, y, u_out, km_out, chunk, N, out_n, out_c0,
    S: tl.constexpr, D: tl.constexpr, C: tl.constexpr, E: tl.constexpr, ENTRIES: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr, SAVE: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """One program per (stream, column slice, group of `ENTRIES` write entries) of one chunk, after
    :func:`gather_kernel`: ``U = X beta (V - Kdec M0)``; the group-0 program writes ``Y = Qdec M0 + QK U`` (and with
    SAVE, U and Kdec M0 for the backward), then each program's slot-first write entries write their slots' new
    rows ``exp(L_total) M0[s] + Z U``.
    Every group computes the same U from the same inputs; a row is read and written by its one writer alone, so the
    groups share no row. y, U, Kdec M0 and Z hold `out_n` chunks a stream from `out_c0` on; the other inputs all N."""
    st = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    grp = tl.program_id(2)
    mcol = col < D
    sc = st * N + chunk
    so = st * out_n + (chunk - out_c0)  # this chunk in y, U and Z
    base = bank + st * S * D
    c = tl.arange(0, BLOCK_C)
    mc = c < C
    m2 = mc[:, None] & mcol[None, :]
    k_m0 = tl.load(km + (st * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
    v_c = tl.load(v + (sc * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
    b_c = tl.load(beta + sc * C + c, mask=mc, other=0.0)
    x = tl.load(X + (sc * C + c)[:, None] * C + c[None, :], mask=mc[:, None] & mc[None, :], other=0.0)
    u = mma(x, b_c[:, None] * (v_c - k_m0), PREC)
    if grp == 0:
        if SAVE:
            tl.store(u_out + (so * C + c)[:, None] * D + col[None, :], u, mask=m2)
            tl.store(km_out + (so * C + c)[:, None] * D + col[None, :], k_m0, mask=m2)
        q_m0 = tl.load(qm + (st * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
        qk = tl.load(QK + (sc * C + c)[:, None] * C + c[None, :], mask=mc[:, None] & mc[None, :], other=0.0)
        tl.store(y + (so * C + c)[:, None] * D + col[None, :], q_m0 + mma(qk, u, PREC), mask=m2)
    for e0 in range(grp * ENTRIES, grp * ENTRIES + ENTRIES, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        me = e < E
        writer = (tl.load(first + sc * E + e, mask=me, other=0) != 0) & me
        s_e = tl.load(slot_w + sc * E + e, mask=me, other=0).to(tl.int64)
        ptr = base + s_e[:, None] * D + col[None, :]
        rows = tl.load(ptr, mask=writer[:, None] & mcol[None, :], other=0.0)
        z = tl.load(Z + (so * E + e)[:, None] * C + c[None, :], mask=me[:, None] & mc[None, :], other=0.0)
        decay = tl.exp(tl.load(L_tot + sc * E + e, mask=me, other=0.0))
        tl.store(ptr, decay[:, None] * rows + mma(z, u, PREC), mask=writer[:, None] & mcol[None, :])


def _streams(x: torch.Tensor, N: int, C: int) -> torch.Tensor:
    """[B, N*C, H, n] -> contiguous [B*H, N, C*n], each chunk's entries token-major."""
    B, _, H, n = x.shape
    return x.transpose(1, 2).reshape(B * H, N, C * n).contiguous()


def _unstream(x: torch.Tensor, B: int, H: int, T: int, n: int) -> torch.Tensor:
    """[B*H, N, C*n] (or [B*H, N, C, n]) -> [B, T, H, n], the padding tokens dropped (the inverse of _streams)."""
    return x.reshape(B, H, -1, n)[:, :, :T].transpose(1, 2)


def _forward(
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_bank: torch.Tensor | None,
    key_weighted_decay: bool,
    S: int,
    C: int,
    save: bool,
) -> tuple[torch.Tensor, torch.Tensor, Saved | None]:
    """The four kernels of the forward: ``(y [B*H, N, C, D], bank [B*H, S, D], what the backward needs or None)``."""
    B, T, H, D = v.shape
    W, R = k_idx.shape[-1], q_idx.shape[-1]
    dev = v.device
    N = max(1, -(-T // C))
    pad = N * C - T
    g32, kv32 = g.float(), k_val.float()
    log_decay = g32[..., None] * kv32 if key_weighted_decay else g32[..., None].expand_as(kv32)
    log_decay = torch.where(first_write_mask(k_idx), log_decay, torch.zeros_like(log_decay))

    def padded(x: torch.Tensor, fill: torch.Tensor | None = None) -> torch.Tensor:
        if pad == 0:
            return x
        tail = x.new_zeros(B, pad, *x.shape[2:]) if fill is None else fill.expand(B, pad, H, -1)
        return torch.cat([x, tail], dim=1)

    # Padding tokens write and read distinct slots with weight 0 and decay 0: they change nothing.
    s_w = _streams(padded(k_idx.long(), torch.arange(W, device=dev) % S), N, C)
    s_r = _streams(padded(q_idx.long(), torch.arange(R, device=dev) % S), N, C)
    kv, ld = _streams(padded(kv32), N, C), _streams(padded(log_decay), N, C)
    qv = _streams(padded(q_val.float()), N, C)
    v_s = padded(v.float()).transpose(1, 2).reshape(B * H, N, C, D).contiguous()
    b_s = _streams(padded(beta.float()[..., None]), N, C)
    BH, E, P = B * H, C * W, C * R
    L_w, L_tot, L_r = (torch.empty(BH, N, n, device=dev) for n in (E, E, P))
    first = torch.empty(BH, N, E, device=dev, dtype=torch.int32)
    A, QK, X = (torch.empty(BH, N, C, C, device=dev) for _ in range(3))
    Z = torch.empty(BH, N, E, C, device=dev)
    block_c = _pow2(C)
    runs = None
    if PHASE1 == "sort":
        out = {"L_w": L_w, "L_tot": L_tot, "L_r": L_r, "first": first, "A": A, "QK": QK, "Z": Z}
        runs = phase1_sorted(s_w, s_r, ld, kv, qv, out, LAUNCH)
    else:
        slot_decay_kernel[(BH * N, triton.cdiv(E + P, BLOCK_ENTRIES))](
            s_w, ld, s_r, L_w, L_tot, L_r, first, E, P, W, R, BLOCK_ENTRIES, BLOCK_ENTRIES, **LAUNCH
        )
        _gram(s_w, kv, L_w, L_tot, s_r, qv, L_r, A, QK, Z, 0)
    solve_kernel[(BH * N,)](A, b_s, X, C, block_c, **LAUNCH)
    bank = torch.zeros(BH, S, D, device=dev) if initial_bank is None else initial_bank.float().reshape(BH, S, D).clone()
    y = torch.empty(BH, N, C, D, device=dev)
    segment = replay_segment(N, BH, S, D, E, P) if save else N
    sv = Saved(
        s_w=s_w, s_r=s_r, kv=kv, qv=qv, ld=ld, v=v_s, b=b_s, L_w=L_w, L_tot=L_tot, L_r=L_r, first=first,
        A=A, QK=QK, X=X, Z=Z, U=torch.empty(BH, N, C, D, device=dev) if save else y,
        KM=torch.empty(BH, N, C, D, device=dev) if save else y, segment=segment, runs=runs,
    )  # fmt: skip
    if not save:
        for i in range(N):
            _step(sv, bank, y, y, y, (y, y), Z, i, (N, 0), (N, 0), save=False)  # y stands in for unwritten buffers
        return y, bank, None
    if segment == N:
        sv.rows_w, sv.rows_r = (torch.empty(BH, N, n, D, device=dev) for n in (E, P))
        for i in range(N):
            _step(sv, bank, y, sv.U, sv.KM, (sv.rows_w, sv.rows_r), Z, i, (N, 0), (N, 0))
        return y, bank, sv
    # The rows of one chunk at a time, into a buffer dropped after: the steps keep the arithmetic of the backward's
    # replay (the same SAVE; only index arguments differ), so the banks it rebuilds are these, bit for bit. Z, as
    # large as a tenth of the rows, is made again there too.
    scratch_w, scratch_r = (torch.empty(BH, 1, n, D, device=dev) for n in (E, P))
    for i in range(N):
        if i % segment == 0:
            sv.checkpoints.append(bank.clone())  # the bank at the segment's start, for the backward's replay
        _step(sv, bank, y, sv.U, sv.KM, (scratch_w, scratch_r), Z, i, (1, i), (N, 0))
    sv.Z = None
    return y, bank, sv


def replay_segment(N: int, BH: int, S: int, D: int, E: int, P: int) -> int:
    """Chunks a segment of the backward's replay holds, or N: keep every chunk's rows.

    Keeping them costs ``N BH (E + P) D`` floats (8 GiB for the flagship op at 8K tokens, 32 GiB at 32K). The
    replay keeps instead the bank at the start of each segment of L chunks (``BH S D`` floats each) and, in the
    backward, one segment's rows at a time, made by running the segment's forward steps again from its bank: the
    same arithmetic on the same bank, so the same bits. L = sqrt(N x bank / rows) balances the two; taken where it at
    least halves the memory (the flagship: 4 of 8 GiB at 8K, 8 of 32 at 32K), for one more pass of the steps."""
    rows, bank = BH * (E + P) * D, BH * S * D
    seg = max(1, round(math.sqrt(N * bank / rows)))
    replayed = -(-N // seg) * bank + seg * rows
    return seg if seg < N and 2 * replayed <= N * rows else N


def _gram(
    s_w: torch.Tensor,
    kv: torch.Tensor,
    L_w: torch.Tensor,
    L_tot: torch.Tensor,
    s_r: torch.Tensor,
    qv: torch.Tensor,
    L_r: torch.Tensor,
    A: torch.Tensor,
    QK: torch.Tensor,
    Z: torch.Tensor,
    seg_c0: int,
    aqk: bool = True,
) -> None:
    """A, QK and Z (:func:`gram_kernel`) of the chunks Z holds (``Z.shape[1]`` a stream, from `seg_c0`); without
    `aqk`, Z alone (A and QK are left as they are), with the bits it has with them."""
    BH, N, E = s_w.shape
    P = s_r.shape[-1]
    seg_n, C = Z.shape[1], Z.shape[-1]
    W, R = E // C, P // C
    gram_kernel[(BH * seg_n, C)](
        s_w, kv, L_w, L_tot, s_r, qv, L_r, A, QK, Z, N, seg_n, seg_c0,
        C, E, P, W, R, _pow2(W), _pow2(R), BLOCK_ENTRIES, _pow2(C), aqk, **LAUNCH,
    )  # fmt: skip


def _step(
    sv: Saved,
    bank: torch.Tensor,
    y: torch.Tensor,
    U: torch.Tensor,
    KM: torch.Tensor,
    rows: tuple[torch.Tensor, torch.Tensor],
    Z: torch.Tensor,
    chunk: int,
    rows_at: tuple[int, int],
    out_at: tuple[int, int],
    save: bool = True,
) -> None:
    """Phase 2 for one chunk (:func:`gather_kernel`, then :func:`update_kernel`): `bank` updated in place; y, and
    with `save` U, ``Kdec M0`` (`KM`) and the chunk-start `rows` (write, read), written into buffers holding
    (chunks, first chunk) = `out_at` and `rows_at`; `Z` held as y is."""
    BH, N, E = sv.s_w.shape
    P = sv.s_r.shape[-1]
    C, D = sv.v.shape[-2:]
    S = bank.shape[1]
    W, R = E // C, P // C
    km, qm = torch.empty(2, BH, C, D, device=bank.device)
    block_g = min(_GATHER_D, triton.next_power_of_2(D))
    gather_kernel[(BH, C, triton.cdiv(D, block_g))](
        bank, sv.s_w, sv.kv, sv.L_w, sv.s_r, sv.qv, sv.L_r, km, qm, rows[0], rows[1], chunk, N, *rows_at,
        S, D, E, P, W, R, _pow2(min(W, BLOCK_ENTRIES), 1), _pow2(min(R, BLOCK_ENTRIES), 1), block_g, save,
        **LAUNCH,
    )  # fmt: skip
    nd = triton.cdiv(D, _BLOCK_D)
    per_group = entry_groups(E, BH * nd)
    update_kernel[(BH, nd, triton.cdiv(E, per_group))](
        bank, sv.s_w, sv.L_tot, sv.first, sv.v, sv.b, sv.X, sv.QK, Z, km, qm, y, U, KM, chunk, N, *out_at,
        S, D, C, E, per_group, BLOCK_ENTRIES, _pow2(C), _pow2(_BLOCK_D), save, _bwd.DOT_PRECISION, **LAUNCH,
    )  # fmt: skip


def _replay(sv: Saved, c0: int, c1: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunk-start rows of chunks c0 .. c1-1 (``[BH, c1 - c0, E | P, D]``) and their Z (``[BH, c1 - c0, E, C]``),
    by the forward's Phase 1 Gram kernel (Z alone, with the forward's bits) and steps run again, from the bank kept
    at c0 (:func:`replay_segment`), which they use up."""
    k = c0 // sv.segment
    bank, sv.checkpoints[k] = sv.checkpoints[k], None  # the reverse walk never comes back to this segment
    assert bank is not None, f"segment {k} replayed twice"
    BH, _, E = sv.s_w.shape
    P = sv.s_r.shape[-1]
    C, D = sv.v.shape[-2:]
    n = c1 - c0
    dev = bank.device
    Z = torch.empty(BH, n, E, C, device=dev)
    if sv.runs is not None:  # the forward's Phase 1 was by slot runs: its Z comes from them
        run_gram(sv.runs, sv.kv, sv.L_w, sv.L_tot, sv.qv, sv.L_r, Z, Z, Z, c0, LAUNCH, aqk=False)
    else:
        _gram(sv.s_w, sv.kv, sv.L_w, sv.L_tot, sv.s_r, sv.qv, sv.L_r, Z, Z, Z, c0, aqk=False)  # Z stands in for A, QK
    rows_w, rows_r = (torch.empty(BH, n, m, D, device=dev) for m in (E, P))
    y, U, KM = (torch.empty(BH, n, C, D, device=dev) for _ in range(3))  # as the forward wrote them: unused
    for i in range(c0, c1):
        _step(sv, bank, y, U, KM, (rows_w, rows_r), Z, i, (n, c0), (n, c0))
    return rows_w, rows_r, Z


class _SdmTritonChunk(torch.autograd.Function):
    """The Triton forward with the deterministic backward of :mod:`.triton_chunk_bwd`."""

    @staticmethod
    def forward(ctx, k_idx, k_val, q_idx, q_val, v, g, beta, initial_bank, key_weighted_decay, S, C):  # type: ignore[override]
        B, T, H, D = v.shape
        save = any(ctx.needs_input_grad)
        with torch.no_grad():
            y, bank, saved = _forward(
                k_idx, k_val, q_idx, q_val, v, g, beta, initial_bank, key_weighted_decay, S, C, save
            )
        ctx.saved = saved
        ctx.meta = (B, T, H, S, D, k_idx.shape[-1], q_idx.shape[-1], C, key_weighted_decay)
        ctx.dtypes = tuple(None if x is None else x.dtype for x in (k_val, q_val, v, g, beta, initial_bank))
        ctx.first = first_write_mask(k_idx) if save else None
        ctx.save_for_backward(k_val, g)
        out = y.reshape(B, H, -1, D)[:, :, :T].transpose(1, 2).to(v.dtype)
        return out, bank.reshape(B, H, S, D)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dbank):  # type: ignore[override]
        B, T, H, S, D, W, R, C, key_weighted = ctx.meta
        k_val, g = ctx.saved_tensors
        saved: Saved = ctx.saved
        N = saved.s_w.shape[1]
        dev = saved.v.device
        dy_s = torch.zeros(B, H, N * C, D, device=dev)
        if dy is not None:
            dy_s[:, :, :T] = dy.float().transpose(1, 2)
        dbank_s = torch.zeros(B * H, S, D, device=dev) if dbank is None else dbank.float().reshape(B * H, S, D).clone()
        with torch.no_grad():
            gr = sdm_chunk_backward(saved, dy_s.reshape(B * H, N, C, D), dbank_s, C, W, R, LAUNCH, _replay)
            dld = _unstream(gr["ld"], B, H, T, W) * ctx.first  # a repeat within a token has no decay of its own
            dkv = _unstream(gr["k_val"], B, H, T, W)
            if key_weighted:
                dkv = dkv + g.float()[..., None] * dld
                dg = sum_in_order(dld * k_val.float(), -1)
            else:
                dg = sum_in_order(dld, -1)
            grads = (
                dkv,
                _unstream(gr["q_val"], B, H, T, R),
                _unstream(gr["v"], B, H, T, D),
                dg,
                _unstream(gr["beta"], B, H, T, 1)[..., 0],
                gr["bank"].reshape(B, H, S, D),
            )
        ctx.saved = None
        k_g, q_g, v_g, g_g, b_g, h_g = (
            None if dt is None else x.to(dt) for x, dt in zip(grads, ctx.dtypes, strict=True)
        )
        return None, k_g, None, q_g, v_g, g_g, b_g, h_g, None, None, None


def sdm_triton_chunk(
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_bank: torch.Tensor | None = None,
    key_weighted_decay: bool = False,
    *,
    num_slots: int | None = None,
    chunk_size: int = 64,
    allow_repeated_writes: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SDM by chunks of `chunk_size` tokens in Triton, forward and backward, bitwise reproducible (see the module
    docstrings of this module and of :mod:`.triton_chunk_bwd`).

    Computes the same as :func:`deltabench.kernels.sdm.torch.torch_chunk.sdm_torch_chunk`. Indices are checked
    here as in the references; float inputs are used in float32. At the dense limit (W = S, every slot written at
    every token; no key-weighted decay) the op is the gated delta rule with K = S, and deltabench's GDN Triton
    kernels run it in the inputs' dtype instead (:mod:`.dense`; `chunk_size` is theirs there, 64).
    Differentiable in ``k_val, q_val, v, g, beta, initial_bank``; when any of them requires a gradient the
    forward keeps U and the chunk-start bank rows it gathers, or a bank per segment of chunks from which the
    backward gathers them again (:func:`replay_segment`; :class:`.triton_chunk_bwd.Saved` has the memory).

    Args:
        k_idx, k_val: ``[B, T, H, W]`` write slots (int64, distinct per token) and weights.
        q_idx, q_val: ``[B, T, H, R]`` read slots and weights.
        v: ``[B, T, H, D]``; g: ``[B, T, H]`` log-decay (<= 0); beta: ``[B, T, H]``.
        initial_bank: optional ``[B, H, S, D]`` (zeros otherwise; then ``num_slots`` gives S); not modified.
        key_weighted_decay: the decay of write n is ``exp(g_t * k_val[n])``.
        chunk_size: C, 1..128 (default 64); T need not be a multiple of it.
        allow_repeated_writes: accept a write slot repeated within a token (decayed once) instead of raising.

    Returns:
        ``(y, final_bank)``: ``[B, T, H, D]`` in ``v.dtype`` and ``[B, H, S, D]`` float32.

    Examples::

        >>> from deltabench.references.sdm import make_inputs
        >>> x = make_inputs(1, 200, 2, 256, 32, 8, 8, device="cuda")
        >>> y, bank = sdm_triton_chunk(**x, chunk_size=64)
    """
    S = check_sdm_shapes(k_idx, k_val, q_idx, q_val, v, g, beta, initial_bank, num_slots)[3]
    if not 1 <= chunk_size <= 128:
        raise ValueError(f"chunk_size must be in 1..128, got {chunk_size}")
    if takes_dense_path(
        k_val, q_val, v, S, key_weighted_decay=key_weighted_decay, allow_repeated_writes=allow_repeated_writes
    ):
        return sdm_dense_gdn(k_idx, k_val, q_idx, q_val, v, g, beta, initial_bank, S)  # checks the slots itself
    weights = k_val if key_weighted_decay else None
    check_slots(k_idx, q_idx, S, allow_repeated_writes=allow_repeated_writes, decay_weights=weights)
    return _SdmTritonChunk.apply(
        k_idx, k_val, q_idx, q_val, v, g, beta, initial_bank, key_weighted_decay, S, chunk_size
    )
