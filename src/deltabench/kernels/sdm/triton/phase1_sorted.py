"""Sort-based Phase 1 of the chunked Triton SDM forward (:mod:`.triton_chunk`): each entry meets only the entries of
its own slot in its chunk, not all of the chunk's entries.

Per stream-chunk the write and read entries are sorted by the unique int64 key ``(slot, token, kind, n)`` (kind 0
for a write, 1 for a read; unique keys, so the order does not depend on the sort algorithm and two calls give the
same one). A slot's entries then lie in one run, in token order, a token's writes before its reads, so that

- ``run_decay_kernel``: an entry's log-decay since the chunk start ``L`` is the sum of the write log-decays of its
  run up to itself (a read: of the writes of its token and earlier), the slot's chunk total ``L_tot`` that over the
  whole run, and a write is its slot's first when no write precedes it in the run;
- ``run_gram_kernel``: row t of ``A`` sums over token t's write entries and the earlier-token writes of their runs,
  row t of ``QK`` over token t's read entries and the writes before them in their runs, and a write entry's row of
  ``Z`` over its run's writes.

The results are those of :func:`.triton_chunk.slot_decay_kernel` and :func:`.triton_chunk.gram_kernel` up to float32
rounding (the sums run in another order), at a cost proportional to the pairs sharing a slot instead of all pairs of
a chunk's entries (the flagship op: about 4096 x 8192 compares a stream-chunk against a few thousand pairs).
The backward's pair kernels walk the same runs (:mod:`.phase1_sorted_bwd`).
Determinism: no atomics, every output has one writer, every sum runs in a fixed order (along a run, or a fixed
reduction tree over a token's entries); the exponents are differences ``L_e - L_f`` (never products of exps), so
a slot's log-decay far past float32's exp range (the strong regime) stays finite.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

__all__ = ["Runs", "phase1_sorted", "run_gram", "sort_runs"]

_BLOCK = 32  # sorted positions per program of run_decay_kernel


@dataclasses.dataclass
class Runs:
    """Each stream-chunk's entries in slot-run order, ``[BH, N, E + P]`` int32 (entry ids: writes ``e``, reads
    ``E + p``): ``order`` (the entry at each sorted position), ``pos`` (each entry's sorted position), ``start``
    and ``end`` (each sorted position's run, end exclusive)."""

    order: torch.Tensor
    pos: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor


def sort_runs(s_w: torch.Tensor, s_r: torch.Tensor, C: int) -> Runs:
    """The slot runs of every stream-chunk (:class:`Runs`) from the write and read slots ``[BH, N, E | P]``."""
    E, P = s_w.shape[-1], s_r.shape[-1]
    W, R = E // C, P // C
    dev = s_w.device
    nb = max(1, (max(W, R) - 1).bit_length())
    tb = max(1, (C - 1).bit_length())
    shift = nb + 1 + tb
    most = int(max(s_w.max(), s_r.max())) if s_w.numel() else 0
    if most >= 1 << (62 - shift):
        raise ValueError(f"slot {most} does not fit the sort key beside {shift} bits of token and entry")
    ew, er = torch.arange(E, device=dev), torch.arange(P, device=dev)
    key_w = (s_w << shift) | ((ew // W) << (nb + 1)) | (ew % W)
    key_r = (s_r << shift) | ((er // R) << (nb + 1)) | (1 << nb) | (er % R)
    keys, order = torch.sort(torch.cat([key_w, key_r], -1), dim=-1)
    slot = (keys >> shift).contiguous()
    # A run's bounds by binary search in the sorted slots (integer work: no scan, the same on every device).
    start = torch.searchsorted(slot, slot, side="left")
    end = torch.searchsorted(slot, slot, side="right")
    idx = torch.arange(E + P, device=dev).expand_as(slot).contiguous()
    pos = torch.empty_like(order).scatter_(-1, order, idx)  # unique indices: one writer each
    return Runs(*(x.to(torch.int32).contiguous() for x in (order, pos, start, end)))


@triton.jit
def run_decay_kernel(
    order, start, end, ld, L_w, L_tot, L_r, first,
    E: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per (stream-chunk, block of sorted positions i): walks i's run from its start, summing the
    write log-decays up to i (``L``) and over the run (``L_tot``), and counting the writes before i (``first``)."""
    sc = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mi = i < E + P
    ent = tl.load(order + sc * (E + P) + i, mask=mi, other=0)
    st = tl.load(start + sc * (E + P) + i, mask=mi, other=0)
    en = tl.load(end + sc * (E + P) + i, mask=mi, other=0)
    pre = tl.zeros([BLOCK], dtype=tl.float32)
    tot = tl.zeros([BLOCK], dtype=tl.float32)
    earlier = tl.zeros([BLOCK], dtype=tl.int32)
    for k in range(0, tl.max(en - st)):
        j = st + k
        ok = mi & (j < en)
        f = tl.load(order + sc * (E + P) + j, mask=ok, other=E)
        w = ok & (f < E)
        ld_f = tl.load(ld + sc * E + f, mask=w, other=0.0)
        tot += tl.where(w, ld_f, 0.0)
        pre += tl.where(w & (j <= i), ld_f, 0.0)
        earlier += (w & (j < i)).to(tl.int32)
    is_w = mi & (ent < E)
    is_r = mi & (ent >= E)
    ew = tl.where(is_w, ent, 0)
    er = tl.where(is_r, ent - E, 0)
    tl.store(L_w + sc * E + ew, pre, mask=is_w)
    tl.store(L_tot + sc * E + ew, tot, mask=is_w)
    tl.store(first + sc * E + ew, (earlier == 0).to(tl.int32), mask=is_w)
    tl.store(L_r + sc * P + er, pre, mask=is_r)


@triton.jit
def run_gram_kernel(
    order, pos, start, end, k_val, L_w, L_tot, q_val, L_r, A, QK, Z, N, seg_n, seg_c0,
    C: tl.constexpr, E: tl.constexpr, P: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
    BLOCK_W: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, AQK: tl.constexpr,
):  # fmt: skip
    """One program per (stream-chunk, token t): row t of A and QK (with AQK) and the Z rows of t's write entries,
    each walking its entry's slot run. The programs cover `seg_n` chunks a stream from `seg_c0` (the outputs hold
    those chunks; the inputs all N), as :func:`.triton_chunk.gram_kernel`'s."""
    so = tl.program_id(0).to(tl.int64)
    sc = (so // seg_n) * N + seg_c0 + so % seg_n
    t = tl.program_id(1)
    c = tl.arange(0, BLOCK_C)
    base = sc * (E + P)
    n = tl.arange(0, BLOCK_W)
    mn = n < W
    e = t * W + n
    kv_e = tl.load(k_val + sc * E + e, mask=mn, other=0.0)
    L_e = tl.load(L_w + sc * E + e, mask=mn, other=0.0)
    T_e = tl.load(L_tot + sc * E + e, mask=mn, other=0.0)
    pe = tl.load(pos + base + e, mask=mn, other=0)
    st_e = tl.load(start + base + pe, mask=mn, other=0)
    en_e = tl.load(end + base + pe, mask=mn, other=0)
    # Z: every write of the run, in run order (the rows of a slot's entries are alike)
    z_rows = tl.zeros([BLOCK_W, BLOCK_C], dtype=tl.float32)
    for k in range(0, tl.max(tl.where(mn, en_e - st_e, 0))):
        j = st_e + k
        ok = mn & (j < en_e)
        f = tl.load(order + base + j, mask=ok, other=E)
        w = ok & (f < E)
        fw = tl.where(w, f, 0)
        kv_f = tl.load(k_val + sc * E + fw, mask=w, other=0.0)
        L_f = tl.load(L_w + sc * E + fw, mask=w, other=0.0)
        contrib = tl.where(w, kv_f * tl.exp(tl.where(w, T_e - L_f, 0.0)), 0.0)
        z_rows += tl.where(w[:, None] & ((fw // W)[:, None] == c[None, :]), contrib[:, None], 0.0)
    mc = c < C
    tl.store(Z + (so * E + e)[:, None] * C + c[None, :], z_rows, mask=mn[:, None] & mc[None, :])
    if AQK:
        # A[t, t']: the writes of earlier tokens before each of t's writes in its run
        a_row = tl.zeros([BLOCK_C], dtype=tl.float32)
        for k in range(1, tl.max(tl.where(mn, pe - st_e, 0)) + 1):
            j = pe - k
            ok = mn & (j >= st_e)
            f = tl.load(order + base + j, mask=ok, other=E)
            fw = tl.where(ok & (f < E), f, 0)
            w = ok & (f < E) & (fw // W < t)
            kv_f = tl.load(k_val + sc * E + fw, mask=w, other=0.0)
            L_f = tl.load(L_w + sc * E + fw, mask=w, other=0.0)
            contrib = tl.where(w, kv_e * kv_f * tl.exp(tl.where(w, L_e - L_f, 0.0)), 0.0)
            a_row += tl.sum(tl.where(w[:, None] & ((fw // W)[:, None] == c[None, :]), contrib[:, None], 0.0), axis=0)
        tl.store(A + (so * C + t) * C + c, a_row, mask=mc)
        # QK[t, t']: the writes before each of t's reads in its run (tokens t' <= t, a token's writes first)
        m = tl.arange(0, BLOCK_R)
        mm = m < R
        p = t * R + m
        qv_p = tl.load(q_val + sc * P + p, mask=mm, other=0.0)
        L_p = tl.load(L_r + sc * P + p, mask=mm, other=0.0)
        pp = tl.load(pos + base + E + p, mask=mm, other=0)
        st_p = tl.load(start + base + pp, mask=mm, other=0)
        qk_row = tl.zeros([BLOCK_C], dtype=tl.float32)
        for k in range(1, tl.max(tl.where(mm, pp - st_p, 0)) + 1):
            j = pp - k
            ok = mm & (j >= st_p)
            f = tl.load(order + base + j, mask=ok, other=E)
            w = ok & (f < E)
            fw = tl.where(w, f, 0)
            kv_f = tl.load(k_val + sc * E + fw, mask=w, other=0.0)
            L_f = tl.load(L_w + sc * E + fw, mask=w, other=0.0)
            contrib = tl.where(w, qv_p * kv_f * tl.exp(tl.where(w, L_p - L_f, 0.0)), 0.0)
            qk_row += tl.sum(tl.where(w[:, None] & ((fw // W)[:, None] == c[None, :]), contrib[:, None], 0.0), axis=0)
        tl.store(QK + (so * C + t) * C + c, qk_row, mask=mc)


def _pow2(n: int) -> int:
    """A block size covering n: a power of two, at least 2."""
    return max(2, triton.next_power_of_2(n))


def run_gram(
    runs: Runs,
    kv: torch.Tensor,
    L_w: torch.Tensor,
    L_tot: torch.Tensor,
    qv: torch.Tensor,
    L_r: torch.Tensor,
    A: torch.Tensor,
    QK: torch.Tensor,
    Z: torch.Tensor,
    seg_c0: int,
    launch: dict,
    aqk: bool = True,
) -> None:
    """A, QK and Z (:func:`run_gram_kernel`) of the chunks Z holds (``Z.shape[1]`` a stream, from `seg_c0`); without
    `aqk`, Z alone, with the bits it has with them."""
    BH, N, E = kv.shape
    P = qv.shape[-1]
    seg_n, C = Z.shape[1], Z.shape[-1]
    W, R = E // C, P // C
    run_gram_kernel[(BH * seg_n, C)](
        runs.order, runs.pos, runs.start, runs.end, kv, L_w, L_tot, qv, L_r, A, QK, Z, N, seg_n, seg_c0,
        C, E, P, W, R, _pow2(W), _pow2(R), _pow2(C), aqk, **launch,
    )  # fmt: skip


def phase1_sorted(
    s_w: torch.Tensor,
    s_r: torch.Tensor,
    ld: torch.Tensor,
    kv: torch.Tensor,
    qv: torch.Tensor,
    out: dict[str, torch.Tensor],
    launch: dict,
) -> Runs:
    """The forward's Phase 1 before the solve, by slot runs: fills ``out``'s ``L_w, L_tot, L_r, first, A, QK, Z``
    (shaped as :func:`.triton_chunk._forward` makes them) and returns the runs (the backward's replay reuses them)."""
    BH, N, E = s_w.shape
    P = s_r.shape[-1]
    C = out["A"].shape[-1]
    runs = sort_runs(s_w, s_r, C)
    run_decay_kernel[(BH * N, triton.cdiv(E + P, _BLOCK))](
        runs.order, runs.start, runs.end, ld, out["L_w"], out["L_tot"], out["L_r"], out["first"], E, P, _BLOCK,
        **launch,
    )  # fmt: skip
    run_gram(runs, kv, out["L_w"], out["L_tot"], qv, out["L_r"], out["A"], out["QK"], out["Z"], 0, launch)
    return runs
