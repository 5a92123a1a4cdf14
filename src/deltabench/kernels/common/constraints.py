"""Constraints shared by several impls' declarations: ``constraint(case) -> str | None`` (None: it can run the case)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["jax_scan_memory", "kv_at_most"]

# The associative scan holds a [K, K] matrix per token (and XLA keeps a few copies of them): cap it by device.
_SCAN_MATRIX_CAP_GIB = {"cpu": 1.0, "cuda": 16.0, "tpu": 4.0}


def jax_scan_memory(case: Any) -> str | None:
    """Refuse shapes whose per-token transition matrices would not fit the device comfortably."""
    gib = case.B * case.T * case.H * case.K * case.K * 4 / 2**30
    cap = _SCAN_MATRIX_CAP_GIB.get(case.device, 1.0)
    if gib > cap:
        return f"the associative scan's per-token [K, K] matrices take {gib:.1f} GiB, over {cap:g} GiB on {case.device}"
    return None


def kv_at_most(limit: int, where: str = "") -> Callable[[Any], str | None]:
    """A constraint refusing K or V above `limit` (a kernel holding a whole key or value row in one tile)."""

    def constraint(case: Any) -> str | None:
        if limit < case.K or limit < case.V:
            return f"K and V up to {limit}{where} (got K={case.K}, V={case.V})"
        return None

    return constraint
