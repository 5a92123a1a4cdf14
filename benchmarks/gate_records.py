"""The gate's rel_fro records of one job of a ``deltabench run`` document, as a small JSON file and a markdown table
(a run document with every record of every job is too large to keep in the repository).

    python benchmarks/gate_records.py RUN.json --impl fla_chunk --mode fwd+bwd --checks grad: \\
        --json out.json --md out.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _job(doc: dict[str, Any], impl: str, mode: str) -> dict[str, Any]:
    jobs = [j for j in doc["jobs"] if j["impl"] == impl and j["case"]["mode"] == mode and j.get("verification")]
    if not jobs:
        raise SystemExit(f"no job of {impl} ({mode}) with gate records")
    return jobs[0]


def records(job: dict[str, Any], prefixes: list[str]) -> list[dict[str, Any]]:
    """The job's gating rel_fro records whose check starts with one of `prefixes`, in the document's order."""
    keep = ("check", "regime", "initial_state", "seed", "value", "threshold", "passed", "reference")
    return [
        {k: r[k] for k in keep}
        for r in job["verification"]
        if r["metric"] == "rel_fro" and r.get("gating", True) and any(r["check"].startswith(p) for p in prefixes)
    ]


def main() -> None:
    """Write the records of one job as JSON and as a markdown table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--impl", required=True)
    ap.add_argument("--mode", default="fwd+bwd")
    ap.add_argument("--checks", default="grad:", help="comma-separated check prefixes")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--md", type=Path, required=True)
    args = ap.parse_args()
    doc = json.loads(args.run.read_text())
    job = _job(doc, args.impl, args.mode)
    recs = records(job, args.checks.split(","))
    c = job["case"]
    shape = f"B{c['B']}-T{c['T']}-H{c['H']}-K{c['K']}-V{c['V']} {c['dtype']} {c['mode']}"
    head = {"run_id": doc["run_id"], "created_at": doc["created_at"], "suite": doc["suite"], "impl": job["impl"]}
    head |= {"case": shape, "status": job["status"], "gate_reference": job["gate_reference"], "notes": job["notes"]}
    body = ",\n".join(json.dumps(r) for r in recs)  # one record a line: small, and diffs read well
    args.json.write_text(json.dumps(head, indent=1)[:-2] + ',\n "records": [\n' + body + "\n ]\n}\n")
    lines = [f"# {job['impl']} {shape}: gate records ({', '.join(args.checks.split(','))})", ""]
    lines += [f"- {k}: {v}" for k, v in head.items()] + [""]
    lines += [
        "| check | regime | h0 | seed | rel_fro | bound | passed | reference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        value = "-" if r["value"] is None else f"{r['value']:.3e}"
        lines.append(
            f"| {r['check']} | {r['regime']} | {'yes' if r['initial_state'] else 'no'} | {r['seed']} | {value} | "
            f"{r['threshold']:g} | {'pass' if r['passed'] else '**FAIL**'} | {r['reference']} |"
        )
    args.md.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
