"""``/compare``: two runs, or two impls in one run, job by job with ratio, interval and verdict."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ... import schemas, services
from ...deps import ReadAccessDep, SessionDep
from ._common import ERRORS

__all__ = ["router"]

router = APIRouter(prefix="/compare", tags=["compare"])

RunRef = Annotated[str, Query(min_length=1, max_length=128, pattern=r"^[^\x00]*$")]
ImplName = Annotated[str, Query(min_length=1, max_length=512, pattern=r"^[^\x00]*$")]
Threshold = Annotated[float, Query(ge=0.0, lt=10.0, description="minimum slowdown to flag, as a fraction")]
Alpha = Annotated[float, Query(gt=0.0, lt=1.0, description="significance level")]


@router.get("/runs", response_model=schemas.ComparisonPublic, responses=ERRORS)
def compare_runs(
    session: SessionDep,
    _read: ReadAccessDep,
    base: RunRef,
    head: RunRef,
    threshold: Threshold = 0.05,
    alpha: Alpha = 0.01,
) -> schemas.ComparisonPublic:
    """Head run vs base run: per job the ratio of medians with its bootstrap interval and the verdict."""
    return services.compare_two_runs(session, base=base, head=head, threshold=threshold, alpha=alpha)


@router.get("/impls", response_model=schemas.ComparisonPublic, responses=ERRORS)
def compare_impls(
    session: SessionDep,
    _read: ReadAccessDep,
    run: RunRef,
    base_impl: ImplName,
    head_impl: ImplName,
    threshold: Threshold = 0.05,
    alpha: Alpha = 0.01,
) -> schemas.ComparisonPublic:
    """Two impls of one run, case by case: `head_impl` vs `base_impl`."""
    return services.compare_impls_in_run(
        session, run=run, base_impl=base_impl, head_impl=head_impl, threshold=threshold, alpha=alpha
    )
