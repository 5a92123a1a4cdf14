"""Adapters for opengdn 0.1.0 (PyPI ``opengdn``): ``gated_delta_triton`` and ``gated_delta_chunkwise``.

opengdn's conventions differ from deltabench's in four ways, all bridged here:

* decay: it takes ``alpha = exp(g)`` (a factor in (0, 1]) where deltabench takes the log-decay ``g``;
* state: it lays the state out ``[B, H, V, K]``; deltabench's is ``[B, H, K, V]``, so the state is transposed in and
  out (and returned as float32);
* scale: it reads ``o_t = S_t q_t`` with no scale, so q is pre-scaled by ``scale`` (default ``K ** -0.5``);
* dtypes: every input and the state must share one dtype, so alpha, beta and the state are cast to q's dtype (for
  16-bit inputs a given initial state is rounded to that dtype: the gate judges the result). In bf16 every alpha
  within 2^-9 of 1 (a log-decay in about [-2e-3, 0], a long-memory head) rounds to exactly 1: such a head does not
  decay at all, and the gate's ``strong`` regime (half its heads near 0) rejects opengdn at bf16 for it, on the
  CPU and on an H200 alike (tests/kernels/external/test_opengdn_conventions.py, benchmarks/NOTES.md).

Its rule, ``S_t = alpha_t (S_{t-1} - beta_t (S_{t-1} k_t) k_t^T) + beta_t v_t k_t^T``, is gdn's written in the
transposed layout. There is no in-kernel normalisation to switch off.

``gated_delta_triton`` silently falls back to its chunkwise PyTorch path outside CUDA bf16 contiguous inputs; the
adapter asks which path ran and raises if it was not Triton, so the ``opengdn_triton`` impl never times the fallback.
On its K = V = 128 bf16 fast path opengdn sets ``torch.set_float32_matmul_precision("high")`` for the whole process;
the adapter restores the previous setting after the forward call so that later fp32 work (references, other impls)
keeps full precision. opengdn's backward then runs at the process's setting.
"""

from __future__ import annotations

import torch

from ..common.constraints import kv_at_most
from ..declare import ALL_DTYPES, ImplDecl

__all__ = ["IMPLS", "from_opengdn_state", "gdn_opengdn_chunkwise", "gdn_opengdn_triton", "to_opengdn"]


def to_opengdn(
    q: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None,
    initial_state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Map deltabench's (q, g, beta, scale, initial_state ``[B,H,K,V]``) to opengdn's (scaled q, alpha, beta,
    state ``[B,H,V,K]``), every tensor contiguous and in q's dtype. Differentiable, so gradients flow back."""
    K = q.shape[-1]
    scale = K**-0.5 if scale is None else scale
    dtype = q.dtype
    # exp in (at least) float32 first, so the factor is rounded to a 16-bit dtype once, at the end.
    alpha = g.to(torch.promote_types(g.dtype, torch.float32)).exp().to(dtype).contiguous()
    state = None if initial_state is None else initial_state.transpose(-1, -2).to(dtype).contiguous()
    return (q * scale).contiguous(), alpha, beta.to(dtype).contiguous(), state


def from_opengdn_state(state: torch.Tensor) -> torch.Tensor:
    """opengdn's final state ``[B, H, V, K]`` as deltabench's ``[B, H, K, V]`` float32."""
    return state.transpose(-1, -2).float()


def gdn_opengdn_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet through ``opengdn.gated_delta_triton`` (CUDA, bf16 only; raises rather than fall back).

    Args:
        q, k: ``[B, T, H, K]`` bf16 (K <= 512). v: ``[B, T, H, V]`` bf16. g: ``[B, T, H]`` log-decay.
        beta: ``[B, T, H]``. scale: default ``K ** -0.5``. initial_state: optional ``[B, H, K, V]``.

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T, H, V]`` bf16, ``final_state`` ``[B, H, K, V]`` float32.
    """
    import opengdn

    q_s, alpha, beta_c, state = to_opengdn(q, g, beta, scale, initial_state)
    precision = torch.get_float32_matmul_precision()
    try:
        o, final_state, resolution = opengdn.gated_delta_triton(
            q_s, k.contiguous(), v.contiguous(), alpha, beta_c, state, return_resolution=True
        )
    finally:
        torch.set_float32_matmul_precision(precision)
    if not resolution.uses_triton:
        raise RuntimeError(f"opengdn fell back to its chunkwise path: {resolution.reason}")
    return o, from_opengdn_state(final_state)


def gdn_opengdn_chunkwise(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet through ``opengdn.gated_delta_chunkwise`` (PyTorch, extended-WY, chunk 64; any device and
    dtype; 16-bit inputs are computed in float32 inside, results returned in q's dtype). Shapes as
    :func:`gdn_opengdn_triton`; the final state comes back float32 ``[B, H, K, V]``."""
    import opengdn

    q_s, alpha, beta_c, state = to_opengdn(q, g, beta, scale, initial_state)
    o, final_state = opengdn.gated_delta_chunkwise(q_s, k.contiguous(), v.contiguous(), alpha, beta_c, state)
    return o, from_opengdn_state(final_state)


IMPLS = (
    ImplDecl(
        "gdn",
        "opengdn_triton",
        f"{__name__}:gdn_opengdn_triton",
        backend="triton",
        devices=("cuda",),
        dtypes=("bf16",),
        constraint=kv_at_most(512, " in opengdn's Triton path"),
        requires=("opengdn", "triton"),
        notes="opengdn 0.1.0 gated_delta_triton; raises instead of falling back to its chunkwise path",
    ),
    ImplDecl(
        "gdn",
        "opengdn_chunkwise",
        f"{__name__}:gdn_opengdn_chunkwise",
        backend="torch",
        devices=("cpu", "cuda"),
        dtypes=ALL_DTYPES,
        requires=("opengdn",),
        notes="opengdn 0.1.0 gated_delta_chunkwise (PyTorch extended WY, chunk 64)",
    ),
)
