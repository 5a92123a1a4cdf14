"""Where a submitted job goes: the fleet (Celery) when a broker is configured, else the server's local worker.

The web layer stores a job in the ``job_queue`` table and calls :func:`submit_job`. With ``DELTABENCH_BROKER``
set, the job is sent as a Celery task to the queue named after its device kind (:mod:`.fleet`); a
``deltabench worker --queue KIND`` on some host executes it and posts the document back. Without a broker,
``deltabench serve`` has started :func:`start_local_worker`: a background thread that claims queued jobs from
the table, one per device of this machine at a time (the CPU, each GPU), runs each in its own process
(:func:`.worker.execute_queued_job`), stores the document with ``db.ingest.ingest_document`` and moves the job
queued -> running -> done | failed (the moves of ``db.jobs``). While a job runs, its heartbeat is written every
``DELTABENCH_JOB_HEARTBEAT_S`` seconds (default 5); the server fails or queues again a job whose heartbeats stop.
A job cancelled while it runs has its process ended and stores nothing. Jobs that a crashed server left
``running`` on its local worker are queued again when the worker starts.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from deltabench.db import jobs
from deltabench.db.models import QueuedJob
from deltabench.runners.environment import nvidia_smi_query

from .worker import (
    JobOutcome,
    QueuedJobRequest,
    device_for_kind,
    execute_queued_job,
    heartbeat_interval_s,
    queued_run_id,
)

__all__ = [
    "BROKER_ENV",
    "LocalWorker",
    "Slot",
    "local_slots",
    "start_local_worker",
    "submit_job",
]

BROKER_ENV = "DELTABENCH_BROKER"
log = logging.getLogger(__name__)
_local_worker: LocalWorker | None = None
_ERROR_MAX = 20_000  # characters of an error kept on the job row


def submit_job(session_factory: Callable[[], Session], job_id: int) -> None:
    """Hand the stored job `job_id` to whoever runs it: a Celery task on the queue of its device kind when
    ``DELTABENCH_BROKER`` is set, else this process's local worker (woken at once; without one the job stays
    queued until a local worker starts). Raises when the broker cannot take the task.
    """
    broker = os.environ.get(BROKER_ENV)
    if broker:
        from .fleet import send_job

        with session_factory() as session:
            job = session.get(QueuedJob, job_id)
            if job is None:
                raise LookupError(f"no job {job_id}")
            send_job(
                job_id=job.id,
                spec=dict(job.spec),
                device_kind=job.device_kind,
                run_id=queued_run_id(job.id, job.created_at),
                broker_url=broker,
            )
        return
    if _local_worker is not None:
        _local_worker.wake()


@dataclass
class Slot:
    """One device of this machine that runs one job at a time: the device kinds it serves and its environment."""

    name: str
    device: str
    kinds: frozenset[str]
    env: dict[str, str] = field(default_factory=dict)
    busy: bool = False


def local_slots() -> list[Slot]:
    """The CPU (kind ``cpu``) and one slot per GPU (its kind, e.g. ``h200``, and ``cuda``), each pinned to its GPU."""
    from deltabench.runners.environment import machine_kind

    slots = [Slot(name="cpu", device="cpu", kinds=frozenset({"cpu"}))]
    for index, name in enumerate(nvidia_smi_query("name")):
        slots.append(
            Slot(
                name=f"cuda:{index}",
                device="cuda",
                kinds=frozenset({machine_kind(name), "cuda"}),
                env={"CUDA_VISIBLE_DEVICES": str(index)},
            )
        )
    return slots


class LocalWorker:
    """Runs queued jobs of the database at `engine_url` on this machine (see the module docstring)."""

    def __init__(
        self,
        engine_url: str,
        *,
        slots: list[Slot] | None = None,
        imports: list[str] | None = None,
        poll_s: float = 2.0,
        fail_unserved: bool = True,
        heartbeat_s: float | None = None,
        on_stored: Callable[[], None] | None = None,
    ) -> None:
        from deltabench.db.engine import get_engine

        self.engine = get_engine(engine_url)
        self.sessions = sessionmaker(bind=self.engine, expire_on_commit=False)
        self.slots = slots if slots is not None else local_slots()
        self.imports = list(imports or [])
        self.poll_s = poll_s
        self.fail_unserved = fail_unserved
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else heartbeat_interval_s()
        self.on_stored = on_stored  # told after each document is committed (the server refreshes its tables)
        self.name = f"local@{socket.gethostname()}"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._scheduler = threading.Thread(target=self._loop, name="deltabench-local-worker", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> LocalWorker:
        """Re-queue what a crashed server left running here, then start claiming jobs."""
        self.requeue_orphans()
        self._scheduler.start()
        return self

    def wake(self) -> None:
        """Look at the queue now rather than at the next poll."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop claiming jobs; running jobs have their processes ended and go back to the queue."""
        self._stop.set()
        self._wake.set()
        self._scheduler.join(timeout)
        for thread in list(self._threads):
            thread.join(timeout)

    @property
    def kinds(self) -> frozenset[str]:
        """Every device kind some slot of this machine serves."""
        return frozenset().union(*(s.kinds for s in self.slots))

    # -- the queue -------------------------------------------------------------------------------------------
    def requeue_orphans(self) -> int:
        """Put jobs left ``running`` by this host's local worker back to ``queued``; how many there were."""
        with self.sessions.begin() as session:
            count = jobs.requeue_jobs_of(session, worker=self.name)
        if count:
            log.warning("re-queued %d job(s) left running by a previous server", count)
        return count

    def _status(self, job_id: int) -> str | None:
        with self.sessions() as session:
            return session.scalar(select(QueuedJob.status).where(QueuedJob.id == job_id))

    def _fail_unserved(self) -> None:
        kinds = sorted(self.kinds)
        reason = (
            f"no broker is configured ({BROKER_ENV}) and this server's local worker has no such device "
            f"(it serves {', '.join(kinds)})"
        )
        with self.sessions.begin() as session:
            jobs.fail_unserved_jobs(session, served_kinds=kinds, reason=reason)

    def _claim(self, slot: Slot) -> QueuedJob | None:
        """Take the oldest queued job this slot serves (atomically: a job is claimed once)."""
        with self.sessions.begin() as session:
            return jobs.claim_job(session, device_kinds=sorted(slot.kinds), worker=self.name)

    def _finish(self, job_id: int, *, status: str, run_id: str | None = None, error: str | None = None) -> None:
        """Record the end of a job, unless it was cancelled meanwhile (a cancel always wins)."""
        with self.sessions.begin() as session:
            jobs.finish_job(session, job_id=job_id, status=status, run_id=run_id, error=error)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.fail_unserved:
                    self._fail_unserved()
                for slot in self.slots:
                    with self._lock:
                        if slot.busy or self._stop.is_set():
                            continue
                        job = self._claim(slot)
                        if job is None:
                            continue
                        slot.busy = True
                    thread = threading.Thread(
                        target=self._run, args=(slot, job), name=f"deltabench-job-{job.id}", daemon=True
                    )
                    self._threads = [t for t in self._threads if t.is_alive()] + [thread]
                    thread.start()
            except Exception:  # a database hiccup must not end the worker: try again at the next poll
                log.exception("local worker: scheduling failed")
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def _run(self, slot: Slot, job: QueuedJob) -> None:
        try:
            self._execute(slot, job)
        except Exception as exc:
            log.exception("local worker: job %s", job.id)
            self._finish(job.id, status="failed", error=f"{type(exc).__name__}: {exc}"[:_ERROR_MAX])
        finally:
            with self._lock:
                slot.busy = False
            self._wake.set()

    def _execute(self, slot: Slot, job: QueuedJob) -> None:
        from deltabench.db.engine import session_scope
        from deltabench.db.ingest import ingest_document

        request = QueuedJobRequest(
            queue_job_id=job.id,
            run_id=queued_run_id(job.id, job.created_at),
            spec=dict(job.spec),
            device=device_for_kind(job.device_kind),  # the slot serves only kinds of its own device
            imports=self.imports,
            worker=f"{self.name}/{slot.name}",
            delivery=job.attempts,
        )
        log.info("local worker: job %s on %s", job.id, slot.name)

        last_beat = [time.monotonic()]

        def should_cancel() -> bool:
            if time.monotonic() - last_beat[0] >= self.heartbeat_s:
                last_beat[0] = time.monotonic()
                try:
                    with self.sessions.begin() as session:
                        jobs.record_heartbeat(session, job_id=job.id)
                except Exception:  # a busy or unreachable database: keep running, beat again later
                    log.warning("local worker: job %s: could not record a heartbeat", job.id, exc_info=True)
            return self._stop.is_set() or self._status(job.id) == "cancelled"

        poll_s = min(1.0, self.heartbeat_s)
        outcome: JobOutcome = execute_queued_job(request, should_cancel=should_cancel, env=slot.env, poll_s=poll_s)
        if outcome.cancelled:
            if self._stop.is_set() and self._status(job.id) == "running":
                self._finish(job.id, status="queued")  # the server is stopping: run it again next time
            return
        if outcome.document is None:
            self._finish(job.id, status="failed", error=outcome.error[:_ERROR_MAX])
            return
        if self._status(job.id) == "cancelled":
            return  # cancelled in its last moments: store nothing, as for any cancelled job
        with session_scope(self.engine) as session:
            run_id = ingest_document(session, outcome.document)
        if self.on_stored is not None:
            self.on_stored()
        self._finish(job.id, status="done", run_id=run_id)


def start_local_worker(
    engine_url: str,
    *,
    imports: list[str] | None = None,
    poll_s: float = 2.0,
    on_stored: Callable[[], None] | None = None,
) -> LocalWorker:
    """Start this process's local worker on the database at `engine_url` and return its handle (``.stop()``);
    `on_stored()` is called after each document it stores is committed.

    Called by ``deltabench serve`` when no broker is configured; :func:`submit_job` wakes it.
    """
    global _local_worker
    if _local_worker is not None:
        _local_worker.stop()
    _local_worker = LocalWorker(engine_url, imports=imports, poll_s=poll_s, on_stored=on_stored).start()
    return _local_worker
