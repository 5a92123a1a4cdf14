"""Calibrate the regression gate on real runs: false failures on unchanged code, detection of planted slowdowns.

Two steps (a script, not a test; it runs the real CLI and takes minutes):

``collect`` runs ``deltabench run`` several times, interleaving groups round-robin so each group sees the same
machine states: a same-code group (the base history) and planted groups that import
``benchmarks/cpu/planted_slowdown.py`` with ``DELTABENCH_PLANTED_SLOWDOWN`` set::

    python benchmarks/gate_calibration.py collect --suite benchmarks/cpu/gate-calibration.toml \\
        --dir /tmp/cal --group same:0:5 --group p10:0.10:20 --group p20:0.20:20

``evaluate`` grades those documents the way ``deltabench gate`` does (``harness.regression``; the history spreads
from the same-code runs' medians as ``db.history`` reads them from a store) and writes a JSON summary::

    python benchmarks/gate_calibration.py evaluate --dir /tmp/cal --same same --planted p10:0.10 --planted p20:0.20 \\
        --out benchmarks/cpu/gate-calibration.json

Figures, for the same-code group: every pair (i < j) gated with no history (files only: the machine class's default
spread), each run gated against the newest other with the other runs as history (leave one out), and the old
within-run-only rule on the same pairs; the per-job spread of log medians over the runs (what the default spread is
derived from). For each planted group: each head against the newest same-code run with all same-code runs as
history, and each head against each same-code run alone (no history): the share of trials whose planted job is
graded a regression, and the control job's false failures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from deltabench.harness.document import ResultDocument
from deltabench.harness.regression import GradingRule, RunSpread, compare_documents, spread_from_history
from deltabench.harness.regression.matching import latest_by_key

PLANTED_FILE = Path(__file__).parent / "cpu" / "planted_slowdown.py"
PLANTED_IMPL = ("gdn", "torch_chunk")  # evaluate --planted-impl changes it (DELTABENCH_PLANTED_IMPL when collecting)


def collect(args: argparse.Namespace) -> None:
    """Run the groups round-robin, one ``deltabench run`` at a time, each document to ``DIR/<label>_<i>.json``."""
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    groups = []
    for spec in args.group:
        label, frac, n = spec.split(":")
        groups.append((label, float(frac), int(n)))
    done = {label: len(list(out.glob(f"{label}_*.json"))) for label, _, _ in groups}
    while any(done[label] < n for label, _, n in groups):
        for label, frac, n in groups:
            if done[label] >= n:
                continue
            path = out / f"{label}_{done[label]:03d}.json"
            cmd = ["deltabench", "run", "--suite", args.suite, "--no-db", "--out", str(path), "--format", "csv"]
            env = dict(os.environ)
            if frac > 0:
                cmd += ["--import", str(PLANTED_FILE)]
                env["DELTABENCH_PLANTED_SLOWDOWN"] = str(frac)
            t0 = time.time()
            rc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False).returncode
            load = os.getloadavg()[0]
            print(f"{path.name}: rc {rc}, {time.time() - t0:.0f} s, load {load:.1f}", flush=True)
            done[label] += 1


def _docs(folder: Path, label: str) -> list[ResultDocument]:
    docs = [ResultDocument.from_json(p.read_text()) for p in sorted(folder.glob(f"{label}_*.json"))]
    return sorted(docs, key=lambda d: d.created_at)


def _spreads(history: list[ResultDocument]) -> dict:
    """Each job's spread from these runs' medians, oldest first (what db.history computes from a store)."""
    medians: dict[tuple, list[float]] = {}
    for doc in history:
        for key, job in latest_by_key(doc).items():
            if job.status == "ok" and job.timing is not None:
                medians.setdefault(key, []).append(job.timing.median_ms)
    out = {}
    for key, m in medians.items():
        s = spread_from_history(m)
        if s is not None:
            out[key] = s
    return out


def _gate_counts(pairs, rule: GradingRule, *, with_history: bool, within_only: bool = False) -> dict:
    """Gate each (base, head, history) triple: failed gates, job regressions among the jobs timed on both sides."""
    failed = regressions = timed = 0
    for base, head, history in pairs:
        spreads = _spreads(history) if with_history else {}
        if within_only:  # the rule before run-to-run noise: no bound at all
            spreads = {k: RunSpread(sigma=0.0, source="default") for k in latest_by_key(base)}
        cmp = compare_documents(base, head, rule=rule, spreads=spreads, allow_missing=True)
        c = cmp.counts
        timed += c["regression"] + c["improvement"] + c["within_noise"]
        regressions += c["regression"]
        failed += cmp.failed
    return {"gates": len(pairs), "failed_gates": failed, "job_comparisons": timed, "job_regressions": regressions}


def _job_spreads(docs: list[ResultDocument]) -> dict:
    """Per timed job: the standard deviation of log medians over the runs; and their distribution over jobs."""
    medians: dict[tuple, list[float]] = {}
    for doc in docs:
        for key, job in latest_by_key(doc).items():
            if job.status == "ok" and job.timing is not None:
                medians.setdefault(key, []).append(job.timing.median_ms)
    sig = {"/".join(k): float(np.std(np.log(m), ddof=1)) for k, m in medians.items() if len(m) == len(docs)}
    v = np.array(sorted(sig.values()))
    return {
        "per_job": sig,
        "median": float(np.median(v)),
        "p75": float(np.quantile(v, 0.75)),
        "p90": float(np.quantile(v, 0.9)),
        "max": float(v.max()),
    }


def _detection(heads, same, rule: GradingRule) -> dict:
    """Share of heads whose planted job is a regression: against all same-code runs as history, and alone."""
    hist_hits = []
    base = same[-1]
    spreads = _spreads(same)
    control_false = 0
    changes = []
    for head in heads:
        cmp = compare_documents(base, head, rule=rule, spreads=spreads, allow_missing=True)
        rows = [r for r in cmp.rows if (r.op, r.impl) == PLANTED_IMPL]
        hist_hits.append(all(r.outcome == "regression" for r in rows) and bool(rows))
        control_false += sum(r.outcome == "regression" for r in cmp.rows if (r.op, r.impl) != PLANTED_IMPL)
        changes += [r.stats.change for r in rows if r.stats is not None and r.stats.change is not None]
    alone_hits = []
    for head in heads:
        for b in same:
            rows = [
                r
                for r in compare_documents(b, head, rule=rule, allow_missing=True).rows
                if (r.op, r.impl) == PLANTED_IMPL
            ]
            alone_hits.append(all(r.outcome == "regression" for r in rows) and bool(rows))
    return {
        "heads": len(heads),
        "with_history": {"caught": int(sum(hist_hits)), "trials": len(hist_hits), "history_runs": len(same)},
        "no_history": {"caught": int(sum(alone_hits)), "trials": len(alone_hits)},
        "control_false_failures": control_false,
        "observed_change_vs_history": {
            "median": float(np.median(changes)) if changes else None,
            "min": float(np.min(changes)) if changes else None,
        },
    }


def evaluate(args: argparse.Namespace) -> None:
    """Grade the collected documents (module docstring) and write the JSON summary."""
    global PLANTED_IMPL
    PLANTED_IMPL = tuple(args.planted_impl.split("/"))  # type: ignore[assignment]
    folder = Path(args.dir)
    rule = GradingRule(threshold=args.threshold, alpha=args.alpha)
    same = _docs(folder, args.same)
    if len(same) < 2:
        sys.exit(f"need at least two '{args.same}' runs in {folder}")
    pairs_no_hist = [(same[i], same[j], []) for i in range(len(same)) for j in range(i + 1, len(same))]
    loo = []
    for j, head in enumerate(same):
        others = [d for i, d in enumerate(same) if i != j]
        loo.append((others[-1], head, others))
    result = {
        "suite": same[0].suite,
        "machine_kind": same[0].environment.machine_kind,
        "cpu": same[0].environment.cpu,
        "alpha": args.alpha,
        "threshold": args.threshold,
        "same_code_runs": len(same),
        "run_started": [d.created_at.isoformat() for d in same],
        "load_note": args.load_note,
        "pairwise_no_history": _gate_counts(pairs_no_hist, rule, with_history=False),
        "leave_one_out_history": _gate_counts(loo, rule, with_history=True),
        "old_within_run_rule_pairwise": _gate_counts(pairs_no_hist, rule, with_history=False, within_only=True),
        "run_to_run_spread": _job_spreads(same),
        "planted_impl": args.planted_impl,
        "planted": {},
    }
    for spec in args.planted:
        label, frac = spec.split(":")
        heads = _docs(folder, label)
        if heads:
            result["planted"][label] = {"slowdown": float(frac), **_detection(heads, same, rule)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "run_to_run_spread"}, indent=1))
    s = result["run_to_run_spread"]
    print(f"run-to-run spread over jobs: median {s['median']:.2%}, p90 {s['p90']:.2%}, max {s['max']:.2%}")


def main() -> None:
    """Parse the command line and run ``collect`` or ``evaluate``."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="run the suite several times per group, interleaved")
    c.add_argument("--suite", required=True)
    c.add_argument("--dir", required=True)
    c.add_argument("--group", action="append", required=True, help="LABEL:SLOWDOWN:RUNS, e.g. p10:0.10:20")
    e = sub.add_parser("evaluate", help="grade the collected runs and write the summary")
    e.add_argument("--dir", required=True)
    e.add_argument("--same", required=True, help="label of the same-code runs")
    e.add_argument("--planted", action="append", default=[], help="LABEL:SLOWDOWN of a planted group")
    e.add_argument("--alpha", type=float, default=0.01)
    e.add_argument("--threshold", type=float, default=0.05)
    e.add_argument("--load-note", default="", help="how loaded the machine was, for the record")
    e.add_argument("--planted-impl", default="gdn/torch_chunk", help="OP/IMPL the planted groups slowed down")
    e.add_argument("--out", required=True)
    args = ap.parse_args()
    collect(args) if args.cmd == "collect" else evaluate(args)


if __name__ == "__main__":
    main()
