"""One SDM token (T == 1) in PyTorch, the bank in float32: decay, write, then read.

Layout: bank ``[B, H, S, D]``; per token write slots ``k_idx [B, H, W]`` (int64) with weights ``k_val``, read slots
``q_idx [B, H, R]`` with weights ``q_val``, value ``v [B, H, D]``, log-decay ``g [B, H]`` (<= 0), strength
``beta [B, H]``. :func:`sdm_step` is the step the token loop (:mod:`.torch_recurrent`) repeats; backward is autograd.
"""

from __future__ import annotations

import torch

from ....references.sdm import check_sdm_inputs, first_write_mask

__all__ = ["sdm_decode_step", "sdm_step"]


def sdm_step(
    bank: torch.Tensor,
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    key_weighted_decay: bool,
    first_write: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token without argument checks: all float inputs float32, ``first_write [B, H, W]`` marks the entry whose
    decay each write slot takes (see :func:`deltabench.references.sdm.first_write_mask`). Returns ``(y, bank)``."""
    B, H, S, D = bank.shape
    W, R = k_idx.shape[-1], q_idx.shape[-1]
    log_decay = g[..., None] * k_val if key_weighted_decay else g[..., None].expand(B, H, W)
    log_decay = torch.where(first_write, log_decay, torch.zeros_like(log_decay))
    bank = bank * bank.new_zeros(B, H, S).scatter_add(-1, k_idx, log_decay).exp()[..., None]
    k_rows = k_idx[..., None].expand(B, H, W, D)
    u = beta[..., None] * (v - (k_val[..., None] * bank.gather(2, k_rows)).sum(2))
    bank = bank.scatter_add(2, k_rows, k_val[..., None] * u[:, :, None, :])
    y = (q_val[..., None] * bank.gather(2, q_idx[..., None].expand(B, H, R, D))).sum(2)
    return y, bank


def sdm_decode_step(
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    bank: torch.Tensor,
    key_weighted_decay: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance the bank by one token and read it back (SDM's decode step; the bank is not modified in place).

    Per (batch, head)::

        M[s] <- exp(g) M[s] for s in k_idx;  u = beta (v - sum_n k_val[n] M[k_idx[n]]);
        M[k_idx[n]] += k_val[n] u;  y = sum_m q_val[m] M[q_idx[m]]

    Args:
        k_idx, k_val: ``[B, H, W]`` distinct write slots (int64) and weights.
        q_idx, q_val: ``[B, H, R]`` read slots and weights.
        v: ``[B, H, D]``; g: ``[B, H]`` log-decay (<= 0); beta: ``[B, H]``.
        bank: ``[B, H, S, D]``, used in float32.
        key_weighted_decay: the decay of write n is ``exp(g * k_val[n])``.

    Returns:
        ``(y, bank)``: ``[B, H, D]`` in ``v.dtype`` and the new ``[B, H, S, D]`` float32 bank.

    Raises:
        ValueError: a shape breaks the contract, an index is out of range, W or R > S, a write slot repeats, or a
            write weight is negative under ``key_weighted_decay``.

    Examples::

        >>> y, bank = sdm_decode_step(k_idx, k_val, q_idx, q_val, v, g, beta, bank)
    """
    args = (k_idx, k_val, q_idx, q_val, v, g, beta)
    check_sdm_inputs(*(x[:, None] for x in args), initial_bank=bank, key_weighted_decay=key_weighted_decay)
    y, bank = sdm_step(
        bank.float(), k_idx.long(), k_val.float(), q_idx.long(), q_val.float(), v.float(), g.float(), beta.float(),
        key_weighted_decay, first_write_mask(k_idx),
    )  # fmt: skip
    return y.to(v.dtype), bank
