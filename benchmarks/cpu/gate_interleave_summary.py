"""Grade and tally the invocations of ``benchmarks/cpu/gate_interleave.sh``: each ``{same,planted}-i`` pair of
documents (head and its interleaved base) through the gate's own code (``compare_documents``, files only, no
history), then failed same-code gates, planted slowdowns caught (gdn torch_chunk's forward jobs), and jobs falsely
failed (every job of a same-code pair; the jobs of a planted pair other than the planted impl's). The control:
the same documents paired across invocations (each same-code head against the base of every other same-code
invocation), which is what two runs made minutes apart give.

    python benchmarks/cpu/gate_interleave_summary.py /tmp/gate-interleave [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PLANTED = ("gdn", "torch_chunk")


def grade(folder: Path) -> list[dict]:
    """One record per invocation found in `folder`: kind, index, gate failed, and each job's outcome and change."""
    from deltabench.harness.document import ResultDocument
    from deltabench.regression import compare_documents

    out = []
    for head_path in sorted(folder.glob("*-*.json")):
        name = head_path.name.removesuffix(".json")
        if "." in name:
            continue  # a base document, a gate's JSON
        base_path = folder / f"{name}.base.json"
        if not base_path.is_file():
            continue
        head, base = (ResultDocument.from_json(p.read_text()) for p in (head_path, base_path))
        if not (head.complete and base.complete):
            continue
        cmp = compare_documents(base, head)
        kind, index = name.split("-")
        rows = [
            {
                "key": list(r.key),
                "outcome": r.outcome,
                "change": r.stats.change if r.stats else None,
                "bound": r.stats.noise_bound if r.stats else None,
                "source": r.stats.spread_source if r.stats else None,
            }
            for r in cmp.rows
        ]
        out.append({"kind": kind, "i": int(index), "failed": cmp.failed, "interleaved": cmp.interleaved, "rows": rows})
    return sorted(out, key=lambda r: (r["kind"], r["i"]))


def across(folder: Path) -> dict:
    """Same-code heads graded against the bases of the other same-code invocations (runs minutes apart, not
    interleaved: the gate judges them on each run's own repetitions)."""
    from deltabench.harness.document import ResultDocument
    from deltabench.regression import compare_documents

    def load(path: Path) -> ResultDocument | None:
        doc = ResultDocument.from_json(path.read_text()) if path.is_file() else None
        return doc if doc is not None and doc.complete else None

    heads = {p.name: load(p) for p in sorted(folder.glob("same-*.json")) if p.name.count(".") == 1}
    bases = {p.name: load(p) for p in sorted(folder.glob("same-*.base.json"))}
    gates = jobs = failed = failed_jobs = 0
    for hname, head in heads.items():
        for bname, base in bases.items():
            if head is None or base is None or bname.split(".")[0] == hname.split(".")[0]:
                continue
            cmp = compare_documents(base, head)
            assert not cmp.interleaved
            gates += 1
            failed += cmp.failed
            jobs += len(cmp.rows)
            failed_jobs += sum(r.outcome == "regression" for r in cmp.rows)
    return {"gates_failed": f"{failed}/{gates}", "jobs_failed": f"{failed_jobs}/{jobs}"}


def tally(records: list[dict]) -> dict:
    """The figures NOTES.md records."""
    same = [r for r in records if r["kind"] == "same"]
    planted = [r for r in records if r["kind"] == "planted"]

    def is_planted(row: dict) -> bool:
        return (row["key"][0], row["key"][1]) == PLANTED

    fwd = [row for r in planted for row in r["rows"] if is_planted(row) and row["key"][4] == "fwd"]
    control = [row for r in planted for row in r["rows"] if not is_planted(row)]
    same_rows = [row for r in same for row in r["rows"]]
    return {
        "same_code_gates_failed": f"{sum(r['failed'] for r in same)}/{len(same)}",
        "same_code_jobs_failed": f"{sum(row['outcome'] == 'regression' for row in same_rows)}/{len(same_rows)}",
        "planted_fwd_caught": f"{sum(row['outcome'] == 'regression' for row in fwd)}/{len(fwd)}",
        "planted_gates_failed": f"{sum(r['failed'] for r in planted)}/{len(planted)}",
        "control_jobs_failed": f"{sum(row['outcome'] == 'regression' for row in control)}/{len(control)}",
        "planted_fwd_changes": [round(row["change"], 3) for row in fwd if row["change"] is not None],
        "planted_fwd_bounds": [round(row["bound"], 3) for row in fwd if row["bound"] is not None],
        "false_failures": [
            {"kind": r["kind"], "i": r["i"], "job": row["key"], "change": row["change"], "bound": row["bound"]}
            for r in records
            for row in r["rows"]
            if row["outcome"] == "regression" and not (r["kind"] == "planted" and is_planted(row))
        ],
        "all_interleaved": all(r["interleaved"] for r in records),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the tally of a folder of interleaved invocations (and write every record as JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    records = grade(args.folder)
    summary = tally(records)
    summary["same_code_across_invocations"] = across(args.folder)
    log = args.folder / "log.tsv"
    if log.is_file():  # kind, i, load average at start-end, gate exit code, wall seconds
        rows = [ln.split("\t") for ln in log.read_text().splitlines() if ln.strip()]
        loads = [float(x) for r in rows for x in r[2].split("-")]
        summary["load_average"] = f"{min(loads):.1f}-{max(loads):.1f}"
        summary["wall_s"] = f"{min(int(r[4]) for r in rows)}-{max(int(r[4]) for r in rows)}"
    first = next(iter(sorted(args.folder.glob("same-*.base.json"))), None)
    if first is not None:
        meta = json.loads(first.read_text())["meta"]
        summary["suite"] = meta.get("suite_source")
        summary["repeat"] = meta.get("repeat")
        summary["jobs_per_run"] = len(records[0]["rows"]) if records else 0
    print(json.dumps(summary, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
