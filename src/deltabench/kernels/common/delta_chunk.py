"""Stages of the chunked WY/UT-transform delta rule, shared by gdn, gdn2 and kda.

Within a chunk of C tokens (state ``S0`` at its start, within-chunk cumulative log-decay ``G``), every op here
unrolls to the same three steps (derivation in each op's ``torch_chunk`` module):

1. **UT transform**: the delta rule's per-token corrections ``u_i`` depend on the earlier ones of the chunk
   through a strictly lower-triangular ``A``; ``(I + A) U = R - W' S0`` is solved once per chunk for the two
   right-hand sides, ``U0 = (I + A)^-1 R`` and ``W = (I + A)^-1 W'``, so that ``U = U0 - W S0``.
2. **Output**: ``O = Q_dec S0 + A_qk U`` (``A_qk`` the causal, decayed q-k scores, diagonal included).
3. **State**: ``S <- decay_last * S0 + K_dec^T U``.

Only step 1's solve and the scan over chunks (steps 2-3 need the state) are shared; the op-specific parts build
``A``, ``A_qk`` and the decayed operands.
"""

from __future__ import annotations

import torch

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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Carry the state across chunks and produce each chunk's output (the only sequential part).

    Args:
        u0: ``[B, H, N, C, V]``, ``(I + A)^-1 R``: the corrections if the chunk started from a zero state.
        w: ``[B, H, N, C, K]``, ``(I + A)^-1 W'``: how the starting state feeds the corrections.
        q_dec: ``[B, H, N, C, K]``, scaled queries decayed from the chunk start, ``exp(G_i) * scale * q_i``.
        a_qk: ``[B, H, N, C, C]``, causal scores ``scale * sum_c q_ic k_jc exp(G_ic - G_jc)`` (``i >= j``).
        k_dec: ``[B, H, N, C, K]``, keys decayed to the chunk end, ``exp(G_last - G_j) * k_j``.
        decay_last: ``[B, H, N, K, 1]`` (per channel) or ``[B, H, N, 1, 1]`` (scalar): ``exp(G_last)``.
        initial_state: ``[B, H, K, V]`` or None for zeros.

    Returns:
        ``(o, final_state)``: float32 ``[B, H, N, C, V]`` and ``[B, H, K, V]``.
    """
    B, H, N, _, K = w.shape
    V = u0.shape[-1]
    if initial_state is None:
        state = u0.new_zeros(B, H, K, V)
    else:
        state = initial_state.to(torch.float32)
    outs = []
    for n in range(N):
        u = u0[:, :, n] - w[:, :, n] @ state
        outs.append(q_dec[:, :, n] @ state + a_qk[:, :, n] @ u)
        state = decay_last[:, :, n] * state + k_dec[:, :, n].transpose(-1, -2) @ u
    return torch.stack(outs, dim=2), state
