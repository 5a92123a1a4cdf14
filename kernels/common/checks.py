"""Argument checks shared by the PyTorch implementations (one clear ValueError instead of a broadcast error)."""

from __future__ import annotations

import torch

__all__ = ["check_inputs"]


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: dict[str, tuple[torch.Tensor, str]],
    initial_state: torch.Tensor | None,
) -> tuple[int, int, int, int, int]:
    """Check the op's shapes and return ``(B, T, H, K, V)``.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
        gates: name -> (tensor, expected layout), the layout one of ``"BTH"``, ``"BTHK"``, ``"BTHV"``.
        initial_state: None or ``[B, H, K, V]``.

    Raises:
        ValueError: naming the first argument whose shape breaks the contract.
    """
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {tuple(q.shape)}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    dims = {"B": B, "T": T, "H": H, "K": K, "V": V}
    expected = {"k": (k, "BTHK"), "v": (v, "BTHV"), **gates}
    for name, (x, layout) in expected.items():
        want = tuple(dims[c] for c in layout)
        if tuple(x.shape) != want:
            raise ValueError(f"{name} must be [{', '.join(layout)}] = {want}, got {tuple(x.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (B, H, K, V):
        raise ValueError(f"initial_state must be [B, H, K, V] = {(B, H, K, V)}, got {tuple(initial_state.shape)}")
    return B, T, H, K, V
