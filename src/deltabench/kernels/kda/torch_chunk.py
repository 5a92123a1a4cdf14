"""Chunked Kimi Delta Attention (KDA) in PyTorch (WY representation / UT transform), float32 inside.

Layout: q, k, g ``[B, T, H, K]``; v ``[B, T, H, V]``; beta ``[B, T, H]``; state ``[B, H, K, V]``; g is a
per-channel log-decay (<= 0) in float32. KDA is GDN-2 with erase and write strengths both beta, so it runs the
per-channel chunked delta rule of :mod:`deltabench.kernels.common.per_channel_chunk` (derivation there).
"""

from __future__ import annotations

import torch

from ..common import per_channel_delta_chunk
from ..common.varlen import ChunkLayout, run_chunked

__all__ = ["kda_torch_chunk"]


def kda_torch_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA by chunks of `chunk_size` tokens, any T (a partial last chunk is zero-padded, exactly).

    Computes the same as :func:`deltabench.kernels.kda.torch_recurrent.kda_torch_recurrent`; inputs are upcast
    to float32, the output is cast to ``v.dtype``. Backward is autograd.

    Args:
        q, k: ``[B, T, H, K]`` queries and keys.
        v: ``[B, T, H, V]`` values.
        g: ``[B, T, H, K]`` per-channel log-decay (<= 0).
        beta: ``[B, T, H]`` write strength.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]``.
        chunk_size: C, default 64.
        cu_seqlens: int32 ``[N + 1]`` offsets of N sequences packed along T (B = 1); the states are then
            ``[N, H, K, V]``, each sequence on chunks of its own (kernels/common/varlen.run_chunk_aligned).

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in ``v.dtype`` and ``[B, H, K, V]`` float32.

    Examples::

        >>> from deltabench.references.kda import make_inputs
        >>> x = make_inputs(2, 200, 4, 64, 64, dtype=torch.bfloat16)
        >>> o, ht = kda_torch_chunk(**x)
    """
    return run_chunked("kda", _kda_chunk, q, k, v, {"g": g, "beta": beta}, scale, initial_state, chunk_size, cu_seqlens)


def _kda_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    chunk_size: int,
    runs: ChunkLayout | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel chunked rule with erase = write = beta (expanded views, nothing copied); float32 out."""
    B, T, H, K = q.shape
    erase = beta[..., None].expand(B, T, H, K)
    write = beta[..., None].expand(B, T, H, v.shape[-1])
    return per_channel_delta_chunk(q, k, v, g, erase, write, scale, initial_state, chunk_size, runs)
