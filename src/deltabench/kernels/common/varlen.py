"""Packed variable-length batches (FLA's ``cu_seqlens`` convention) run through a dense kernel.

The packed batch is one row: N sequences concatenated along T at the int32 offsets ``cu_seqlens`` [N + 1], the
initial and final states one row per sequence [N, H, K, V]. :func:`run_packed` lays the sequences out as a dense
batch of N rows, each zero-padded at its end to the longest length, and runs the dense kernel on it once: every
sequence starts from its own state row and no chunk holds tokens of two sequences. A token whose inputs and gates
are all zero leaves the delta family's state unchanged (no decay, no write), so each row's final state is its
sequence's; the padded outputs are dropped. Autograd carries the gradients back through the layout.

Where padding would more than double the tokens (:data:`PAD_LIMIT`: one long sequence among many short ones, as
lengths drawn lognormal give), the kernel runs sequence by sequence instead: N calls, but memory in proportion to
the packed T, not to N times the longest (gdn2's chunked PyTorch impl at 32768 packed tokens, 19 sequences, asked
for 62 GiB padded).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["PAD_LIMIT", "run_packed", "seq_offsets"]

# The most padded tokens per packed token before run_packed calls the kernel once per sequence instead
PAD_LIMIT = 2.0


def seq_offsets(cu_seqlens: torch.Tensor, T: int, B: int) -> list[int]:
    """The offsets of `cu_seqlens` as ints, checked against a packed batch of `B` rows of `T` tokens."""
    if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be a 1-d int32 tensor of N + 1 offsets, got {cu_seqlens.dtype} {list(cu_seqlens.shape)}"
        )
    offsets = [int(x) for x in cu_seqlens.tolist()]
    if B != 1:
        raise ValueError(f"packed sequences (cu_seqlens) take a batch of one row, got B={B}")
    if offsets[0] != 0 or offsets[-1] != T or any(b <= a for a, b in itertools.pairwise(offsets)):
        raise ValueError(f"cu_seqlens {offsets} must rise strictly from 0 to T={T}")
    return offsets


def run_packed(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    *seqs: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn(*seqs, initial_state=..., **kwargs)`` (a dense delta-family kernel) over packed sequences.

    Args:
        fn: the dense kernel, ``[B, T, ...]`` inputs to ``(o [B, T, ...], final_state [B, ...])``.
        seqs: its positional inputs, each ``[1, T, ...]`` (q, k, v, then the gates).
        cu_seqlens: int32 ``[N + 1]`` offsets of the sequences along T.
        initial_state: ``[N, ...]``, one row per sequence, or None (zeros).
        kwargs: passed to `fn` as they are (``scale``, a chunk size).

    Returns:
        ``(o, final_state)``: ``[1, T, ...]`` and ``[N, ...]``.
    """
    T = seqs[0].shape[1]
    offsets = seq_offsets(cu_seqlens, T, seqs[0].shape[0])
    lengths = [b - a for a, b in itertools.pairwise(offsets)]
    n, longest = len(lengths), max(lengths)
    if initial_state is not None and initial_state.shape[0] != n:
        raise ValueError(f"initial_state has {initial_state.shape[0]} rows for {n} packed sequences")

    if n * longest > PAD_LIMIT * T:
        outs, states = [], []
        for i, (a, b) in enumerate(itertools.pairwise(offsets)):
            h0 = None if initial_state is None else initial_state[i : i + 1]
            o, ht = fn(*(x[:, a:b] for x in seqs), initial_state=h0, **kwargs)
            outs.append(o)
            states.append(ht)
        return torch.cat(outs, dim=1), torch.cat(states)

    def rows(x: torch.Tensor) -> torch.Tensor:
        pieces = []
        for a, length in zip(offsets[:-1], lengths, strict=True):
            piece = x[0, a : a + length]
            pad = piece.new_zeros(longest - length, *piece.shape[1:])
            pieces.append(torch.cat([piece, pad]))
        return torch.stack(pieces)

    o, final_state = fn(*(rows(x) for x in seqs), initial_state=initial_state, **kwargs)
    packed = torch.cat([o[i, :length] for i, length in enumerate(lengths)])
    return packed[None], final_state
