"""Executing one queued job (cases x impls x a device kind) into one result document, in its own process.

Both workers use this: the local worker of ``deltabench serve`` (:mod:`.dispatch`) and the fleet's Celery worker
(:mod:`.fleet`). A queued job's spec is the JSON the web layer stores::

    {"suite": "smoke" | null, "ops": [...], "impls": [...], "shapes": ["B=1,T=100,H=2,K=16,V=32"],
     "dtypes": ["fp32"], "modes": ["fwd"], "device_kind": "cpu"}

It becomes a suite (:func:`suite_for_spec`), then the same plan ``deltabench run`` executes: each (case, impl)
gated then timed in its own subprocess with a timeout (runners/session.py, runners/isolated.py). The whole job runs
in one more process (``python -m deltabench.fleet.worker``), so that the server or the Celery worker never
imports torch, and a cancel or a shutdown can end it: SIGTERM makes that process kill the running case's process
group before it exits, and it ends itself the same way when its parent dies.

Idempotence: the run id is fixed by the queued job (:func:`queued_run_id`) and each result's job id by
(run, case, impl) (:func:`stable_job_id`), always as attempt 1. A job delivered twice (its worker was killed,
the broker redelivered it) therefore produces the same document, and the store keeps it once.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deltabench.harness.errors import BadInput

__all__ = [
    "HEARTBEAT_ENV",
    "JobOutcome",
    "QueuedJobRequest",
    "device_for_kind",
    "execute_queued_job",
    "heartbeat_interval_s",
    "main",
    "queued_run_id",
    "run_queued_job",
    "stable_job_id",
    "suite_for_spec",
]

HEARTBEAT_ENV = "DELTABENCH_JOB_HEARTBEAT_S"
_TERM_GRACE_S = 10.0  # after SIGTERM, how long the job process has to kill its case and exit
_LOG_TAIL = 1500  # characters of the job process's log quoted in a failure


def heartbeat_interval_s() -> float:
    """Seconds between a worker's heartbeats for the job it runs: ``$DELTABENCH_JOB_HEARTBEAT_S``, default 5.

    The server gives up on a job after ``DELTABENCH_JOB_HEARTBEAT_TIMEOUT_S`` (default 300) without one, so the
    interval must stay well below that. A worker also learns of a cancel at its heartbeats.
    """
    raw = os.environ.get(HEARTBEAT_ENV, "").strip()
    try:
        seconds = float(raw) if raw else 5.0
    except ValueError:
        raise BadInput(f"{HEARTBEAT_ENV}={raw!r}: give a positive number of seconds") from None
    if not 0 < seconds < float("inf"):
        raise BadInput(f"{HEARTBEAT_ENV}={raw!r}: give a positive number of seconds")
    return seconds


def device_for_kind(device_kind: str) -> str:
    """The runners' device for a queue's device kind (:func:`deltabench.harness.devices.device_for_kind`):
    ``cpu`` -> ``cpu``; ``tpu``, ``tpu-v5e``... -> ``tpu`` (a machine without a TPU ends each job
    ``unsupported``, never runs it on its CPU); any other kind (``h200``, ``cuda``) -> ``cuda``."""
    from deltabench.harness.devices import device_for_kind as _device_for_kind

    return _device_for_kind(device_kind).platform


def queued_run_id(queue_job_id: int, created_at: _dt.datetime | str) -> str:
    """The run id of a queued job's document: fixed by the job, so every delivery of it writes the same run.

    The submission time is hashed in, so that two stores (or a store recreated from scratch) that both have a
    job 7 still give their runs different ids.
    """
    stamp = created_at if isinstance(created_at, str) else created_at.replace(tzinfo=None).isoformat()
    digest = hashlib.sha256(f"{queue_job_id}|{stamp}".encode()).hexdigest()[:10]
    return f"job{queue_job_id}-{digest}"


def stable_job_id(run_id: str, case: dict[str, Any], impl: str) -> str:
    """A result's job id, the same on every delivery of the queued job: the run id and a hash of (case, impl)."""
    key = json.dumps({"case": case, "impl": impl}, sort_keys=True)
    return f"{run_id}-{hashlib.sha256(key.encode()).hexdigest()[:20]}"


