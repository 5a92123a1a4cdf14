"""The fleet: jobs through Celery (Redis broker), one queue per device kind, executed by ``deltabench worker``.

The server sends ``deltabench.run_job(job_id, spec, run_id)`` to the queue named after the job's device kind
(:func:`send_job`). A worker (``deltabench worker --queue h200 --server URL --token T``) takes one job at a time,
tells the server it runs it (``POST /api/v1/jobs/{id}/status``), runs it in its own process
(:func:`.worker.execute_queued_job`) and posts the result document to ``POST /api/v1/runs`` with its bearer
token: the document's ``meta.queue_job_id`` marks the job done. A GPU host thus needs no database access, and
this module imports neither SQLAlchemy nor FastAPI.

Delivery guarantees:

- ``task_acks_late``: a job is acknowledged only once its document is stored (or it is skipped), so a worker
  killed mid-job leaves it unacknowledged and Redis delivers it again, to another worker, after the broker's
  visibility timeout (``DELTABENCH_BROKER_VISIBILITY_S``, default 6 h: it must exceed the longest job, else a
  running job is delivered a second time). ``task_reject_on_worker_lost`` does the same for a pool process lost.
- The document's run id and job ids are fixed by the job (see :mod:`.worker`), so a job run twice is stored once.
- Before running, the worker asks the server for the job: a job already done or cancelled is not run (again).
  While it runs, the worker sends a heartbeat every ``DELTABENCH_JOB_HEARTBEAT_S`` (default 5 s) through
  ``POST /api/v1/jobs/{id}/heartbeat``; the reply tells it of a cancel, which ends the running job. A job whose
  heartbeats stop (its worker was killed) is queued again, then failed, by the server (``deltabench.db.jobs``).
- A job's failure (incorrect, timeout, oom, failed cases) is in its document; only a job whose process could
  not produce a document (a spec naming nothing runnable, a crash) is reported ``failed`` with the reason.
- A document the server refuses (a 4xx: it fails validation, the token was revoked) is not retried: the job is
  reported ``failed`` with the server's reason and the task is acknowledged, so it never hangs ``running``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from celery import Celery

from .worker import QueuedJobRequest, device_for_kind, execute_queued_job, heartbeat_interval_s

__all__ = [
    "TASK_NAME",
    "RefusedUpload",
    "ServerClient",
    "WorkerConfig",
    "configure_worker",
    "make_celery",
    "send_job",
]

TASK_NAME = "deltabench.run_job"
VISIBILITY_ENV = "DELTABENCH_BROKER_VISIBILITY_S"
RESTORE_ENV = "DELTABENCH_BROKER_RESTORE_S"
DEFAULT_VISIBILITY_S = 6 * 3600
log = logging.getLogger(__name__)


def _transport_options() -> dict[str, Any]:
    """Redis transport options: the visibility timeout after which an unacknowledged job is delivered again,
    and how often a worker looks for such jobs (``DELTABENCH_BROKER_RESTORE_S``, default kombu's)."""
    options: dict[str, Any] = {"visibility_timeout": float(os.environ.get(VISIBILITY_ENV, DEFAULT_VISIBILITY_S))}
    restore = os.environ.get(RESTORE_ENV)
    if restore:
        # kombu scans every interval x throttle seconds; a throttle of 1 makes the interval the period.
        options.update(unacked_restore_interval=float(restore), unacked_restore_throttle=1)
    return options


def make_celery(broker_url: str | None = None) -> Celery:
    """The Celery app on `broker_url` (default ``$DELTABENCH_BROKER``): late acks, one job at a time, no results."""
    app = Celery("deltabench", broker=broker_url or os.environ.get("DELTABENCH_BROKER"))
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue="cpu",
        task_create_missing_queues=True,
        broker_transport_options=_transport_options(),
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    app.task(name=TASK_NAME, bind=True, acks_late=True)(_run_job_task)
    return app


_senders: dict[str, Celery] = {}


def send_job(*, job_id: int, spec: dict[str, Any], device_kind: str, run_id: str, broker_url: str) -> None:
    """Send a stored job to the queue of its device kind (what the server's dispatcher calls)."""
    app = _senders.get(broker_url)
    if app is None:
        app = _senders[broker_url] = make_celery(broker_url)
    app.send_task(TASK_NAME, args=[job_id, spec, run_id], queue=device_kind, retry=True)


class RefusedUpload(Exception):
    """The server refused a result document (a 4xx); the message is its reason, short."""


def _reason(response: Any) -> str:
    """The server's reason for refusing a request, on one line: its ``detail`` (the first validation error)."""
    try:
        detail = response.json().get("detail")
    except Exception:
        detail = response.text
    if isinstance(detail, list) and detail:
        first = detail[0] if isinstance(detail[0], dict) else {"msg": str(detail[0])}
        where = ".".join(str(p) for p in first.get("loc", ()))
        more = f" (and {len(detail) - 1} more)" if len(detail) > 1 else ""
        detail = f"{where}: {first.get('msg', '')}{more}" if where else f"{first.get('msg', '')}{more}"
    return f"{response.status_code} {str(detail)[:1000]}"


class ServerClient:
    """The worker's side of the server's API: job status, reports, and result upload (bearer token)."""

    def __init__(self, server: str, token: str, *, timeout_s: float = 60.0) -> None:
        import httpx

        self.http = httpx.Client(
            base_url=server.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    def job_status(self, job_id: int) -> str | None:
        """The job's status on the server (None when the server does not know it)."""
        response = self.http.get(f"/jobs/{job_id}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()["status"]

    def heartbeat(self, job_id: int) -> str | None:
        """Tell the server this worker still runs the job; the job's status there (None when it is unknown)."""
        response = self.http.post(f"/jobs/{job_id}/heartbeat")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()["status"]

    def report(self, job_id: int, status: str, *, worker: str, error: str | None = None) -> None:
        """Tell the server the job is running, or failed (with the reason)."""
        body: dict[str, Any] = {"status": status, "worker": worker}
        if error is not None:
            body["error"] = error[:20_000]
        self.http.post(f"/jobs/{job_id}/status", json=body).raise_for_status()

    def upload(self, document: Any, *, tries: int = 6) -> dict[str, Any]:
        """Post one result document, retrying a server that is down or busy (1, 2, 4 ... s apart).

        Posting again is safe: the server stores a document once however often it is posted.

        Raises:
            RefusedUpload: the server answered 4xx (posting again would be refused again).
        """
        import httpx

        payload = '{"documents": [' + document.model_dump_json() + "]}"
        for attempt in range(tries):
            try:
                response = self.http.post("/runs", content=payload, headers={"Content-Type": "application/json"})
                if 400 <= response.status_code < 500:
                    raise RefusedUpload(_reason(response))
                if response.status_code < 500 or attempt == tries - 1:
                    response.raise_for_status()
                    return response.json()
            except httpx.TransportError:
                if attempt == tries - 1:
                    raise
            time.sleep(2.0**attempt)
        raise AssertionError("unreachable")


class WorkerConfig:
    """What this worker process was started with (``deltabench worker`` options)."""

    server: str = ""
    token: str = ""
    name: str = ""
    device: str | None = None
    imports: list[str] = []  # noqa: RUF012 - replaced as a whole by configure_worker
    timeout_s: float | None = None
    heartbeat_s: float = 5.0  # between heartbeats, which also bring news of a cancel
    concurrency: int = 1
    retry_s: float = 60.0  # wait before retrying a job whose server could not be reached
    max_retries: int = 30


class _Accelerators:
    """Which accelerator each running job has: with ``--concurrency N``, N jobs each pinned to their own GPU."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[int] = [0]

    def reset(self, count: int) -> None:
        with self._lock:
            self._free = list(range(count))

    def take(self) -> int:
        with self._lock:
            # Celery runs at most `concurrency` tasks at once, so one is free; 0 is only a guard.
            return self._free.pop(0) if self._free else 0

    def give_back(self, index: int) -> None:
        with self._lock:
            self._free.append(index)
            self._free.sort()


_accelerators = _Accelerators()


def configure_worker(
    *,
    server: str,
    token: str,
    name: str | None = None,
    device: str | None = None,
    imports: list[str] | None = None,
    timeout_s: float | None = None,
    concurrency: int = 1,
) -> None:
    """Set this process's worker configuration (read by the task when a job arrives); `concurrency` jobs at a
    time, job i on GPU i."""
    WorkerConfig.server = server
    WorkerConfig.token = token
    name = name or f"worker{os.getpid()}"
    WorkerConfig.name = name if "@" in name else f"{name}@{socket.gethostname()}"
    WorkerConfig.device = device
    WorkerConfig.imports = list(imports or [])
    WorkerConfig.timeout_s = timeout_s
    WorkerConfig.concurrency = concurrency
    WorkerConfig.heartbeat_s = heartbeat_interval_s()
    _accelerators.reset(concurrency)


def gpu_pinning() -> bool:
    """Whether jobs are pinned to one GPU each: when this worker runs several at a time and the host's GPU
    selection was not already narrowed by the user (``CUDA_VISIBLE_DEVICES`` unset)."""
    return WorkerConfig.concurrency > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ


def _redelivered(task: Any) -> bool:
    info = getattr(task.request, "delivery_info", None) or {}
    return bool(info.get("redelivered") or getattr(task.request, "redelivered", False))


def _run_job_task(task: Any, job_id: int, spec: dict[str, Any], run_id: str) -> str:
    """The Celery task: run one queued job here and post its document to the server; returns what happened.

    A server that cannot be reached sends the job back to the queue (retried every ``retry_s`` seconds): a job
    is never dropped because its server was briefly down.
    """
    import httpx

    if not WorkerConfig.server:
        raise RuntimeError("this process is not a configured deltabench worker (use `deltabench worker`)")
    try:
        return _run_job(task, job_id, spec, run_id)
    except httpx.TransportError as exc:
        log.warning("job %s: server %s unreachable (%s): retrying later", job_id, WorkerConfig.server, exc)
        raise task.retry(exc=exc, countdown=WorkerConfig.retry_s, max_retries=WorkerConfig.max_retries) from exc


def _run_job(task: Any, job_id: int, spec: dict[str, Any], run_id: str) -> str:
    client = ServerClient(WorkerConfig.server, WorkerConfig.token)
    status = client.job_status(job_id)
    if status in (None, "done", "cancelled", "failed"):
        log.info("job %s is %s on the server: not run", job_id, status or "unknown")
        return f"skipped ({status or 'unknown'})"
    client.report(job_id, "running", worker=WorkerConfig.name)
    kind = str(spec.get("device_kind") or "cpu")
    request = QueuedJobRequest(
        queue_job_id=job_id,
        run_id=run_id,
        spec=spec,
        device=WorkerConfig.device or device_for_kind(kind),
        imports=WorkerConfig.imports,
        timeout_s=WorkerConfig.timeout_s,
        worker=WorkerConfig.name,
        delivery=2 if _redelivered(task) else 1,
    )
    last_check = [time.monotonic()]

    def should_cancel() -> bool:
        # Called about once a second while the job runs: the heartbeat doubles as the question "cancelled?".
        if time.monotonic() - last_check[0] < WorkerConfig.heartbeat_s:
            return False
        last_check[0] = time.monotonic()
        try:
            return client.heartbeat(job_id) == "cancelled"
        except Exception:  # the server briefly unreachable: keep running, beat again later
            return False

    log.info("job %s: running %s", job_id, run_id)
    gpu = _accelerators.take()
    try:
        env = {"CUDA_VISIBLE_DEVICES": str(gpu)} if request.device == "cuda" and gpu_pinning() else None
        poll_s = min(1.0, WorkerConfig.heartbeat_s)
        outcome = execute_queued_job(request, should_cancel=should_cancel, env=env, poll_s=poll_s)
    finally:
        _accelerators.give_back(gpu)
    if outcome.cancelled:
        return "cancelled"
    if outcome.document is None:
        client.report(job_id, "failed", worker=WorkerConfig.name, error=outcome.error)
        return "failed"
    try:
        client.upload(outcome.document)
    except RefusedUpload as exc:
        log.error("job %s: the server refused its result document: %s", job_id, exc)
        client.report(
            job_id, "failed", worker=WorkerConfig.name, error=f"the server refused the result document: {exc}"
        )
        return "refused"
    log.info("job %s: %d result(s) stored as run %s", job_id, len(outcome.document.jobs), run_id)
    return "done"
