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

Chunked impls can do better than either (:func:`chunk_layout`, :func:`run_chunk_aligned`): the sequences laid out
chunk-aligned in one row, each starting on a chunk of its own and its last chunk zero-padded, so no chunk holds two
sequences and at most C - 1 tokens a sequence are padding. The chunk-local work then runs once over the row, and
only the scan over chunks needs the sequences (``delta_chunk.chunk_scan``'s ``runs``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .checks import check_op_inputs, default_scale

__all__ = [
    "PAD_LIMIT",
    "ChunkLayout",
    "chunk_layout",
    "from_chunks",
    "run_chunk_aligned",
    "run_chunked",
    "run_packed",
    "seq_offsets",
    "state_to_check",
    "to_chunks",
]

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
    _check_state_rows(initial_state, n)

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


class ChunkLayout(NamedTuple):
    """Packed sequences laid out chunk-aligned in one row of ``NT * chunk`` tokens.

    Attributes:
        positions: int64 ``[T]`` on the inputs' device, the row index of each packed token.
        sources: int64 ``[NT * C]`` on the inputs' device, the packed token each row holds (0 at the pads).
        pads: int64, the row indices no token takes (each sequence's last chunk's tail).
        starts: int32 ``[N + 1]`` on the inputs' device, sequence i's chunks ``[starts[i], starts[i + 1])``.
        order: int32 ``[N]`` on the inputs' device, the sequences longest first (ties: the earlier first), the
            order their walks are launched in: a GPU starts programs in launch order, and when the walks outnumber
            the programs it holds at once, the longest ones started last would end last.
        counts: the chunks of each sequence.
        chunk: C.
    """

    positions: torch.Tensor
    sources: torch.Tensor
    pads: torch.Tensor
    starts: torch.Tensor
    order: torch.Tensor
    counts: tuple[int, ...]
    chunk: int

    @property
    def NT(self) -> int:
        """The row's chunks."""
        return sum(self.counts)


# The most recent layouts, newest first, each with the cu_seqlens tensor it came from (held, so that its identity
# cannot pass to another tensor) and that tensor's version (an in-place change makes the entry stale)
_RECENT: list[tuple[torch.Tensor, int, tuple[int, int], ChunkLayout]] = []
_RECENT_KEPT = 8


def chunk_layout(cu_seqlens: torch.Tensor, T: int, chunk: int, B: int = 1) -> ChunkLayout:
    """The chunk-aligned layout of the packed sequences at `cu_seqlens` (a batch of `B` = 1 row of T tokens) in
    chunks of `chunk` tokens; the same object for the same tensor, unchanged, at the same T and chunk (the last
    few are kept: reading the offsets to the host waits for the GPU, and a model's layers share one cu_seqlens)."""
    if B != 1:
        raise ValueError(f"packed sequences (cu_seqlens) take a batch of one row, got B={B}")
    for held, version, key, layout in _RECENT:
        if held is cu_seqlens and version == cu_seqlens._version and key == (T, chunk):
            return layout
    offsets = seq_offsets(cu_seqlens, T, 1)
    counts = tuple(-(-(eos - bos) // chunk) for bos, eos in itertools.pairwise(offsets))
    starts = list(itertools.accumulate(counts, initial=0))
    bounds = itertools.pairwise(offsets)
    positions = torch.cat(
        [torch.arange(eos - bos) + c * chunk for (bos, eos), c in zip(bounds, starts[:-1], strict=True)]
    )
    taken = torch.zeros(starts[-1] * chunk, dtype=torch.bool)
    taken[positions] = True
    sources = torch.zeros(starts[-1] * chunk, dtype=torch.int64)
    sources[positions] = torch.arange(len(positions))
    device = cu_seqlens.device
    layout = ChunkLayout(
        positions.to(device),
        sources.to(device),
        (~taken).nonzero().flatten().to(device),
        torch.tensor(starts, dtype=torch.int32, device=device),
        torch.tensor(sorted(range(len(counts)), key=lambda i: -counts[i]), dtype=torch.int32, device=device),
        counts,
        chunk,
    )
    _RECENT.insert(0, (cu_seqlens, cu_seqlens._version, (T, chunk), layout))
    del _RECENT[_RECENT_KEPT:]
    return layout


def _scatter_rows(x: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """`x` ``[1, T, ...]`` in the chunk-aligned row ``[1, NT * C, ...]``: token i at ``positions[i]``, zeros at
    the pads. Made as a gather of every row from its source token, then the pads zeroed: on an H100 PyTorch's
    gather (index_select) moved 2.6 TB/s where its scatter (index_copy_) moved 1.2."""
    return x.index_select(1, layout.sources).index_fill_(1, layout.pads, 0)


class _ToChunks(torch.autograd.Function):
    """A packed input into the chunk-aligned row; its gradient gathered back."""

    @staticmethod
    def forward(ctx, x, layout):  # type: ignore[no-untyped-def]
        ctx.layout = layout
        return _scatter_rows(x, layout)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad.index_select(1, ctx.layout.positions), None


class _FromChunks(torch.autograd.Function):
    """The chunk-aligned output back to the packed tokens; its gradient scattered, zero at the pads."""

    @staticmethod
    def forward(ctx, y, layout):  # type: ignore[no-untyped-def]
        ctx.layout = layout
        return y.index_select(1, layout.positions)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return _scatter_rows(grad.contiguous(), ctx.layout), None


def to_chunks(x: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """Packed ``[1, T, ...]`` to the chunk-aligned row ``[1, NT * C, ...]`` (pads zero); differentiable."""
    return _ToChunks.apply(x, layout)


def from_chunks(y: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """The chunk-aligned row ``[1, NT * C, ...]`` back to the packed ``[1, T, ...]``; differentiable."""
    return _FromChunks.apply(y, layout)


def run_chunk_aligned(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    *seqs: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    chunk_size: int,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn(*rows, initial_state=..., chunk_size=..., runs=layout, **kwargs)`` over the chunk-aligned row.

    Args:
        fn: a chunked kernel taking the row ``[1, NT * C, ...]`` and `runs` (the :class:`ChunkLayout`, for its
            scan over each sequence's chunks), returning ``(o [1, NT * C, ...], final_state [N, ...])``.
        seqs: its positional inputs, each ``[1, T, ...]``.
        cu_seqlens: int32 ``[N + 1]`` offsets of the sequences along T.
        initial_state: ``[N, ...]`` or None.
        chunk_size: C.
        kwargs: passed to `fn` as they are.

    Returns:
        ``(o, final_state)``: ``[1, T, ...]`` and ``[N, ...]``.
    """
    layout = chunk_layout(cu_seqlens, seqs[0].shape[1], chunk_size, seqs[0].shape[0])
    _check_state_rows(initial_state, len(layout.counts))
    rows = (to_chunks(x, layout) for x in seqs)
    o, final_state = fn(*rows, initial_state=initial_state, chunk_size=chunk_size, runs=layout, **kwargs)
    return from_chunks(o, layout), final_state


def run_chunked(
    op: str,
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: dict[str, torch.Tensor],
    scale: float | None,
    initial_state: torch.Tensor | None,
    chunk_size: int,
    cu_seqlens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A chunked torch entry of `op`: its inputs checked against the op's contract (with `cu_seqlens`, a row of
    the initial state as one sequence's), the scale resolved, then ``fn(q, k, v, *gates, scale, initial_state,
    chunk_size)`` on a dense batch, or over the chunk-aligned row of packed sequences (:func:`run_chunk_aligned`,
    `fn` taking ``runs``); the output in v's dtype."""
    K = check_op_inputs(op, q, k, v, gates, state_to_check(initial_state, cu_seqlens))[3]
    scale = default_scale(scale, K)
    if cu_seqlens is None:
        o, final_state = fn(q, k, v, *gates.values(), scale, initial_state, chunk_size)
    else:
        o, final_state = run_chunk_aligned(
            fn, q, k, v, *gates.values(), cu_seqlens=cu_seqlens, initial_state=initial_state, chunk_size=chunk_size,
            scale=scale,
        )  # fmt: skip
    return o.to(v.dtype), final_state


def state_to_check(initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None) -> torch.Tensor | None:
    """What an op contract's check of a batch of one row sees of the initial state: the state itself, or with
    packed sequences its first row (one sequence's; the rows' count is checked against cu_seqlens)."""
    return initial_state if initial_state is None or cu_seqlens is None else initial_state[:1]


def _check_state_rows(initial_state: torch.Tensor | None, n: int) -> None:
    """An initial state of packed sequences has one row a sequence."""
    if initial_state is not None and initial_state.shape[0] != n:
        raise ValueError(f"initial_state has {initial_state.shape[0]} rows for {n} packed sequences")
