"""Token-serial Sparse Delta Memory in PyTorch: inputs in their dtype, the bank in float32.

Layout: ``k_idx, k_val [B, T, H, W]``; ``q_idx, q_val [B, T, H, R]``; ``v [B, T, H, D]``; ``g, beta [B, T, H]``;
bank ``[B, H, S, D]``. The readable version beside :mod:`.torch_chunk`: it repeats :func:`.decode.sdm_step`;
backward is autograd.
"""

from __future__ import annotations

import torch

from ....references.sdm import check_sdm_inputs, first_write_mask
from .decode import sdm_step

__all__ = ["sdm_torch_recurrent"]


def sdm_torch_recurrent(
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
    allow_repeated_writes: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SDM one token at a time, the bank kept in float32 (the rule of :mod:`deltabench.references.sdm`).

    Args:
        k_idx, k_val: ``[B, T, H, W]`` write slots (int64, distinct per token) and weights.
        q_idx, q_val: ``[B, T, H, R]`` read slots and weights.
        v: ``[B, T, H, D]``; g: ``[B, T, H]`` log-decay (<= 0); beta: ``[B, T, H]``.
        initial_bank: optional ``[B, H, S, D]`` (zeros otherwise; then ``num_slots`` gives S).
        key_weighted_decay: the decay of write n is ``exp(g_t * k_val[n])``.
        allow_repeated_writes: accept a write slot repeated within a token (decayed once) instead of raising.

    Returns:
        ``(y, final_bank)``: ``[B, T, H, D]`` in ``v.dtype`` and ``[B, H, S, D]`` float32.

    Examples::

        >>> from deltabench.references.sdm import make_inputs
        >>> x = make_inputs(1, 100, 2, 256, 32, 8, 8)
        >>> y, bank = sdm_torch_recurrent(**x)
    """
    B, T, H, S, D, _, _ = check_sdm_inputs(
        k_idx,
        k_val,
        q_idx,
        q_val,
        v,
        g,
        beta,
        initial_bank,
        num_slots,
        allow_repeated_writes=allow_repeated_writes,
        key_weighted_decay=key_weighted_decay,
    )
    bank = v.new_zeros(B, H, S, D, dtype=torch.float32) if initial_bank is None else initial_bank.float()
    k_idx, q_idx = k_idx.long(), q_idx.long()
    first = first_write_mask(k_idx)
    ys = []
    for t in range(T):
        y, bank = sdm_step(
            bank, k_idx[:, t], k_val[:, t].float(), q_idx[:, t], q_val[:, t].float(), v[:, t].float(),
            g[:, t].float(), beta[:, t].float(), key_weighted_decay, first[:, t],
        )  # fmt: skip
        ys.append(y.to(v.dtype))
    y = torch.stack(ys, dim=1) if ys else v.new_zeros(B, 0, H, D)
    return y, bank
