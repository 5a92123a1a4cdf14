"""Gated DeltaNet-2 (GDN-2) implementations.

Layout: q, k, g, b ``[B, T, H, K]``; v, w ``[B, T, H, V]``; state ``[B, H, K, V]`` float32; g is a per-channel
log-decay (<= 0). Per token: ``S <- Diag(exp g) S; r = S^T (b * k); S <- S + k (w * v - r)^T; o = S^T (scale q)``.

- :func:`gdn2_torch_recurrent` (``torch_recurrent.py``): token-serial, fp32 state, the readable version;
- :func:`gdn2_torch_chunk` (``torch_chunk.py``): chunked WY/UT transform in fp32, any T.
"""

from .torch_chunk import gdn2_torch_chunk
from .torch_recurrent import gdn2_torch_recurrent

__all__ = ["gdn2_torch_chunk", "gdn2_torch_recurrent"]
