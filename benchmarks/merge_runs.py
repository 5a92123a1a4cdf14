"""One result document from several runs of one suite made back to back on one machine.

A device session often runs a suite in parts (``deltabench run --impl A``, then ``--impl B``: an impl per part, so
that a part cut short costs only its own jobs). This joins the parts into one document, which ``deltabench ingest``
and ``deltabench results`` then show as one table with every impl beside the op's baseline::

    python benchmarks/merge_runs.py train-ours.json train-fla.json train-flashqla.json --out train.json [--gzip] \
        [--format markdown]

``--format`` also prints the merged table as ``deltabench run`` would (table, csv, json, markdown), with no database:
what a GPU host without the ``db`` extra renders.

The parts must share the suite, the machine (kind, device, driver, torch, Triton) and the deltabench commit; the
merged document takes the first part's environment and ceilings, the jobs in the order given, and names every part
(run id, start time) under ``meta["merged_from"]``. Exit code 2 with one line when the parts differ.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import uuid
from pathlib import Path

from deltabench.harness.document import ResultDocument
from deltabench.harness.documents_io import load_documents
from deltabench.harness.errors import BadInput
from deltabench.harness.report import FORMATS, render_results

# What must agree for the parts' timings to sit in one table.
SAME_ENVIRONMENT = ("machine_kind", "device_name", "driver", "cuda", "torch", "triton", "git_commit", "kernel_hash")


def merge(parts: list[ResultDocument]) -> ResultDocument:
    """The parts as one document (module docstring). Raises BadInput when they differ in suite or environment."""
    if not parts:
        raise BadInput("no documents to merge")
    first = parts[0]
    for doc in parts[1:]:
        if doc.suite != first.suite:
            raise BadInput(f"run {doc.run_id} is of suite {doc.suite!r}, not {first.suite!r}")
        for field in SAME_ENVIRONMENT:
            a, b = getattr(first.environment, field), getattr(doc.environment, field)
            if a != b:
                raise BadInput(f"run {doc.run_id} differs in {field}: {b!r} against {a!r}")
    baselines: dict[str, str] = {}
    for doc in parts:
        for op, impl in doc.baselines.items():
            baselines.setdefault(op, impl)
    meta = dict(first.meta)
    meta["complete"] = all(doc.meta.get("complete", True) for doc in parts)
    meta["merged_from"] = [{"run_id": d.run_id, "created_at": d.created_at.isoformat()} for d in parts]
    return first.model_copy(
        update={
            "run_id": uuid.uuid4().hex,
            "baselines": baselines,
            "jobs": [job for doc in parts for job in doc.jobs],
            "meta": meta,
        }
    )


def main(argv: list[str] | None = None) -> int:
    """Merge the files given (each one document) into --out; 2 on bad input."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--gzip", action="store_true", help="also write OUT.gz (what a repository keeps)")
    parser.add_argument("--format", choices=FORMATS, help="also print the merged table in this format")
    args = parser.parse_args(argv)
    try:
        parts = [doc for path in args.files for doc in load_documents(path)]
        merged = merge(parts)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = merged.model_dump_json()
    args.out.write_text(text, encoding="utf-8")
    if args.gzip:
        with gzip.open(f"{args.out}.gz", "wt", encoding="utf-8") as fh:
            fh.write(text)
    print(f"{args.out}: run {merged.run_id}, {len(merged.jobs)} jobs from {len(parts)} runs")
    if args.format:
        print(render_results(merged, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
