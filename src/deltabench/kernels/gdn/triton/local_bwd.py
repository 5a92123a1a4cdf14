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
``tl.trans`` of a dot result, which Triton 3.4-3.7.0 miscompiled on Hopper.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton.mma import dot_precision, mma, padded
from .wy import CHUNK, TUNED_K

__all__ = ["LAUNCH", "local_bwd"]

# Fixed launch settings (no autotuning): warps for K >= 128, V block of the in-kernel loop, stages, split.
# Measured at 8x4096x6 on the H200 (benchmarks/NOTES.md, v2; results equal within 3e-7): 64/8/2 1.48 ms,
# 64/8/1 (the first choice) 1.81, 64/4/1 1.81, 32/4/1 1.85, 64/4/2 2.18, 128/8/1 2.20; 32/8/1 faulted.
# `split`: three launches (PARTs 1-3 of the kernel) instead of one. On the H200 one launch had 255 registers
# and ~300 spilled; two (query side | the rest) ran 1.29 -> 1.15 ms at 8x4096x6 and 3.34 -> 3.10 ms at
# 1x32768x16 (64/8/2), the second still at 255 registers and 712 stack bytes. The three, at K = V = 128 in
# bf16 (sm_90a, Triton 3.6.0, benchmarks/cpu/kernel_resources.py): no stack at any train shape; not yet
# timed on the GPU (benchmarks/NOTES.md, "local_bwd in three launches"). Their cost: dk's fp32 partial
# written and read once more, half of dA through L's unused upper triangle, k and L read once more (about
# 280 MB at 8x4096x6). Stages and split apply at K = 128 (wy.TUNED_K) only, where they were measured;
# elsewhere one stage, one launch: the configs the GPU gate passed at K = 64 and 256.
# v3 (2026-12-03, benchmarks/gpu/gdn_h16.py sweep, the three launches together): 3 stages 2.222 ms at 4x8192x16
# against 2.320 for 2 (1x32768x16 2.327 / 2.417, 8x4096x6 0.851 / 0.892, 4x4096x6 0.447 / 0.465), every gradient
# bit-identical; 64/4/2 about as fast (2.244) but not bit-identical; 128 columns 2.932; 32/4/2 2.618.
# `parts`: each split launch's own (V block, warps, stages), PARTs 1-3 in order; the three hold different work (two
# V loops, then one), so one config need not suit them all. H200, 2026-12-04 (benchmarks/gpu/local_bwd_parts.py,
# each part alone, us at 4x8192x16 / 1x32768x16): PART 1 64/8/3 729 / 756 (4 warps spill 220 values: 954);
# PART 2 128/4/2 565 / 578 against 762 / 819 at 64/8/3 (30 spilled values, but two programs an SM instead of
# one; 64/4/2 613 / 632; before dT's uses were moved ahead of dk's read-modify-write: 685 / 694 and 108 spilled,
# 64/4/2 660 / 680); PART 3 128/4/1 480 / 496 against 830 / 855 at 8 warps (before dv moved
# into it: 389 at 4 warps, 645 at 8).
LAUNCH = {
    "warps": 8,
    "block_v": 64,
    "stages": 3,
    "split": True,
    "parts": ((64, 8, 3), (128, 4, 2), (128, 4, 1)),
}


