"""``/jobs``: submit a job (cases x impls x a device kind), list them, follow one, cancel one.

A submitted job is stored ``queued`` and handed to ``deltabench.fleet.dispatch.submit_job``: Celery when a
broker is configured, else the local worker ``deltabench serve`` started. Workers report progress with
``POST /jobs/{id}/status``, send ``POST /jobs/{id}/heartbeat`` every few seconds while a job runs (the reply
tells them of a cancel), and post their result documents to ``POST /runs`` (with ``meta.queue_job_id``).
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, FastAPI, HTTPException, Path, Query, Request
from sqlalchemy.orm import Session, sessionmaker

from deltabench.db import jobs as job_states
from deltabench.db import queries

from ... import crud, jobspec, schemas
from ...deps import ReadAccessDep, SessionDep, WriteTokenDep
from ._common import ERRORS, WRITE_ERRORS, Before, Limit, Offset

__all__ = ["dispatch_job", "dispatch_to_workers", "router", "submit"]

router = APIRouter(prefix="/jobs", tags=["jobs"])
log = logging.getLogger(__name__)

# The queue's id column is an INTEGER (32 bits on PostgreSQL): a larger id is malformed, not a database error.
JobId = Annotated[int, Path(ge=1, le=2**31 - 1)]
Status = Annotated[str | None, Query(pattern="^(queued|running|done|failed|cancelled)$")]
Kind = Annotated[str | None, Query(pattern=schemas.DEVICE_KIND_PATTERN)]


def dispatch_job(request: Request, job_id: int) -> str | None:
    """Hand a stored job to the runners' dispatcher; the error text when it could not be handed over."""
    return dispatch_to_workers(request.app, job_id)


def dispatch_to_workers(app: FastAPI, job_id: int) -> str | None:
    """Hand `app`'s stored job `job_id` to the runners' dispatcher; the error text when it could not be.

    Without ``deltabench.fleet.dispatch`` installed (or with ``Settings.dispatch_jobs`` off) the job stays
    queued for a worker started later.
    """
    if not app.state.settings.dispatch_jobs:
        return None
    try:
        from deltabench.fleet.dispatch import submit_job
    except ImportError:
        log.warning("deltabench.fleet.dispatch is not installed: job %s stays queued", job_id)
        return None
    factory = sessionmaker(bind=app.state.engine, expire_on_commit=False)
    try:
        submit_job(factory, job_id)
    except Exception as exc:  # a broker that is down: the job fails with the reason, the request does not
        log.exception("could not dispatch job %s", job_id)
        return f"could not dispatch the job: {type(exc).__name__}: {exc}"
    return None


def submit(request: Request, session: Session, body: schemas.JobSubmit, submitted_by: str) -> schemas.JobPublic:
    """Validate, store, commit and dispatch a job (shared by the API and the queue page's form)."""
    spec = jobspec.validate_job(body)
    job = crud.create_job(session, spec=spec, device_kind=body.device_kind, submitted_by=submitted_by)
    session.commit()  # the dispatcher (another thread or a worker) must see the row
    error = dispatch_job(request, job.id)
    if error is not None:
        crud.update_job_status(session, job=job, status="failed", error=error)
        session.commit()
    session.refresh(job)
    return schemas.JobPublic.model_validate(job)


@router.post("", status_code=201, response_model=schemas.JobPublic, responses=WRITE_ERRORS)
def submit_job(
    body: schemas.JobSubmit, request: Request, session: SessionDep, token: WriteTokenDep
) -> schemas.JobPublic:
    """Submit a job: a suite (optionally filtered) or ops x shapes, some impls, on a device kind."""
    return submit(request, session, body, token.name)


@router.get("", response_model=schemas.JobsPublic, responses=ERRORS)
def list_jobs(
    session: SessionDep,
    _read: ReadAccessDep,
    status: Status = None,
    device_kind: Kind = None,
    limit: Limit = 100,
    offset: Offset = 0,
    before: Before = None,
) -> schemas.JobsPublic:
    """Submitted jobs, newest first. Page with `before` (the previous page's `next_before`): each page costs the
    same however deep."""
    filters = {"status": status, "device_kind": device_kind}
    rows = queries.list_queued_jobs(session, limit=limit, offset=offset, before=before, **filters)
    return schemas.JobsPublic(
        data=[schemas.JobPublic.model_validate(r) for r in rows],
        count=queries.count_queued_jobs(session, **filters),
        next_before=rows[-1].id if len(rows) == limit else None,
    )


def _job(session: Session, job_id: int):  # type: ignore[no-untyped-def]
    job = queries.get_queued_job(session, job_id=job_id)
    if job is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id}")
    return job


@router.get("/{job_id}", response_model=schemas.JobPublic, responses=ERRORS)
def get_job(job_id: JobId, session: SessionDep, _read: ReadAccessDep) -> schemas.JobPublic:
    """One job and where it stands (``run_id`` names its results once done)."""
    return schemas.JobPublic.model_validate(_job(session, job_id))


@router.post("/{job_id}/cancel", response_model=schemas.JobPublic, responses=WRITE_ERRORS)
def cancel_job(job_id: JobId, session: SessionDep, _token: WriteTokenDep) -> schemas.JobPublic:
    """Cancel a queued or running job (a finished one is returned unchanged)."""
    job = _job(session, job_id)
    crud.cancel_job(session, job=job)
    return schemas.JobPublic.model_validate(job)


@router.post("/{job_id}/status", response_model=schemas.JobPublic, responses=WRITE_ERRORS)
def report_status(
    job_id: JobId, body: schemas.JobStatusUpdate, session: SessionDep, token: WriteTokenDep
) -> schemas.JobPublic:
    """A worker's report: it took the job (running), finished it (done, with the run id) or failed it."""
    job = _job(session, job_id)
    crud.update_job_status(
        session, job=job, status=body.status, worker=body.worker or token.name, run_id=body.run_id, error=body.error
    )
    return schemas.JobPublic.model_validate(job)


@router.post("/{job_id}/heartbeat", response_model=schemas.JobPublic, responses=WRITE_ERRORS)
def heartbeat(job_id: JobId, session: SessionDep, _token: WriteTokenDep) -> schemas.JobPublic:
    """A worker running the job is alive (sent every few seconds); the job as it stands, so the worker learns
    of a cancel. A job that is not running is returned unchanged."""
    job = _job(session, job_id)
    if job_states.record_heartbeat(session, job_id=job_id):
        session.refresh(job)
    return schemas.JobPublic.model_validate(job)
