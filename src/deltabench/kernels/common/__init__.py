"""Helpers shared by the ops' PyTorch implementations.

- :mod:`.chunking`: the ``[B, T, H, ...] <-> [B, H, N, C, ...]`` chunk layout and the causal pairwise decays;
- :mod:`.delta_chunk`: the UT-transform solve and the scan over chunks of the WY/UT chunked delta rule;
- :mod:`.per_channel_chunk`: the chunked delta rule with per-channel decay and erase/write strengths (gdn2, kda);
- :mod:`.checks`: the op contract's shape checks, gate layouts and default query scale.
"""

from .checks import GATE_LAYOUTS, check_inputs, check_op_inputs, default_scale
from .chunking import merge_chunks, pairwise_decay, split_chunks
from .delta_chunk import chunk_scan, ut_solve
from .per_channel_chunk import per_channel_delta_chunk

__all__ = [
    "GATE_LAYOUTS",
    "check_inputs",
    "check_op_inputs",
    "chunk_scan",
    "default_scale",
    "merge_chunks",
    "pairwise_decay",
    "per_channel_delta_chunk",
    "split_chunks",
    "ut_solve",
]
