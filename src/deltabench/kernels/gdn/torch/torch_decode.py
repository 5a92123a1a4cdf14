"""Gated DeltaNet decode step in PyTorch (impl ``torch_decode``): the token loop of :mod:`.torch_recurrent` from the
state cache, the new state written back into it."""

from __future__ import annotations

import torch

from ...common.decode import decode_in_place
from .torch_recurrent import gdn_torch_recurrent

__all__ = ["gdn_torch_decode"]


def gdn_torch_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """T new tokens (q, k ``[B, T, H, K]``, v ``[B, T, H, V]``, g, beta ``[B, T, H]``) from `initial_state`
    (``[B, H, K, V]`` float32, updated in place and returned); o ``[B, T, H, V]`` in v's dtype."""
    return decode_in_place(gdn_torch_recurrent, q, k, v, g, beta, scale=scale, initial_state=initial_state)