def _dims_key(shape: str, op: str) -> tuple[tuple[str, int], ...]:
    """`shape` read with `op`'s contract (its dims, defaults filled in), comparable with a suite plan's shapes."""
    from deltabench.harness.cases import parse_shape

    return tuple(parse_shape(shape, op).items())


def _filtered(values: tuple, wanted: list[str], canon: Callable[[str], Any]) -> tuple:
    if not wanted:
        return values
    keep = {canon(w) for w in wanted}
    return tuple(v for v in values if canon(v) in keep)


def suite_for_spec(spec: dict[str, Any]):  # type: ignore[no-untyped-def]  # -> harness.suites.Suite
    """The suite a job spec stands for.

    With ``suite``, the shipped suite restricted to the spec's shapes, dtypes and modes when given (ops and
    impls are filtered when the plan is made). Without, a suite of ``ops`` x ``shapes`` x ``dtypes`` x
    ``modes`` (a suite's defaults, bf16 and fwd, when empty) run by ``impls``, else by every impl registered
    for the op. Raises BadInput when the spec names nothing runnable.
    """
    from deltabench.harness.cases import parse_dtype
    from deltabench.harness.registry import impls_for
    from deltabench.harness.suites import load_suite, parse_suite

    shapes = list(spec.get("shapes") or [])
    dtypes = list(spec.get("dtypes") or [])
    modes = list(spec.get("modes") or [])
    if spec.get("suite"):
        suite = load_suite(str(spec["suite"]))
        plans = []
        for plan in suite.ops:
            shapes_kept = tuple(
                s for s in plan.shapes if not shapes or tuple(s.items()) in {_dims_key(x, plan.op) for x in shapes}
            )
            plan = dataclasses.replace(
                plan,
                shapes=shapes_kept,
                dtypes=_filtered(plan.dtypes, dtypes, parse_dtype),
                modes=_filtered(plan.modes, modes, str),
            )
            if plan.shapes and plan.dtypes and plan.modes:
                plans.append(plan)
        if not plans:
            raise BadInput(f"suite {suite.name!r} has no case with the shapes, dtypes and modes given")
        return dataclasses.replace(suite, ops=tuple(plans))
    ops = list(spec.get("ops") or [])
    if not ops or not shapes:
        raise BadInput("a job without a suite needs ops and shapes")
    wanted = list(spec.get("impls") or [])
    table: dict[str, Any] = {}
    for op in ops:
        registered = [impl.name for impl in impls_for(op)]
        impls = [i for i in wanted if i in registered] if wanted else registered
        if impls:
            baseline = "torch_recurrent" if "torch_recurrent" in impls else impls[0]
            table[op] = {"impls": impls, "baseline": baseline}
    if not table:
        raise BadInput(f"none of the impls {', '.join(wanted)} is registered for {', '.join(ops)}")
    data: dict[str, Any] = {"name": spec.get("name") or "job", "shapes": shapes, "ops": table}
    if dtypes:
        data["dtypes"] = dtypes
    if modes:
        data["modes"] = modes
    return parse_suite(data, source="job spec")


@dataclasses.dataclass
class QueuedJobRequest:
    """What the job process needs: the queued job, where to run it, and where to write its document."""

    queue_job_id: int
    run_id: str
    spec: dict[str, Any]
    device: str = "cpu"
    imports: list[str] = dataclasses.field(default_factory=list)
    timeout_s: float | None = None
    worker: str = ""
    delivery: int = 1  # 1 on the first delivery; more when the job runs again (a fleet worker knows only 2)
    out: str = ""


