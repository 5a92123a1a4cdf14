"""Output stage of chunked Gated DeltaNet: fully parallel, one Triton program per (chunk, V block, batch*head).

Given the state S_n at each chunk's start (``h``) and the chunk's new values v_new (walk.py)::

    o = scale * ( gamma * (q S_n) + M v_new ),   M_ij = exp(G_i - G_j) q_i . k_j  for j <= i

with G the in-chunk cumulative log-decay and gamma = exp(G). No program depends on another, so every chunk
of every head runs at once; the same products were on the chunk-serial path in state.py's ``state_fwd``.
The arithmetic is state.py's, term for term (the stored h is the 16-bit-rounded state that state_fwd
multiplied q by), so this path's o equals ``triton_chunk``'s up to accumulation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton.mma import dot_precision, mma, padded
from .wy import CHUNK

__all__ = ["LAUNCH", "chunk_output"]

# Fixed launch settings (no autotuning): V blocks of up to 128 columns with 4 warps, 16 columns below V = 64
# (never 32 columns: state.py's H200 fault). Measured at 8x4096x6x128 on the H200 (benchmarks/NOTES.md, v1),
# each config's o bit-identical to state_fwd's: 128 cols / 4 warps 0.102 ms, 128 / 8 0.124, 64 / 4 0.115,
# 64 / 8 (the first choice) 0.164; a second stage changed nothing (64 / 4 / 2: 0.115). One program per
# chunk and head at V <= 128 also reads q and k once instead of once per V block.
LAUNCH = {"block_v": 128, "warps": 4, "stages": 1}


@triton.jit
def chunk_output_kernel(
    q, k, g, h, vnew, o,
    scale, T, NT, NV,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """o for one chunk of one (batch, head), one block of V columns."""
    i_v = tl.program_id(0) % NV
    i_n = tl.program_id(0) // NV
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    rc = tl.arange(0, C)
    mk = rk < K
    mv = rv < V
    t = i_n * C + rc
    mt = t < T
    row = (i_b * T + t).to(tl.int64) * H + i_h
    mtk = mt[:, None] & mk[None, :]
    mtv = mt[:, None] & mv[None, :]
    dt = q.dtype.element_ty
    qc = tl.load(q + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
    kc = tl.load(k + row[:, None] * K + rk[None, :], mask=mtk, other=0.0)
    gc = tl.load(g + row, mask=mt, other=0.0).to(tl.float32)
    h_off = ((i_b * NT + i_n).to(tl.int64) * H + i_h) * K * V
    Sd = tl.load(h + h_off + rk[:, None] * V + rv[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
    vnd = tl.load(vnew + row[:, None] * V + rv[None, :], mask=mtv, other=0.0)
    G = tl.cumsum(gc, axis=0)
    causal = rc[:, None] >= rc[None, :]
    # q k^T from loaded operands (tl.trans of a loaded tile, never of a dot result: a Triton miscompile on Hopper)
    qk = mma(qc, tl.trans(kc), PREC)
    dG = G[:, None] - G[None, :]
    M = tl.where(causal, qk * tl.exp(tl.where(causal, dG, 0.0)), 0.0)
    oc = mma(qc, Sd, PREC) * tl.exp(G)[:, None]
    oc += mma(M.to(dt), vnd, PREC)
    tl.store(o + row[:, None] * V + rv[None, :], (oc * scale).to(o.dtype.element_ty), mask=mtv)


def _block_v(V: int) -> int:
    """V block of the output stage: the padded V up to LAUNCH's (128), or 16 when V is under 64 (never 32)."""
    return min(LAUNCH["block_v"], padded(V)) if padded(V) >= 64 else 16


def chunk_output(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    h: torch.Tensor,
    vnew: torch.Tensor,
    scale: float,
    config: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """Launch the output stage.

    Args:
        q, k: ``[B, T, H, K]``; g: ``[B, T, H]`` fp32 log-decay; h: ``[B, NT, H, K, V]`` state at each chunk's
            start; vnew: ``[B, T, H, V]`` (both from ``state_walk``); scale: the query scale; config:
            ``(V block, warps, stages)`` in place of LAUNCH's (for tuning scripts; None in the library).

    Returns:
        o ``[B, T, H, V]`` in v_new's dtype.
    """
    B, T, H, K = q.shape
    V = vnew.shape[-1]
    NT = triton.cdiv(T, CHUNK)
    o = torch.empty_like(vnew)
    BV = _block_v(V)
    warps, stages = LAUNCH["warps"], LAUNCH["stages"]
    if config is not None:
        BV, warps, stages = config
    NV = triton.cdiv(V, BV)
    BK = padded(K)
    # V blocks vary fastest in grid axis 0, so a chunk's programs run side by side and share q, k in L2
    chunk_output_kernel[(NT * NV, B * H)](
        q, k, g, h, vnew, o, scale, T, NT, NV,
        H=H, K=K, V=V, BK=BK, BV=BV, C=CHUNK, PREC=dot_precision(q.dtype),
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return o
