"""The job queue's state machine: a queued job's statuses, the moves between them, and its heartbeat.

::

    queued  -> running     a worker took it (attempts + 1, heartbeat now)
    queued  -> failed      no worker serves its device kind (the local worker, without a broker)
    running -> running     a heartbeat (the worker is alive)
    running -> done        its result document was stored
    running -> failed      its worker reported a failure, or it missed its heartbeats a second time
    running -> queued      it missed its heartbeats on its first attempt, or the server's own worker stopped
    queued | running -> cancelled

A worker sends a heartbeat every few seconds while a job runs: the fleet's workers through
``POST /api/v1/jobs/{id}/heartbeat``, the local worker of ``deltabench serve`` straight into the table. The
server sweeps the table (:func:`sweep_stalled_jobs`): a running job whose last heartbeat is older than
``DELTABENCH_JOB_HEARTBEAT_TIMEOUT_S`` (default :data:`DEFAULT_HEARTBEAT_TIMEOUT_S`) lost its worker (killed,
its host down, cut off from the server). On its first attempt it is queued again, so another worker runs it
soon rather than after the broker's visibility timeout; after that it fails. Either way ``error`` says which
worker went silent and for how long, so the queue page and the API show why.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from .models import QueuedJob

__all__ = [
    "DEFAULT_HEARTBEAT_TIMEOUT_S",
    "FINAL_JOB_STATUSES",
    "HEARTBEAT_TIMEOUT_ENV",
    "JOB_STATUSES",
    "StalledJob",
    "cancel_job",
    "claim_job",
    "create_job",
    "fail_unserved_jobs",
    "finish_job",
    "heartbeat_timeout_s",
    "record_heartbeat",
    "requeue_jobs_of",
    "sweep_stalled_jobs",
    "update_job_status",
]

JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled")
FINAL_JOB_STATUSES = frozenset({"done", "failed", "cancelled"})
HEARTBEAT_TIMEOUT_ENV = "DELTABENCH_JOB_HEARTBEAT_TIMEOUT_S"
# Workers beat every 5 s: five minutes of silence is a lost worker, not a slow network or a server restart.
DEFAULT_HEARTBEAT_TIMEOUT_S = 300.0
# A job queued again after missing its heartbeats on this many attempts fails instead.
REQUEUE_ATTEMPTS = 1


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _utc(value: _dt.datetime) -> _dt.datetime:
    # SQLite hands back naive datetimes; everything is stored in UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=_dt.timezone.utc)


def heartbeat_timeout_s(value: str | None = None) -> float:
    """The heartbeat timeout in seconds: `value`, else ``$DELTABENCH_JOB_HEARTBEAT_TIMEOUT_S``, else the default.

    Raises:
        ValueError: not a positive number of seconds (naming the variable).
    """
    raw = value if value is not None else os.environ.get(HEARTBEAT_TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_HEARTBEAT_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{HEARTBEAT_TIMEOUT_ENV}={raw!r}: give a positive number of seconds")
    return seconds


def create_job(session: Session, *, spec: dict[str, Any], device_kind: str, submitted_by: str | None) -> QueuedJob:
    """Store a submitted job as ``queued`` and return it (its id assigned)."""
    job = QueuedJob(spec=spec, device_kind=device_kind, status="queued", submitted_by=submitted_by)
    session.add(job)
    session.flush()
    return job


def cancel_job(session: Session, *, job: QueuedJob) -> bool:
    """Mark `job` cancelled unless it has finished; True when it changed. A running job's worker sees the flag."""
    if job.status in FINAL_JOB_STATUSES:
        return False
    job.status = "cancelled"
    job.heartbeat_at = None
    job.updated_at = _now()
    session.flush()
    return True


def update_job_status(
    session: Session,
    *,
    job: QueuedJob,
    status: str,
    worker: str | None = None,
    run_id: str | None = None,
    error: str | None = None,
) -> None:
    """Record a worker's report on `job`. A cancelled job stays cancelled; ``running`` counts an attempt and
    is the first heartbeat."""
    if job.status == "cancelled":
        return
    now = _now()
    if status == "running":
        if job.status != "running":
            job.attempts = (job.attempts or 0) + 1
        job.heartbeat_at = now
    else:
        job.heartbeat_at = None
    job.status = status
    if worker is not None:
        job.worker = worker
    if run_id is not None:
        job.run_id = run_id
    if error is not None:
        job.error = error
    job.updated_at = now
    session.flush()


