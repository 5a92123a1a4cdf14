"""Runs each job in its own process with a timeout, so that a crash, a hang or an out-of-memory error
ends that job (with its status and message) and the run goes on.

By default a job process is forked from a multiprocessing fork server that has imported torch and the
harness once (a job then starts in milliseconds rather than seconds); with ``python=`` it is
``python -m deltabench.runners.job_main`` under that interpreter. Either way the job runs in a new
session (its own process group): on timeout the whole group is killed, whatever the subject spawned.
A job that dies without writing a result (a segfault, ``os._exit``, the kernel's OOM killer) ends
``failed`` with the signal or exit code and the tail of its log.
"""

from __future__ import annotations

import datetime as _dt
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from deltabench.harness.document import JobResult

from .base import JobSpec
from .job import PHASE_MARK, case_spec

__all__ = ["IsolatedRunner", "job_environment", "run_isolated"]

_LOG_TAIL = 600  # characters of the child's log quoted in a failure's reason
_context: multiprocessing.context.BaseContext | None = None


def _forkserver() -> multiprocessing.context.BaseContext:
    global _context
    if _context is None:
        from .job_main import PRELOAD

        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def job_environment() -> dict[str, str]:
    """The environment a job runs with: this process's, and JAX not grabbing most of the GPU up front
    (a job may hold torch and JAX buffers side by side)."""
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


def _log_tail(log: str) -> str:
    lines = [ln for ln in log.splitlines() if ln.strip() and not ln.startswith(PHASE_MARK)]
    return " | ".join(lines[-4:])[-_LOG_TAIL:]


def _last_phase(log: str) -> str:
    phases = [ln[len(PHASE_MARK) :].strip() for ln in log.splitlines() if ln.startswith(PHASE_MARK)]
    return phases[-1] if phases else "startup"


def _kill_group(pid: int, fallback) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        fallback()


def _run_forked(payload: dict, log_path: Path, timeout_s: float) -> tuple[bool, int]:
    """(timed_out, exit code) of the job run in a process forked from the fork server."""
    proc = _forkserver().Process(target=_child, args=(json.dumps(payload), str(log_path)), daemon=False)
    proc.start()
    try:
        proc.join(timeout_s)
    except BaseException:
        _kill_group(proc.pid, proc.kill)  # interrupted: leave no orphan behind
        proc.join()
        raise
    if proc.exitcode is None:
        _kill_group(proc.pid, proc.kill)
        proc.join()
        return True, proc.exitcode or 0
    return False, proc.exitcode


def _child(payload_json: str, log_path: str) -> None:
    from .job_main import child_main

    child_main(payload_json, log_path)


def _run_exec(payload: dict, log_path: Path, timeout_s: float, python: str) -> tuple[bool, int]:
    """(timed_out, exit code) of the job run as ``python -m deltabench.runners.job_main``."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [python, "-m", "deltabench.runners.job_main"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            env=payload["env"],
        )
        try:
            try:
                proc.stdin.write(json.dumps(payload))
                proc.stdin.close()
            except BrokenPipeError:
                pass  # the child died before reading its job: reported from its exit code
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid, proc.kill)
            proc.wait()
            return True, proc.returncode
        except BaseException:
            _kill_group(proc.pid, proc.kill)
            proc.wait()
            raise
    return False, proc.returncode


def run_isolated(job: JobSpec, *, python: str | None = None) -> JobResult:
    """Run `job` in a fresh process, killing its process group after ``job.timeout_s`` seconds.

    With `python` (an interpreter path) the job is started under it; otherwise it is forked from the
    fork server.
    """
    started = _dt.datetime.now(_dt.timezone.utc)
    case = job.to_case()
    with tempfile.TemporaryDirectory(prefix="deltabench-job-") as tmp:
        result_path = Path(tmp) / "result.json"
        log_path = Path(tmp) / "log.txt"
        payload = {"job": job.model_dump(), "result_path": str(result_path), "env": job_environment()}
        if python:
            timed_out, rc = _run_exec(payload, log_path, job.timeout_s, python)
        else:
            timed_out, rc = _run_forked(payload, log_path, job.timeout_s)
        log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if not timed_out and result_path.exists():
            return JobResult.model_validate_json(result_path.read_text())

    result = JobResult(
        job_id=job.job_id,
        attempt=job.attempt,
        case=case_spec(case),
        impl=job.impl,
        device=case.device,
        status="failed",
        started_at=started,
        finished_at=_dt.datetime.now(_dt.timezone.utc),
    )
    phase = _last_phase(log_text)
    if timed_out:
        result.status = "timeout"
        result.reason = f"no result after {job.timeout_s:g} s (in {phase}); process group killed"
    else:
        if rc < 0:
            try:
                how = f"killed by signal {signal.Signals(-rc).name}"
            except ValueError:
                how = f"killed by signal {-rc}"
        else:
            how = f"exited with code {rc}"
        result.reason = f"crashed in {phase}: {how} without a result"
    tail = _log_tail(log_text)
    if tail:
        result.reason += f" [log: {tail}]"
    return result


class IsolatedRunner:
    """Runs each job in its own process with the job's timeout (forked, or under `python` if given)."""

    def __init__(self, python: str | None = None) -> None:
        self.python = python

    def run(self, job: JobSpec) -> JobResult:
        """Run `job` in a fresh process."""
        return run_isolated(job, python=self.python)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("deltabench.runners.isolated is a library; use `deltabench run`")
