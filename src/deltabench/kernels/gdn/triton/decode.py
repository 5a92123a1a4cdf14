"""Gated DeltaNet decode step in Triton (impl ``triton_decode``): one launch per step of T = 1..8 new tokens.

The kernel is :mod:`.fused_recurrent`'s: one program per (V block, batch*head) loads its ``[K, BV]`` slice of the
float32 state, and per token applies the gate (decay) first, then the delta update, then the output; the slice is
stored back into the very buffer it was read from (each program reads its slice whole before it writes it, and no
two programs share one), so the state cache is updated in place and no new state is allocated.
"""

from __future__ import annotations

import torch
import triton

from ...common.decode import require_state_cache
from .fused_recurrent import fused_recurrent_fwd_kernel

__all__ = ["gdn_triton_decode"]


def gdn_triton_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """T new tokens (q, k ``[B, T, H, K]``, v ``[B, T, H, V]``, g, beta ``[B, T, H]``) from `initial_state`
    (``[B, H, K, V]`` float32 contiguous, updated in place and returned); o ``[B, T, H, V]`` in v's dtype."""
    state = require_state_cache(initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    q, k, v, g, beta = q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous()
    o = torch.empty_like(v)
    BK = max(16, triton.next_power_of_2(K))
    # Small V blocks: a decode step at B = 1 has only H heads, and B*H*V/BV programs must fill the machine.
    BV = 16
    with torch.no_grad():
        fused_recurrent_fwd_kernel[(triton.cdiv(V, BV), B * H)](
            q, k, v, g, beta, state, o, state, scale, T,
            H=H, K=K, V=V, BK=BK, BV=BV, HAS_H0=True, STORE_FINAL=True,
            num_warps=4, num_stages=2,
        )  # fmt: skip
    return o, state
