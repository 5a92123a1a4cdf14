"""Runs each job in its own subprocess with a timeout, so that a crash, a hang or an out-of-memory
error ends that job (with its status and message) and the run goes on.

The child is ``python -m deltabench.runners.job_main`` in a new session (its own process group): on
timeout the whole group is killed, whatever the subject spawned. A child that dies without writing a
result (a segfault, ``os._exit``, the kernel's OOM killer) ends ``failed`` with the signal or exit
code and the tail of its log.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from deltabench.harness.document import JobResult

from .base import JobSpec
from .job import PHASE_MARK, case_spec

__all__ = ["IsolatedRunner", "run_isolated"]

_LOG_TAIL = 600  # characters of the child's log quoted in a failure's reason


def _log_tail(log: str) -> str:
    lines = [ln for ln in log.splitlines() if ln.strip() and not ln.startswith(PHASE_MARK)]
    return " | ".join(lines[-4:])[-_LOG_TAIL:]


def _last_phase(log: str) -> str:
    phases = [ln[len(PHASE_MARK) :].strip() for ln in log.splitlines() if ln.startswith(PHASE_MARK)]
    return phases[-1] if phases else "startup"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def run_isolated(job: JobSpec, *, python: str | None = None) -> JobResult:
    """Run `job` in a fresh subprocess, killing its process group after ``job.timeout_s`` seconds."""
    started = _dt.datetime.now(_dt.timezone.utc)
    case = job.to_case()
    with tempfile.TemporaryDirectory(prefix="deltabench-job-") as tmp:
        result_path = Path(tmp) / "result.json"
        log_path = Path(tmp) / "log.txt"
        payload = json.dumps({"job": job.model_dump(), "result_path": str(result_path)})
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [python or sys.executable, "-m", "deltabench.runners.job_main"],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                text=True,
            )
            timed_out = False
            try:
                try:
                    proc.stdin.write(payload)
                    proc.stdin.close()
                except BrokenPipeError:
                    pass  # the child died before reading its job: reported below from its exit code
                proc.wait(timeout=job.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            except BaseException:
                _kill_group(proc)  # interrupted: leave no orphan behind
                raise
        log_text = log_path.read_text(errors="replace")
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
        rc = proc.returncode
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
    """Runs each job in its own subprocess with the job's timeout."""

    def __init__(self, python: str | None = None) -> None:
        self.python = python

    def run(self, job: JobSpec) -> JobResult:
        """Run `job` in a fresh process."""
        return run_isolated(job, python=self.python)
