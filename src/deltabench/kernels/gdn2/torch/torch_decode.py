"""Gated DeltaNet-2 decode step in PyTorch (impl ``torch_decode``): the token loop of :mod:`.torch_recurrent` from
the state cache, the new state written back into it."""

from __future__ import annotations

import torch

from ...common.decode import decode_in_place
from .torch_recurrent import gdn2_torch_recurrent

__all__ = ["gdn2_torch_decode"]


def gdn2_torch_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """T new tokens from `initial_state` (``[B, H, K, V]`` float32, updated in place and returned)."""
    return decode_in_place(gdn2_torch_recurrent, q, k, v, g, b, w, scale=scale, initial_state=initial_state)