def claim_job(session: Session, *, device_kinds: Sequence[str], worker: str) -> QueuedJob | None:
    """Take the oldest queued job of one of `device_kinds` for `worker` (queued -> running); None when there is
    none. Atomic: of several workers claiming at once, one gets each job."""
    candidates = session.scalars(
        select(QueuedJob.id)
        .where(QueuedJob.status == "queued", QueuedJob.device_kind.in_(sorted(device_kinds)))
        .order_by(QueuedJob.created_at, QueuedJob.id)
        .limit(5)
    ).all()
    for job_id in candidates:
        now = _now()
        taken = session.execute(
            update(QueuedJob)
            .where(QueuedJob.id == job_id, QueuedJob.status == "queued")
            .values(status="running", attempts=QueuedJob.attempts + 1, worker=worker, heartbeat_at=now, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        if taken.rowcount == 1:
            return session.get(QueuedJob, job_id, populate_existing=True)
    return None


def finish_job(
    session: Session, *, job_id: int, status: str, run_id: str | None = None, error: str | None = None
) -> bool:
    """End a running job: ``done`` (with its run), ``failed`` (with the reason) or ``queued`` (to run again).
    Nothing changes when it is no longer running (a cancel always wins); True when it changed."""
    result = session.execute(
        update(QueuedJob)
        .where(QueuedJob.id == job_id, QueuedJob.status == "running")
        .values(status=status, run_id=run_id, error=error, heartbeat_at=None, updated_at=_now())
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)


def requeue_jobs_of(session: Session, *, worker: str) -> int:
    """Put every job `worker` left running back in the queue (its process ended mid-job); how many there were."""
    result = session.execute(
        update(QueuedJob)
        .where(QueuedJob.status == "running", QueuedJob.worker == worker)
        .values(status="queued", heartbeat_at=None, updated_at=_now())
        .execution_options(synchronize_session=False)
    )
    return result.rowcount or 0


def fail_unserved_jobs(session: Session, *, served_kinds: Sequence[str], reason: str) -> int:
    """Fail the queued jobs of device kinds outside `served_kinds` with `reason`; how many."""
    unserved = (QueuedJob.status == "queued", QueuedJob.device_kind.not_in(sorted(served_kinds)))
    # Look before writing: an UPDATE that matches nothing would still take SQLite's write lock on every call.
    if session.scalar(select(QueuedJob.id).where(*unserved).limit(1)) is None:
        return 0
    result = session.execute(
        update(QueuedJob)
        .where(*unserved)
        .values(status="failed", error=reason, updated_at=_now())
        .execution_options(synchronize_session=False)
    )
    return result.rowcount or 0


def record_heartbeat(session: Session, *, job_id: int) -> bool:
    """Note that the worker running job `job_id` is alive; True when the job is running (else nothing changes)."""
    result = session.execute(
        update(QueuedJob)
        .where(QueuedJob.id == job_id, QueuedJob.status == "running")
        .values(heartbeat_at=_now())
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)


@dataclasses.dataclass(frozen=True)
class StalledJob:
    """A running job whose worker went silent: what the sweep did with it (``queued`` again or ``failed``)."""

    job_id: int
    status: str
    reason: str


def sweep_stalled_jobs(session: Session, *, timeout_s: float, now: _dt.datetime | None = None) -> list[StalledJob]:
    """Queue again (first attempt) or fail (later ones) every running job with no heartbeat for `timeout_s`.

    A job running under a worker that predates heartbeats counts from its last update. Each change is
    conditional on the job still being running and silent, so a heartbeat or a report that lands meanwhile
    wins. Returns what changed; the caller commits (and hands jobs queued again to their workers).
    """
    now = now or _now()
    cutoff = now - _dt.timedelta(seconds=timeout_s)
    last_sign = func.coalesce(QueuedJob.heartbeat_at, QueuedJob.updated_at)
    silent = (QueuedJob.status == "running", last_sign < cutoff)
    rows = session.execute(
        select(QueuedJob.id, QueuedJob.worker, QueuedJob.attempts, QueuedJob.heartbeat_at, QueuedJob.updated_at)
        .where(*silent)
        .order_by(QueuedJob.id)
    ).all()
    changed: list[StalledJob] = []
    for job_id, worker, attempts, heartbeat_at, updated_at in rows:
        silent_s = (now - _utc(heartbeat_at or updated_at)).total_seconds()
        reason = f"no heartbeat from worker {worker or '(unknown)'} for {silent_s:.0f} s (timeout {timeout_s:g} s)"
        if (attempts or 0) <= REQUEUE_ATTEMPTS:
            status, reason = "queued", f"{reason} on attempt {attempts or 1}: queued again"
        else:
            status, reason = "failed", f"{reason} on attempt {attempts}: failed"
        result = session.execute(
            update(QueuedJob)
            .where(QueuedJob.id == job_id, *silent)
            .values(status=status, error=reason, heartbeat_at=None, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount:
            changed.append(StalledJob(job_id=job_id, status=status, reason=reason))
    return changed
