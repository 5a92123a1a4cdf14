"""The server's sweep of running jobs whose worker went silent (see ``deltabench.db.jobs``).

A thread started with the app (its lifespan) looks at the queue every tenth of the heartbeat timeout (at least
every 0.2 s, at most every minute). A silent job on its first attempt is queued again and handed to the
dispatcher once more (the fleet's broker, or the local worker); later ones fail. Each change is logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import Engine

from deltabench.db.engine import session_scope
from deltabench.db.jobs import sweep_stalled_jobs, update_job_status
from deltabench.db.models import QueuedJob

__all__ = ["JobSweeper", "sweep_period_s"]

log = logging.getLogger(__name__)


def sweep_period_s(timeout_s: float) -> float:
    """How often to sweep for a heartbeat timeout of `timeout_s`: a tenth of it, between 0.2 s and 60 s."""
    return min(60.0, max(0.2, timeout_s / 10))


class JobSweeper:
    """Sweeps the queue of `engine` every :func:`sweep_period_s`; `redispatch(job_id)` hands a job queued again
    to its workers and returns an error text when it could not (the job then fails with it)."""

    def __init__(self, engine: Engine, *, timeout_s: float, redispatch: Callable[[int], str | None]) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.redispatch = redispatch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="deltabench-job-sweeper", daemon=True)

    def start(self) -> JobSweeper:
        """Start sweeping in the background."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sweeping (the sweep under way finishes)."""
        self._stop.set()
        self._thread.join(timeout)

    def sweep(self) -> list[int]:
        """One sweep: requeue or fail the silent jobs, hand the requeued ones over; the ids of those it changed."""
        with session_scope(self.engine) as session:
            stalled = sweep_stalled_jobs(session, timeout_s=self.timeout_s)
        for job in stalled:
            log.warning("job %s: %s", job.job_id, job.reason)
            if job.status != "queued":
                continue
            error = self.redispatch(job.job_id)
            if error is not None:
                with session_scope(self.engine) as session:
                    row = session.get(QueuedJob, job.job_id)
                    if row is not None and row.status == "queued":
                        update_job_status(session, job=row, status="failed", error=f"{job.reason}; {error}")
        return [job.job_id for job in stalled]

    def _loop(self) -> None:
        period = sweep_period_s(self.timeout_s)
        while not self._stop.wait(period):
            try:
                self.sweep()
            except Exception:  # a database hiccup must not end the sweeps: try again next period
                log.exception("sweeping the job queue failed")
