"""Stages of the chunked WY/UT-transform delta rule, shared by gdn, gdn2 and kda.

Within a chunk of C tokens (state ``S0`` at its start, within-chunk cumulative log-decay ``G``), every op here
unrolls to the same three steps (derivation in each op's ``torch_chunk`` module):

1. **UT transform**: the delta rule's per-token corrections ``u_i`` depend on the earlier ones of the chunk
   through a strictly lower-triangular ``A``; ``(I + A) U = R - W' S0`` is solved once per chunk for the two
   right-hand sides, ``U0 = (I + A)^-1 R`` and ``W = (I + A)^-1 W'``, so that ``U = U0 - W S0``.
2. **Output**: ``O = Q_dec S0 + A_qk U`` (``A_qk`` the causal, decayed q-k scores, diagonal included).
3. **State**: ``S <- decay_last * S0 + K_dec^T U``.

Only step 1's solve and the scan over chunks (steps 2-3 need the state) are shared; the op-specific parts build
``A``, ``A_qk`` and the decayed operands. Packed sequences laid out chunk-aligned in one row (varlen.chunk_layout)
share every step but the scan, which carries one state a sequence over that sequence's chunks alone.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .varlen import ChunkLayout

__all__ = ["chunk_scan", "ut_solve"]


def ut_solve(a_kk: torch.Tensor, *rhs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Apply ``(I + A)^-1`` to each right-hand side, ``A`` strictly lower-triangular (the UT transform).

    Args:
        a_kk: ``[..., C, C]``; only its strictly lower triangle is read (the unit diagonal is implied).
        rhs: tensors ``[..., C, D_r]`` sharing ``a_kk``'s batch dims.

    Returns:
        One solution per right-hand side, same shapes as given.
    """
    widths = [r.shape[-1] for r in rhs]
    # unitriangular=True reads the diagonal as ones, so A's own (zero) diagonal stands for I + A.
    solved = torch.linalg.solve_triangular(a_kk, torch.cat(rhs, dim=-1), upper=False, unitriangular=True)
    return tuple(solved.split(widths, dim=-1))


def chunk_scan(
    u0: torch.Tensor,
    w: torch.Tensor,
    q_dec: torch.Tensor,
    a_qk: torch.Tensor,
    k_dec: torch.Tensor,
    decay_last: torch.Tensor,
    initial_state: torch.Tensor | None,
    runs: ChunkLayout | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Carry the state across chunks and produce each chunk's output (the only sequential part).

    Args:
        u0: ``[B, H, N, C, V]``, ``(I + A)^-1 R``: the corrections if the chunk started from a zero state.
        w: ``[B, H, N, C, K]``, ``(I + A)^-1 W'``: how the starting state feeds the corrections.
        q_dec: ``[B, H, N, C, K]``, scaled queries decayed from the chunk start, ``exp(G_i) * scale * q_i``.
        a_qk: ``[B, H, N, C, C]``, causal scores ``scale * sum_c q_ic k_jc exp(G_ic - G_jc)`` (``i >= j``).
        k_dec: ``[B, H, N, C, K]``, keys decayed to the chunk end, ``exp(G_last - G_j) * k_j``.
        decay_last: ``[B, H, N, K, 1]`` (per channel) or ``[B, H, N, 1, 1]`` (scalar): ``exp(G_last)``.
        initial_state: ``[B, H, K, V]`` or None for zeros (with `runs`: ``[S, H, K, V]``, a row a sequence).
        runs: packed sequences on a chunk-aligned row (B = 1): sequence s owns the ``runs.counts[s]`` chunks from
            ``sum(runs.counts[:s])`` and its own state.

    Returns:
        ``(o, final_state)``: float32 ``[B, H, N, C, V]`` and ``[B, H, K, V]`` (with `runs`: ``[S, H, K, V]``).
    """
    if runs is not None:
        return _packed_scan(u0, w, q_dec, a_qk, k_dec, decay_last, initial_state, runs.counts)
    B, H, N, _, K = w.shape
    V = u0.shape[-1]
    if initial_state is None:
        state = u0.new_zeros(B, H, K, V)
    else:
        state = initial_state.to(torch.float32)
    outs = []
    for n in range(N):
        o, state = _step(state, *(x[:, :, n] for x in (u0, w, q_dec, a_qk, k_dec, decay_last)))
        outs.append(o)
    return torch.stack(outs, dim=2), state


def _step(
    state: torch.Tensor,
    u0: torch.Tensor,
    w: torch.Tensor,
    q_dec: torch.Tensor,
    a_qk: torch.Tensor,
    k_dec: torch.Tensor,
    decay_last: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk from `state`: ``(its output, the state after it)``, the operands one chunk's of :func:`chunk_scan`."""
    u = u0 - w @ state
    return q_dec @ state + a_qk @ u, decay_last * state + k_dec.transpose(-1, -2) @ u


def _packed_scan(
    u0: torch.Tensor,
    w: torch.Tensor,
    q_dec: torch.Tensor,
    a_qk: torch.Tensor,
    k_dec: torch.Tensor,
    decay_last: torch.Tensor,
    initial_state: torch.Tensor | None,
    counts: tuple[int, ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`chunk_scan` over packed sequences of `counts` chunks each (one row): step j takes chunk j of every
    sequence that has one, batched. The sequences go longest first, so those still walking at step j are the first
    ones: their states a prefix of the batch, the others' carried as they are."""
    _, H, _, _, K = w.shape
    V = u0.shape[-1]
    first = list(itertools.accumulate(counts, initial=0))
    order = sorted(range(len(counts)), key=lambda s: -counts[s])
    walking = [sum(counts[s] > j for s in order) for j in range(counts[order[0]])]  # sequences at step j
    steps = [first[s] + j for j, m in enumerate(walking) for s in order[:m]]  # the row's chunks in walk order
    # every index the walk needs, made on the host and moved in one copy (a copy a step would wait for the GPU)
    back = sorted(range(len(steps)), key=steps.__getitem__)
    index = torch.tensor(steps + back + sorted(range(len(order)), key=order.__getitem__), device=u0.device)
    if initial_state is None:
        state = u0.new_zeros(len(counts), H, K, V)
    else:
        state = initial_state.to(torch.float32)[index[-len(order) :].argsort()]
    # every operand chunk-major, [N, H, ...], so that one step's chunks are gathered along dim 0
    u0, w, q_dec, a_qk, k_dec, decay_last = (x[0].transpose(0, 1) for x in (u0, w, q_dec, a_qk, k_dec, decay_last))
    outs, at = [], 0
    for m in walking:
        idx = index[at : at + m]
        o, S = _step(state[:m], *(x[idx] for x in (u0, w, q_dec, a_qk, k_dec, decay_last)))
        outs.append(o)
        state = torch.cat([S, state[m:]])
        at += m
    o = torch.cat(outs)[index[at : 2 * at]]  # back to the row's chunk order
    return o.transpose(0, 1)[None], state[index[2 * at :]]
