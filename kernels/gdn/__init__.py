"""Gated DeltaNet (GDN) implementations.

Layout (FLA's): q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]``; state ``[B, H, K, V]`` float32;
g is a log-decay (<= 0). Per token: ``S <- exp(g) S; u = beta (v - S^T k); S <- S + k u^T; o = S^T (scale q)``.

- :func:`gdn_torch_recurrent` (``torch_recurrent.py``): token-serial, fp32 state, the readable version;
- :func:`gdn_torch_chunk` (``torch_chunk.py``): chunked WY/UT transform in fp32, any T.
"""

from .torch_chunk import gdn_torch_chunk
from .torch_recurrent import gdn_torch_recurrent

__all__ = ["gdn_torch_chunk", "gdn_torch_recurrent"]
