"""SDM decode step in PyTorch (impl ``torch_decode``): the token loop of :mod:`.torch_recurrent` from the bank
cache, the new bank written back into it."""

from __future__ import annotations

import torch

from ...common.decode import require_state_cache
from .torch_recurrent import sdm_torch_recurrent

__all__ = ["sdm_torch_decode"]


def sdm_torch_decode(
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_bank: torch.Tensor | None = None,
    key_weighted_decay: bool = False,
    *,
    num_slots: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """T new tokens (the op's ``[B, T, H, ...]`` inputs) from `initial_bank` (``[B, H, S, D]`` float32, updated in
    place and returned); y ``[B, T, H, D]`` in v's dtype."""
    bank = require_state_cache(initial_bank)
    with torch.no_grad():
        y, final = sdm_torch_recurrent(
            k_idx, k_val, q_idx, q_val, v, g, beta, bank, key_weighted_decay, num_slots=num_slots
        )
        bank.copy_(final)
    return y, bank
