"""The backward's pair work of the chunked Triton SDM (:mod:`.triton_chunk_bwd`) by slot runs, for a forward whose
Phase 1 ran by them (:data:`.triton_chunk.PHASE1` = "sort"): each entry meets only the entries of its own slot in
its chunk, read from the forward's sort (:class:`.phase1_sorted.Runs`: per stream-chunk the write and read entries
in ``(slot, token, kind, n)`` order, a slot's entries one run, in token order, a token's writes before its reads).

- ``run_gather_weights_kernel`` (the walk's :func:`.triton_chunk_bwd.gather_weights_kernel`, one chunk): per entry
  its slot's chunk total log-decay and gather weights per token (``Gk``, ``Gq``), summed along its run, and whether
  it writes its slot's gradient row (the run's first entry: one writer a slot);
- ``run_gram_bwd_kernel`` (:func:`.triton_chunk_bwd.gram_bwd_kernel`): per entry the gradient of its weight and of
  its log-decay since the chunk start through A, QK, Z and the gathers, and (writes) of its slot's chunk total;
- ``run_decay_bwd_kernel`` (:func:`.triton_chunk_bwd.decay_bwd_kernel`): per write entry the gradient of its
  log-decay, the sum of the run's entries of its token or later and its slot's chunk total.

The results are those of the all-pairs kernels up to float32 rounding (the sums run in run order, not in blocks of
entry ids), at a cost proportional to the pairs sharing a slot (the sum of squared run lengths) instead of all
``(E + P)^2`` pairs of a chunk. Which entry writes a slot's row differs from the all-pairs kernel's (the run's first
against the lowest entry id), not what it writes: every entry of a run sums the same terms in the same order.
Determinism: no atomics, one writer per output, every sum runs along its run in a fixed order. Bounded decays: every
exponent is ``L`` (<= 0) or a difference of log-decays that is <= 0 for the pairs it is used for (masked pairs get
0 before exp), never a product of exps, so the strong regime's in-chunk log-decays stay finite.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["RUN_BLOCK", "run_decay_bwd_kernel", "run_gather_weights_kernel", "run_gram_bwd_kernel"]

RUN_BLOCK = 32  # sorted positions per program


@triton.jit
def _run_walk(order, start, end, base, i, mi):
    """A program's sorted positions `i` (mask `mi`) in the stream-chunk at `base`: ``(entry id, run start, run end,
    the longest run's length)``; entry ids are writes ``e < E`` and reads ``E + p``."""
    ent = tl.load(order + base + i, mask=mi, other=0)
    st = tl.load(start + base + i, mask=mi, other=0)
    en = tl.load(end + base + i, mask=mi, other=0)
    return ent, st, en, tl.max(tl.where(mi, en - st, 0))


