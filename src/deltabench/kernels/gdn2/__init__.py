"""Gated DeltaNet-2 (GDN-2) implementations.

Layout: q, k, g, b ``[B, T, H, K]``; v, w ``[B, T, H, V]``; state ``[B, H, K, V]`` float32; g is a per-channel
log-decay (<= 0). Per token: ``S <- Diag(exp g) S; r = S^T (b * k); S <- S + k (w * v - r)^T; o = S^T (scale q)``.

A folder per backend, each module named in the declarations below as its impl's target:

- ``torch/``: :func:`gdn2_torch_recurrent` (token-serial, fp32 state, the readable version) and
  :func:`gdn2_torch_chunk` (chunked WY/UT transform in fp32, any T), exported here;
- ``triton/``: ``triton_chunk`` for gdn2 and kda (kda is gdn2 with b = w = beta), the chunked forward in Triton
  and its backward (chunk_bwd.py), all in Triton (the Triton interpreter on the CPU); ``triton_decode`` for both
  (mode decode, the state updated in place);
- ``jax/``: ``jax_chunk``, ``jax_scan`` and, in ``jax/pallas/``, the fused Pallas kernels (gdn2's and kda's
  ``pallas_chunk``, for the TPU, and ``pallas_gpu_chunk``, for a GPU): Pallas is JAX's kernel language, so the
  folder follows the declared backend.
"""

from typing import Any

from ..common.constraints import jax_scan_memory, kv_at_most
from ..declare import JAX_DEVICES, JAX_DTYPES, TORCH_DEVICES, ImplDecl
from .torch.torch_chunk import gdn2_torch_chunk
from .torch.torch_recurrent import gdn2_torch_recurrent

__all__ = ["IMPLS", "gdn2_torch_chunk", "gdn2_torch_recurrent"]

_HERE = "deltabench.kernels.gdn2"
# The interpreter runs each (batch, head, chunk) program as XLA operations, one after another: for checking only.
_PALLAS_CPU_PROGRAMS = 256


def _interpreter_case(case: Any) -> str | None:
    """Why Pallas' interpreter on the CPU would take too long for `case` (None when it would not)."""
    programs = case.B * case.H * -(-case.T // 64)
    if case.device == "cpu" and programs > _PALLAS_CPU_PROGRAMS:
        return (
            f"on the CPU the kernel runs in Pallas' interpreter, for checking: up to {_PALLAS_CPU_PROGRAMS} "
            f"(batch, head, chunk) programs, this case has {programs}"
        )
    return None


def _pallas_gpu_case(case: Any) -> str | None:
    """Why the fused Pallas GDN-2 kernels for a GPU cannot run `case` (None when they can)."""
    if case.device == "cuda" and case.dtype == "fp32" and max(case.K, case.V) >= 128:
        # measured on the H200 (2026-12-01): Triton asked 360448 bytes of shared memory a program, 232448 allowed
        return (
            f"float32 inputs take IEEE float32 products, whose tiles at K={case.K}, V={case.V} need 352 KiB of "
            "shared memory a program (an H200 has 227 KiB); bf16 inputs run"
        )
    return _interpreter_case(case)


def pallas_case(case: Any) -> str | None:
    """Why the fused Pallas GDN-2 kernel for the TPU cannot run `case` (None when it can)."""
    if case.device == "tpu" and (case.K % 128 or case.V % 128):
        return f"Mosaic blocks of [64, K] and [64, V] need K and V multiples of 128 (got K={case.K}, V={case.V})"
    return _interpreter_case(case)


IMPLS = (
    ImplDecl(
        "gdn2",
        "torch_recurrent",
        f"{_HERE}.torch.torch_recurrent:gdn2_torch_recurrent",
        "torch",
        TORCH_DEVICES,
        varlen=True,
    ),
    ImplDecl("gdn2", "torch_chunk", f"{_HERE}.torch.torch_chunk:gdn2_torch_chunk", "torch", TORCH_DEVICES, varlen=True),
    ImplDecl(
        "gdn2",
        "torch_decode",
        f"{_HERE}.torch.torch_decode:gdn2_torch_decode",
        "torch",
        TORCH_DEVICES,
        backward=False,
        modes=("decode",),
        state_in_place=True,
        notes="decode steps (mode decode): torch_recurrent's token loop, the state updated in place",
    ),
    # Decode steps (mode decode) in Triton, kda's too (kda is gdn2 with b = w = beta): the state cache in place.
    *(
        ImplDecl(
            op,
            "triton_decode",
            f"{_HERE}.triton.decode:{op}_triton_decode",
            "triton",
            ("cuda", "cpu"),
            requires=("triton",),
            constraint=kv_at_most(256),
            backward=False,
            modes=("decode",),
            state_in_place=True,
            notes="decode steps (mode decode): one Triton launch (gating, state update and output), each token's "
            "inputs loaded during the token before; the state updated in place",
        )
        for op in ("gdn2", "kda")
    ),
    ImplDecl(
        "gdn2", "jax_chunk", f"{_HERE}.jax.jax_chunk:gdn2_jax_chunk", "jax", JAX_DEVICES, JAX_DTYPES, requires=("jax",)
    ),
    ImplDecl(
        "gdn2",
        "jax_scan",
        f"{_HERE}.jax.jax_scan:gdn2_jax_scan",
        "jax",
        JAX_DEVICES,
        JAX_DTYPES,
        requires=("jax",),
        constraint=jax_scan_memory,
        notes="associative-scan baseline: O(T K^2) memory",
    ),
    # Triton kernels (triton/): native Triton on CUDA, the Triton interpreter on the CPU; kda is gdn2 with b = w = beta.
    *(
        ImplDecl(
            op,
            "triton_chunk",
            f"{_HERE}.triton.chunk:{op}_triton_chunk",
            "triton",
            ("cuda", "cpu"),
            requires=("triton",),
            constraint=kv_at_most(256),
            varlen=True,
            notes="chunked forward (C = 64; scores, inverse, apply, walk kernels) and backward (reverse state "
            "walk, local and pairwise-score gradient kernels), all in Triton; packed sequences walked one by one",
        )
        for op in ("gdn2", "kda")
    ),
    # Pallas kernels (jax/pallas/): Mosaic on a TPU, Pallas' interpreter on the CPU; kda is gdn2 with b = w = beta.
    *(
        ImplDecl(
            op,
            "pallas_chunk",
            f"{_HERE}.jax.pallas.chunk:{op}_pallas_chunk",
            "jax",
            ("cpu", "tpu"),
            JAX_DTYPES,
            requires=("jax",),
            constraint=pallas_case,
            compiles_per_shape=True,  # Mosaic / Triton lowering, a compile per length (about a minute on an H200)
            notes="fused Pallas forward and backward kernels (Mosaic on a TPU; the interpreter on the CPU)",
        )
        for op in ("gdn2", "kda")
    ),
    # the same algebra for a GPU (Pallas' Triton lowering): the chunk loop inside each (batch, head) program
    *(
        ImplDecl(
            op,
            "pallas_gpu_chunk",
            f"{_HERE}.jax.pallas.gpu_chunk:{op}_pallas_gpu_chunk",
            "jax",
            ("cpu", "cuda"),
            JAX_DTYPES,
            requires=("jax",),
            constraint=_pallas_gpu_case,
            compiles_per_shape=True,
            notes="fused Pallas forward and backward kernels for a GPU (Triton on CUDA; the interpreter on the CPU)",
        )
        for op in ("gdn2", "kda")
    ),
)
