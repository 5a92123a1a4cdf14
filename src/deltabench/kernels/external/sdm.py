"""Adapters for sparse-delta-memory 2.0.0 (PyPI ``sparse-delta-memory``, module ``sparse_delta_memory``): its
chunked op ``memory_ops.sdm_write_read``, its single-token ``decode.sdm_decode_step`` and its
``product_key_topk.product_key_topk``, with deltabench's sdm / pk_topk signatures.

The package computes the op of references/sdm.py; its conventions differ from deltabench's, bridged here:

* streams: it runs P parallel streams over one 2-D bank ``[P * S, D]`` whose stream p owns rows
  ``[p S, (p + 1) S)``, with inputs ``[P, T, ...]`` and global row ids (``num_parallel=P, num_memory_slots=S``,
  as its layer calls it). Each (batch row, head) is one stream, ``p = b H + h``: inputs are permuted from
  ``[B, T, H, ...]`` to ``[B H, T, ...]`` and the indices offset by ``p S``; its readings ``[P T, D]`` come back as
  ``y [B, T, H, D]``;
* gates: ``beta`` and ``g`` are ``[..., 1]`` float32; key-weighted decay takes ``g`` per write, ``[..., W]``, the
  product ``g * k_val`` in float32 (as its layer forms it, so the gradient reaches g and k_val through autograd);
* bank: it advances the bank in place and its backward restores it in place, so the adapter hands it a float32
  copy of the initial bank (zeros without one) and returns a copy of the advanced bank as the final state;
* dtypes: k_val, q_val and v are used in the bank's dtype (float32 here, deltabench's bank), so bf16 and fp32
  inputs go in as they are; the readings (float32) are cast to v's dtype.

Its backward starts from a zero bank gradient: the final bank is not an output of its autograd function, so the
final state returned here carries no gradient (the impl is declared ``state_grad=False``; the gate then puts the
cotangent on y alone, for the impl and its reference). A second backward through one call raises in the package,
so mode ``bwd`` (a backward replayed over one graph) is refused.

The package has no CPU path: its op, decode step and top-k check for CUDA tensors and its op and top-k build CUDA
extensions on their first call (about 6 to 10 minutes with a cold ``TORCH_EXTENSIONS_DIR``). It declares
Python >= 3.12, torch 2.13.0 and triton 3.7.1; where it does not import, the impl is unsupported with the import's
error as the reason. Which (head dim, chunk, GPU) its kernels have a plan for is decided on the GPU, at the call: a
call without one raises its ``UnsupportedConfigurationError`` (a ValueError naming the reason) before any work.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import Any

import torch

from ...references.sdm import check_factors, check_sdm_inputs
from ..declare import ImplDecl

__all__ = [
    "IMPLS",
    "MAX_WIDTH",
    "import_failure",
    "pk_topk_sdm_package",
    "sdm_decode_step_package",
    "sdm_package_chunk",
]

MAX_WIDTH = 256  # write and read slots per token sdm_write_read and sdm_decode_step take (its MAX_WIDTH)
_CHUNKS = (16, 256)  # the chunk sizes sdm_write_read takes (its MIN_CHUNK, MAX_CHUNK)
_ROWS = 2**31  # its kernels address bank rows and padded token rows in int32


@functools.cache
def import_failure() -> str | None:
    """Why ``sparse_delta_memory`` does not import here (its first line), or None when it does."""
    try:
        importlib.import_module("sparse_delta_memory.memory_ops")
    except Exception as exc:  # any import failure is the reason the impl cannot run
        return f"sparse_delta_memory does not import: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _streams(x: torch.Tensor) -> torch.Tensor:
    """``[B, T, H, ...]`` as the package's streams ``[B H, T, ...]`` (stream ``b H + h``), contiguous."""
    B, T, H = x.shape[:3]
    return x.transpose(1, 2).reshape(B * H, T, *x.shape[3:]).contiguous()


def _global_rows(idx: torch.Tensor, S: int) -> torch.Tensor:
    """Stream-local slot ids ``[B, T, H, n]`` as the package's rows ``[B H, T, n]`` of the shared 2-D bank."""
    B, _, H = idx.shape[:3]
    offset = torch.arange(B * H, device=idx.device, dtype=torch.int64).view(B * H, 1, 1) * S
    return _streams(idx.long()) + offset


def _gates(g: torch.Tensor, beta: torch.Tensor, k_val: torch.Tensor, key_weighted_decay: bool):
    """The package's ``(g, beta)``: float32 ``[B H, T, 1]``, g ``[B H, T, W]`` per write with key-weighted decay."""
    g32 = g.float()
    g_in = g32[..., None] * k_val.float() if key_weighted_decay else g32[..., None]
    return _streams(g_in), _streams(beta.float()[..., None])


def to_package(
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    bank: torch.Tensor,
    key_weighted_decay: bool,
) -> tuple[torch.Tensor, ...]:
    """deltabench's sdm arguments (``[B, T, H, ...]``, bank ``[B, H, S, D]``) as the package's positional ones,
    ``(memory, k_idx, k_val, v, beta, g, q_idx, q_val)``: a fresh float32 ``[B H S, D]`` bank and ``[B H, T, ...]``
    stream inputs with global row ids. Differentiable in every float input."""
    S = bank.shape[2]
    memory = bank.to(torch.float32).reshape(-1, bank.shape[-1]).clone()
    g_in, beta_in = _gates(g, beta, k_val, key_weighted_decay)
    kw, qv = _streams(k_val), _streams(q_val)
    return memory, _global_rows(k_idx, S), kw, _streams(v), beta_in, g_in, _global_rows(q_idx, S), qv


