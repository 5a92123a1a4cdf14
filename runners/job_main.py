"""Entry points of a job's own process.

* ``python -m deltabench.runners.job_main`` reads ``{"job": JobSpec, "result_path": PATH}`` as JSON on stdin
  (used when the job must run under another interpreter);
* :func:`child_main` is the target of a process forked from deltabench's fork server, which has torch and
  the harness imported already, so that a job does not pay for importing them.

Either way the job runs in a fresh process and its JobResult is written as JSON to ``result_path``
atomically (a parent never reads half a file); stdout and stderr are the job's log, and a segfault's
traceback lands there too (faulthandler).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["PRELOAD", "child_main", "main", "run_payload"]

# What the fork server imports once, before forking jobs (never JAX or Triton: they read their settings
# and may start threads at import; a job imports them itself).
PRELOAD = ["torch", "deltabench.harness.verify", "deltabench.runners.job"]


def run_payload(payload: dict[str, Any]) -> None:
    """Run the job of `payload` and write its result to ``payload["result_path"]``."""
    from deltabench.runners.base import JobSpec
    from deltabench.runners.job import execute

    result = execute(JobSpec.model_validate(payload["job"]))
    path = Path(payload["result_path"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(result.model_dump_json())
    os.replace(tmp, path)


def child_main(payload_json: str, log_path: str) -> None:
    """Body of a forked job process: own session, log on fds 1 and 2, the parent's environment, the job."""
    os.setsid()  # its own process group: a timeout kills everything the job started
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()
    payload = json.loads(payload_json)
    # The fork server was started with the environment of its time; the job sees the parent's of now.
    os.environ.clear()
    os.environ.update(payload.get("env", {}))
    run_payload(payload)
    sys.stdout.flush()
    sys.stderr.flush()


def main() -> int:
    """Run the job given on stdin; the exit code is 0 whenever a result was written."""
    faulthandler.enable()
    run_payload(json.loads(sys.stdin.read()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
