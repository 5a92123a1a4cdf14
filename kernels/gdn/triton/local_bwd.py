"""Chunk-local backward of chunked Gated DeltaNet: one Triton program per (chunk, batch*head).

Given, per chunk, the state S at its start (h), the gradient dH w.r.t. the state at its end (dh), the
new values v_new and their full gradient dv_new (state.py), and L = (I + A)^{-1} (wy.py), this kernel
produces dq, dk, dv, dg and dbeta. With T = L diag(beta), K^ = gamma * k, U = T v, W = T K^:

    dq      = scale * gamma * (do S^T) + (scale * Pm * E_incl) k,                Pm = do v_new^T
    dT      = dv_new v^T - (dv_new S^T) K^^T,  dv = T^T dv_new,  dK^ = -T^T (dv_new S^T)
    dA      = -L^T (dT diag beta) L^T  (strictly lower),  A = beta_i exp(G_i - G_j) k_i . k_j
    dk      = from M (o's intra-chunk term), from K^, from A (dA-weighted k k^T), from the state update
    dg      = reverse in-chunk cumulative sum of dG, the gradient w.r.t. the cumulative log-decay G

Every transposed product is formed from loaded operands (e.g. ``v_new do^T`` for ``Pm^T``), never as
``tl.trans`` of a dot result, which Triton 3.4-3.7.0 miscompiled on Hopper (ANCHORS.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton.mma import mma
from .wy import CHUNK, TUNED_K, dot_precision, padded

__all__ = ["LAUNCH", "local_bwd"]

# Fixed launch settings (no autotuning): warps for K >= 128, V block of the in-kernel loop, stages, split.
# Measured at 8x4096x6 on the H200 (benchmarks/NOTES.md, v2; results equal within 3e-7): 64/8/2 1.48 ms,
# 64/8/1 (the first choice) 1.81, 64/4/1 1.81, 32/4/1 1.85, 64/4/2 2.18, 128/8/1 2.20; 32/8/1 faulted.
# `split`: two launches (PART 1 and 2 of the kernel), each with about half of the accumulators (one launch:
# 255 registers, ~300 spilled; PART 1: 199, none), at the cost of dk's and dg's query-side terms written
# and re-read in fp32 (200 MB at 8x4096x6): 1.29 -> 1.15 ms at 8x4096x6 and 3.34 -> 3.10 ms at 1x32768x16
# (64/8/2). Stages and split apply at K = 128 (wy.TUNED_K) only, where they were measured; elsewhere one
# stage, one launch: the configs the GPU gate passed at K = 64 and 256.
LAUNCH = {"warps": 8, "block_v": 64, "stages": 2, "split": True}


@triton.jit
def local_bwd_kernel(
    q, k, v, g, beta, L, h, dh, vnew, dvnew, do,
    dq, dk, dv, dg, dbeta, dkp, dgp,
    scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    PREC: tl.constexpr, PART: tl.constexpr,
):  # fmt: skip
    """One chunk's input gradients: all of them (PART 0), or in two launches that each hold half of the
    accumulators: PART 1 the query side (dq, and o's terms of dk and dg, left in fp32 in dkp / dgp),
    PART 2 the rest (W, U, the state update, dv, dbeta), which adds dkp / dgp and stores dk and dg."""
    i_n = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    rc = tl.arange(0, C)
    rk = tl.arange(0, BK)
    t = i_n * C + rc
    mt = t < T
    mk = rk < K
    mtk = mt[:, None] & mk[None, :]
    row = (i_b * T + t).to(tl.int64) * H + i_h
    dt = q.dtype.element_ty

    qc = tl.load(q + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
    kc = tl.load(k + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
    gc = tl.load(g + row, mask=mt, other=0.0).to(tl.float32)
    bc = tl.load(beta + row, mask=mt, other=0.0).to(tl.float32)
    G = tl.cumsum(gc, axis=0)
    G_last = tl.sum(gc, axis=0)
    gam = tl.exp(G)
    khat = (kc * gam[:, None]).to(dt)
    h_off = ((i_b * NT + i_n).to(tl.int64) * H + i_h) * K * V

    dq_acc = tl.zeros([C, BK], dtype=tl.float32)  # do S^T
    dkt_acc = tl.zeros([C, BK], dtype=tl.float32)  # v_new dH^T
    dw_acc = tl.zeros([C, BK], dtype=tl.float32)  # dv_new S^T  (= -dW)
    Pm = tl.zeros([C, C], dtype=tl.float32)  # do v_new^T
    PmT = tl.zeros([C, C], dtype=tl.float32)  # v_new do^T
    dT = tl.zeros([C, C], dtype=tl.float32)  # dv_new v^T (the K^ part is added below)
    dTT = tl.zeros([C, C], dtype=tl.float32)  # (v - K^ S) dv_new^T
    gC = tl.zeros([BK], dtype=tl.float32)  # per-row sums of S * dH
    for i_v in range(tl.cdiv(V, BV)):
        rv = i_v * BV + tl.arange(0, BV)
        mv = rv < V
        mkv = mk[:, None] & mv[None, :]
        mtv = mt[:, None] & mv[None, :]
        Sb = tl.load(h + h_off + rk[:, None] * V + rv[None, :], mask=mkv, other=0.0)
        ub = tl.load(vnew + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
        if PART != 2:  # the query side
            dob = tl.load(do + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
            dq_acc += mma(dob, tl.trans(Sb), PREC)
            Pm += mma(dob, tl.trans(ub), PREC)
            PmT += mma(ub, tl.trans(dob), PREC)
        if PART != 1:  # W, U, the state update
            dHb = tl.load(dh + h_off + rk[:, None] * V + rv[None, :], mask=mkv, other=0.0)
            dub = tl.load(dvnew + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
            vb = tl.load(v + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
            dkt_acc += mma(ub, tl.trans(dHb), PREC)
            dw_acc += mma(dub, tl.trans(Sb), PREC)
            dT += mma(dub, tl.trans(vb), PREC)
            Z = vb.to(tl.float32) - mma(khat, Sb, PREC)
            dTT += mma(Z.to(dt), tl.trans(dub), PREC)
            gC += tl.sum(Sb.to(tl.float32) * dHb.to(tl.float32), axis=1)

    rI = rc[:, None]
    rJ = rc[None, :]
    Gd = G[:, None] - G[None, :]
    dk_acc = tl.zeros([C, BK], dtype=tl.float32)
    dGv = tl.zeros([C], dtype=tl.float32)
    if PART != 2:  # the query side
        # o's terms: inter-chunk scale * gamma * (q S), intra-chunk scale * M v_new
        incl = rI >= rJ
        inclT = rI <= rJ
        Pmask = tl.where(incl, Pm * tl.exp(tl.where(incl, Gd, 0.0)), 0.0) * scale
        PmaskT = tl.where(inclT, PmT * tl.exp(tl.where(inclT, -Gd, 0.0)), 0.0) * scale
        dq_inter = dq_acc * (gam * scale)[:, None]
        dq_c = dq_inter + mma(Pmask.to(dt), kc, PREC)
        tl.store(dq + row[:, None] * K + rk[None, :], dq_c.to(dq.dtype.element_ty), mask=mtk)
        qk = mma(qc, tl.trans(kc), PREC)
        X = Pmask * qk
        dGv += tl.sum(X, axis=1) - tl.sum(X, axis=0)
        dGv += tl.sum(dq_inter * qc.to(tl.float32), axis=1)
        dk_acc += mma(PmaskT.to(dt), qc, PREC)
        if PART == 1:
            tl.store(dkp + row[:, None] * K + rk[None, :], dk_acc, mask=mtk)
            tl.store(dgp + row, dGv, mask=mt)
    if PART != 1:  # W, U, the state update
        if PART == 2:
            dk_acc += tl.load(dkp + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
            dGv += tl.load(dgp + row, mask=mt, other=0.0)
        dT -= mma(dw_acc.to(dt), tl.trans(khat), PREC)
        lower = rI > rJ
        upper = rI < rJ
        Lm = tl.load(L + row[:, None] * C + rJ, mask=mt[:, None] & (rJ <= rI), other=0.0)
        LT = tl.trans(Lm)
        # T = L diag(beta): dL = dT diag(beta), dbeta_j = sum_i dT_ij L_ij
        db = tl.sum(dT * Lm, axis=0)
        dA = -mma(mma(LT, dT * bc[None, :], PREC), LT, PREC)
        dAT = -mma(mma(Lm, dTT * bc[:, None], PREC), Lm, PREC)
        dA = tl.where(lower, dA, 0.0)
        dAT = tl.where(upper, dAT, 0.0)
        E_low = tl.where(lower, tl.exp(tl.where(lower, Gd, 0.0)), 0.0)  # exp(G_i - G_j), i > j
        E_up = tl.where(upper, tl.exp(tl.where(upper, -Gd, 0.0)), 0.0)  # exp(G_j - G_i), i < j
        kk = mma(kc, tl.trans(kc), PREC)
        Ek = E_low * kk
        db += tl.sum(dA * Ek, axis=1)
        dAA = dA * Ek * bc[:, None]
        dGv += tl.sum(dAA, axis=1) - tl.sum(dAA, axis=0)
        dkk = (dA * E_low * bc[:, None]).to(dt)
        dkkT = (dAT * E_up * bc[None, :]).to(dt)
        dk_acc += mma(dkk, kc, PREC) + mma(dkkT, kc, PREC)

        # W = T K^: dK^ = T^T dW = -T^T dw_acc
        TT = LT * bc[:, None]
        dk_w = -mma(TT, dw_acc, PREC) * gam[:, None]
        dGv += tl.sum(dk_w * kc.to(tl.float32), axis=1)
        dk_acc += dk_w

        # state update: S' = exp(G_C) S + (k exp(G_C - G))^T v_new
        dk_s = dkt_acc * tl.exp(G_last - G)[:, None]
        s = tl.sum(dk_s * kc.to(tl.float32), axis=1)
        dk_acc += dk_s
        dGv -= s
        last = tl.sum(s, axis=0) + tl.exp(G_last) * tl.sum(gC, axis=0)
        dGv = tl.where(rc == C - 1, dGv + last, dGv)
        # g_t enters every G_i with i >= t: reverse cumulative sum
        dgc = tl.sum(dGv, axis=0) - tl.cumsum(dGv, axis=0) + dGv

        tl.store(dk + row[:, None] * K + rk[None, :], dk_acc.to(dk.dtype.element_ty), mask=mtk)
        tl.store(dg + row, dgc, mask=mt)
        tl.store(dbeta + row, db, mask=mt)

        TTd = TT.to(dt)
        for i_v in range(tl.cdiv(V, BV)):
            rv = i_v * BV + tl.arange(0, BV)
            mtv = mt[:, None] & (rv < V)[None, :]
            dub = tl.load(dvnew + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
            dvb = mma(TTd, dub, PREC)
            tl.store(dv + row[:, None] * V + rv[None, :], dvb.to(dv.dtype.element_ty), mask=mtv)


def local_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    L: torch.Tensor,
    h: torch.Tensor,
    dh: torch.Tensor,
    vnew: torch.Tensor,
    dvnew: torch.Tensor,
    do: torch.Tensor,
    scale: float,
    config: tuple[int, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the chunk-local backward. Returns ``(dq, dk, dv, dg, dbeta)``; dg and dbeta are fp32 [B, T, H].

    `config` ``(V block, warps, stages[, split])`` replaces LAUNCH's (for tuning scripts; None in the library)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    dg = g.new_empty(B, T, H, dtype=torch.float32)
    dbeta = g.new_empty(B, T, H, dtype=torch.float32)
    BK = padded(K)
    tuned = BK == TUNED_K
    stages = LAUNCH["stages"] if tuned else 1
    BV, warps, stages = (
        config[:3] if config else (min(LAUNCH["block_v"], padded(V)), LAUNCH["warps"] if BK >= 128 else 4, stages)
    )
    split = config[3] if config and len(config) > 3 else LAUNCH["split"] and tuned
    dkp = torch.empty_like(dq, dtype=torch.float32) if split else None
    dgp = torch.empty_like(dg) if split else None
    for part in (1, 2) if split else (0,):
        local_bwd_kernel[(NT, B * H)](
            q, k, v, g, beta, L, h, dh, vnew, dvnew, do, dq, dk, dv, dg, dbeta, dkp, dgp, scale, T, NT,
            H=H, K=K, V=V, BK=BK, BV=BV, C=CHUNK, PREC=dot_precision(q.dtype), PART=part,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return dq, dk, dv, dg, dbeta
