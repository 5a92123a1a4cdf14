"""Thresholds of the correctness gate: one number per dtype and check family (PROVISIONAL, being measured)."""

from __future__ import annotations

from .cases import parse_dtype

__all__ = ["FAMILIES", "TOLERANCES", "family_of", "threshold"]

FAMILIES = ("output", "state", "gradient", "streaming")

TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"output": 1e-4, "state": 1e-4, "gradient": 1e-4, "streaming": 1e-4},
    "bf16": {"output": 1e-2, "state": 1e-2, "gradient": 8e-3, "streaming": 1e-2},
    "fp16": {"output": 2e-3, "state": 2e-3, "gradient": 2e-3, "streaming": 2e-3},
}


def family_of(check: str) -> str:
    """The tolerance family of a check name (``output``, ``final_state``, ``grad:q``, ``streaming:output``)."""
    if check.startswith("grad:"):
        return "gradient"
    if check.startswith("streaming"):
        return "streaming"
    if check == "final_state":
        return "state"
    return "output"


def threshold(dtype: str, check: str) -> float:
    """The relative Frobenius bound for `check` at `dtype`."""
    return TOLERANCES[parse_dtype(dtype)][family_of(check)]
