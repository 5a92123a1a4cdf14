"""Chunk layout helpers shared by the PyTorch chunked references.

The chunked algorithms view a sequence ``[B, T, H, ...]`` as ``[B, H, N, C, ...]``: N chunks of C tokens, heads
next to batch so that every per-chunk product is a batched matmul over ``(B, H, N)``. A partial last chunk is
padded with zeros. Zero padding is exact for every delta rule here: a padded token has k = 0, a write/erase
strength of 0 and a log-decay of 0, so it leaves the state untouched (``S <- 1 * S + 0``) and its output row is
dropped; results therefore never depend on the padding.

Log-decays stay in log space: :func:`pairwise_decay` only exponentiates ``G_i - G_j`` for ``i >= j`` (a sum of
non-positive log-decays, so never above 0), which keeps long chunks with strong decay from overflowing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["merge_chunks", "pairwise_decay", "split_chunks"]


def split_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """View ``[B, T, H, *rest]`` as float32 ``[B, H, N, C, *rest]``, zero-padding T up to ``N * C``.

    Args:
        x: a per-token tensor, time on dim 1 and heads on dim 2 (``rest`` may be empty, as for scalar gates).
        chunk_size: C.

    Returns:
        The float32 chunked tensor (a differentiable function of ``x``).
    """
    B, T, H = x.shape[:3]
    rest = x.shape[3:]
    n_chunks = max(1, -(-T // chunk_size))
    pad = n_chunks * chunk_size - T
    x = x.to(torch.float32)
    if pad:
        # F.pad pads from the last dim backwards: zeros for every dim after T, then `pad` rows at the end of T.
        x = F.pad(x, (0, 0) * (len(rest) + 1) + (0, pad))
    x = x.reshape(B, n_chunks, chunk_size, H, *rest)
    return x.movedim(3, 1)


def merge_chunks(x: torch.Tensor, T: int) -> torch.Tensor:
    """Inverse of :func:`split_chunks`: ``[B, H, N, C, *rest]`` back to ``[B, T, H, *rest]`` (padding dropped)."""
    B, H, N, C = x.shape[:4]
    rest = x.shape[4:]
    x = x.movedim(1, 3).reshape(B, N * C, H, *rest)
    return x[:, :T]


def pairwise_decay(cum_log_decay: torch.Tensor, *, per_channel: bool) -> torch.Tensor:
    """Decay from token j to token i of a chunk, ``exp(G_i - G_j)`` for ``i >= j`` and 0 above the diagonal.

    Args:
        cum_log_decay: the within-chunk cumulative log-decay G, ``[..., C]`` (scalar gates) or ``[..., C, K]``
            (per-channel gates).
        per_channel: whether G carries a channel dim.

    Returns:
        ``[..., C, C]`` or ``[..., C, C, K]``; entry ``(i, j)`` is the decay applied between the two tokens.
    """
    if per_channel:
        diff = cum_log_decay[..., :, None, :] - cum_log_decay[..., None, :, :]
        C = cum_log_decay.shape[-2]
        causal = torch.ones(C, C, dtype=torch.bool, device=diff.device).tril()[..., None]
    else:
        diff = cum_log_decay[..., :, None] - cum_log_decay[..., None, :]
        C = cum_log_decay.shape[-1]
        causal = torch.ones(C, C, dtype=torch.bool, device=diff.device).tril()
    # The acausal differences are positive and may overflow: replace them by -inf BEFORE exp, so they come out as
    # exact zeros (and their gradient, grad * exp(-inf), is zero too). One pass cheaper than masking twice.
    return torch.where(causal, diff, float("-inf")).exp()
