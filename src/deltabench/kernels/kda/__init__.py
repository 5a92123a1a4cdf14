"""Kimi Delta Attention (KDA) implementations.

Layout: q, k, g ``[B, T, H, K]``; v ``[B, T, H, V]``; beta ``[B, T, H]``; state ``[B, H, K, V]`` float32; g is a
per-channel log-decay (<= 0). Per token: ``S <- Diag(exp g) S; u = beta (v - S^T k); S <- S + k u^T;
o = S^T (scale q)``, i.e. GDN-2 with b = w = beta.

- :func:`kda_torch_recurrent` (``torch_recurrent.py``): token-serial, fp32 state, the readable version;
- :func:`kda_torch_chunk` (``torch_chunk.py``): chunked WY/UT transform in fp32, any T.

KDA's ``triton_chunk``, ``triton_decode``, ``pallas_chunk`` and ``pallas_gpu_chunk`` are GDN-2's kernels with
b = w = beta, declared in :mod:`deltabench.kernels.gdn2`.
"""

from ..declare import TORCH_DEVICES, ImplDecl
from .torch_chunk import kda_torch_chunk
from .torch_recurrent import kda_torch_recurrent

__all__ = ["IMPLS", "kda_torch_chunk", "kda_torch_recurrent"]

IMPLS = (
    ImplDecl(
        "kda",
        "torch_recurrent",
        "deltabench.kernels.kda.torch_recurrent:kda_torch_recurrent",
        "torch",
        TORCH_DEVICES,
        varlen=True,
    ),
    ImplDecl(
        "kda", "torch_chunk", "deltabench.kernels.kda.torch_chunk:kda_torch_chunk", "torch", TORCH_DEVICES, varlen=True
    ),
    ImplDecl(
        "kda",
        "torch_decode",
        "deltabench.kernels.kda.torch_decode:kda_torch_decode",
        "torch",
        TORCH_DEVICES,
        backward=False,
        modes=("decode",),
        state_in_place=True,
        notes="decode steps (mode decode): torch_recurrent's token loop, the state updated in place",
    ),
)
