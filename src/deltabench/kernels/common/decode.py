"""Decode steps from a state cache: a token-serial impl run from the state buffer it is given, the new state written
back into that buffer (a serving engine's cache update), for mode ``decode``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["decode_in_place", "require_state_cache"]


def require_state_cache(initial_state: torch.Tensor | None) -> torch.Tensor:
    """`initial_state` when it can be updated in place (a contiguous float32 tensor), else ValueError saying why."""
    if initial_state is None:
        raise ValueError("a decode step needs the state it steps from (initial_state=)")
    if initial_state.dtype != torch.float32 or not initial_state.is_contiguous():
        raise ValueError(f"the decode state must be a contiguous float32 tensor, got {initial_state.dtype}")
    return initial_state


def decode_in_place(
    recurrent: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    *args: Any,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`recurrent` (an op's token-serial impl, ``(*args, scale=, initial_state=) -> (o, final_state)``) over the
    T new tokens of `args` from `initial_state`, the final state copied into `initial_state`, which is returned."""
    state = require_state_cache(initial_state)
    with torch.no_grad():
        o, final = recurrent(*args, scale=scale, initial_state=state)
        state.copy_(final)
    return o, state
