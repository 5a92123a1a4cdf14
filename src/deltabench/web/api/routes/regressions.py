"""``/regressions`` and ``/annotations``: the latest change point of each series, and humans' verdicts on them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from deltabench.db import queries

from ... import crud, schemas, services
from ...deps import ReadAccessDep, SessionDep, WriteTokenDep
from ._common import ERRORS, WRITE_ERRORS, Before, Limit, Text

__all__ = ["router"]

router = APIRouter(tags=["regressions"])


@router.get("/regressions", response_model=schemas.RegressionsPublic, responses=ERRORS)
def latest_regressions(
    session: SessionDep,
    _read: ReadAccessDep,
    only_regressions: bool = False,
    since_days: Annotated[int, Query(ge=1, le=3650)] = 90,
    machine: Text = None,
    op: Text = None,
) -> schemas.RegressionsPublic:
    """The latest change point of every series active in the last `since_days` days, slowdowns first."""
    return services.latest_change_points(
        session, since_days=since_days, only_regressions=only_regressions, machine_kind=machine, op=op
    )


@router.get("/annotations", response_model=schemas.AnnotationsPublic, responses=ERRORS)
def list_annotations(
    session: SessionDep,
    _read: ReadAccessDep,
    series_key: Text = None,
    limit: Limit = 1000,
    before: Before = None,
) -> schemas.AnnotationsPublic:
    """Annotations, newest first (of one series when `series_key` is given). Page with `before` (the previous
    page's `next_before`)."""
    rows = queries.list_annotations(session, series_key=series_key, limit=limit, before=before)
    return schemas.AnnotationsPublic(
        data=[schemas.AnnotationPublic.model_validate(a) for a in rows],
        count=len(rows),
        next_before=rows[-1].id if len(rows) == limit else None,
    )


@router.post("/annotations", status_code=201, response_model=schemas.AnnotationPublic, responses=WRITE_ERRORS)
def annotate(body: schemas.AnnotationCreate, session: SessionDep, token: WriteTokenDep) -> schemas.AnnotationPublic:
    """Mark a change point of a series ``acknowledged`` (a real change, known) or ``expected``."""
    row = crud.add_annotation(
        session,
        series_key=body.series_key,
        kind=body.kind,
        note=body.note,
        author=token.name,
        run_id=body.run_id,
        git_commit=body.git_commit,
    )
    return schemas.AnnotationPublic.model_validate(row)