def run_queued_job(request: QueuedJobRequest):  # type: ignore[no-untyped-def]  # -> ResultDocument
    """Run the queued job in this process (what the job process does) and return its document.

    The document is written to ``request.out`` after every case, and at the end with its fixed run id and
    ``meta`` naming the queued job (``queue_job_id``: ingesting the document marks that job done).
    """
    from deltabench.harness.registry import load_module
    from deltabench.runners.session import plan_run, run_plan, write_document

    for module in request.imports:
        load_module(module)
    spec = request.spec
    suite = suite_for_spec(spec)
    filters = {
        "impls": list(spec.get("impls") or []) or None if spec.get("suite") else None,
        "ops": list(spec.get("ops") or []) or None if spec.get("suite") else None,
    }
    plan = plan_run(suite, device=request.device, timeout_s=request.timeout_s, imports=request.imports, **filters)
    if not plan.jobs:
        raise BadInput("the job spec expands to no jobs")
    for job in plan.jobs:
        job.job_id = stable_job_id(request.run_id, job.case, job.impl)
        job.attempt = 1  # the same on every delivery: a redelivered job's results are stored once
    out = Path(request.out) if request.out else None
    doc = run_plan(plan, out=out)
    if out is None:
        from deltabench.runners.session import partial_path

        partial_path(doc.run_id).unlink(missing_ok=True)
    doc.run_id = request.run_id
    doc.meta.update(
        queue_job_id=request.queue_job_id,
        device_kind=str(spec.get("device_kind") or ""),
        worker=request.worker,
        delivery=request.delivery,
    )
    if out is not None:
        write_document(doc, out)
    return doc


@dataclasses.dataclass
class JobOutcome:
    """How a job process ended: its document (finished), or cancelled, or an error (it produced no document)."""

    document: Any = None  # ResultDocument when finished
    cancelled: bool = False
    error: str = ""
    seconds: float = 0.0


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-6:])[-_LOG_TAIL:]


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM the job process (it kills its running case), then SIGKILL its group if it lingers."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=_TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


def execute_queued_job(
    request: QueuedJobRequest,
    *,
    should_cancel: Callable[[], bool] = lambda: False,
    poll_s: float = 1.0,
    env: dict[str, str] | None = None,
    python: str | None = None,
) -> JobOutcome:
    """Run `request` in a fresh job process and wait for it, asking `should_cancel` every `poll_s` seconds.

    A cancel (or an exception here, such as a shutdown) ends the job process and its running case. A job
    process that dies without a document is an error with the tail of its log; the cases' own failures
    (incorrect, timeout, oom, failed) are results inside the document.
    """
    from deltabench.harness.document import ResultDocument

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="deltabench-queued-job-") as tmp:
        out = Path(tmp) / "document.json"
        log_path = Path(tmp) / "log.txt"
        payload = json.dumps(dataclasses.asdict(dataclasses.replace(request, out=str(out))))
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [python or sys.executable, "-m", "deltabench.fleet.worker"],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                text=True,
                env={**os.environ, **(env or {})},
            )
            try:
                try:
                    proc.stdin.write(payload)  # type: ignore[union-attr]
                    proc.stdin.close()  # type: ignore[union-attr]
                except BrokenPipeError:
                    pass  # it died at once: reported below from its exit code
                while True:
                    try:
                        proc.wait(timeout=poll_s)
                        break
                    except subprocess.TimeoutExpired:
                        if should_cancel():
                            _end(proc)
                            return JobOutcome(cancelled=True, seconds=time.monotonic() - started)
            except BaseException:
                _end(proc)
                raise
        seconds = time.monotonic() - started
        if proc.returncode == 0 and out.exists():
            doc = ResultDocument.model_validate_json(out.read_text())
            if doc.meta.get("complete"):
                return JobOutcome(document=doc, seconds=seconds)
        rc = proc.returncode
        how = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        tail = _tail(log_path)
        return JobOutcome(error=f"the job process {how}" + (f": {tail}" if tail else ""), seconds=seconds)


def _exit_on_term(signum: int, _frame: Any) -> None:
    # Raised in the main thread wherever it is: run_isolated then kills the running case's process group.
    raise SystemExit(128 + signum)


def _watch_parent(parent: int) -> None:
    """End this process (as a SIGTERM would) once its parent is gone: a killed worker leaves no orphan job."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> int:
    """The job process: read a :class:`QueuedJobRequest` (JSON) on stdin, run it, write its document.

    Exit code 0 with a complete document; 2 when the spec names nothing runnable (its reason on stderr).
    """
    signal.signal(signal.SIGTERM, _exit_on_term)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    request = QueuedJobRequest(**json.loads(sys.stdin.read()))
    try:
        run_queued_job(request)
    except BadInput as exc:
        print(f"bad job: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
