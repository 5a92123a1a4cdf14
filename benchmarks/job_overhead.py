"""Where a run's time went, job by job, from its result documents: the harness's overhead beyond the timing.

    python benchmarks/job_overhead.py RUN.json [RUN.json ...] [--wall-s SECONDS ...]

For each job: its duration (``started_at`` to ``finished_at``, both stamped inside the job's process, so the
process's start-up is not in it), ``compile_s`` (the first call), the time its timed samples took, and the
overhead: the duration less the timed samples, i.e. imports of the impl, inputs, the first call, the
correctness gate, the memory probe and warm-up. For a kernel already compiled (a warm run) that overhead is
what the target of at most 5 s per job beyond its timing budget bounds. Per document: jobs, the sum of
durations, and with ``--wall-s`` (the run's measured wall clock, one per document) the rest: the parent's
start-up, environment and printing, and between jobs the processes' start-up and clean-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from deltabench.harness.document import ResultDocument


def job_rows(doc: ResultDocument) -> list[dict]:
    """One row per job: impl, case, status, duration, compile and timed-sample seconds, overhead."""
    rows = []
    for job in doc.jobs:
        duration = (job.finished_at - job.started_at).total_seconds() if job.finished_at else float("nan")
        sampled = sum(job.timing.samples_ms) / 1e3 if job.timing else 0.0
        compile_s = job.timing.compile_s if job.timing and job.timing.compile_s is not None else None
        rows.append(
            {
                "job": f"{job.impl} {job.case.shape_id} {job.case.dtype} {job.case.mode}",
                "status": job.status,
                "duration_s": duration,
                "compile_s": compile_s,
                "sampled_s": sampled,
                "overhead_s": duration - sampled,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the per-job table and the summary of each document."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("documents", nargs="+", type=Path)
    parser.add_argument("--wall-s", type=float, action="append", default=[], help="measured wall clock, per document")
    args = parser.parse_args(argv)
    for i, path in enumerate(args.documents):
        doc = ResultDocument.from_json(path.read_text())
        rows = job_rows(doc)
        print(f"## {path.name}: suite {doc.suite}, {len(rows)} jobs")
        print("| job | status | duration s | compile s | timed samples s | overhead s |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            comp = "-" if r["compile_s"] is None else f"{r['compile_s']:.2f}"
            print(
                f"| {r['job']} | {r['status']} | {r['duration_s']:.2f} | {comp} | {r['sampled_s']:.2f} "
                f"| {r['overhead_s']:.2f} |"
            )
        total = sum(r["duration_s"] for r in rows)
        overheads = [r["overhead_s"] for r in rows if r["status"] != "unsupported"]
        line = f"jobs' durations sum to {total:.1f} s"
        if overheads:
            line += (
                f"; overhead per started job: median {statistics.median(overheads):.2f} s, "
                f"mean {statistics.fmean(overheads):.2f} s, max {max(overheads):.2f} s"
            )
        if i < len(args.wall_s):
            line += f"; wall {args.wall_s[i]:.1f} s, outside jobs {args.wall_s[i] - total:.1f} s"
        print(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
