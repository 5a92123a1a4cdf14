"""deltabench's Pallas GDN-2 for a GPU (and KDA through it): the kernels of :mod:`.gpu` under one
``jax.custom_vjp``; the forward stores the state at every chunk start and its chunks' prepared work, which the
backward reads back.

Where it runs: compiled by Pallas' Triton lowering on a GPU; in Pallas' interpreter on the CPU (the same kernel
body as XLA operations: for checking, not for speed); ``interpret=None`` picks per platform when the program is
lowered. Any T, K, V (padded to whole chunks and to powers of two inside).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ....common.jax.jax_bridge import TorchFacingJaxOp
from .chunk import _per_platform
from .forward import CHUNK
from .gpu import DOTS, gdn2_gpu_backward, gdn2_gpu_forward

__all__ = [
    "BLOCK_V",
    "GRADS_WARPS",
    "WALK_WARPS",
    "chunk_gdn2_pallas_gpu",
    "chunk_kda_pallas_gpu",
    "gdn2_pallas_gpu_chunk",
    "kda_pallas_gpu_chunk",
]

# The default tiling, from the H200 (benchmarks/NOTES.md, 2026-12-02 19:35; bf16 B8 T4096 H6 d128): the walks at
# 64 value columns and 8 warps a program ran 0.65 / 0.89 ms (forward / cotangent) against 2.76 / 2.12 at all 128
# columns and 4 warps; the gradient kernel, holding two [V, K] states a program, ran 1.6 ms faster at 8 warps.
BLOCK_V = 64
WALK_WARPS = 8
GRADS_WARPS = 8


def _run(kernel, *args, interpret, tiling, **params):
    """A kernel of :mod:`.gpu`, compiled (Triton) or interpreted, with the static `tiling` items as parameters."""
    return _per_platform(kernel, *args, interpret=interpret, **dict(tiling), **params)


def _forward(tiling):
    """The tiling items the forward takes (the gradient kernel's own warps are the backward's alone)."""
    return tuple(item for item in tiling if item[0] != "grads_warps")


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _gdn2_gpu(q, k, v, g, b, w, h0, scale, interpret, tiling):
    h0_t = jnp.swapaxes(h0.astype(jnp.float32), -1, -2)
    o, ht_t = _run(gdn2_gpu_forward, q, k, v, g, b, w, h0_t, interpret=interpret, tiling=_forward(tiling), scale=scale)
    return o, jnp.swapaxes(ht_t, -1, -2)


def _gdn2_gpu_fwd(q, k, v, g, b, w, h0, scale, interpret, tiling):
    h0_t = jnp.swapaxes(h0.astype(jnp.float32), -1, -2)
    o, ht_t, states_t, prepared = _run(
        gdn2_gpu_forward, q, k, v, g, b, w, h0_t, interpret=interpret, tiling=_forward(tiling), scale=scale,
        store_states=True,
    )  # fmt: skip
    return (o, jnp.swapaxes(ht_t, -1, -2)), ((q, k, v, g, b, w), states_t, prepared, h0)


def _gdn2_gpu_bwd(scale, interpret, tiling, residuals, cotangents):
    inputs, states_t, prepared, h0 = residuals
    do, d_final = cotangents
    d_final_t = jnp.swapaxes(d_final.astype(jnp.float32), -1, -2)
    *grads, dh0_t = _run(
        gdn2_gpu_backward, *inputs, do, states_t, d_final_t, prepared, interpret=interpret, tiling=tiling, scale=scale
    )
    grads = tuple(gr.astype(x.dtype) for gr, x in zip(grads, inputs, strict=True))
    return (*grads, jnp.swapaxes(dh0_t, -1, -2).astype(h0.dtype))


_gdn2_gpu.defvjp(_gdn2_gpu_fwd, _gdn2_gpu_bwd)


def chunk_gdn2_pallas_gpu(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    b: jax.Array,
    w: jax.Array,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    *,
    chunk_size: int = CHUNK,
    block_v: int | None = BLOCK_V,
    num_warps: int = 4,
    num_stages: int = 1,
    dots: str | None = None,
    interpret: bool | None = None,
    grads_warps: int | None = GRADS_WARPS,
    walk_warps: int | None = WALK_WARPS,
) -> tuple[jax.Array, jax.Array]:
    """Gated DeltaNet-2 through deltabench's fused Pallas GPU kernels; differentiable (``jax.custom_vjp``).

    Args:
        q, k: ``[B, T, H, K]``.
        v: ``[B, T, H, V]``.
        g: ``[B, T, H, K]`` per-channel log-decay (<= 0).
        b: ``[B, T, H, K]`` erase strength per key channel.
        w: ``[B, T, H, V]`` write strength per value channel.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]``.
        chunk_size: tokens per chunk (default 64; a power of two, >= 16).
        block_v: value columns a program of the two walks (a power of two; None: all of V, a program per (batch,
            head)). Default :data:`BLOCK_V`.
        num_warps: Triton warps a program of the per-chunk kernels.
        num_stages: Triton's software pipelining depth (1: none; see :func:`.gpu.gdn2_gpu_forward`).
        dots: how the kernels' matrix products run: ``"fp32"`` (Triton's IEEE float32 dot), ``"bf16x3"`` (three
            bf16 tensor-core products, float32 accumulation: about 16 significant bits a product) or ``"bf16"``
            (one, on operands rounded to bf16; :data:`.gpu.DOTS`). Default: ``"bf16"`` for bf16 and fp16 inputs
            (the precision of FLA's kernels for them), ``"fp32"`` for float32 ones.
        interpret: True runs Pallas' interpreter, False compiles with Triton (GPU), None (default) picks by
            platform: the interpreter on the CPU, Triton elsewhere.
        grads_warps: Triton warps of the backward's gradient kernel alone (it holds two ``[V, K]`` states a
            program; :func:`.gpu.gdn2_gpu_backward`); None: `num_warps`. Default :data:`GRADS_WARPS`.
        walk_warps: Triton warps of the two walks; None: `num_warps`. Default :data:`WALK_WARPS`.

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in v's dtype and ``[B, H, K, V]`` float32.

    Examples::

        >>> o, ht = jax.jit(chunk_gdn2_pallas_gpu)(q, k, v, g, b, w)
    """
    B, _, H, K = q.shape
    V = v.shape[-1]
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two >= 16 (Triton tiles), got {chunk_size}")
    if dots is None:
        dots = "fp32" if q.dtype == jnp.float32 else "bf16"
    if dots not in DOTS:
        raise ValueError(f"dots must be one of {DOTS}, got {dots!r}")
    scale = K**-0.5 if scale is None else float(scale)
    h0 = jnp.zeros((B, H, K, V), jnp.float32) if initial_state is None else initial_state
    tiling = (("chunk", chunk_size), ("block_v", block_v), ("num_warps", num_warps), ("num_stages", num_stages))
    tiling += (("dots", dots), ("grads_warps", grads_warps), ("walk_warps", walk_warps))
    return _gdn2_gpu(q, k, v, g, b, w, h0, scale, interpret, tiling)


def chunk_kda_pallas_gpu(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    scale: float | None = None,
    initial_state: jax.Array | None = None,
    *,
    chunk_size: int = CHUNK,
    block_v: int | None = BLOCK_V,
    num_warps: int = 4,
    num_stages: int = 1,
    dots: str | None = None,
    interpret: bool | None = None,
    grads_warps: int | None = GRADS_WARPS,
    walk_warps: int | None = WALK_WARPS,
) -> tuple[jax.Array, jax.Array]:
    """Kimi Delta Attention through the GDN-2 Pallas GPU kernels, with ``b = w = beta`` broadcast over the channels.

    Args:
        q, k, g: ``[B, T, H, K]`` (g a per-channel log-decay <= 0); v ``[B, T, H, V]``; beta ``[B, T, H]``.
        scale, initial_state, chunk_size, block_v, num_warps, num_stages, dots, interpret, grads_warps,
            walk_warps: as :func:`chunk_gdn2_pallas_gpu`.

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` in v's dtype and ``[B, H, K, V]`` float32.
    """
    # broadcast in float32 (the values are beta's exactly): the broadcast's gradient sums db over K and dw over V,
    # which in bf16 rounded each term and the running sum (kda dbeta 1.1e-2 at bf16, 3x torch_chunk's)
    beta32 = beta.astype(jnp.float32)
    b = jnp.broadcast_to(beta32[..., None], k.shape)
    w = jnp.broadcast_to(beta32[..., None], v.shape)
    return chunk_gdn2_pallas_gpu(
        q, k, v, g, b, w, scale, initial_state,
        chunk_size=chunk_size, block_v=block_v, num_warps=num_warps, num_stages=num_stages, dots=dots,
        interpret=interpret, grads_warps=grads_warps, walk_warps=walk_warps,
    )  # fmt: skip


gdn2_pallas_gpu_chunk = TorchFacingJaxOp(chunk_gdn2_pallas_gpu, name="gdn2/pallas_gpu_chunk", gates=("g", "b", "w"))
kda_pallas_gpu_chunk = TorchFacingJaxOp(chunk_kda_pallas_gpu, name="kda/pallas_gpu_chunk", gates=("g", "beta"))
