"""``/runs``: ingest result documents (a batch per request) and read runs back."""

from __future__ import annotations

import datetime as _dt
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import ValidationError
from sqlalchemy import Engine

from deltabench.db import queries
from deltabench.db.engine import session_scope
from deltabench.harness.document import ID_PATTERN

from ... import crud, schemas, services
from ...deps import TOKEN_COOKIE, ReadAccessDep, SessionDep, bearer, check_token
from ._common import ERRORS, WRITE_ERRORS, Limit, Offset, Text

__all__ = ["router"]

router = APIRouter(prefix="/runs", tags=["runs"])


def _authenticate(engine: Engine, token: str | None) -> None:
    with session_scope(engine) as session:
        check_token(session, token)


def _ingest(request: Request, token: str | None, body: schemas.RunsIngest, raw: bytes) -> schemas.IngestResponse:
    with session_scope(request.app.state.engine) as session:
        check_token(session, token)
        run_ids, jobs, new_jobs = crud.ingest_batch(session, docs=body.documents, raw=raw)
    if new_jobs:  # committed: the regressions table's refresh reads these results now (web.series_refresh)
        request.app.state.series_refresher.wake()
    return schemas.IngestResponse(runs=run_ids, jobs=jobs, new_jobs=new_jobs, already_stored_jobs=jobs - new_jobs)


@router.post(
    "",
    status_code=201,
    response_model=schemas.IngestResponse,
    responses=WRITE_ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RunsIngest"}}},
        }
    },
)
async def ingest_runs(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> schemas.IngestResponse:
    """Store a batch of result documents. Idempotent: a run or job already stored is not stored again.

    The body is a :class:`RunsIngest` (``{"documents": [...]}``), parsed straight from its bytes by pydantic's
    JSON parser (several times faster than decoding to Python objects first: a worker posts thousands of jobs).
    """
    token = credentials.credentials if credentials is not None else request.cookies.get(TOKEN_COOKIE)
    # Authenticate before reading the body (AuthenticateWritesFirst has done so already for the API's paths).
    await run_in_threadpool(_authenticate, request.app.state.engine, token)
    raw = await request.body()
    try:
        body = schemas.RunsIngest.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_context=False)) from None
    return await run_in_threadpool(_ingest, request, token, body, raw)


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
    before: Annotated[str | None, Query(max_length=128, pattern=ID_PATTERN)] = None,
) -> schemas.RunsPublic:
    """Runs, newest first; `commit` is a prefix of the git commit, `machine` a machine kind. Page with `before`
    (the previous page's `next_before`): each page costs the same however deep."""
    filters: dict[str, Any] = {"suite": suite, "machine_kind": machine, "commit": commit}
    filters.update(since=since, until=until)
    rows = queries.list_runs(session, limit=limit, offset=offset, before=before, **filters)
    return schemas.RunsPublic(
        data=[schemas.RunPublic(**vars(r)) for r in rows],
        count=queries.count_runs(session, **filters),
        next_before=rows[-1].run_id if len(rows) == limit else None,
    )


@router.get("/{run_id}", responses=ERRORS)
def get_run(run_id: str, session: SessionDep, _read: ReadAccessDep) -> dict[str, Any]:
    """The stored run as its result document (`run_id` may be a unique prefix or ``latest``)."""
    return services.load_run(session, run_id).model_dump(mode="json")
