"""Backward of the chunked Triton SDM (:mod:`.triton_chunk`), deterministic: a reverse walk over chunks.

Layout as in :mod:`.triton_chunk`: a stream is one (b, h); chunk tensors are ``[BH, N, ...]`` with write entries
``e = t W + n`` and read entries ``p = t R + m``. The forward keeps, per chunk, its Phase 1 tensors (``L_w, L_tot,
L_r, first, A, QK, X, Z``), ``U [C, D]`` and the chunk-start bank rows it gathered (``rows_w [E, D]``,
``rows_r [P, D]``), so no bank is recomputed.

Per chunk, with ``G = dL/dY`` of the chunk and ``dM`` the bank gradient after it (the forward's equations are in
:mod:`.torch_chunk`):

- ``step_bwd_kernel`` (Triton, one launch per chunk, last chunk first; one program per stream and column slice):
  ``dU = QK^T G + Z_first^T dM[s_e]``, ``dw = X^T dU`` (``dv = beta dw``, ``dKdecM0 = -beta dw``), then every touched
  row of ``dM`` becomes the gradient before the chunk, ``exp(L_tot) dM[s] + Gk[j] dKdecM0 + Gq[j] G`` (``Gk, Gq`` the
  gather weights of the slot's entries per token, written by its representative entry ``j``: one writer per row);
  it also writes the column slice's share of the scalar gradients: ``dQK = G U^T``, ``dX = dU w^T``, per write entry
  ``<dM[s_e], U[t_e]>``, ``<M0[s_e], dM[s_e]>``, ``<dKdecM0[t_e], M0[s_e]>``, per read entry ``<G[t_p], M0[s_p]>``,
  per token ``<dw, v - KdecM0>``; the shares of the column slices are then added in slice order.
- Phase 1 backward (the Gram matrices, the solve and the segmented decay scans to ``k_val, q_val, g, beta``): in
  PyTorch, chunk by chunk, with dense pair masks and plain sums (no scatter-add), so it is deterministic too.

Every row of the bank gradient has one writer per launch; no atomics; every sum has a fixed order.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from ..common.mma import mma

__all__ = ["BLOCK_D", "BLOCK_ENTRIES", "Saved", "sdm_chunk_backward"]

BLOCK_ENTRIES = 32  # entries per block in the loops over a chunk's entries
BLOCK_D = 32  # bank columns per program of the reverse walk


@dataclasses.dataclass
class Saved:
    """What the forward keeps for the backward, each ``[BH, N, ...]`` (E = C W write and P = C R read entries).

    Memory beyond the inputs: ``rows_w, rows_r`` (float32, ``T_pad * BH * (W + R) * D * 4`` bytes), ``U``
    (``T_pad * BH * D * 4``), ``Z`` (``T_pad * BH * W * C * 4``), ``A, QK, X`` (``3 * T_pad * BH * C * 4``) and the
    per-entry ``L_w, L_tot, L_r, first`` (``T_pad * BH * (3 W + R) * 4``).
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
    Z: torch.Tensor  # [BH, N, E, C]
    U: torch.Tensor  # [BH, N, C, D]
    rows_w: torch.Tensor  # [BH, N, E, D] bank rows at the chunk start, gathered at the write slots
    rows_r: torch.Tensor  # [BH, N, P, D] the same at the read slots


