"""Backward of the chunked Triton SDM (:mod:`.triton_chunk`), deterministic: a reverse walk over chunks.

Layout as in :mod:`.triton_chunk`: a stream is one (b, h); chunk tensors are ``[BH, N, ...]`` with write entries
``e = t W + n`` and read entries ``p = t R + m``. The forward keeps, per chunk, its Phase 1 tensors (``L_w, L_tot,
L_r, first, A, QK, X, Z``), ``U [C, D]`` and the chunk-start bank rows it gathered (``rows_w [E, D]``,
``rows_r [P, D]``); or, for a large bank over many chunks, the bank at the start of each segment of chunks, from
which the walk gathers a segment's rows again just before it walks that segment back (triton_chunk._replay).

Per chunk, with ``G = dL/dY`` of the chunk and ``dM`` the bank gradient after it (the forward's equations are in
:mod:`.torch_chunk`):

- three launches per chunk (Triton, last chunk first), after ``gather_weights_kernel`` (each entry's slot
  representative, total log-decay and gather weights per token): ``bwd_entries_kernel`` (per stream, column slice
  and group of write entries: the group's share of ``Z_first^T dM[s_e]``, and per write entry ``<dM[s_e], U[t_e]>``
  and ``<M0[s_e], dM[s_e]>``), ``bwd_tokens_kernel`` (per stream and column slice: ``dU = QK^T G`` plus the groups'
  shares, ``dw = X^T dU``, ``dv = beta dw``, ``dKdecM0 = -beta dw``, and ``dQK = G U^T``, ``dX = dU w^T``, per token
  ``<dw, v - KdecM0>``), ``bwd_rewrite_kernel`` (per stream, column slice and group of entries: per write entry
  ``<dKdecM0[t_e], M0[s_e]>``, per read entry ``<G[t_p], M0[s_p]>``, then every touched row of ``dM`` becomes the
  gradient before the chunk, ``exp(L_tot) dM[s] + Gk[j] dKdecM0 + Gq[j] G`` (``Gk, Gq`` the gather weights of the
  slot's entries per token, written by its representative entry ``j``: one writer per row)). The per-entry and
  per-token values are each column slice's share; the shares are then added in slice order (:func:`sum_in_order`).
- Phase 1 backward, every chunk at once (Triton, no bank): ``solve_bwd_kernel`` (``dBm = -X^T dX X^T``, then
  ``dA`` and the solve's share of ``dbeta``), ``gram_bwd_kernel`` (per entry: the gradient of its weight and of its
  log-decay since the chunk start, through A, QK, Z and the gathers; per write entry that of its slot's chunk total)
  and ``decay_bwd_kernel`` (the segmented scans backward: the gradient of each write entry's log-decay).
- Where the forward's Phase 1 ran by slot runs (``Saved.runs``, triton_chunk.PHASE1 = "sort"), the three kernels
  that compare every pair of a chunk's entries, ``gather_weights_kernel``, ``gram_bwd_kernel`` and
  ``decay_bwd_kernel``, give way to their run forms (:mod:`.phase1_sorted_bwd`, on the forward's sort): the same
  values up to float32 rounding.

The caller (:mod:`.triton_chunk`) turns the log-decay gradients into those of g (and of k_val with key-weighted
decay) with a sum over the W entries of each token, in PyTorch.

Every row of the bank gradient has one writer per launch; no atomics; every sum has a fixed order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from ...common.triton.mma import mma
from .phase1_sorted import Runs
from .phase1_sorted_bwd import RUN_BLOCK, run_decay_bwd_kernel, run_gather_weights_kernel, run_gram_bwd_kernel

__all__ = [
    "BLOCK_D",
    "BLOCK_ENTRIES",
    "DOT_PRECISION",
    "PROGRAMS",
    "Saved",
    "entry_groups",
    "sdm_chunk_backward",
    "sum_in_order",
]

BLOCK_ENTRIES = 32  # entries per block in the loops over a chunk's entries
BLOCK_D = 32  # bank columns per program of the reverse walk
PROGRAMS = 256  # about two waves of an H100/H200's 132 SMs: the walk's per-entry steps split their entries to fill them
# tl.dot's input precision in the forward's update and the walk's three kernels, read at each launch: "ieee" (IEEE
# float32 products on CUDA cores) or "tf32x3" (three TF32 tensor-core products, float32 to within ~1e-6 relative;
# benchmarks/gpu/sdm_profile.py --precision times both). The same bits from call to call either way.
DOT_PRECISION = "ieee"


@dataclasses.dataclass
class Saved:
    """What the forward keeps for the backward, each ``[BH, N, ...]`` (E = C W write and P = C R read entries).

    Memory beyond the inputs: ``rows_w, rows_r`` (float32, ``T_pad * BH * (W + R) * D * 4`` bytes) or, where the
    forward chose to replay them (``segment`` < N, triton_chunk.replay_segment), one bank per segment of that many
    chunks in ``checkpoints`` (``BH * S * D * 4`` bytes each), and then no ``Z`` either (made again by segments);
    ``U`` and ``KM`` (``T_pad * BH * D * 4`` each), ``Z`` (``T_pad * BH * W * C * 4``), ``A, QK, X``
    (``3 * T_pad * BH * C * 4``) and the per-entry ``L_w, L_tot, L_r, first`` (``T_pad * BH * (3 W + R) * 4``).
    """

    s_w: torch.Tensor  # [BH, N, E] int64
    s_r: torch.Tensor  # [BH, N, P] int64
    kv: torch.Tensor  # [BH, N, E]
    qv: torch.Tensor  # [BH, N, P]
    ld: torch.Tensor  # [BH, N, E] log-decay of each write entry (0 for a repeat within its token)
    v: torch.Tensor  # [BH, N, C, D]
    b: torch.Tensor  # [BH, N, C]
    L_w: torch.Tensor  # [BH, N, E]
    L_tot: torch.Tensor  # [BH, N, E]
    L_r: torch.Tensor  # [BH, N, P]
    first: torch.Tensor  # [BH, N, E] int32
    A: torch.Tensor  # [BH, N, C, C]
    QK: torch.Tensor  # [BH, N, C, C]
    X: torch.Tensor  # [BH, N, C, C]
    Z: torch.Tensor | None  # [BH, N, E, C] (None where the backward makes it again by segments)
    U: torch.Tensor  # [BH, N, C, D]
    KM: torch.Tensor  # [BH, N, C, D] Kdec M0: the decay-weighted sums of each token's chunk-start write rows
    segment: int  # chunks per segment of the backward's walk: N when the rows are kept, fewer when replayed
    rows_w: torch.Tensor | None = None  # [BH, N, E, D] bank rows at the chunk start, gathered at the write slots
    rows_r: torch.Tensor | None = None  # [BH, N, P, D] the same at the read slots
    checkpoints: list[torch.Tensor | None] = dataclasses.field(default_factory=list)  # [BH, S, D] per segment
    runs: Runs | None = None  # where Phase 1 was by slot runs: the replay makes Z from them, the pair backward runs


def sdm_chunk_backward(
    saved: Saved,
    dy: torch.Tensor,
    dbank: torch.Tensor,
    C: int,
    W: int,
    R: int,
    launch: dict,
    replay: Callable[[Saved, int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor]:
    """Gradients of the chunked SDM forward, walking its chunks back segment by segment (``saved.segment`` chunks
    each; one segment of all N when the forward kept every chunk's rows).

    Args:
        saved: what the forward kept.
        dy: ``[BH, N, C, D]`` float32 gradient of y (zero on padding tokens).
        dbank: ``[BH, S, D]`` float32 gradient of the final bank (a fresh tensor: it is updated in place).
        C, W, R: chunk size and entries per token.
        launch: the pinned launch configuration.
        replay: ``replay(saved, c0, c1)``, the chunk-start rows (write, read) and Z of chunks c0 .. c1-1 where the
            forward did not keep them (triton_chunk._replay).

    Returns:
        ``{"k_val": [BH, N, E], "q_val": [BH, N, P], "ld": [BH, N, E], "v": [BH, N, C, D], "beta": [BH, N, C],
        "bank": [BH, S, D]}``, all float32 (``ld``: the gradient of each write entry's log-decay).
    """
    BH, N, E = saved.s_w.shape
    P = saved.s_r.shape[-1]
    dev, nd = dbank.device, triton.cdiv(dbank.shape[-1], BLOCK_D)
    dv = torch.empty_like(saved.v)
    sizes = {"dX": (C, C), "dQK": (C, C), "h": (E,), "mdm": (E,), "dcw": (E,), "dcr": (P,), "db": (C,)}
    sums = {name: torch.empty(BH, N, *shape, device=dev) for name, shape in sizes.items()}
    for c0 in reversed(range(0, N, saved.segment)):
        c1 = min(N, c0 + saved.segment)
        if saved.rows_w is not None and saved.rows_r is not None and saved.Z is not None:
            rows = (saved.rows_w, saved.rows_r, saved.Z)
        elif replay is not None:
            rows = replay(saved, c0, c1)
        else:
            raise ValueError("the forward kept no rows: the backward needs its replay")
        # each column slice's share of the segment's scalar gradients, added in slice order (elementwise, so
        # segment by segment gives the bits of one sum over all chunks)
        part = {name: torch.empty(BH, c1 - c0, nd, *shape, device=dev) for name, shape in sizes.items()}
        for i in reversed(range(c0, c1)):
            _step_backward(saved, rows, dy, dbank, W, R, launch, dv, part, i, c0)
        for name, x in part.items():
            sums[name][:, c0:c1] = sum_in_order(x, 2)
        del rows, part
    dA, db = torch.empty_like(saved.A), torch.empty_like(saved.b)
    solve_bwd_kernel[(BH * N,)](saved.X, sums["dX"], saved.A, saved.b, sums["db"], dA, db, C, _pow2(C), **launch)
    dkv, dL_w, dtot, dld = (torch.empty_like(saved.kv) for _ in range(4))
    dqv, dL_r = torch.empty_like(saved.qv), torch.empty_like(saved.qv)
    runs = saved.runs
    if runs is not None:  # Phase 1 ran by slot runs: so does its backward, on the forward's sort
        grid = (BH * N, triton.cdiv(E + P, RUN_BLOCK))
        run_gram_bwd_kernel[grid](
            runs.order, runs.start, runs.end, saved.kv, saved.L_w, saved.L_tot, saved.qv, saved.L_r, dA,
            sums["dQK"], sums["h"], sums["mdm"], sums["dcw"], sums["dcr"], dkv, dL_w, dtot, dqv, dL_r,
            C, E, P, W, R, RUN_BLOCK, **launch,
        )  # fmt: skip
        run_decay_bwd_kernel[grid](
            runs.order, runs.start, runs.end, dL_w, dL_r, dtot, dld, E, P, W, R, RUN_BLOCK, **launch
        )
        return {"k_val": dkv, "q_val": dqv, "ld": dld, "v": dv, "beta": db, "bank": dbank}
    gram_bwd_kernel[(BH * N, triton.cdiv(E + P, BLOCK_ENTRIES))](
        saved.s_w, saved.kv, saved.L_w, saved.L_tot, saved.s_r, saved.qv, saved.L_r, dA, sums["dQK"],
        sums["h"], sums["mdm"], sums["dcw"], sums["dcr"], dkv, dL_w, dtot, dqv, dL_r,
        C, E, P, W, R, BLOCK_ENTRIES, BLOCK_ENTRIES, **launch,
    )  # fmt: skip
    decay_bwd_kernel[(BH * N, triton.cdiv(E, BLOCK_ENTRIES))](
        saved.s_w, saved.s_r, dL_w, dL_r, dtot, dld, E, P, W, R, BLOCK_ENTRIES, BLOCK_ENTRIES, **launch
    )
    return {"k_val": dkv, "q_val": dqv, "ld": dld, "v": dv, "beta": db, "bank": dbank}


def sum_in_order(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The sum of `x` over `dim`, adding the slices one after another from index 0 (elementwise adds only: the same
    order and the same bits on every device and call)."""
    acc = x.select(dim, 0).clone()
    for k in range(1, x.shape[dim]):
        acc += x.select(dim, k)
    return acc


def _pow2(n: int) -> int:
    """The block size covering n: a power of two, at least 16 (tl.dot needs 16)."""
    return max(16, triton.next_power_of_2(n))


# ----------------------------------------------------------------------------------------------------------------
# The reverse walk (bank-sized work): Triton
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def gather_weights_kernel(
    slot_w, k_val, L_w, ld, slot_r, q_val, L_r, rep, ltot, Gk, Gq, chunk, N,
    C: tl.constexpr, E: tl.constexpr, P: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
    BLOCK_ROW: tl.constexpr, BLOCK_COL: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """One program per (stream, block of rows j) of one chunk; rows are its write entries then its read entries.
    Row j: whether it is its slot's first entry (the one writing the slot's gradient row), the slot's total
    log-decay over the chunk, and its slot's gather weights per token ``Gk[j, t]`` (writes) and ``Gq[j, t]``
    (reads)."""
    st = tl.program_id(0).to(tl.int64)
    sc = st * N + chunk
    row = tl.program_id(1) * BLOCK_ROW + tl.arange(0, BLOCK_ROW)
    is_w = row < E
    is_r = (row >= E) & (row < E + P)
    rw = tl.where(is_w, row, 0)
    rr = tl.where(is_r, row - E, 0)
    s_row = tl.where(is_w, tl.load(slot_w + sc * E + rw, mask=is_w, other=-1), -1)
    s_row = tl.where(is_r, tl.load(slot_r + sc * P + rr, mask=is_r, other=-1), s_row)
    c = tl.arange(0, BLOCK_C)
    tot = tl.zeros([BLOCK_ROW], dtype=tl.float32)
    earlier = tl.zeros([BLOCK_ROW], dtype=tl.int32)
    gk = tl.zeros([BLOCK_ROW, BLOCK_C], dtype=tl.float32)
    gq = tl.zeros([BLOCK_ROW, BLOCK_C], dtype=tl.float32)
    for f0 in range(0, E, BLOCK_COL):
        f = f0 + tl.arange(0, BLOCK_COL)
        mf = f < E
        s_f = tl.load(slot_w + sc * E + f, mask=mf, other=-2)
        match = (s_row[:, None] == s_f[None, :]) & mf[None, :]
        if tl.max(match.to(tl.int32)) > 0:  # else exact zeros for every sum: skipped (the forward's gram_kernel)
            ld_f = tl.load(ld + sc * E + f, mask=mf, other=0.0)
            wt = tl.load(k_val + sc * E + f, mask=mf, other=0.0) * tl.exp(tl.load(L_w + sc * E + f, mask=mf, other=0.0))
            tot += tl.sum(tl.where(match, ld_f[None, :], 0.0), axis=1)
            earlier += tl.sum((match & (f[None, :] < row[:, None])).to(tl.int32), axis=1)
            to_token = (((f // W)[:, None] == c[None, :]) & mf[:, None]).to(tl.float32)  # 0/1: exact products
            gk += mma(tl.where(match, wt[None, :], 0.0), to_token, "ieee")
    for f0 in range(0, P, BLOCK_COL):
        f = f0 + tl.arange(0, BLOCK_COL)
        mf = f < P
        s_f = tl.load(slot_r + sc * P + f, mask=mf, other=-2)
        match = (s_row[:, None] == s_f[None, :]) & mf[None, :]
        if tl.max(match.to(tl.int32)) > 0:
            wt = tl.load(q_val + sc * P + f, mask=mf, other=0.0) * tl.exp(tl.load(L_r + sc * P + f, mask=mf, other=0.0))
            earlier += tl.sum((match & (E + f[None, :] < row[:, None])).to(tl.int32), axis=1)
            to_token = (((f // R)[:, None] == c[None, :]) & mf[:, None]).to(tl.float32)
            gq += mma(tl.where(match, wt[None, :], 0.0), to_token, "ieee")
    mrow = is_w | is_r
    out = st * (E + P) + row
    tl.store(rep + out, (earlier == 0).to(tl.int32), mask=mrow)
    tl.store(ltot + out, tot, mask=mrow)
    m2 = mrow[:, None] & (c[None, :] < C)
    tl.store(Gk + out[:, None] * C + c[None, :], gk, mask=m2)
    tl.store(Gq + out[:, None] * C + c[None, :], gq, mask=m2)


@triton.jit
def _walk_program(dbank, chunk, N, seg_n, seg_c0, S, D, C, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    """Where a program of the reverse walk's per-entry steps works, grid (stream, column slice, entry group):
    ``(stream, group, columns, their mask, the chunk's index in the inputs, the stream's bank gradient, token
    offsets, their mask, the chunk's index in the segment's buffers, the program's share index)``."""
    st = tl.program_id(0).to(tl.int64)
    pd = tl.program_id(1)
    col = pd * BLOCK_D + tl.arange(0, BLOCK_D)
    c = tl.arange(0, BLOCK_C)
    ss = st * seg_n + (chunk - seg_c0)  # this chunk in the segment's rows and shares
    part = ss * tl.num_programs(1) + pd  # this program's share in the partial buffers [BH, seg_n, nd, ...]
    return st, tl.program_id(2), col, col < D, st * N + chunk, dbank + st * S * D, c, c < C, ss, part


@triton.jit
def bwd_entries_kernel(
    dbank, slot_w, first, Z, U, rows_w, p_du, p_h, p_mdm, chunk, N, seg_n, seg_c0,
    S: tl.constexpr, D: tl.constexpr, C: tl.constexpr, E: tl.constexpr, W: tl.constexpr, ENTRIES: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Step 1 of a chunk of the reverse walk, one program per (stream, column slice, group of `ENTRIES` write
    entries), reading the bank gradient after the chunk: the group's share of ``Z^T dM[s]`` over the slots' first
    write entries (into `p_du` ``[BH, groups, C, D]``), and per write entry the slice's share of
    ``<dM[s_e], U[t_e]>`` and ``<M0[s_e], dM[s_e]>``."""
    st, grp, col, mcol, sc, base, c, mc, ss, part = _walk_program(
        dbank, chunk, N, seg_n, seg_c0, S, D, C, BLOCK_C, BLOCK_D
    )
    du = tl.zeros([BLOCK_C, BLOCK_D], dtype=tl.float32)
    for e0 in range(grp * ENTRIES, grp * ENTRIES + ENTRIES, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        me = e < E
        me2 = me[:, None] & mcol[None, :]
        s_e = tl.load(slot_w + sc * E + e, mask=me, other=0).to(tl.int64)
        writer = (tl.load(first + sc * E + e, mask=me, other=0) != 0) & me
        dm = tl.load(base + s_e[:, None] * D + col[None, :], mask=me2, other=0.0)
        m0 = tl.load(rows_w + (ss * E + e)[:, None] * D + col[None, :], mask=me2, other=0.0)
        z = tl.load(Z + (ss * E + e)[:, None] * C + c[None, :], mask=me[:, None] & mc[None, :], other=0.0)
        du += mma(tl.trans(z), tl.where(writer[:, None], dm, 0.0), PREC)
        u_e = tl.load(U + (sc * C + e // W)[:, None] * D + col[None, :], mask=me2, other=0.0)
        tl.store(p_h + part * E + e, tl.sum(dm * u_e, axis=1), mask=me)
        tl.store(p_mdm + part * E + e, tl.sum(m0 * dm, axis=1), mask=me)
    groups = tl.num_programs(2)
    tl.store(p_du + ((st * groups + grp) * C + c)[:, None] * D + col[None, :], du, mask=mc[:, None] & mcol[None, :])


@triton.jit
def bwd_tokens_kernel(
    beta, v, X, QK, U, KM, dy, p_du, dv, p_dX, p_dQK, p_db, chunk, N, seg_n, seg_c0, groups,
    D: tl.constexpr, C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Step 2, one program per (stream, column slice): ``dU = QK^T G + the groups' shares of Z^T dM`` (added in
    group order), ``dw = X^T dU``, dv = beta dw (which step 3 reads back as the gradient of Kdec M0, -dv), and the
    slice's shares of dX, dQK and dbeta."""
    st = tl.program_id(0).to(tl.int64)
    pd = tl.program_id(1)
    nd = tl.num_programs(1)
    col = pd * BLOCK_D + tl.arange(0, BLOCK_D)
    mcol = col < D
    sc = st * N + chunk
    c = tl.arange(0, BLOCK_C)
    mc = c < C
    m2 = mc[:, None] & mcol[None, :]
    mcc = mc[:, None] & mc[None, :]
    part = (st * seg_n + (chunk - seg_c0)) * nd + pd
    g = tl.load(dy + (sc * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
    u = tl.load(U + (sc * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
    k_m0 = tl.load(KM + (sc * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
    qk = tl.load(QK + (sc * C + c)[:, None] * C + c[None, :], mask=mcc, other=0.0)
    x = tl.load(X + (sc * C + c)[:, None] * C + c[None, :], mask=mcc, other=0.0)
    du = mma(tl.trans(qk), g, PREC)
    for grp in range(0, groups):
        du += tl.load(p_du + ((st * groups + grp) * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
    dw = mma(tl.trans(x), du, PREC)
    b_c = tl.load(beta + sc * C + c, mask=mc, other=0.0)
    v_c = tl.load(v + (sc * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
    resid = v_c - k_m0
    tl.store(dv + (sc * C + c)[:, None] * D + col[None, :], b_c[:, None] * dw, mask=m2)
    tl.store(p_db + part * C + c, tl.sum(dw * resid, axis=1), mask=mc)
    tl.store(p_dX + (part * C + c)[:, None] * C + c[None, :], mma(du, tl.trans(b_c[:, None] * resid), PREC), mask=mcc)
    tl.store(p_dQK + (part * C + c)[:, None] * C + c[None, :], mma(g, tl.trans(u), PREC), mask=mcc)


@triton.jit
def bwd_rewrite_kernel(
    dbank, slot_w, slot_r, rows_w, rows_r, dy, dv, rep, ltot, Gk, Gq, p_dcw, p_dcr, chunk, N, seg_n, seg_c0,
    S: tl.constexpr, D: tl.constexpr, C: tl.constexpr, E: tl.constexpr, P: tl.constexpr,
    W: tl.constexpr, R: tl.constexpr, ENTRIES: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Step 3, one program per (stream, column slice, group of `ENTRIES` entries, writes then reads): per entry
    the slice's share of ``<dKdecM0[t_e], M0[s_e]>`` (writes) or ``<G[t_p], M0[s_p]>`` (reads), then each touched
    row of the bank gradient becomes the gradient before the chunk, ``exp(L_tot) dM[s] + Gk[j] dKdecM0 + Gq[j] G``,
    written by its slot's representative entry j (one writer a row: a program reads and writes only its own
    representatives' rows). An entry's token row is loaded at its token, not spread by one-hot products."""
    st, grp, col, mcol, sc, base, c, mc, ss, part = _walk_program(
        dbank, chunk, N, seg_n, seg_c0, S, D, C, BLOCK_C, BLOCK_D
    )
    m2 = mc[:, None] & mcol[None, :]
    g = tl.load(dy + (sc * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
    dk = -tl.load(dv + (sc * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)  # the gradient of Kdec M0
    for j0 in range(grp * ENTRIES, grp * ENTRIES + ENTRIES, BLOCK_E):
        j = j0 + tl.arange(0, BLOCK_E)
        is_w = j < E
        is_r = (j >= E) & (j < E + P)
        jw = tl.where(is_w, j, 0)
        jr = tl.where(is_r, j - E, 0)
        mw2 = is_w[:, None] & mcol[None, :]
        mr2 = is_r[:, None] & mcol[None, :]
        m0 = tl.load(rows_w + (ss * E + jw)[:, None] * D + col[None, :], mask=mw2, other=0.0)
        dk_e = tl.load(dv + (sc * C + jw // W)[:, None] * D + col[None, :], mask=mw2, other=0.0)
        tl.store(p_dcw + part * E + jw, -tl.sum(m0 * dk_e, axis=1), mask=is_w)
        m0 = tl.load(rows_r + (ss * P + jr)[:, None] * D + col[None, :], mask=mr2, other=0.0)
        g_p = tl.load(dy + (sc * C + jr // R)[:, None] * D + col[None, :], mask=mr2, other=0.0)
        tl.store(p_dcr + part * P + jr, tl.sum(m0 * g_p, axis=1), mask=is_r)
        s_j = tl.load(slot_w + sc * E + jw, mask=is_w, other=0)
        s_j = tl.where(is_r, tl.load(slot_r + sc * P + jr, mask=is_r, other=0), s_j)
        out = st * (E + P) + j
        writer = (tl.load(rep + out, mask=is_w | is_r, other=0) != 0) & (is_w | is_r)
        ptr = base + s_j.to(tl.int64)[:, None] * D + col[None, :]
        dm = tl.load(ptr, mask=writer[:, None] & mcol[None, :], other=0.0)
        mj = (is_w | is_r)[:, None] & mc[None, :]
        gk = tl.load(Gk + out[:, None] * C + c[None, :], mask=mj, other=0.0)
        gq = tl.load(Gq + out[:, None] * C + c[None, :], mask=mj, other=0.0)
        decay = tl.exp(tl.load(ltot + out, mask=is_w | is_r, other=0.0))
        new = decay[:, None] * dm + mma(gk, dk, PREC) + mma(gq, g, PREC)
        tl.store(ptr, new, mask=writer[:, None] & mcol[None, :])


def entry_groups(entries: int, slices: int) -> int:
    """Entries per program (a multiple of :data:`BLOCK_ENTRIES`) when `entries` are split over programs beside
    `slices` (stream, column slice) pairs: enough groups for about :data:`PROGRAMS` programs, at least one block a
    group. The split changes no bit: every entry's work is done whole by one program."""
    blocks = triton.cdiv(entries, BLOCK_ENTRIES)
    return BLOCK_ENTRIES * triton.cdiv(blocks, max(1, min(blocks, triton.cdiv(PROGRAMS, slices))))


def _step_backward(
    sv: Saved, rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor], dy: torch.Tensor, dbank: torch.Tensor,
    W: int, R: int, launch: dict, dv: torch.Tensor, part: dict[str, torch.Tensor], chunk: int, seg_c0: int,
) -> None:  # fmt: skip
    """Chunk `chunk` of the reverse walk: rewrites `dbank` to the gradient of the chunk-start bank, writes the
    chunk's dv into `dv` and each column slice's share of its scalar gradients into `part` ``[BH, seg_n, nd, ...]``
    (the segment from chunk `seg_c0`, whose chunk-start rows and Z `rows` holds: write rows, read rows, Z)."""
    BH, N, E = sv.s_w.shape
    P, C = sv.s_r.shape[-1], sv.b.shape[-1]
    S, D = dbank.shape[1:]
    dev = dbank.device
    block_c, block_d = _pow2(C), _pow2(BLOCK_D)
    nd = triton.cdiv(D, BLOCK_D)
    seg_n = part["db"].shape[1]
    rep = torch.empty(BH, E + P, device=dev, dtype=torch.int32)
    ltot = torch.empty(BH, E + P, device=dev)
    Gk, Gq = (torch.empty(BH, E + P, C, device=dev) for _ in range(2))
    runs = sv.runs
    if runs is not None:  # Phase 1 ran by slot runs: the gather weights are summed along the forward's runs
        run_gather_weights_kernel[(BH, triton.cdiv(E + P, RUN_BLOCK))](
            runs.order, runs.start, runs.end, sv.kv, sv.L_w, sv.ld, sv.qv, sv.L_r, rep, ltot, Gk, Gq, chunk, N,
            C, E, P, W, R, RUN_BLOCK, block_c, **launch,
        )  # fmt: skip
    else:
        gather_weights_kernel[(BH, triton.cdiv(E + P, BLOCK_ENTRIES))](
            sv.s_w, sv.kv, sv.L_w, sv.ld, sv.s_r, sv.qv, sv.L_r, rep, ltot, Gk, Gq, chunk, N,
            C, E, P, W, R, BLOCK_ENTRIES, BLOCK_ENTRIES, block_c, **launch,
        )  # fmt: skip
    per_group = entry_groups(E, BH * nd)
    groups = triton.cdiv(E, per_group)
    p_du = torch.empty(BH, groups, C, D, device=dev)
    bwd_entries_kernel[(BH, nd, groups)](
        dbank, sv.s_w, sv.first, rows[2], sv.U, rows[0], p_du, part["h"], part["mdm"], chunk, N, seg_n, seg_c0,
        S, D, C, E, W, per_group, BLOCK_ENTRIES, block_c, block_d, DOT_PRECISION, **launch,
    )  # fmt: skip
    bwd_tokens_kernel[(BH, nd)](
        sv.b, sv.v, sv.X, sv.QK, sv.U, sv.KM, dy, p_du, dv, part["dX"], part["dQK"], part["db"], chunk, N,
        seg_n, seg_c0, groups, D, C, block_c, block_d, DOT_PRECISION, **launch,
    )  # fmt: skip
    per_group = entry_groups(E + P, BH * nd)
    bwd_rewrite_kernel[(BH, nd, triton.cdiv(E + P, per_group))](
        dbank, sv.s_w, sv.s_r, rows[0], rows[1], dy, dv, rep, ltot, Gk, Gq, part["dcw"], part["dcr"], chunk, N,
        seg_n, seg_c0, S, D, C, E, P, W, R, per_group, BLOCK_ENTRIES, block_c, block_d, DOT_PRECISION, **launch,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Phase 1 backward (no bank), every chunk at once: Triton
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def solve_bwd_kernel(X, dX, A, beta, db_direct, dA, db, C: tl.constexpr, BLOCK_C: tl.constexpr):
    """One program per stream-chunk: with ``X = (I + Bm)^-1``, ``Bm = tril(beta A, -1)``: ``dBm = -X^T dX X^T``
    (strictly lower), ``dA = beta dBm`` and ``dbeta = dbeta_direct + sum_t' dBm[t, t'] A[t, t']``."""
    sc = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK_C)
    mr = r < C
    m2 = mr[:, None] & mr[None, :]
    off = (sc * C + r)[:, None] * C + r[None, :]
    x = tl.load(X + off, mask=m2, other=0.0)
    dx = tl.load(dX + off, mask=m2, other=0.0)
    a = tl.load(A + off, mask=m2, other=0.0)
    b = tl.load(beta + sc * C + r, mask=mr, other=0.0)
    dbm = -mma(mma(tl.trans(x), dx, "ieee"), tl.trans(x), "ieee")
    dbm = tl.where(r[None, :] < r[:, None], dbm, 0.0)
    tl.store(dA + off, b[:, None] * dbm, mask=m2)
    direct = tl.load(db_direct + sc * C + r, mask=mr, other=0.0)
    tl.store(db + sc * C + r, direct + tl.sum(dbm * a, axis=1), mask=mr)


@triton.jit
def gram_bwd_kernel(
    slot_w, k_val, L_w, L_tot, slot_r, q_val, L_r, dA, dQK, h, mdm, dcw, dcr, dkv, dL_w, dtot, dqv, dL_r,
    C: tl.constexpr, E: tl.constexpr, P: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
    BLOCK_ROW: tl.constexpr, BLOCK_COL: tl.constexpr,
):  # fmt: skip
    """One program per (stream-chunk, block of rows), rows the chunk's write entries then its read entries: the
    gradient of each entry's weight and of its log-decay since the chunk start (through A, QK, Z and the gathers),
    and for a write entry the gradient of its slot's chunk total (the same for every entry of the slot)."""
    sc = tl.program_id(0).to(tl.int64)
    row = tl.program_id(1) * BLOCK_ROW + tl.arange(0, BLOCK_ROW)
    is_w = row < E
    is_r = (row >= E) & (row < E + P)
    rw = tl.where(is_w, row, 0)
    rr = tl.where(is_r, row - E, 0)
    s_row = tl.where(is_w, tl.load(slot_w + sc * E + rw, mask=is_w, other=-1), -1)
    s_row = tl.where(is_r, tl.load(slot_r + sc * P + rr, mask=is_r, other=-1), s_row)
    t_row = tl.where(is_w, rw // W, rr // R)
    val = tl.where(is_w, tl.load(k_val + sc * E + rw, mask=is_w, other=0.0), 0.0)
    val = tl.where(is_r, tl.load(q_val + sc * P + rr, mask=is_r, other=0.0), val)
    L_row = tl.where(is_w, tl.load(L_w + sc * E + rw, mask=is_w, other=0.0), 0.0)
    L_row = tl.where(is_r, tl.load(L_r + sc * P + rr, mask=is_r, other=0.0), L_row)
    t_row_c = tl.minimum(t_row, C - 1)
    d_val = tl.zeros([BLOCK_ROW], dtype=tl.float32)  # sum of d(pair weight) * the other entry's weight
    d_L = tl.zeros([BLOCK_ROW], dtype=tl.float32)
    zsum = tl.zeros([BLOCK_ROW], dtype=tl.float32)
    for f0 in range(0, E, BLOCK_COL):
        f = f0 + tl.arange(0, BLOCK_COL)
        mf = f < E
        s_f = tl.load(slot_w + sc * E + f, mask=mf, other=-2)
        match = (s_row[:, None] == s_f[None, :]) & mf[None, :]
        if tl.max(match.to(tl.int32)) > 0:  # else exact zeros for every sum: skipped
            kv_f = tl.load(k_val + sc * E + f, mask=mf, other=0.0)
            L_f = tl.load(L_w + sc * E + f, mask=mf, other=0.0)
            zt_f = kv_f * tl.exp(tl.load(L_tot + sc * E + f, mask=mf, other=0.0) - L_f)
            zt_f = zt_f * tl.load(h + sc * E + f, mask=mf, other=0.0)
            t_f = f // W
            # Masked pairs get a zero exponent before exp, so no overflow can reach the sums.
            earlier = match & is_w[:, None] & (t_f[None, :] < t_row[:, None])  # A[t_row, t_f]
            later = match & is_w[:, None] & (t_f[None, :] > t_row[:, None])  # A[t_f, t_row]
            read = match & is_r[:, None] & (t_f[None, :] <= t_row[:, None])  # QK[t_row, t_f]
            g_e = tl.load(dA + (sc * C + t_row_c)[:, None] * C + t_f[None, :], mask=earlier, other=0.0)
            g_l = tl.load(dA + (sc * C + t_f)[None, :] * C + t_row_c[:, None], mask=later, other=0.0)
            g_r = tl.load(dQK + (sc * C + t_row_c)[:, None] * C + t_f[None, :], mask=read, other=0.0)
            ex = tl.exp(tl.where(earlier | read, L_row[:, None] - L_f[None, :], 0.0))
            ex_l = tl.exp(tl.where(later, L_f[None, :] - L_row[:, None], 0.0))
            plus = tl.sum(tl.where(earlier | read, (g_e + g_r) * ex * kv_f[None, :], 0.0), axis=1)
            minus = tl.sum(tl.where(later, g_l * ex_l * kv_f[None, :], 0.0), axis=1)
            d_val += plus + minus
            d_L += val * (plus - minus)
            zsum += tl.sum(tl.where(match & is_w[:, None], zt_f[None, :], 0.0), axis=1)
    for p0 in range(0, P, BLOCK_COL):
        p = p0 + tl.arange(0, BLOCK_COL)
        mp = p < P
        s_p = tl.load(slot_r + sc * P + p, mask=mp, other=-2)
        t_p = p // R
        seen = (s_row[:, None] == s_p[None, :]) & mp[None, :] & is_w[:, None] & (t_p[None, :] >= t_row[:, None])
        if tl.max(seen.to(tl.int32)) > 0:
            qv_p = tl.load(q_val + sc * P + p, mask=mp, other=0.0)
            L_p = tl.load(L_r + sc * P + p, mask=mp, other=0.0)
            g_q = tl.load(dQK + (sc * C + t_p)[None, :] * C + t_row_c[:, None], mask=seen, other=0.0)
            ex = tl.exp(tl.where(seen, L_p[None, :] - L_row[:, None], 0.0))
            minus = tl.sum(tl.where(seen, g_q * ex * qv_p[None, :], 0.0), axis=1)
            d_val += minus
            d_L -= val * minus
    # The entry's own terms: its gather of the chunk-start bank, and (writes) its share of its slot's new row.
    dc = tl.where(is_w, tl.load(dcw + sc * E + rw, mask=is_w, other=0.0), 0.0)
    dc = tl.where(is_r, tl.load(dcr + sc * P + rr, mask=is_r, other=0.0), dc)
    Lt = tl.load(L_tot + sc * E + rw, mask=is_w, other=0.0)
    zt = tl.where(is_w, tl.exp(Lt - L_row) * tl.load(h + sc * E + rw, mask=is_w, other=0.0), 0.0)
    d_val += zt + dc * tl.exp(L_row)
    d_L += val * (dc * tl.exp(L_row) - zt)
    tl.store(dkv + sc * E + rw, d_val, mask=is_w)
    tl.store(dL_w + sc * E + rw, d_L, mask=is_w)
    tl.store(dtot + sc * E + rw, tl.exp(Lt) * tl.load(mdm + sc * E + rw, mask=is_w, other=0.0) + zsum, mask=is_w)
    tl.store(dqv + sc * P + rr, d_val, mask=is_r)
    tl.store(dL_r + sc * P + rr, d_L, mask=is_r)


@triton.jit
def decay_bwd_kernel(
    slot_w, slot_r, dL_w, dL_r, dtot, dld,
    E: tl.constexpr, P: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
    BLOCK_ROW: tl.constexpr, BLOCK_COL: tl.constexpr, SKIP: tl.constexpr = True,
):  # fmt: skip
    """One program per (stream-chunk, block of write entries f): the gradient of f's log-decay, which the segmented
    scans add to every same-slot entry of its token or later and to its slot's chunk total.

    With SKIP, a block of entries none of which meets a row adds no loads and no sum: the sum it would add is +0
    exactly, and ``acc + 0.0`` (kept) is what that add does to acc (-0 becomes +0, every other value stays), so the
    bits are those of SKIP=False, which sums every block (the tests compare the two)."""
    sc = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1) * BLOCK_ROW + tl.arange(0, BLOCK_ROW)
    mf = f < E
    s_f = tl.load(slot_w + sc * E + f, mask=mf, other=-1)
    t_f = f // W
    acc = tl.load(dtot + sc * E + f, mask=mf, other=0.0)
    for e0 in range(0, E, BLOCK_COL):
        e = e0 + tl.arange(0, BLOCK_COL)
        me = e < E
        s_e = tl.load(slot_w + sc * E + e, mask=me, other=-2)
        hit = (s_f[:, None] == s_e[None, :]) & me[None, :] & ((e // W)[None, :] >= t_f[:, None])
        if tl.max(hit.to(tl.int32)) + (0 if SKIP else 1) > 0:
            d_e = tl.load(dL_w + sc * E + e, mask=me, other=0.0)
            acc += tl.sum(tl.where(hit, d_e[None, :], 0.0), axis=1)
        else:
            acc += 0.0
    for p0 in range(0, P, BLOCK_COL):
        p = p0 + tl.arange(0, BLOCK_COL)
        mp = p < P
        s_p = tl.load(slot_r + sc * P + p, mask=mp, other=-2)
        hit = (s_f[:, None] == s_p[None, :]) & mp[None, :] & ((p // R)[None, :] >= t_f[:, None])
        if tl.max(hit.to(tl.int32)) + (0 if SKIP else 1) > 0:
            d_p = tl.load(dL_r + sc * P + p, mask=mp, other=0.0)
            acc += tl.sum(tl.where(hit, d_p[None, :], 0.0), axis=1)
        else:
            acc += 0.0
    tl.store(dld + sc * E + f, acc, mask=mf)