@triton.jit
def run_gather_weights_kernel(
    order, start, end, k_val, L_w, ld, q_val, L_r, rep, ltot, Gk, Gq, chunk, N,
    C: tl.constexpr, E: tl.constexpr, P: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """One program per (stream, block of sorted positions) of one chunk; outputs per entry id j (``[BH, E + P]``,
    as :func:`.triton_chunk_bwd.gather_weights_kernel`'s): `rep` (j is its run's first entry), `ltot` (the run's
    write log-decays summed), ``Gk[j, t]`` and ``Gq[j, t]`` (the run's write and read weights at token t)."""
    st_ = tl.program_id(0).to(tl.int64)
    sc = st_ * N + chunk
    base = sc * (E + P)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mi = i < E + P
    ent, s0, s1, longest = _run_walk(order, start, end, base, i, mi)
    c = tl.arange(0, BLOCK_C)
    tot = tl.zeros([BLOCK], dtype=tl.float32)
    gk = tl.zeros([BLOCK, BLOCK_C], dtype=tl.float32)
    gq = tl.zeros([BLOCK, BLOCK_C], dtype=tl.float32)
    for k in range(0, longest):
        j = s0 + k
        ok = mi & (j < s1)
        f = tl.load(order + base + j, mask=ok, other=0)
        w = ok & (f < E)
        r = ok & (f >= E)
        fw = tl.where(w, f, 0)
        fr = tl.where(r, f - E, 0)
        tot += tl.where(w, tl.load(ld + sc * E + fw, mask=w, other=0.0), 0.0)
        wt_w = tl.load(k_val + sc * E + fw, mask=w, other=0.0) * tl.exp(tl.load(L_w + sc * E + fw, mask=w, other=0.0))
        wt_r = tl.load(q_val + sc * P + fr, mask=r, other=0.0) * tl.exp(tl.load(L_r + sc * P + fr, mask=r, other=0.0))
        t_f = tl.where(w, fw // W, fr // R)
        at = t_f[:, None] == c[None, :]
        gk += tl.where(w[:, None] & at, wt_w[:, None], 0.0)
        gq += tl.where(r[:, None] & at, wt_r[:, None], 0.0)
    out = st_ * (E + P) + ent
    tl.store(rep + out, (i == s0).to(tl.int32), mask=mi)
    tl.store(ltot + out, tot, mask=mi)
    m2 = mi[:, None] & (c[None, :] < C)
    tl.store(Gk + out[:, None] * C + c[None, :], gk, mask=m2)
    tl.store(Gq + out[:, None] * C + c[None, :], gq, mask=m2)


@triton.jit
def run_gram_bwd_kernel(
    order, start, end, k_val, L_w, L_tot, q_val, L_r, dA, dQK, h, mdm, dcw, dcr, dkv, dL_w, dtot, dqv, dL_r,
    C: tl.constexpr, E: tl.constexpr, P: tl.constexpr, W: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per (stream-chunk, block of sorted positions): for each position's entry, the terms of
    :func:`.triton_chunk_bwd.gram_bwd_kernel` summed along its run instead of over every entry of the chunk (a
    write meets its run's writes of earlier tokens through A[t, t'], of later tokens through A[t', t], its reads of
    its token or later through QK and all its writes through Z; a read meets its run's writes of its token or
    earlier through QK), then the entry's own terms."""
    sc = tl.program_id(0).to(tl.int64)
    base = sc * (E + P)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mi = i < E + P
    ent, s0, s1, longest = _run_walk(order, start, end, base, i, mi)
    is_w = mi & (ent < E)
    is_r = mi & (ent >= E)
    rw = tl.where(is_w, ent, 0)
    rr = tl.where(is_r, ent - E, 0)
    t_row = tl.where(is_w, rw // W, rr // R)
    val = tl.where(is_w, tl.load(k_val + sc * E + rw, mask=is_w, other=0.0), 0.0)
    val = tl.where(is_r, tl.load(q_val + sc * P + rr, mask=is_r, other=0.0), val)
    L_row = tl.where(is_w, tl.load(L_w + sc * E + rw, mask=is_w, other=0.0), 0.0)
    L_row = tl.where(is_r, tl.load(L_r + sc * P + rr, mask=is_r, other=0.0), L_row)
    d_val = tl.zeros([BLOCK], dtype=tl.float32)
    d_L = tl.zeros([BLOCK], dtype=tl.float32)
    zsum = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(0, longest):
        j = s0 + k
        ok = mi & (j < s1)
        f = tl.load(order + base + j, mask=ok, other=0)
        fw_ok = ok & (f < E)  # the partner is a write
        fr_ok = ok & (f >= E)  # a read
        fw = tl.where(fw_ok, f, 0)
        fr = tl.where(fr_ok, f - E, 0)
        t_f = fw // W
        t_p = fr // R
        kv_f = tl.load(k_val + sc * E + fw, mask=fw_ok, other=0.0)
        L_f = tl.load(L_w + sc * E + fw, mask=fw_ok, other=0.0)
        earlier = fw_ok & is_w & (t_f < t_row)  # A[t_row, t_f]
        later = fw_ok & is_w & (t_f > t_row)  # A[t_f, t_row]
        read = fw_ok & is_r & (t_f <= t_row)  # QK[t_row, t_f]
        seen = fr_ok & is_w & (t_p >= t_row)  # QK[t_p, t_row]
        g_e = tl.load(dA + (sc * C + t_row) * C + t_f, mask=earlier, other=0.0)
        g_l = tl.load(dA + (sc * C + t_f) * C + t_row, mask=later, other=0.0)
        g_r = tl.load(dQK + (sc * C + t_row) * C + t_f, mask=read, other=0.0)
        g_q = tl.load(dQK + (sc * C + t_p) * C + t_row, mask=seen, other=0.0)
        qv_p = tl.load(q_val + sc * P + fr, mask=seen, other=0.0)
        L_p = tl.load(L_r + sc * P + fr, mask=seen, other=0.0)
        # Masked pairs get a zero exponent before exp, so no overflow can reach the sums.
        ex = tl.exp(tl.where(earlier | read, L_row - L_f, 0.0))
        ex_l = tl.exp(tl.where(later, L_f - L_row, 0.0))
        ex_q = tl.exp(tl.where(seen, L_p - L_row, 0.0))
        plus = tl.where(earlier | read, (g_e + g_r) * ex * kv_f, 0.0)
        minus = tl.where(later, g_l * ex_l * kv_f, 0.0) + tl.where(seen, g_q * ex_q * qv_p, 0.0)
        d_val += plus + minus
        d_L += val * (plus - minus)
        zw = fw_ok & is_w
        zt_f = kv_f * tl.exp(tl.where(zw, tl.load(L_tot + sc * E + fw, mask=zw, other=0.0) - L_f, 0.0))
        zsum += tl.where(zw, zt_f * tl.load(h + sc * E + fw, mask=zw, other=0.0), 0.0)
    # The entry's own terms: its gather of the chunk-start bank, and (writes) its share of its slot's new row.
    dc = tl.where(is_w, tl.load(dcw + sc * E + rw, mask=is_w, other=0.0), 0.0)
    dc = tl.where(is_r, tl.load(dcr + sc * P + rr, mask=is_r, other=0.0), dc)
    Lt = tl.load(L_tot + sc * E + rw, mask=is_w, other=0.0)
    zt = tl.where(is_w, tl.exp(tl.where(is_w, Lt - L_row, 0.0)) * tl.load(h + sc * E + rw, mask=is_w, other=0.0), 0.0)
    d_val += zt + dc * tl.exp(L_row)
    d_L += val * (dc * tl.exp(L_row) - zt)
    tl.store(dkv + sc * E + rw, d_val, mask=is_w)
    tl.store(dL_w + sc * E + rw, d_L, mask=is_w)
    tl.store(dtot + sc * E + rw, tl.exp(Lt) * tl.load(mdm + sc * E + rw, mask=is_w, other=0.0) + zsum, mask=is_w)
    tl.store(dqv + sc * P + rr, d_val, mask=is_r)
    tl.store(dL_r + sc * P + rr, d_L, mask=is_r)


@triton.jit
def run_decay_bwd_kernel(
    order, start, end, dL_w, dL_r, dtot, dld,
    E: tl.constexpr, P: tl.constexpr, W: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per (stream-chunk, block of sorted positions): for each write entry f among them, the gradient
    of its log-decay, ``dtot[f]`` plus the log-decay gradients of its run's entries of token ``t_f`` or later (the
    segmented scans of :func:`.phase1_sorted.run_decay_kernel` backward); read positions write nothing."""
    sc = tl.program_id(0).to(tl.int64)
    base = sc * (E + P)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mi = i < E + P
    ent, s0, s1, longest = _run_walk(order, start, end, base, i, mi)
    is_w = mi & (ent < E)
    rw = tl.where(is_w, ent, 0)
    t_row = rw // W
    acc = tl.load(dtot + sc * E + rw, mask=is_w, other=0.0)
    for k in range(0, longest):
        j = s0 + k
        ok = is_w & (j < s1)
        f = tl.load(order + base + j, mask=ok, other=0)
        fw_ok = ok & (f < E)
        fr_ok = ok & (f >= E)
        fw = tl.where(fw_ok, f, 0)
        fr = tl.where(fr_ok, f - E, 0)
        hit_w = fw_ok & (fw // W >= t_row)
        hit_r = fr_ok & (fr // R >= t_row)
        d = tl.load(dL_w + sc * E + fw, mask=hit_w, other=0.0)
        d = tl.where(hit_r, tl.load(dL_r + sc * P + fr, mask=hit_r, other=0.0), d)
        acc += tl.where(hit_w | hit_r, d, 0.0)
    tl.store(dld + sc * E + rw, acc, mask=is_w)
