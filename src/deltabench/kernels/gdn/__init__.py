"""Gated DeltaNet (GDN) implementations.

Layout (FLA's): q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]``; state ``[B, H, K, V]`` float32;
g is a log-decay (<= 0). Per token: ``S <- exp(g) S; u = beta (v - S^T k); S <- S + k u^T; o = S^T (scale q)``.

A folder per backend, each module named in the declarations below as its impl's target:

- ``torch/``: :func:`gdn_torch_recurrent` (token-serial, fp32 state, the readable version) and
  :func:`gdn_torch_chunk` (chunked WY/UT transform in fp32, any T), exported here;
- ``triton/``: ``triton_chunk``, ``triton_chunk_split``, ``triton_chunk_auto`` (one of the two by shape),
  ``triton_recurrent``, ``triton_decode`` (mode decode, the state updated in place);
- ``torch/torch_decode.py``: ``torch_decode`` (mode decode: ``torch_recurrent``'s loop, the state updated in place);
- ``jax/``: ``jax_chunk``, ``jax_scan``.
"""

from ..common.constraints import jax_scan_memory, kv_at_most
from ..declare import JAX_DEVICES, JAX_DTYPES, TORCH_DEVICES, ImplDecl
from .torch.torch_chunk import gdn_torch_chunk
from .torch.torch_recurrent import gdn_torch_recurrent

__all__ = ["IMPLS", "gdn_torch_chunk", "gdn_torch_recurrent"]

_HERE = "deltabench.kernels.gdn"
# The Triton kernels run on the CPU through the Triton interpreter; they hold a key and a value row in one tile.
_TRITON = dict(backend="triton", devices=("cuda", "cpu"), requires=("triton",), constraint=kv_at_most(256), varlen=True)
_DECODE = dict(
    backward=False,
    modes=("decode",),
    state_in_place=True,
    varlen=False,  # one state row per batch row: decode steps of packed sequences are not a case
    notes="decode steps (mode decode), the state updated in place",
)

IMPLS = (
    ImplDecl(
        "gdn",
        "torch_recurrent",
        f"{_HERE}.torch.torch_recurrent:gdn_torch_recurrent",
        "torch",
        TORCH_DEVICES,
        varlen=True,
    ),
    ImplDecl("gdn", "torch_chunk", f"{_HERE}.torch.torch_chunk:gdn_torch_chunk", "torch", TORCH_DEVICES, varlen=True),
    ImplDecl("gdn", "triton_chunk", f"{_HERE}.triton.chunk:gdn_triton_chunk", **_TRITON),
    ImplDecl(
        "gdn",
        "triton_chunk_split",
        f"{_HERE}.triton.chunk_split:gdn_triton_chunk_split",
        **_TRITON,
        notes="split forward (state walk + parallel output); H200 times in benchmarks/NOTES.md",
    ),
    ImplDecl(
        "gdn",
        "triton_chunk_auto",
        f"{_HERE}.triton.auto:gdn_triton_chunk_auto",
        **_TRITON,
        notes="triton_chunk's or triton_chunk_split's forward picked by shape (rule and H200 times: triton/auto.py)",
    ),
    ImplDecl(
        "gdn", "triton_recurrent", f"{_HERE}.triton.fused_recurrent:gdn_triton_recurrent", **_TRITON, backward=False
    ),
    # Decode steps (mode decode): the new state written into the state cache given.
    ImplDecl("gdn", "torch_decode", f"{_HERE}.torch.torch_decode:gdn_torch_decode", "torch", TORCH_DEVICES, **_DECODE),
    ImplDecl("gdn", "triton_decode", f"{_HERE}.triton.decode:gdn_triton_decode", **{**_TRITON, **_DECODE}),
    # Torch-facing wrappers of JAX (the gate checks the JAX forward and vjp); runners.jax times `.jax_fn` natively.
    ImplDecl(
        "gdn", "jax_chunk", f"{_HERE}.jax.jax_chunk:gdn_jax_chunk", "jax", JAX_DEVICES, JAX_DTYPES, requires=("jax",)
    ),
    ImplDecl(
        "gdn",
        "jax_scan",
        f"{_HERE}.jax.jax_scan:gdn_jax_scan",
        "jax",
        JAX_DEVICES,
        JAX_DTYPES,
        requires=("jax",),
        constraint=jax_scan_memory,
        notes="associative-scan baseline: O(T K^2) memory",
    ),
)
