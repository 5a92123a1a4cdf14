"""The one call every adapter of an FLA-convention entry point makes (FLA's own ops, FlashQLA).

Those entry points share FLA's argument order, layouts and keywords, so deltabench's contract maps onto them the same
way everywhere: the final state is always returned (as float32), and q, k arrive already L2-normalised, so in-kernel
normalisation stays off. This module imports nothing third-party.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["call_fla_convention"]


def call_fla_convention(
    entry: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    *args: torch.Tensor,
    scale: float | None,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call `entry(*args, scale=, initial_state=, output_final_state=True, use_qk_l2norm_in_kernel=False, **kwargs)`,
    with ``cu_seqlens=`` for packed sequences (FLA's varlen path: B = 1, the states one row per sequence).

    Args:
        entry: an FLA-convention function, e.g. ``fla.ops.kda.chunk_kda`` or ``flash_qla.chunk_gated_delta_rule``.
        args: the tensors it takes positionally (q, k, v and the gates its signature puts there).
        scale, initial_state: passed through; cu_seqlens: passed only when given (an entry without a varlen path
            then still takes the call); kwargs: any other keyword (e.g. gates it takes by keyword).

    Returns:
        ``(o, final_state)`` with the final state in float32.

    Examples::

        >>> o, ht = call_fla_convention(fla_kda.chunk_kda, q, k, v, g, beta, scale=None, initial_state=h0)
    """
    o, final_state = entry(
        *args,
        scale=scale,
        initial_state=initial_state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=False,
        **({} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}),
        **kwargs,
    )
    # FLA and FlashQLA return the state in float32 already; the cast is a no-op then and keeps the contract if it
    # changes.
    return o, final_state.float()
