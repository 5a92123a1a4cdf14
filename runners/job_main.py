"""Entry point of a job's subprocess: ``python -m deltabench.runners.job_main``.

Reads ``{"job": JobSpec, "result_path": PATH}`` as JSON on stdin, runs the job in this fresh process and
writes the JobResult as JSON to ``result_path`` (atomically: a parent never reads half a file). stdout
and stderr are the job's log; a segfault's traceback lands there too (faulthandler).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path

__all__ = ["main"]


def main() -> int:
    """Run the job given on stdin; the exit code is 0 whenever a result was written."""
    faulthandler.enable()
    payload = json.loads(sys.stdin.read())
    from deltabench.runners.base import JobSpec
    from deltabench.runners.job import execute

    result = execute(JobSpec.model_validate(payload["job"]))
    path = Path(payload["result_path"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(result.model_dump_json())
    os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
