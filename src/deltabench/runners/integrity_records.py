"""The ``integrity:<defence>`` check record, shared by the guard (runners/integrity.py) and the GPU-side defences
(runners/cuda_integrity.py)."""

from __future__ import annotations

from deltabench.harness.document import CheckRecord

__all__ = ["INTEGRITY_PREFIX", "integrity_record"]

INTEGRITY_PREFIX = "integrity:"


def integrity_record(
    defence: str,
    metric: str,
    value: float | None,
    threshold: float | None,
    passed: bool,
    detail: str,
    *,
    gating: bool = True,
) -> CheckRecord:
    """The record of `defence` (``integrity:<defence>``); `gating` False for a note that never fails a job."""
    return CheckRecord(
        check=f"{INTEGRITY_PREFIX}{defence}",
        metric=metric,
        value=value,
        threshold=threshold,
        passed=passed,
        gating=gating,
        reference="integrity",
        detail=detail[:2000],
    )
