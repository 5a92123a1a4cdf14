"""Sparse Delta Memory (SDM) implementations.

Layout: ``k_idx, k_val [B, T, H, W]`` write slots and weights; ``q_idx, q_val [B, T, H, R]`` read slots and weights;
``v [B, T, H, D]``; ``g, beta [B, T, H]``; bank ``[B, H, S, D]`` float32. Per token: decay the written slots once,
``u = beta (v - sum_n k_val[n] M[k_idx[n]])``, ``M[k_idx[n]] += k_val[n] u``, ``y = sum_m q_val[m] M[q_idx[m]]``.

- :func:`sdm_torch_recurrent` (``torch_recurrent.py``): token-serial, fp32 bank, the readable version;
- :func:`sdm_torch_chunk` (``torch_chunk.py``): chunked WY form (sorted entries, per-slot segmented decay scans,
  Gram matrices, a triangular solve), any T;
- :func:`sdm_decode_step` (``decode.py``): one token;
- :func:`pk_topk_torch` (``pk_topk.py``): product-key top-k with SDM 2.0.0's selection rule;
- ``sdm_triton_chunk`` (``triton_chunk.py``, imported on its own: it needs triton): the deterministic Triton forward.
"""

from .decode import sdm_decode_step
from .pk_topk import pk_topk_torch
from .torch_chunk import sdm_torch_chunk
from .torch_recurrent import sdm_torch_recurrent

__all__ = ["pk_topk_torch", "sdm_decode_step", "sdm_torch_chunk", "sdm_torch_recurrent"]