def sdm_chunk_backward(
    saved: Saved, dy: torch.Tensor, dbank: torch.Tensor, C: int, W: int, R: int, launch: dict
) -> dict[str, torch.Tensor]:
    """Gradients of the chunked SDM forward.

    Args:
        saved: what the forward kept.
        dy: ``[BH, N, C, D]`` float32 gradient of y (zero on padding tokens).
        dbank: ``[BH, S, D]`` float32 gradient of the final bank (a fresh tensor: it is updated in place).
        C, W, R: chunk size and entries per token.
        launch: the pinned launch configuration.

    Returns:
        ``{"k_val": [BH, N, E], "q_val": [BH, N, P], "ld": [BH, N, E], "v": [BH, N, C, D], "beta": [BH, N, C],
        "bank": [BH, S, D]}``, all float32 (``ld``: the gradient of each write entry's log-decay).
    """
    N = saved.s_w.shape[1]
    full = {f.name: getattr(saved, f.name) for f in dataclasses.fields(saved)}
    out = {
        "k_val": torch.empty_like(saved.kv),
        "q_val": torch.empty_like(saved.qv),
        "ld": torch.empty_like(saved.kv),
        "v": torch.empty_like(saved.v),
        "beta": torch.empty_like(saved.b),
    }
    for i in reversed(range(N)):
        part = _step_backward(full, dy, dbank, C, W, R, launch, out["v"], i)
        ch = {f.name: getattr(saved, f.name)[:, i] for f in dataclasses.fields(saved)}
        grads = _phase1_backward(ch, part, C, W, R)
        for name in ("k_val", "q_val", "ld", "beta"):
            out[name][:, i] = grads[name]
    out["bank"] = dbank
    return out


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
        ld_f = tl.load(ld + sc * E + f, mask=mf, other=0.0)
        wt = tl.load(k_val + sc * E + f, mask=mf, other=0.0) * tl.exp(tl.load(L_w + sc * E + f, mask=mf, other=0.0))
        match = (s_row[:, None] == s_f[None, :]) & mf[None, :]
        tot += tl.sum(tl.where(match, ld_f[None, :], 0.0), axis=1)
        earlier += tl.sum((match & (f[None, :] < row[:, None])).to(tl.int32), axis=1)
        to_token = ((f // W)[:, None] == c[None, :]) & mf[:, None]
        gk += tl.sum(tl.where(match, wt[None, :], 0.0)[:, :, None] * to_token.to(tl.float32)[None, :, :], axis=1)
    for f0 in range(0, P, BLOCK_COL):
        f = f0 + tl.arange(0, BLOCK_COL)
        mf = f < P
        s_f = tl.load(slot_r + sc * P + f, mask=mf, other=-2)
        wt = tl.load(q_val + sc * P + f, mask=mf, other=0.0) * tl.exp(tl.load(L_r + sc * P + f, mask=mf, other=0.0))
        match = (s_row[:, None] == s_f[None, :]) & mf[None, :]
        earlier += tl.sum((match & (E + f[None, :] < row[:, None])).to(tl.int32), axis=1)
        to_token = ((f // R)[:, None] == c[None, :]) & mf[:, None]
        gq += tl.sum(tl.where(match, wt[None, :], 0.0)[:, :, None] * to_token.to(tl.float32)[None, :, :], axis=1)
    mrow = is_w | is_r
    out = st * (E + P) + row
    tl.store(rep + out, (earlier == 0).to(tl.int32), mask=mrow)
    tl.store(ltot + out, tot, mask=mrow)
    m2 = mrow[:, None] & (c[None, :] < C)
    tl.store(Gk + out[:, None] * C + c[None, :], gk, mask=m2)
    tl.store(Gq + out[:, None] * C + c[None, :], gq, mask=m2)


@triton.jit
def step_bwd_kernel(
    dbank, slot_w, k_val, L_w, first, slot_r, v, beta, X, QK, Z, U, rows_w, rows_r, dy,
    rep, ltot, Gk, Gq, dv, p_dX, p_dQK, p_h, p_mdm, p_dcw, p_dcr, p_db, chunk, N,
    S: tl.constexpr, D: tl.constexpr, C: tl.constexpr, E: tl.constexpr, P: tl.constexpr,
    W: tl.constexpr, R: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One chunk of the reverse walk for one (stream, column slice): the slice's share of the chunk's scalar
    gradients, dv, then every touched row of the bank gradient rewritten by its slot's representative entry."""
    st = tl.program_id(0).to(tl.int64)
    pd = tl.program_id(1)
    nd = tl.num_programs(1)
    col = pd * BLOCK_D + tl.arange(0, BLOCK_D)
    mcol = col < D
    sc = st * N + chunk
    base = dbank + st * S * D
    c = tl.arange(0, BLOCK_C)
    mc = c < C
    m2 = mc[:, None] & mcol[None, :]
    mcc = mc[:, None] & mc[None, :]
    g = tl.load(dy + (sc * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
    u = tl.load(U + (sc * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
    qk = tl.load(QK + (sc * C + c)[:, None] * C + c[None, :], mask=mcc, other=0.0)
    x = tl.load(X + (sc * C + c)[:, None] * C + c[None, :], mask=mcc, other=0.0)
    part = (st * nd + pd).to(tl.int64)  # this program's share in the partial buffers
    # dU = QK^T G + Z^T dM[s] over the slots' first write entries; per write entry <dM[s_e], U[t_e]>, <M0, dM>.
    du = mma(tl.trans(qk), g, "ieee")
    k_m0 = tl.zeros([BLOCK_C, BLOCK_D], dtype=tl.float32)
    for e0 in range(0, E, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        me = e < E
        me2 = me[:, None] & mcol[None, :]
        s_e = tl.load(slot_w + sc * E + e, mask=me, other=0).to(tl.int64)
        writer = (tl.load(first + sc * E + e, mask=me, other=0) != 0) & me
        dm = tl.load(base + s_e[:, None] * D + col[None, :], mask=me2, other=0.0)
        m0 = tl.load(rows_w + (sc * E + e)[:, None] * D + col[None, :], mask=me2, other=0.0)
        z = tl.load(Z + (sc * E + e)[:, None] * C + c[None, :], mask=me[:, None] & mc[None, :], other=0.0)
        du += mma(tl.trans(z), tl.where(writer[:, None], dm, 0.0), "ieee")
        onehot = (((e // W)[:, None] == c[None, :]) & me[:, None]).to(tl.float32)  # [BLOCK_E, BLOCK_C]
        tl.store(p_h + part * E + e, tl.sum(dm * mma(onehot, u, "ieee"), axis=1), mask=me)
        tl.store(p_mdm + part * E + e, tl.sum(m0 * dm, axis=1), mask=me)
        wt = tl.load(k_val + sc * E + e, mask=me, other=0.0) * tl.exp(tl.load(L_w + sc * E + e, mask=me, other=0.0))
        k_m0 += mma(tl.trans(onehot * wt[:, None]), m0, "ieee")
    dw = mma(tl.trans(x), du, "ieee")
    b_c = tl.load(beta + sc * C + c, mask=mc, other=0.0)
    v_c = tl.load(v + (sc * C + c)[:, None] * D + col[None, :], mask=m2, other=0.0)
    resid = v_c - k_m0
    tl.store(dv + (sc * C + c)[:, None] * D + col[None, :], b_c[:, None] * dw, mask=m2)
    tl.store(p_db + part * C + c, tl.sum(dw * resid, axis=1), mask=mc)
    tl.store(p_dX + (part * C + c)[:, None] * C + c[None, :], mma(du, tl.trans(b_c[:, None] * resid), "ieee"), mask=mcc)
    tl.store(p_dQK + (part * C + c)[:, None] * C + c[None, :], mma(g, tl.trans(u), "ieee"), mask=mcc)
    dk = -b_c[:, None] * dw  # the gradient of Kdec M0
    for e0 in range(0, E, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        me = e < E
        m0 = tl.load(rows_w + (sc * E + e)[:, None] * D + col[None, :], mask=me[:, None] & mcol[None, :], other=0.0)
        onehot = (((e // W)[:, None] == c[None, :]) & me[:, None]).to(tl.float32)
        tl.store(p_dcw + part * E + e, tl.sum(m0 * mma(onehot, dk, "ieee"), axis=1), mask=me)
    for p0 in range(0, P, BLOCK_E):
        p = p0 + tl.arange(0, BLOCK_E)
        mp = p < P
        m0 = tl.load(rows_r + (sc * P + p)[:, None] * D + col[None, :], mask=mp[:, None] & mcol[None, :], other=0.0)
        onehot = (((p // R)[:, None] == c[None, :]) & mp[:, None]).to(tl.float32)
        tl.store(p_dcr + part * P + p, tl.sum(m0 * mma(onehot, g, "ieee"), axis=1), mask=mp)
    # Every read of the bank gradient above must be done before any row is rewritten.
    tl.debug_barrier()
    for j0 in range(0, E + P, BLOCK_E):
        j = j0 + tl.arange(0, BLOCK_E)
        is_w = j < E
        is_r = (j >= E) & (j < E + P)
        s_j = tl.load(slot_w + sc * E + tl.where(is_w, j, 0), mask=is_w, other=0)
        s_j = tl.where(is_r, tl.load(slot_r + sc * P + tl.where(is_r, j - E, 0), mask=is_r, other=0), s_j)
        out = st * (E + P) + j
        writer = (tl.load(rep + out, mask=is_w | is_r, other=0) != 0) & (is_w | is_r)
        ptr = base + s_j.to(tl.int64)[:, None] * D + col[None, :]
        dm = tl.load(ptr, mask=writer[:, None] & mcol[None, :], other=0.0)
        mj = (is_w | is_r)[:, None] & mc[None, :]
        gk = tl.load(Gk + out[:, None] * C + c[None, :], mask=mj, other=0.0)
        gq = tl.load(Gq + out[:, None] * C + c[None, :], mask=mj, other=0.0)
        decay = tl.exp(tl.load(ltot + out, mask=is_w | is_r, other=0.0))
        new = decay[:, None] * dm + mma(gk, dk, "ieee") + mma(gq, g, "ieee")
        tl.store(ptr, new, mask=writer[:, None] & mcol[None, :])


def _step_backward(
    ch: dict[str, torch.Tensor], dy: torch.Tensor, dbank: torch.Tensor, C: int, W: int, R: int, launch: dict,
    dv: torch.Tensor, chunk: int,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Chunk `chunk` of the reverse walk: rewrites `dbank` to the gradient of the chunk-start bank, writes the
    chunk's dv into `dv`, and returns the chunk's scalar partial gradients (each summed over D in slice order)."""
    BH, N, E = ch["s_w"].shape
    P = ch["s_r"].shape[-1]
    S, D = dbank.shape[1:]
    dev = dbank.device
    block_c = max(16, triton.next_power_of_2(C))
    nd = triton.cdiv(D, BLOCK_D)
    rep = torch.empty(BH, E + P, device=dev, dtype=torch.int32)
    ltot = torch.empty(BH, E + P, device=dev)
    Gk, Gq = (torch.empty(BH, E + P, C, device=dev) for _ in range(2))
    gather_weights_kernel[(BH, triton.cdiv(E + P, BLOCK_ENTRIES))](
        ch["s_w"], ch["kv"], ch["L_w"], ch["ld"], ch["s_r"], ch["qv"], ch["L_r"], rep, ltot, Gk, Gq, chunk, N,
        C, E, P, W, R, BLOCK_ENTRIES, BLOCK_ENTRIES, block_c, **launch,
    )  # fmt: skip
    part = {
        "dX": torch.empty(BH, nd, C, C, device=dev),
        "dQK": torch.empty(BH, nd, C, C, device=dev),
        "h": torch.empty(BH, nd, E, device=dev),
        "mdm": torch.empty(BH, nd, E, device=dev),
        "dcw": torch.empty(BH, nd, E, device=dev),
        "dcr": torch.empty(BH, nd, P, device=dev),
        "db": torch.empty(BH, nd, C, device=dev),
    }
    step_bwd_kernel[(BH, nd)](
        dbank, ch["s_w"], ch["kv"], ch["L_w"], ch["first"], ch["s_r"], ch["v"], ch["b"], ch["X"], ch["QK"], ch["Z"],
        ch["U"], ch["rows_w"], ch["rows_r"], dy, rep, ltot, Gk, Gq, dv,
        part["dX"], part["dQK"], part["h"], part["mdm"], part["dcw"], part["dcr"], part["db"], chunk, N,
        S, D, C, E, P, W, R, BLOCK_ENTRIES, block_c, max(16, triton.next_power_of_2(BLOCK_D)), **launch,
    )  # fmt: skip
    # The column slices' shares, added in slice order (a fixed reduction over a fixed-size dim).
    return {name: x.sum(1) for name, x in part.items()}


# ----------------------------------------------------------------------------------------------------------------
# Phase 1 backward (no bank): PyTorch
# ----------------------------------------------------------------------------------------------------------------


def _phase1_backward(
    ch: dict[str, torch.Tensor], part: dict[str, torch.Tensor], C: int, W: int, R: int
) -> dict[str, torch.Tensor]:
    """From one chunk's partial gradients to those of ``k_val, q_val, beta`` and each write entry's log-decay."""
    E, P = ch["s_w"].shape[-1], ch["s_r"].shape[-1]
    dev = ch["kv"].device
    s_w, s_r, kv, qv, L_w, L_r, L_tot = (ch[n] for n in ("s_w", "s_r", "kv", "qv", "L_w", "L_r", "L_tot"))
    b, A, X = ch["b"], ch["A"], ch["X"]
    tok_w = torch.arange(E, device=dev) // W
    tok_r = torch.arange(P, device=dev) // R
    # The solve: X = (I + Bm)^-1 with Bm = tril(beta A, -1), so dBm = -X^T dX X^T on the strictly lower part.
    lower = torch.ones(C, C, dtype=torch.bool, device=dev).tril(-1)
    dBm = -(X.transpose(-1, -2) @ part["dX"] @ X.transpose(-1, -2)) * lower
    dA = b[..., None] * dBm
    db = part["db"] + (dBm * A).sum(-1)
    # A[t, t'] = sum over same-slot write pairs (e in t, f in t', t' < t) of kv_e kv_f exp(L_e - L_f).
    same_ww = s_w[..., :, None] == s_w[..., None, :]
    m_a = same_ww & (tok_w[:, None] > tok_w[None, :])
    e_a = torch.where(m_a, L_w[..., :, None] - L_w[..., None, :], 0.0).exp() * m_a
    da = dA[:, tok_w][:, :, tok_w] * e_a  # [BH, E(e), E(f)]
    g_a = da * kv[..., :, None] * kv[..., None, :]
    dkv = (da * kv[..., None, :]).sum(-1) + (da * kv[..., :, None]).sum(-2)
    dL_w = g_a.sum(-1) - g_a.sum(-2)
    # QK[t, t'] = sum over same-slot (read p in t, write f in t', t' <= t) of qv_p kv_f exp(L_p - L_f).
    m_q = (s_r[..., :, None] == s_w[..., None, :]) & (tok_r[:, None] >= tok_w[None, :])
    e_q = torch.where(m_q, L_r[..., :, None] - L_w[..., None, :], 0.0).exp() * m_q
    dq = part["dQK"][:, tok_r][:, :, tok_w] * e_q  # [BH, P, E]
    g_q = dq * qv[..., :, None] * kv[..., None, :]
    dqv = (dq * kv[..., None, :]).sum(-1)
    dL_r = g_q.sum(-1)
    dkv = dkv + (dq * qv[..., :, None]).sum(-2)
    dL_w = dL_w - g_q.sum(-2)
    # Z: write f adds kv_f exp(L_tot - L_f) U[t_f] to its slot's new row.
    ez = (L_tot - L_w).exp()
    dkv = dkv + ez * part["h"]
    zterm = kv * ez * part["h"]
    dL_w = dL_w - zterm
    d_tot = L_tot.exp() * part["mdm"] + (same_ww * zterm[..., None, :]).sum(-1)  # the same for a slot's entries
    # The gathers Kdec M0 and Qdec M0.
    dkv = dkv + part["dcw"] * L_w.exp()
    dL_w = dL_w + part["dcw"] * kv * L_w.exp()
    dqv = dqv + part["dcr"] * L_r.exp()
    dL_r = dL_r + part["dcr"] * qv * L_r.exp()
    # The segmented scans: L_e sums ld_f over same-slot writes f with t_f <= t_e; L_tot over all of them.
    later_w = same_ww & (tok_w[:, None] >= tok_w[None, :])  # [e, f]
    later_r = (s_r[..., :, None] == s_w[..., None, :]) & (tok_r[:, None] >= tok_w[None, :])  # [p, f]
    dld = (later_w * dL_w[..., :, None]).sum(-2) + (later_r * dL_r[..., :, None]).sum(-2) + d_tot
    return {"k_val": dkv, "q_val": dqv, "ld": dld, "beta": db}
