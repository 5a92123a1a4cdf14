"""Sparse Delta Memory (SDM) implementations.

Layout: ``k_idx, k_val [B, T, H, W]`` write slots and weights; ``q_idx, q_val [B, T, H, R]`` read slots and weights;
``v [B, T, H, D]``; ``g, beta [B, T, H]``; bank ``[B, H, S, D]`` float32. Per token: decay the written slots once,
``u = beta (v - sum_n k_val[n] M[k_idx[n]])``, ``M[k_idx[n]] += k_val[n] u``, ``y = sum_m q_val[m] M[q_idx[m]]``.

- :func:`sdm_torch_recurrent` (``torch/torch_recurrent.py``): token-serial, fp32 bank, the readable version;
- :func:`sdm_torch_chunk` (``torch/torch_chunk.py``): chunked WY form (sorted entries, per-slot segmented decay scans,
  Gram matrices, a triangular solve), any T;
- :func:`sdm_decode_step` (``torch/decode.py``): one token;
- :func:`pk_topk_torch` (``torch/pk_topk.py``): product-key top-k with SDM 2.0.0's selection rule;
- ``sdm_triton_chunk`` (``triton/triton_chunk.py``, imported on its own: it needs triton): the deterministic
  Triton forward and backward.

``IMPLS`` declares the three sdm impls to the harness (op ``sdm``); decode and pk_topk are not sequence ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..declare import TORCH_DEVICES, ImplDecl
from .torch.decode import sdm_decode_step
from .torch.pk_topk import pk_topk_torch
from .torch.torch_chunk import sdm_torch_chunk
from .torch.torch_recurrent import sdm_torch_recurrent

__all__ = [
    "CPU_TRAFFIC_CAP",
    "IMPLS",
    "INTERPRETER_ENTRY_CAP",
    "pk_topk_torch",
    "sdm_decode_step",
    "sdm_torch_chunk",
    "sdm_torch_recurrent",
]

_HERE = "deltabench.kernels.sdm"
_CHUNK = 64  # the chunk length torch_chunk and triton_chunk use when called by the harness (their default)
# On the CPU a call may move at most this many bytes through memory (whole-bank passes and, for torch_chunk, its
# per-chunk pair matrices): 8 GiB is seconds at a CPU's memory bandwidth, and the gate makes dozens of calls; a GPU
# shape (S = 65536, D = 1024: 512 MiB per bank of 2 heads) is refused with its figure instead of running for hours.
CPU_TRAFFIC_CAP = 8 * 2**30
# Under the Triton interpreter (the CPU) a case may touch at most this many (entry x column) pairs per call,
# B*T*H*(W+R)*D. The interpreter runs every program in Python: the whole gate of B1 x 40 tokens, H1, D4, W = R = 3
# took 6.7 min on a busy 2-core machine; the cap keeps GPU shapes (2^30 pairs and more) off it, with their figure.
INTERPRETER_ENTRY_CAP = 2**22
# torch_chunk's float32 pair matrices per chunk, each [B, H, C*W, C*W] or [B, H, C*R, C*W] (the slot-match masks,
# the decays of write pairs and their products, the path of each write to the chunk's end).
_PAIR_MATRICES = 6


def _bank_bytes(case: Any) -> int:
    """Bytes of the float32 bank [B, H, S, D]."""
    return case.B * case.H * case.S * case.D * 4


def _recurrent_traffic(case: Any) -> tuple[int, str]:
    """torch_recurrent's bytes per call, and why: a whole-bank pass per token."""
    return case.T * _bank_bytes(case), "each token rescales the whole bank"


def _chunk_traffic(case: Any) -> tuple[int, str]:
    """torch_chunk's bytes per call, and why: per chunk, three whole-bank passes and the pair matrices."""
    chunks, entries_w, entries_r = math.ceil(case.T / _CHUNK), _CHUNK * case.W, _CHUNK * case.R
    pairs = case.B * case.H * (entries_w + entries_r) * entries_w * 4 * _PAIR_MATRICES
    why = "each chunk rewrites the whole bank 3 times and builds its pair matrices"
    return chunks * (3 * _bank_bytes(case) + pairs), why


def _cpu_traffic(estimate: Callable[[Any], tuple[int, str]]) -> Callable[[Any], str | None]:
    """A constraint refusing CPU cases whose memory traffic per call (`estimate(case)`: bytes and why) exceeds
    :data:`CPU_TRAFFIC_CAP`; GPU cases are not limited here."""

    def constraint(case: Any) -> str | None:
        if case.device != "cpu":
            return None
        traffic, what = estimate(case)
        if traffic > CPU_TRAFFIC_CAP:
            return (
                f"on the CPU {what}: {traffic / 2**30:,.0f} GiB of memory traffic per call at this shape, over the "
                f"{CPU_TRAFFIC_CAP / 2**30:.0f} GiB a CPU case may take (run it on a GPU)"
            )
        return None

    return constraint


def _interpreted_size(case: Any) -> str | None:
    """Refuse CPU cases too large for the Triton interpreter (:data:`INTERPRETER_ENTRY_CAP`)."""
    if case.device != "cpu":
        return None
    pairs = case.B * case.T * case.H * (case.W + case.R) * case.D
    if pairs > INTERPRETER_ENTRY_CAP:
        return (
            f"on the CPU the Triton interpreter takes at most {INTERPRETER_ENTRY_CAP:,} entry-columns "
            f"B*T*H*(W+R)*D per call, this case has {pairs:,} (run it on a GPU)"
        )
    return None


IMPLS = (
    ImplDecl(
        "sdm",
        "torch_recurrent",
        f"{_HERE}.torch.torch_recurrent:sdm_torch_recurrent",
        "torch",
        TORCH_DEVICES,
        constraint=_cpu_traffic(_recurrent_traffic),
        notes="token-serial, fp32 bank; backward by autograd",
    ),
    ImplDecl(
        "sdm",
        "torch_chunk",
        f"{_HERE}.torch.torch_chunk:sdm_torch_chunk",
        "torch",
        TORCH_DEVICES,
        constraint=_cpu_traffic(_chunk_traffic),
        notes="chunked WY reference (C = 64); backward by autograd",
    ),
    ImplDecl(
        "sdm",
        "triton_chunk",
        f"{_HERE}.triton.triton_chunk:sdm_triton_chunk",
        "triton",
        # on the CPU through the Triton interpreter (TRITON_INTERPRET=1)
        ("cuda", "cpu"),
        requires=("triton",),
        constraint=_interpreted_size,
        notes="deterministic chunked forward and backward (C = 64), bitwise the same on every call",
    ),
    ImplDecl(
        "sdm",
        "torch_decode",
        f"{_HERE}.torch.torch_decode:sdm_torch_decode",
        "torch",
        TORCH_DEVICES,
        backward=False,
        constraint=_cpu_traffic(_recurrent_traffic),
        modes=("decode",),
        state_in_place=True,
        notes="decode steps: torch_recurrent's token loop, the bank updated in place",
    ),
)
