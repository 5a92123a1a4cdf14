"""Entry points of a job's own process, and of a worker process that runs one impl's jobs one after another.

* ``python -m deltabench.runners.job_main`` reads ``{"job": JobSpec, "result_path": PATH}`` as JSON on stdin
  (used when the job must run under another interpreter);
* ``python -m deltabench.runners.job_main --serve`` reads such payloads one per line on stdin and runs them
  in turn, until stdin closes (the shared worker of :mod:`.isolated` under another interpreter);
* :func:`child_main` and :func:`serve_main` are the same two, as targets of a process forked from
  deltabench's fork server, which has torch and the harness imported already, so that a job does not pay
  for importing them.

Each JobResult is written as JSON to its ``result_path`` atomically (a parent never reads half a file);
stdout and stderr are the log, and a segfault's traceback lands there too (faulthandler).
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

__all__ = ["PRELOAD", "child_main", "main", "run_payload", "serve_main"]

# What the fork server imports once, before forking jobs (never JAX or Triton: they read their settings
# and may start threads at import; a job imports them itself).
PRELOAD = ["torch", "deltabench.correctness.engine", "deltabench.runners.job"]


def run_payload(payload: dict[str, Any], *, settle: bool = False) -> None:
    """Run the job of `payload` and write its result to ``payload["result_path"]``.

    With `settle` (a worker that runs more jobs) what the job left is freed before the result is written, so the
    parent sends the next job only to a clean process; an error surfacing then (an asynchronous CUDA fault of the
    job's last launch) fails this job, and the parent replaces the process.
    """
    from deltabench.runners.base import JobSpec
    from deltabench.runners.job import execute

    result = execute(JobSpec.model_validate(payload["job"]))
    if settle:
        try:
            _between_jobs()
        except Exception as exc:
            result.status, result.timing = "failed", None
            result.reason = f"after the job: {type(exc).__name__}: {exc}".strip()[:2000]
    path = Path(payload["result_path"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(result.model_dump_json())
    os.replace(tmp, path)


def _between_jobs() -> None:
    """Free what the last job left (its tensors, torch's cached CUDA blocks), so the next starts clean."""
    gc.collect()
    # What survives (torch, JAX, the impl's modules and caches) is frozen out of later collections: a full
    # collection over them costs ~0.4 s a job; the next one then scans only what that job created.
    gc.freeze()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _own_session(log_path: str, env: dict[str, str]) -> None:
    os.setsid()  # its own process group: a timeout kills everything the job started
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()
    # The fork server was started with the environment of its time; the job sees the parent's of now.
    os.environ.clear()
    os.environ.update(env)


def child_main(payload_json: str, log_path: str) -> None:
    """Body of a forked job process: own session, log on fds 1 and 2, the parent's environment, the job."""
    payload = json.loads(payload_json)
    _own_session(log_path, payload.get("env", {}))
    run_payload(payload)
    sys.stdout.flush()
    sys.stderr.flush()


def serve_main(jobs: Connection, log_path: str, env: dict[str, str]) -> None:
    """Body of a forked worker process: own session and log, then every payload received on `jobs`, in turn,
    until the parent closes its end."""
    _own_session(log_path, env)
    while True:
        try:
            payload = json.loads(jobs.recv())
        except EOFError:
            return
        run_payload(payload, settle=True)
        sys.stdout.flush()
        sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """Run the job given on stdin (or, with ``--serve``, each job given as one line of stdin); the exit code
    is 0 whenever every result was written."""
    faulthandler.enable()
    if "--serve" in (sys.argv[1:] if argv is None else argv):
        for line in sys.stdin:
            if line.strip():
                run_payload(json.loads(line), settle=True)
                sys.stdout.flush()
                sys.stderr.flush()
        return 0
    run_payload(json.loads(sys.stdin.read()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
