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

__all__ = ["Saved", "sdm_chunk_backward"]


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
    BH, N, E = saved.s_w.shape
    P = saved.s_r.shape[-1]
    D = dy.shape[-1]
    out = {
        "k_val": torch.empty_like(saved.kv),
        "q_val": torch.empty_like(saved.qv),
        "ld": torch.empty_like(saved.kv),
        "v": torch.empty_like(saved.v),
        "beta": torch.empty_like(saved.b),
    }
    for i in reversed(range(N)):
        ch = {f.name: getattr(saved, f.name)[:, i] for f in dataclasses.fields(saved)}
        part = _step_backward(ch, dy[:, i], dbank, C, W, R, launch)
        grads = _phase1_backward(ch, part, C, W, R)
        out["v"][:, i] = ch["b"][..., None] * part["dw"]
        for name in ("k_val", "q_val", "ld", "beta"):
            out[name][:, i] = grads[name]
    out["bank"] = dbank
    return out


# ----------------------------------------------------------------------------------------------------------------
# The reverse walk (bank-sized work): Triton
# ----------------------------------------------------------------------------------------------------------------


def _step_backward(
    ch: dict[str, torch.Tensor], dy: torch.Tensor, dbank: torch.Tensor, C: int, W: int, R: int, launch: dict
) -> dict[str, torch.Tensor]:
    """One chunk of the reverse walk: updates `dbank` to the gradient of the chunk-start bank and returns the
    chunk's scalar partial gradients (summed over D) and ``dw``."""
    BH, E = ch["s_w"].shape
    P = ch["s_r"].shape[-1]
    S, D = dbank.shape[1:]
    rows_w, rows_r, U = ch["rows_w"], ch["rows_r"], ch["U"]
    tok_w = torch.arange(E, device=dy.device) // W
    tok_r = torch.arange(P, device=dy.device) // R
    dM1_w = dbank.gather(1, ch["s_w"][..., None].expand(BH, E, D))
    zf = ch["Z"] * ch["first"][..., None]
    dU = ch["QK"].transpose(-1, -2) @ dy + zf.transpose(-1, -2) @ dM1_w
    dw = ch["X"].transpose(-1, -2) @ dU
    k_m0 = ((ch["kv"] * ch["L_w"].exp())[..., None] * rows_w).view(BH, C, W, D).sum(2)
    dk_m0 = -ch["b"][..., None] * dw
    w = ch["b"][..., None] * (ch["v"] - k_m0)
    part = {
        "dw": dw,
        "db": (dw * (ch["v"] - k_m0)).sum(-1),
        "dX": dU @ w.transpose(-1, -2),
        "dQK": dy @ U.transpose(-1, -2),
        "h": (dM1_w * U[:, tok_w]).sum(-1),
        "mdm": (rows_w * dM1_w).sum(-1),
        "dcw": (dk_m0[:, tok_w] * rows_w).sum(-1),
        "dcr": (dy[:, tok_r] * rows_r).sum(-1),
    }
    # The gradient before the chunk: each touched row gets exactly one value, from its representative entry.
    slots = torch.cat([ch["s_w"], ch["s_r"]], dim=-1)  # [BH, E + P]
    same = slots[..., :, None] == slots[..., None, :]
    rep = same.int().argmax(-1) == torch.arange(E + P, device=dy.device)
    same_w = same[..., :E]  # [BH, E + P, E]
    same_r = same[..., E:]
    ltot = (same_w * ch["ld"][:, None, :]).sum(-1)  # the slot's total log-decay over the chunk (0 if unwritten)
    gk = (same_w * (ch["kv"] * ch["L_w"].exp())[:, None, :]) @ (tok_w[:, None] == torch.arange(C)).float()
    gq = (same_r * (ch["qv"] * ch["L_r"].exp())[:, None, :]) @ (tok_r[:, None] == torch.arange(C)).float()
    dM1 = dbank.gather(1, slots[..., None].expand(BH, E + P, D))
    new = ltot.exp()[..., None] * dM1 + gk @ dk_m0 + gq @ dy
    for b in range(BH):
        dbank[b, slots[b][rep[b]]] = new[b][rep[b]]
    return part


# ----------------------------------------------------------------------------------------------------------------
# Phase 1 backward (no bank): PyTorch
# ----------------------------------------------------------------------------------------------------------------


def _phase1_backward(
    ch: dict[str, torch.Tensor], part: dict[str, torch.Tensor], C: int, W: int, R: int
) -> dict[str, torch.Tensor]:
    """From one chunk's partial gradients to those of ``k_val, q_val, beta`` and each write entry's log-decay."""
    BH, E = ch["s_w"].shape
    P = ch["s_r"].shape[-1]
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