@triton.jit
def _dv_from_wy(TTd, dvnew, dv, row, mt, V: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """U = T v, so dv = T^T dv_new: `TTd` is T^T [C, C] in the inputs' dtype; dv stored by V blocks."""
    for i_v in range(tl.cdiv(V, BV)):
        rv = i_v * BV + tl.arange(0, BV)
        mtv = mt[:, None] & (rv < V)[None, :]
        dub = tl.load(dvnew + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
        dvb = mma(TTd, dub, PREC)
        tl.store(dv + row[:, None] * V + rv[None, :], dvb.to(dv.dtype.element_ty), mask=mtv)


@triton.jit
def local_bwd_kernel(
    q, k, v, g, beta, L, h, dh, vnew, dvnew, do,
    dq, dk, dv, dg, dbeta, dkp, dgp,
    scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    PREC: tl.constexpr, PART: tl.constexpr,
):  # fmt: skip
    """One chunk's input gradients: all of them (PART 0), or in three launches that each hold a third of the
    work (the one launch spills at K = 128):

    - PART 1, the query side and the state update: dq, and o's and the update's terms of dk and dg, left in
      fp32 in dkp / dgp;
    - PART 2, W and U: W's terms of dk and dg (added into dkp / dgp), dbeta's dT term (into dbeta), and
      Y = L^T dL, the first product of dA = -L^T dL L^T: its strictly lower part, all that dA needs, stored
      transposed into L's strictly upper triangle, which L = (I + A)^{-1} leaves unused (no extra memory; L's
      own lower triangle is never written);
    - PART 3, A: dA and its transpose from L's tile read in both orientations (loaded operands, never a
      transposed product), A's terms of dk, dg and dbeta added, dk and dg stored; and dv = T^T dv_new, from
      the L^T it holds (PART 2, at 250 registers, is the longer launch)."""
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

    gc = tl.load(g + row, mask=mt, other=0.0).to(tl.float32)
    bc = tl.load(beta + row, mask=mt, other=0.0).to(tl.float32)
    G = tl.cumsum(gc, axis=0)
    G_last = tl.sum(gc, axis=0)
    gam = tl.exp(G)
    if PART == 0:  # Z in the loop needs K^; the split parts load k after their loops, where registers are free
        kc = tl.load(k + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
        khat = (kc * gam[:, None]).to(dt)
    h_off = ((i_b * NT + i_n).to(tl.int64) * H + i_h) * K * V

    dq_acc = tl.zeros([C, BK], dtype=tl.float32)  # do S^T
    dkt_acc = tl.zeros([C, BK], dtype=tl.float32)  # v_new dH^T
    dw_acc = tl.zeros([C, BK], dtype=tl.float32)  # dv_new S^T  (= -dW)
    Pm = tl.zeros([C, C], dtype=tl.float32)  # do v_new^T
    PmT = tl.zeros([C, C], dtype=tl.float32)  # v_new do^T
    dT = tl.zeros([C, C], dtype=tl.float32)  # dv_new v^T (the K^ part is added below)
    dTT = tl.zeros([C, C], dtype=tl.float32)  # (v - K^ S) dv_new^T  (= dT^T)
    gC = tl.zeros([BK], dtype=tl.float32)  # per-row sums of S * dH
    if PART != 3:
        for i_v in range(tl.cdiv(V, BV)):
            rv = i_v * BV + tl.arange(0, BV)
            mv = rv < V
            mkv = mk[:, None] & mv[None, :]
            mtv = mt[:, None] & mv[None, :]
            Sb = tl.load(h + h_off + rk[:, None] * V + rv[None, :], mask=mkv, other=0.0)
            if PART <= 1:  # the query side and the state update
                ub = tl.load(vnew + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
                dob = tl.load(do + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
                dHb = tl.load(dh + h_off + rk[:, None] * V + rv[None, :], mask=mkv, other=0.0)
                dq_acc += mma(dob, tl.trans(Sb), PREC)
                Pm += mma(dob, tl.trans(ub), PREC)
                PmT += mma(ub, tl.trans(dob), PREC)
                dkt_acc += mma(ub, tl.trans(dHb), PREC)
                gC += tl.sum(Sb.to(tl.float32) * dHb.to(tl.float32), axis=1)
            if PART != 1:  # W and U
                dub = tl.load(dvnew + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
                vb = tl.load(v + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
                dw_acc += mma(dub, tl.trans(Sb), PREC)
                dT += mma(dub, tl.trans(vb), PREC)
                if PART == 0:  # dT^T from loaded operands (the split reads Y^T from memory instead)
                    Z = vb.to(tl.float32) - mma(khat, Sb, PREC)
                    dTT += mma(Z.to(dt), tl.trans(dub), PREC)

    if PART != 0:
        kc = tl.load(k + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
        khat = (kc * gam[:, None]).to(dt)
    rI = rc[:, None]
    rJ = rc[None, :]
    Gd = G[:, None] - G[None, :]
    dk_acc = tl.zeros([C, BK], dtype=tl.float32)
    dGv = tl.zeros([C], dtype=tl.float32)
    db = tl.zeros([C], dtype=tl.float32)
    if PART <= 1:  # the query side and the state update
        # state update: S' = exp(G_C) S + (k exp(G_C - G))^T v_new
        dk_s = dkt_acc * tl.exp(G_last - G)[:, None]
        s = tl.sum(dk_s * kc.to(tl.float32), axis=1)
        dk_acc += dk_s
        dGv -= s
        last = tl.sum(s, axis=0) + tl.exp(G_last) * tl.sum(gC, axis=0)
        # at the chunk's last valid row: the reverse cumulative sum below adds it to every row, and PART 1
        # stores valid rows only
        dGv = tl.where(rc == tl.minimum(T - i_n * C, C) - 1, dGv + last, dGv)

        # o's terms: inter-chunk scale * gamma * (q S), intra-chunk scale * M v_new
        qc = tl.load(q + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
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
    lower = rI > rJ
    upper = rI < rJ
    if PART == 0 or PART == 2:
        Lm = tl.load(L + row[:, None] * C + rJ, mask=mt[:, None] & (rJ <= rI), other=0.0)
        LT = tl.trans(Lm)
        # W and U
        TT = LT * bc[:, None]
        if PART == 0:  # U = T v: dv = T^T dv_new (the split does it in PART 3, which holds L^T anyway)
            _dv_from_wy(TT.to(dt), dvnew, dv, row, mt, V, BV, PREC)
        # W = T K^: dT's K^ part, then dK^ = T^T dW = -T^T dw_acc (dw_acc's last use). dT's uses come first, so
        # that its tile and L's are dead by dk's read-modify-write (PART 2 runs at 4 warps, near its registers)
        dT -= mma(dw_acc.to(dt), tl.trans(khat), PREC)
        # T = L diag(beta): dL = dT diag(beta), dbeta_j = sum_i dT_ij L_ij
        db += tl.sum(dT * Lm, axis=0)
        if PART == 2:
            # the first product of dA, Y = L^T dL; only its strictly lower part reaches dA's (L^T is upper
            # triangular): (i, j), i > j, goes to row j, column i of L, its strictly upper triangle
            Y = mma(LT, dT * bc[None, :], PREC)
            tl.store(L + row[None, :] * C + rI, Y, mask=mt[None, :] & lower)
        dk_w = -mma(TT, dw_acc, PREC) * gam[:, None]
        dGv += tl.sum(dk_w * kc.to(tl.float32), axis=1)
        dk_acc += dk_w
        if PART == 2:
            dkw = dk_acc + tl.load(dkp + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
            tl.store(dkp + row[:, None] * K + rk[None, :], dkw, mask=mtk)
            tl.store(dgp + row, dGv + tl.load(dgp + row, mask=mt, other=0.0), mask=mt)
            tl.store(dbeta + row, db, mask=mt)
    if PART == 0:
        # dA = -L^T dL L^T, strictly lower, and the same from the transposed side, from loaded operands
        dA = tl.where(lower, -mma(mma(LT, dT * bc[None, :], PREC), LT, PREC), 0.0)
        dAT = tl.where(upper, -mma(mma(Lm, dTT * bc[:, None], PREC), Lm, PREC), 0.0)
    if PART == 0 or PART == 3:  # A
        if PART == 3:
            mtt = mt[:, None] & mt[None, :]
            # L's tile holds L and Y^T; read in both orientations it gives all four operands
            Lrow = tl.load(L + row[:, None] * C + rJ, mask=mtt, other=0.0)
            Lcol = tl.load(L + row[None, :] * C + rI, mask=mtt, other=0.0)
            Lm = tl.where(rJ <= rI, Lrow, 0.0)
            YT = tl.where(upper, Lrow, 0.0)
            LT = tl.where(rI <= rJ, Lcol, 0.0)
            Yl = tl.where(lower, Lcol, 0.0)
            dA = tl.where(lower, -mma(Yl, LT, PREC), 0.0)
            dAT = tl.where(upper, -mma(Lm, YT, PREC), 0.0)
            _dv_from_wy((LT * bc[:, None]).to(dt), dvnew, dv, row, mt, V, BV, PREC)
            db += tl.load(dbeta + row, mask=mt, other=0.0)
            dGv += tl.load(dgp + row, mask=mt, other=0.0)
        E_low = tl.where(lower, tl.exp(tl.where(lower, Gd, 0.0)), 0.0)  # exp(G_i - G_j), i > j
        Ek = E_low * mma(kc, tl.trans(kc), PREC)
        db += tl.sum(dA * Ek, axis=1)
        dAA = dA * Ek * bc[:, None]
        dGv += tl.sum(dAA, axis=1) - tl.sum(dAA, axis=0)
        # dk from A's both factors of k: (dkk + dkk^T) k, the transposed part from dAT
        # (strictly lower + strictly upper: the sum is exact, one product)
        E_up = tl.where(upper, tl.exp(tl.where(upper, -Gd, 0.0)), 0.0)  # exp(G_j - G_i), i < j
        dkk = dA * E_low * bc[:, None] + dAT * E_up * bc[None, :]
        dk_acc += mma(dkk.to(dt), kc, PREC)
        if PART == 3:
            dk_acc += tl.load(dkp + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)

        # g_t enters every G_i with i >= t: reverse cumulative sum
        dgc = tl.sum(dGv, axis=0) - tl.cumsum(dGv, axis=0) + dGv
        tl.store(dk + row[:, None] * K + rk[None, :], dk_acc.to(dk.dtype.element_ty), mask=mtk)
        tl.store(dg + row, dgc, mask=mt)
        tl.store(dbeta + row, db, mask=mt)


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
    parts: tuple[tuple[int, ...], ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the chunk-local backward. Returns ``(dq, dk, dv, dg, dbeta)``; dg and dbeta are fp32 [B, T, H].

    `config` ``(V block, warps, stages[, split])`` replaces LAUNCH's, and `parts` LAUNCH's per-launch configs of
    the split (for tuning scripts; None in the library)."""
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
    # PART 2 leaves a partial of dA in L's strictly upper triangle, which nothing else reads
    dkp = torch.empty_like(dq, dtype=torch.float32) if split else None
    dgp = torch.empty_like(dg) if split else None
    if split:
        # the split's per-launch configs; a `config` without `parts` keeps the one config for all three
        chosen = parts or (LAUNCH["parts"] if not config else [(BV, warps, stages)] * 3)
        launches = list(zip((1, 2, 3), chosen, strict=True))
    else:
        launches = [(0, (BV, warps, stages))]
    for part, (bv, nw, ns) in launches:
        local_bwd_kernel[(NT, B * H)](
            q, k, v, g, beta, L, h, dh, vnew, dvnew, do, dq, dk, dv, dg, dbeta, dkp, dgp, scale, T, NT,
            H=H, K=K, V=V, BK=BK, BV=min(bv, padded(V)), C=CHUNK, PREC=dot_precision(q.dtype), PART=part,
            num_warps=nw, num_stages=ns,
        )  # fmt: skip
    return dq, dk, dv, dg, dbeta
