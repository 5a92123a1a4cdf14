"""``/runs``: ingest result documents (a batch per request) and read runs back."""

from __future__ import annotations

import datetime as _dt
from typing import Annotated, Any

from deltabench.db import queries
from fastapi import APIRouter, Query

from ... import crud, schemas, services
from ...deps import ReadAccessDep, SessionDep, WriteTokenDep
from ._common import ERRORS, WRITE_ERRORS, Limit, Offset, Text

__all__ = ["router"]

router = APIRouter(prefix="/runs", tags=["runs"])


@router.post("", status_code=201, response_model=schemas.IngestResponse, responses=WRITE_ERRORS)
def ingest_runs(body: schemas.RunsIngest, session: SessionDep, _token: WriteTokenDep) -> schemas.IngestResponse:
    """Store a batch of result documents. Idempotent: a run or job already stored is not stored again."""
    run_ids, jobs = crud.ingest_batch(session, docs=body.documents)
    return schemas.IngestResponse(runs=run_ids, jobs=jobs)


@router.get("", response_model=schemas.RunsPublic, responses=ERRORS)
def list_runs(
    session: SessionDep,
    _read: ReadAccessDep,
    suite: Text = None,
    machine: Text = None,
    commit: Text = None,
    since: Annotated[_dt.datetime | None, Query()] = None,
    until: Annotated[_dt.datetime | None, Query()] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> schemas.RunsPublic:
    """Runs, newest first; `commit` is a prefix of the git commit, `machine` a machine kind."""
    filters: dict[str, Any] = {"suite": suite, "machine_kind": machine, "commit": commit}
    filters.update(since=since, until=until)
    rows = queries.list_runs(session, limit=limit, offset=offset, **filters)
    return schemas.RunsPublic(
        data=[schemas.RunPublic(**vars(r)) for r in rows], count=queries.count_runs(session, **filters)
    )


@router.get("/{run_id}", responses=ERRORS)
def get_run(run_id: str, session: SessionDep, _read: ReadAccessDep) -> dict[str, Any]:
    """The stored run as its result document (`run_id` may be a unique prefix or ``latest``)."""
    return services.load_run(session, run_id).model_dump(mode="json")
