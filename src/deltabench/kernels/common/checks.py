"""Argument checks and defaults shared by the PyTorch implementations (one clear ValueError instead of a broadcast
error, and one place for the op contract's gate layouts and default query scale)."""

from __future__ import annotations

import torch

from deltabench.references import gdn as _gdn
from deltabench.references import gdn2 as _gdn2
from deltabench.references import kda as _kda

__all__ = ["GATE_LAYOUTS", "check_inputs", "check_op_inputs", "default_scale"]

# The gate layouts of each op, in argument order, read from the op's contract (references/<op>.py): the one gate list.
GATE_LAYOUTS: dict[str, dict[str, str]] = {
    c.name: {a.name: "".join(a.layout) for a in c.gates} for c in (_gdn.CONTRACT, _gdn2.CONTRACT, _kda.CONTRACT)
}


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


def check_op_inputs(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: dict[str, torch.Tensor],
    initial_state: torch.Tensor | None,
) -> tuple[int, int, int, int, int]:
    """:func:`check_inputs` with the gates' layouts taken from :data:`GATE_LAYOUTS` for `op`.

    Examples::

        >>> B, T, H, K, V = check_op_inputs("gdn", q, k, v, {"g": g, "beta": beta}, initial_state)
    """
    layouts = GATE_LAYOUTS[op]
    return check_inputs(q, k, v, {name: (gates[name], layout) for name, layout in layouts.items()}, initial_state)


def default_scale(scale: float | None, K: int) -> float:
    """The query scale: `scale` as given, or the contract's default ``K ** -0.5``."""
    return K**-0.5 if scale is None else scale
