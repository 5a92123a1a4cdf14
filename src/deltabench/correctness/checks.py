"""Error metrics and the CheckRecords built from them.

Every comparison yields two records: the relative Frobenius error ``||x - ref||_F / ||ref||_F`` (gating; it is
FLA's ``get_err_ratio``, RMS of the error over RMS of the reference) and the max abs error (reported, never
gating), each with the index of the worst element. A non-finite value anywhere in `x` makes both values
``inf`` and the gating record fail: nothing downgrades a failure. A failed record's detail gives the part of the
error along the reference (:func:`along_reference`): a result off by a constant factor shows there whole, rounding
noise hardly, which tells a wrong scale from a kernel's rounding near the bound.
"""

from __future__ import annotations

import math

import torch

from deltabench.harness.document import CheckRecord

__all__ = ["along_reference", "compare", "finite_record", "note_record", "rel_fro", "worst_element"]

# Below this reference norm a relative error is meaningless; the absolute error is used instead (a reference
# that is exactly zero, e.g. a gradient that must vanish).
_TINY_NORM = 1e-30


def _float64_pair(x: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` and `ref` detached, in float64, on the reference's device (where every metric is computed)."""
    return x.detach().to(ref.device, torch.float64), ref.detach().to(torch.float64)


def rel_fro(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref||_F / ||ref||_F`` computed in float64 (``inf`` when `x` holds a non-finite value)."""
    x64, r64 = _float64_pair(x, ref)
    if not bool(torch.isfinite(x64).all()):
        return math.inf
    err = torch.linalg.vector_norm(x64 - r64).item()
    norm = torch.linalg.vector_norm(r64).item()
    return err / norm if norm > _TINY_NORM else err


def along_reference(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``(x - ref)·ref / ref·ref`` in float64: the part of the relative error along the reference (exactly 0.01 for
    ``x = 1.01 * ref``; for errors unrelated to the reference, about the relative error over sqrt(numel))."""
    x64, r64 = _float64_pair(x, ref)
    norm = torch.linalg.vector_norm(r64).item()
    return float(((x64 - r64) * r64).sum().item()) / norm**2 if norm > _TINY_NORM else 0.0


def worst_element(x: torch.Tensor, ref: torch.Tensor) -> tuple[float, list[int]]:
    """The max abs error and the index of the element where it occurs (a non-finite element counts as worst)."""
    x64, r64 = _float64_pair(x, ref)
    diff = (x64 - r64).abs()
    diff = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, math.inf))
    if diff.numel() == 0:
        return 0.0, []
    flat = int(torch.argmax(diff.reshape(-1)).item())
    index = [int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)]
    return float(diff.reshape(-1)[flat].item()), index


def compare(
    check: str,
    x: torch.Tensor,
    ref: torch.Tensor,
    *,
    threshold: float,
    seed: int,
    regime: str,
    initial_state: bool,
    reference: str,
) -> list[CheckRecord]:
    """Records of `x` against `ref`: ``rel_fro`` (gating, against `threshold`) and ``max_abs`` (reported).

    A shape mismatch is a failed record rather than an exception: the impl broke the contract.
    """
    common = {"seed": seed, "regime": regime, "initial_state": initial_state, "reference": reference}
    if tuple(x.shape) != tuple(ref.shape):
        detail = f"shape {list(x.shape)}, expected {list(ref.shape)}"
        return [
            CheckRecord(
                check=check, metric="rel_fro", value=None, threshold=threshold, passed=False, detail=detail, **common
            )
        ]
    value = rel_fro(x, ref)
    max_abs, index = worst_element(x, ref)
    finite = math.isfinite(value)
    passed = finite and value <= threshold
    detail = "" if finite else "non-finite values"
    if finite and not passed:
        detail = f"{along_reference(x, ref):+.2e} along the reference"
    return [
        CheckRecord(
            check=check,
            metric="rel_fro",
            value=value,
            threshold=threshold,
            passed=passed,
            worst_index=index,
            detail=detail,
            **common,
        ),
        CheckRecord(
            check=check,
            metric="max_abs",
            value=max_abs,
            threshold=None,
            passed=math.isfinite(max_abs),
            gating=False,
            worst_index=index,
            **common,
        ),
    ]


def finite_record(
    tensors: dict[str, torch.Tensor | None], *, seed: int, regime: str, initial_state: bool
) -> CheckRecord:
    """One gating record: every output and gradient in `tensors` is finite (value = count of bad elements)."""
    bad: dict[str, int] = {}
    for name, t in tensors.items():
        if t is None:
            continue
        n = int((~torch.isfinite(t.detach())).sum().item()) if t.is_floating_point() else 0
        if n:
            bad[name] = n
    return CheckRecord(
        check="finite",
        metric="nonfinite_count",
        value=float(sum(bad.values())),
        threshold=0.0,
        passed=not bad,
        seed=seed,
        regime=regime,
        initial_state=initial_state,
        reference="none",
        detail=", ".join(f"{k}: {v} non-finite" for k, v in bad.items()),
    )


def note_record(
    check: str,
    detail: str,
    *,
    passed: bool = False,
    gating: bool = True,
    seed: int | None = None,
    regime: str | None = None,
    initial_state: bool | None = None,
    reference: str = "none",
) -> CheckRecord:
    """A record without a metric: a contract violation (gating) or a skipped check (non-gating)."""
    return CheckRecord(
        check=check,
        metric="note",
        value=None,
        threshold=None,
        passed=passed,
        gating=gating,
        seed=seed,
        regime=regime,
        initial_state=initial_state,
        reference=reference,
        detail=detail,
    )
