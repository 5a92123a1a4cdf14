"""GDN-2 and KDA decode steps in Triton (impl ``triton_decode``): one launch per step of T = 1..8 new tokens, the
decode kernel of kernels/common/triton/decode.py with per-channel decay (and, for GDN-2, per-channel erase and
write strengths), the state cache updated in place."""

from __future__ import annotations

import torch
import triton

from ...common.decode import require_state_cache
from ...common.triton.decode import launch_delta_decode

__all__ = ["delta_decode_launch", "gdn2_triton_decode", "kda_triton_decode"]


def delta_decode_launch(B: int, H: int, V: int, T: int) -> dict[str, int | bool]:
    """The decode kernel's launch for `B` sequences of `H` heads, `V` value columns and `T` new tokens: one program
    a tile, one warp a program, the token stepped as written (not fused), 32 value columns a tile once the heads fill
    the machine, else 16. From decode_tune.py's kda sweep on an H100 (benchmarks/NOTES.md, Decode steps): at B64 and
    B512, T4 and T8, within 7% of the best launch everywhere, the persistent form best only at T4."""
    del T
    BV = 32 if B * H >= 1024 else 16
    return {"BV": min(BV, max(16, triton.next_power_of_2(V))), "num_warps": 1, "per_sm": 0, "fused": False}


def _step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, b: torch.Tensor, w: torch.Tensor,
          scale: float | None, initial_state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    state = require_state_cache(initial_state)
    B, T, H, K = q.shape
    scale = K**-0.5 if scale is None else scale
    q, k, v, g, b, w = (x.contiguous() for x in (q, k, v, g, b, w))
    o = torch.empty_like(v)
    with torch.no_grad():
        launch_delta_decode(q, k, v, g, b, w, state, o, scale, **delta_decode_launch(B, H, v.shape[-1], T))
    return o, state


def gdn2_triton_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """T new GDN-2 tokens (q, k, g, b ``[B, T, H, K]``, v, w ``[B, T, H, V]``) from `initial_state` (``[B, H, K,
    V]`` float32 contiguous, updated in place and returned); o ``[B, T, H, V]`` in v's dtype."""
    return _step(q, k, v, g, b, w, scale, initial_state)


def kda_triton_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """T new KDA tokens (q, k, g ``[B, T, H, K]``, v ``[B, T, H, V]``, beta ``[B, T, H]``) from `initial_state`
    (``[B, H, K, V]`` float32 contiguous, updated in place and returned); o ``[B, T, H, V]`` in v's dtype."""
    return _step(q, k, v, g, beta, beta, scale, initial_state)