def sdm_package_chunk(
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_bank: torch.Tensor | None = None,
    key_weighted_decay: bool = False,
    *,
    num_slots: int | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SDM through sparse-delta-memory 2.0.0's ``sdm_write_read`` (CUDA; bitwise deterministic by its design).

    Args:
        k_idx, k_val: ``[B, T, H, W]`` distinct write slots (int64) and weights, W <= 256.
        q_idx, q_val: ``[B, T, H, R]`` read slots and weights, R <= 256.
        v: ``[B, T, H, D]`` bf16 or fp32; g: ``[B, T, H]`` log-decay; beta: ``[B, T, H]``.
        initial_bank: optional ``[B, H, S, D]`` (zeros otherwise; then ``num_slots`` gives S); not modified.
        key_weighted_decay: the decay of write n is ``exp(g_t * k_val[n])``.
        chunk_size: its C, 16..256 (default 64, its default).

    Returns:
        ``(y, final_bank)``: ``[B, T, H, D]`` in ``v.dtype`` and ``[B, H, S, D]`` float32 (no gradient: see the
        module docstring).

    Raises:
        ValueError: a shape, an index, W or R > S, a repeated write slot or a negative write weight under
            key-weighted decay (deltabench's check, one line).
    """
    B, T, H, S, D, _, _ = check_sdm_inputs(
        k_idx, k_val, q_idx, q_val, v, g, beta, initial_bank, num_slots, key_weighted_decay=key_weighted_decay
    )
    from sparse_delta_memory.memory_ops import sdm_write_read

    bank = initial_bank if initial_bank is not None else v.new_zeros(B, H, S, D, dtype=torch.float32)
    memory, *args = to_package(k_idx, k_val, q_idx, q_val, v, g, beta, bank, key_weighted_decay)
    readings = sdm_write_read(
        memory,
        *args,
        chunk_size=chunk_size,
        num_memory_slots=S,
        num_parallel=B * H,
        key_weighted_decay=key_weighted_decay,
    )
    y = readings.view(B, H, T, D).transpose(1, 2).to(v.dtype)
    # A copy: the package's backward restores `memory` to the initial bank in place.
    return y, memory.detach().view(B, H, S, D).clone()


def sdm_decode_step_package(
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    bank: torch.Tensor,
    key_weighted_decay: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token through sparse-delta-memory 2.0.0's ``sdm_decode_step`` (CUDA, no gradient), with the signature
    of deltabench's :func:`deltabench.kernels.sdm.sdm_decode_step`: ``[B, H, ...]`` inputs, ``bank [B, H, S, D]``
    (not modified); returns ``(y [B, H, D] in v.dtype, new bank [B, H, S, D] float32)``."""
    seq_args = (x[:, None] for x in (k_idx, k_val, q_idx, q_val, v, g, beta))
    check_sdm_inputs(*seq_args, initial_bank=bank, key_weighted_decay=key_weighted_decay)
    from sparse_delta_memory.decode import sdm_decode_step

    B, H, S, D = bank.shape
    seq = [x[:, None] for x in (k_idx, k_val, q_idx, q_val, v, g, beta)]  # as [B, T=1, H, ...]
    memory, kr, kw, vv, b_in, g_in, qr, qv = to_package(*seq, bank, key_weighted_decay)
    with torch.no_grad():
        readings = sdm_decode_step(memory, kr, kw, vv, b_in, g_in, qr, qv)
    return readings.reshape(B, H, D).to(v.dtype), memory.view(B, H, S, D)


def pk_topk_sdm_package(
    raw: torch.Tensor, factors: Sequence[int], k: int, *, num_slots: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Product-key top-k through sparse-delta-memory 2.0.0's ``product_key_topk`` (CUDA, bf16 or fp32 raw scores,
    1 <= k <= 256), with the signature of :func:`deltabench.kernels.sdm.pk_topk_torch`: ``(val, idx)`` each
    ``[..., min(k, S)]``, idx int64 ascending, val differentiable to raw."""
    dims = check_factors(factors, num_slots)
    if raw.shape[-1] != sum(dims):
        raise ValueError(f"raw's last dim {raw.shape[-1]} is not the sum of the factor widths {list(dims)}")
    if not 1 <= k <= MAX_WIDTH:
        raise ValueError(f"k must be in 1..{MAX_WIDTH} for sparse-delta-memory's top-k, got {k}")
    from sparse_delta_memory.product_key_topk import product_key_topk

    return product_key_topk(raw, dims, k)


def _package_case(case: Any) -> str | None:
    """Why sdm_write_read cannot run `case`: its widths, its int32 row ids, mode bwd, or the package's import."""
    dims = case.dims
    if max(dims["W"], dims["R"]) > MAX_WIDTH:
        return f"sparse-delta-memory takes at most {MAX_WIDTH} write and read slots per token"
    streams = dims["B"] * dims["H"]
    if streams * dims["S"] >= _ROWS or streams * -(-dims["T"] // 64) * 64 >= _ROWS:
        return "sparse-delta-memory addresses bank rows and padded token rows in int32 (B*H*S and B*H*T < 2^31)"
    if case.mode == "bwd":
        return "sparse-delta-memory's backward runs once per call (its backward restores the bank in place)"
    return import_failure()


IMPLS = (
    ImplDecl(
        "sdm",
        "sdm_pkg_chunk",
        f"{__name__}:sdm_package_chunk",
        backend="cuda",
        devices=("cuda",),
        # its bank here is float32 (deltabench's); fp16 inputs are outside its tested dtypes (bf16, fp32)
        dtypes=("fp32", "bf16"),
        requires=("sparse_delta_memory",),
        constraint=_package_case,
        state_grad=False,
        notes=(
            "sparse-delta-memory 2.0.0 sdm_write_read (C = 64, float32 bank, one stream per batch row and head); "
            "its final bank carries no gradient"
        ),
    ),
)
