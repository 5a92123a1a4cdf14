"""Chunked Gated DeltaNet-2 in PyTorch (WY representation / UT transform), float32 inside.

Layout: q, k, g, b ``[B, T, H, K]``; v, w ``[B, T, H, V]``; state ``[B, H, K, V]``; g is a per-channel
log-decay (<= 0) in float32. The UT form (erase ``r = S^T (b * k)``, write ``w * v - r``) is derived in
:mod:`deltabench.kernels.common.per_channel_chunk`.
"""

from __future__ import annotations

import torch

from ...common import per_channel_delta_chunk
from ...common.varlen import run_chunked

__all__ = ["gdn2_torch_chunk"]


def gdn2_torch_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet-2 by chunks of `chunk_size` tokens, any T (a partial last chunk is zero-padded, exactly).

    Computes the same as :func:`deltabench.kernels.gdn2.torch.torch_recurrent.gdn2_torch_recurrent`; inputs are upcast
    to float32, the output is cast to ``v.dtype``. Memory grows as ``B H T C K`` (the pairwise per-channel
    decays), fine for a reference. Backward is autograd.

    Args:
        q, k: ``[B, T, H, K]`` queries and keys.
        v: ``[B, T, H, V]`` values.
        g: ``[B, T, H, K]`` per-channel log-decay (<= 0).
        b: ``[B, T, H, K]`` erase strength per key channel.
        w: ``[B, T, H, V]`` write strength per value channel.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]``.
        chunk_size: C, default 64.
        cu_seqlens: int32 ``[N + 1]`` offsets of N sequences packed along T (B = 1); the states are then
            ``[N, H, K, V]``, each sequence on chunks of its own (kernels/common/varlen.run_chunk_aligned).

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in ``v.dtype`` and ``[B, H, K, V]`` float32.

    Examples::

        >>> from deltabench.references.gdn2 import make_inputs
        >>> x = make_inputs(2, 200, 4, 64, 64, dtype=torch.bfloat16)
        >>> o, ht = gdn2_torch_chunk(**x)
    """
    gates = {"g": g, "b": b, "w": w}
    return run_chunked("gdn2", per_channel_delta_chunk, q, k, v, gates, scale, initial_state, chunk_size, cu_seqlens)
