"""Token-serial fused Gated DeltaNet in Triton, for inference and decoding (forward only).

Layout as in chunk.py. One program per (V block, batch*head) keeps its ``[K, BV]`` slice of the fp32
state in registers and walks the tokens::

    S <- exp(g_t) S;   u = beta_t (v_t - S^T k_t);   S <- S + k_t u^T;   o_t = S^T (scale q_t)

The state slice is exact per V column (every column's update reads only that column), so V blocks are
independent programs. No gradients: use chunk.py for training.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.varlen import run_packed

__all__ = ["fused_recurrent_gated_delta_rule", "gdn_triton_recurrent"]


@triton.jit
def _token(q, k, v, g, beta, row, rk, rv, mk, mv, scale, K: tl.constexpr, V: tl.constexpr):
    """One token's inputs in float32 (`row`: its (batch, token, head) row): k, scale * q, v, g, beta."""
    kt = tl.load(k + row * K + rk, mask=mk, other=0.0).to(tl.float32)
    qt = tl.load(q + row * K + rk, mask=mk, other=0.0).to(tl.float32) * scale
    vt = tl.load(v + row * V + rv, mask=mv, other=0.0).to(tl.float32)
    return kt, qt, vt, tl.load(g + row).to(tl.float32), tl.load(beta + row).to(tl.float32)


@triton.jit
def fused_recurrent_fwd_kernel(
    q, k, v, g, beta, h0, o, ht,
    scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr,
):  # fmt: skip
    """Walk the tokens of one (batch, head) for one block of V columns. The next token's inputs are loaded before
    this token's update, so their memory latency hides behind it instead of stalling every token."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    rk = tl.arange(0, BK)
    rv = i_v * BV + tl.arange(0, BV)
    mk = rk < K
    mv = rv < V
    mkv = mk[:, None] & mv[None, :]
    state_off = i_bh.to(tl.int64) * K * V + rk[:, None] * V + rv[None, :]
    row = (i_b * T).to(tl.int64) * H + i_h
    kt, qt, vt, gt, bt = _token(q, k, v, g, beta, row, rk, rv, mk, mv, scale, K, V)
    if HAS_H0:
        S = tl.load(h0 + state_off, mask=mkv, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    last = row + (T - 1) * H
    for _ in range(T):
        nxt = tl.minimum(row + H, last)  # past the last token: that token again, never read out of bounds
        kn, qn, vn, gn, bn = _token(q, k, v, g, beta, nxt, rk, rv, mk, mv, scale, K, V)
        S = S * tl.exp(gt)
        ut = bt * (vt - tl.sum(S * kt[:, None], axis=0))
        S += kt[:, None] * ut[None, :]
        ot = tl.sum(S * qt[:, None], axis=0)
        tl.store(o + row * V + rv, ot.to(o.dtype.element_ty), mask=mv)
        kt, qt, vt, gt, bt = kn, qn, vn, gn, bn
        row = nxt
    if STORE_FINAL:
        tl.store(ht + state_off, S, mask=mkv)


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-serial Gated DeltaNet forward (Triton), state in and out.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; g: ``[B, T, H]`` log-decay; beta: ``[B, T, H]``.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]`` state (fp32).
        output_final_state: return the fp32 state after the last token.

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in v's dtype; final_state ``[B, H, K, V]`` fp32 or None.

    Examples::

        >>> o, ht = fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h)  # one decode step: T = 1
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    if max(K, V) > 256:
        raise ValueError(f"fused_recurrent_gated_delta_rule supports K and V up to 256, got K={K}, V={V}")
    scale = K**-0.5 if scale is None else scale
    q, k, v, g, beta = q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous()
    if initial_state is not None:
        initial_state = initial_state.float().contiguous()
    o = torch.empty_like(v)
    ht = q.new_empty(B, H, K, V, dtype=torch.float32) if output_final_state else None
    BK = max(16, triton.next_power_of_2(K))
    # small V blocks: many independent programs, and the [K, BV] slice stays in registers
    BV = min(32 if BK <= 128 else 16, max(16, triton.next_power_of_2(V)))
    fused_recurrent_fwd_kernel[(triton.cdiv(V, BV), B * H)](
        q, k, v, g, beta, initial_state, o, ht, scale, T,
        H=H, K=K, V=V, BK=BK, BV=BV, HAS_H0=initial_state is not None, STORE_FINAL=output_final_state,
        num_warps=4, num_stages=2,
    )  # fmt: skip
    return o, ht


def gdn_triton_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Registry entry (impl ``triton_recurrent``): forward only, final state returned.
    ``cu_seqlens``: packed sequences (kernels/common/varlen.run_packed)."""
    if cu_seqlens is not None:
        return run_packed(
            gdn_triton_recurrent, q, k, v, g, beta, cu_seqlens=cu_seqlens, scale=scale, initial_state=initial_state
        )
    with torch.no_grad():
        return fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state=True)
