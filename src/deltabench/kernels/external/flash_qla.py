"""Adapter for FlashQLA (PyPI ``flash-qla`` 0.1.3, import name ``flash_qla``): fused TileLang GDN forward and
backward for NVIDIA SM90 (Hopper), SM100/SM103 and SM120/SM121, bf16/fp16, K = V = 128.

Its ``chunk_gated_delta_rule`` takes FLA's argument order and layouts (q, k ``[B, T, H, K]``; v ``[B, T, H, V]``;
g ``[B, T, H]`` natural-log decay; beta ``[B, T, H]``; state ``[B, H, K, V]``), so the adapter passes the inputs
through with in-kernel L2 normalisation off. Importing flash_qla picks its kernels for the GPU it finds and raises on
any other, so it is imported on the first call, never at module import. Every new shape is compiled by TileLang on its
first call (3 to 50 s per kernel): a runner's warm-up absorbs that and reports it apart as compile time, and a run
on a GPU lists the kernels its gates will call by a dry run and builds them side by side first (``jit="tilelang"``,
kernels/common/jit_units.py).

FlashQLA 0.1.3 has no decode or recurrent entry point: ``chunk_gated_delta_rule`` (with its ``_fwd`` and ``_bwd``
halves) is all it exports. In mode decode (T = 1..8 new tokens from a state) the impl runs that chunk kernel, the T
tokens padded to one 64-token chunk, its new state allocated: the figure a serving engine would get from FlashQLA
alone, not a decode kernel's.
"""

from __future__ import annotations

from typing import Any

import torch

from ..declare import ImplDecl
from .fla_convention import call_fla_convention

__all__ = ["IMPLS", "SUPPORTED_ARCHS", "flash_qla_case", "gdn_flash_qla", "unsupported_reason"]

# Compute capabilities flash_qla 0.1.3 ships kernels for (its chunk/__init__.py raises on any other).
SUPPORTED_ARCHS = ((9, 0), (10, 0), (10, 3), (12, 0), (12, 1))
HEAD_DIM = 128


def unsupported_reason(
    *, K: int, V: int, device: str, capability: tuple[int, int] | None, H: int | None = None
) -> str | None:
    """Why FlashQLA cannot run a case, or None: the device, the GPU's compute capability, then K and V, then H.

    `capability` is ``torch.cuda.get_device_capability()`` of the GPU that will run it (None when unknown); `H`
    the number of heads (None: not judged).
    """
    if device != "cuda":
        return f"runs on NVIDIA GPUs only (SM90+), not {device}"
    if capability is not None and tuple(capability) not in SUPPORTED_ARCHS:
        major, minor = capability
        return f"needs an SM90+ GPU (sm_90, sm_100, sm_103, sm_120, sm_121; this is sm_{major}{minor})"
    if K != HEAD_DIM or V != HEAD_DIM:
        return f"K = V = 128 only (got K={K}, V={V})"
    if H is not None and H % 2:
        # its chunk cumsum holds an [H, 64] fragment over 128 threads: TileLang finds no layout for odd H (an H200
        # raised "no available layout found" at H = 3; every even H of the train suite runs)
        return f"an even number of heads only (got H={H}): TileLang lays out its per-head decays two heads a warp group"
    return None


def gdn_flash_qla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet through ``flash_qla.chunk_gated_delta_rule`` (with its automatic intra-card split on).

    Args:
        q, k: ``[B, T, H, 128]`` bf16 or fp16, already L2-normalised. v: ``[B, T, H, 128]``, same dtype.
        g: ``[B, T, H]`` log-decay (float32). beta: ``[B, T, H]``.
        scale: default ``K ** -0.5``. initial_state: optional ``[B, H, K, V]`` float32.
        cu_seqlens: int32 ``[N + 1]`` offsets of packed sequences (B = 1, states ``[N, H, K, V]``): FlashQLA's
            varlen path, FLA's convention.

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in v's dtype, ``final_state`` ``[B, H, K, V]`` float32.
    """
    import flash_qla

    return call_fla_convention(
        flash_qla.chunk_gated_delta_rule,
        q,
        k,
        v,
        g,
        beta,
        scale=scale,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )


def flash_qla_case(case: Any) -> str | None:
    """:func:`unsupported_reason` for a case, with the GPU's compute capability when it runs on one."""
    capability = None
    if case.device == "cuda" and torch.cuda.is_available():
        capability = torch.cuda.get_device_capability()
    return unsupported_reason(K=case.K, V=case.V, device=case.device, capability=capability, H=case.H)


IMPLS = (
    ImplDecl(
        "gdn",
        "flash_qla",
        f"{__name__}:gdn_flash_qla",
        backend="cuda",
        devices=("cuda",),
        dtypes=("bf16", "fp16"),
        constraint=flash_qla_case,
        requires=("flash_qla", "tilelang"),
        varlen=True,
        compiles_per_shape=True,  # TileLang, without autotuning: its gates side by side, a process each
        jit="tilelang",  # its kernels listed by a dry run and built side by side before its gates
        notes="FlashQLA 0.1.3 (TileLang); compiles each new shape on its first call, tens of seconds; no decode "
        "entry point: mode decode runs its chunk kernel",
    ),
)
