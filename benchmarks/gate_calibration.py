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
        --out benchmarks/results/gate-calibration/gate-calibration-suite.json

``repetitions`` grades runs made with ``collect --repeat N`` (each job timed in N worker processes, round by
round) with no history at all, as each k = 1..N first repetitions would have: every unordered pair of same-code
runs (base older than head), and every planted head against every same-code run, the gate taking the spread
between repetitions (``noise.spread_from_repetitions``; trials count the planted impl's jobs of ``--planted-mode``
only, since the busy-wait follows the forward call); it names the smallest k that catches the planted jobs in
>= 95% of trials with no failed same-code gate::

    python benchmarks/gate_calibration.py collect --suite benchmarks/cpu/gate-repeat.toml --repeat 10 \
        --dir /tmp/rep --group same:0:5 --group p20:0.20:6
    python benchmarks/gate_calibration.py repetitions --dir /tmp/rep --same same --planted p20:0.20 \
        --planted-mode fwd --out benchmarks/results/gate-calibration/gate-repeat-n10.json

Figures, for the same-code group: the default spread these runs support (the sigma at which no-history job
comparisons fail at most a share alpha, and the smallest at which no no-history gate fails); every ordered pair
gated with no history (files only: the machine class's default spread); each run gated against the newest other
with the other runs as history (leave one out); the old median rule (ratio, rank test, interval) on the same pairs;
the per-job spread of log run levels (best times) and of log medians over the runs. For each planted group: each
head against the newest same-code run with all same-code runs as history, and each head against each same-code run
alone (no history): the share of trials whose planted job is graded a regression, and the control job's false failures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from deltabench.harness.document import ResultDocument
from deltabench.regression import GradingRule, compare_documents
from deltabench.regression.matching import latest_by_key
from deltabench.regression.noise import run_level, spreads_from_histories
from deltabench.runners.replay import first_repetitions

PLANTED_FILE = Path(__file__).parent / "cpu" / "planted_slowdown.py"
PLANTED_IMPL = ("gdn", "torch_chunk")  # evaluate --planted-impl changes it (DELTABENCH_PLANTED_IMPL when collecting)


def run_suite(suite: str, path: Path, repeat: int, fraction: float, import_planted: bool = False) -> float:
    """One ``deltabench run --repeat`` of `suite` to `path`, the planted file imported at `fraction` (when above 0,
    or when `import_planted`); its seconds, printed and logged beside the machine's load in ``collect.log``."""
    # The CLI through the interpreter: a GPU machine with deltabench on PYTHONPATH has no console script.
    cli = [sys.executable, "-m", "deltabench.cli.app", "run"]
    cmd = [*cli, "--suite", suite, "--no-db", "--out", str(path), "--format", "csv", "--quiet"]
    if repeat > 1:
        cmd += ["--repeat", str(repeat)]
    env = dict(os.environ)
    if fraction > 0 or import_planted:
        cmd += ["--import", str(PLANTED_FILE)]
        env["DELTABENCH_PLANTED_SLOWDOWN"] = str(fraction)
    t0 = time.time()
    rc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False).returncode
    seconds = time.time() - t0
    line = f"{path.name}: rc {rc}, {seconds:.0f} s, load {os.getloadavg()[0]:.1f}"
    print(line, flush=True)
    with open(path.parent / "collect.log", "a") as log:  # the machine's load beside each run, for the record
        log.write(f"{time.strftime('%H:%M:%S', time.gmtime())} UTC {line}\n")
    return seconds


def collect(args: argparse.Namespace) -> None:
    """Run the groups round-robin, one ``deltabench run`` at a time, each document to ``DIR/<label>_<i>.json``."""
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    groups = []
    for spec in args.group:
        label, frac, n = spec.split(":")
        groups.append((label, float(frac), int(n)))
    done = {label: len(list(out.glob(f"{label}_*.json"))) for label, _, _ in groups}
    started, longest = time.time(), 0.0
    while any(done[label] < n for label, _, n in groups):
        for label, frac, n in groups:
            if done[label] >= n:
                continue
            if args.deadline_s is not None and time.time() - started + longest > args.deadline_s:
                print(f"deadline: {args.deadline_s:.0f} s leaves no room for another run ({longest:.0f} s)", flush=True)
                return
            path = out / f"{label}_{done[label]:03d}.json"
            seconds = run_suite(args.suite, path, args.repeat, frac, args.planted_everywhere)
            longest = max(longest, seconds)
            done[label] += 1


def _docs(folder: Path, label: str) -> list[ResultDocument]:
    """The runs of group `label` in `folder`, oldest first; a run cut before its first job ended (a partial
    document without jobs: the collection's timeout) is left out and named on stderr."""
    docs = []
    for path in sorted(folder.glob(f"{label}_*.json")):
        doc = ResultDocument.from_json(path.read_text())
        if doc.jobs:
            docs.append(doc)
        else:
            print(f"{path.name}: no finished job (a run cut short), left out", file=sys.stderr)
    return sorted(docs, key=lambda d: d.created_at)


def _levels(docs: list[ResultDocument], level=run_level) -> dict[tuple, list[float]]:
    """Each ok job's run levels over these runs, in their order (the gate's: best time; or another statistic)."""
    out: dict[tuple, list[float]] = {}
    for doc in docs:
        for key, job in latest_by_key(doc).items():
            if job.status == "ok" and job.timing is not None:
                out.setdefault(key, []).append(level(job.timing.samples_ms, job.timing.median_ms))
    return out


def _spreads(history: list[ResultDocument]) -> dict:
    """Each job's spread from these runs' levels, oldest first, as db.history computes it from a store."""
    return spreads_from_histories(_levels(history))


def _old_rule_regression(ev, rule: GradingRule) -> bool:
    """The gate's rule before run-to-run noise: ratio of medians over the threshold, p < alpha, interval above 1."""
    return ev.ratio > 1.0 + rule.threshold and ev.pvalue < rule.alpha and (ev.ci_low or 0.0) > 1.0


def _gate_counts(
    pairs, rule: GradingRule, *, with_history: bool, within_only: bool = False, sigma: float | None = None
) -> dict:
    """Gate each (base, head, history) triple: failed gates, job regressions among the jobs timed on both sides.
    `sigma`: the no-history default spread (None: the machine class's)."""
    failed = regressions = timed = 0
    for base, head, history in pairs:
        spreads = _spreads(history) if with_history else {}
        cmp = compare_documents(base, head, rule=rule, spreads=spreads, default_sigma=sigma, allow_missing=True)
        if within_only:  # the rule before run-to-run noise: ratio of medians, rank test and interval only
            old = [r for r in cmp.rows if r.stats is not None and _old_rule_regression(r.stats, rule)]
            timed += sum(r.stats is not None for r in cmp.rows)
            regressions += len(old)
            failed += bool(old)
            continue
        c = cmp.counts
        timed += c["regression"] + c["improvement"] + c["within_noise"]
        regressions += c["regression"]
        failed += cmp.failed
    return {"gates": len(pairs), "failed_gates": failed, "job_comparisons": timed, "job_regressions": regressions}


def _job_spreads(docs: list[ResultDocument], level=run_level) -> dict:
    """Per timed job: the standard deviation of log run levels over the runs; and their distribution over jobs."""
    medians = _levels(docs, level)
    sig = {"/".join(k): float(np.std(np.log(m), ddof=1)) for k, m in medians.items() if len(m) == len(docs)}
    v = np.array(sorted(sig.values()))
    return {
        "per_job": sig,
        "median": float(np.median(v)),
        "p75": float(np.quantile(v, 0.75)),
        "p90": float(np.quantile(v, 0.9)),
        "max": float(v.max()),
    }


def suggested_default(docs: list[ResultDocument], alpha: float) -> float:
    """The default spread these same-code runs support: the sigma whose no-history bound z(1-alpha) * sqrt(2) * sigma
    equals the (1 - alpha) quantile of the log ratios of run levels over every job and ordered pair of runs, so the
    no-history rule fails at most a share alpha of those job comparisons."""
    from scipy.stats import norm

    d = []
    for levels in _levels(docs).values():
        y = np.log(levels)
        d += [float(a - b) for i, a in enumerate(y) for j, b in enumerate(y) if i != j]
    return float(np.quantile(d, 1.0 - alpha)) / (float(norm.isf(alpha)) * np.sqrt(2.0))


def gate_safe_default(pairs, rule: GradingRule) -> float:
    """The smallest default spread (to 0.5%, by bisection: failures only fall as it grows) at which no-history gates
    on these same-code pairs fail none."""
    lo, hi = 0.0, 4.0
    while hi - lo > 0.005:
        mid = (lo + hi) / 2
        failed = _gate_counts(pairs, rule, with_history=False, sigma=mid)["failed_gates"]
        lo, hi = (mid, hi) if failed else (lo, mid)
    return math.ceil(hi * 1000) / 1000  # rounded up: still no failed gate


def _detection(heads, same, rule: GradingRule, sigma: float | None = None, mode: str | None = None) -> dict:
    """Share of heads whose planted jobs (of `mode`, or all) are regressions: against all same-code runs as
    history, and alone."""
    hist_hits = []
    base = same[-1]
    spreads = _spreads(same)
    control_false = 0
    changes = []
    for head in heads:
        cmp = compare_documents(base, head, rule=rule, spreads=spreads, allow_missing=True)
        rows = [r for r in cmp.rows if _planted_row(r, mode)]
        hist_hits.append(all(r.outcome == "regression" for r in rows) and bool(rows))
        control_false += sum(r.outcome == "regression" for r in cmp.rows if (r.op, r.impl) != PLANTED_IMPL)
        changes += [r.stats.change for r in rows if r.stats is not None and r.stats.change is not None]
    alone_hits = []
    for head in heads:
        for b in same:
            cmp = compare_documents(b, head, rule=rule, default_sigma=sigma, allow_missing=True)
            rows = [r for r in cmp.rows if _planted_row(r, mode)]
            alone_hits.append(all(r.outcome == "regression" for r in rows) and bool(rows))
    return {
        "heads": len(heads),
        "with_history": {"caught": int(sum(hist_hits)), "trials": len(hist_hits), "history_runs": len(same)},
        "no_history": {"caught": int(sum(alone_hits)), "trials": len(alone_hits), "default_spread": sigma},
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
    # Both directions of every pair: a base may be newer than its head (a revert, a bisection).
    pairs_no_hist = [(same[i], same[j], []) for i in range(len(same)) for j in range(len(same)) if i != j]
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
        "suggested_default_spread": suggested_default(same, args.alpha),
        "gate_safe_default_spread": gate_safe_default(pairs_no_hist, rule),
        "run_to_run_spread": _job_spreads(same),
        "run_to_run_spread_of_medians": _job_spreads(same, lambda samples, median: median),
        "planted_impl": args.planted_impl,
        "planted": {},
    }
    for spec in args.planted:
        label, frac = spec.split(":")
        heads = _docs(folder, label)
        if heads:
            found = _detection(heads, same, rule, mode=args.planted_mode)
            result["planted"][label] = {"slowdown": float(frac), "mode": args.planted_mode, **found}
            if args.default_spread is not None:
                own = _detection(heads, same, rule, sigma=args.default_spread, mode=args.planted_mode)["no_history"]
                result["planted"][label]["no_history_given_default"] = own
    if args.default_spread is not None:
        result["pairwise_no_history_given_default"] = {
            "default_spread": args.default_spread,
            **_gate_counts(pairs_no_hist, rule, with_history=False, sigma=args.default_spread),
        }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("run_to_run_spread")}, indent=1))
    m = result["run_to_run_spread_of_medians"]
    print(
        f"default spread: job false failures <= alpha at {result['suggested_default_spread']:.2%}, "
        f"no failed gate at {result['gate_safe_default_spread']:.2%}"
    )
    print(f"medians' run-to-run spread over jobs: median {m['median']:.2%}, p90 {m['p90']:.2%}, max {m['max']:.2%}")
    s = result["run_to_run_spread"]
    print(f"run-to-run spread over jobs: median {s['median']:.2%}, p90 {s['p90']:.2%}, max {s['max']:.2%}")


def _planted_row(row, mode: str | None) -> bool:
    return (row.op, row.impl) == PLANTED_IMPL and (mode is None or row.mode == mode)


def _repetition_figures(same: list[ResultDocument], heads: dict, rule: GradingRule, mode: str | None) -> dict:
    """No-history gates of these (already truncated) runs: same-code pairs, and planted heads vs same-code bases."""
    pairs = [(same[i], same[j]) for i in range(len(same)) for j in range(i + 1, len(same))]
    failed = regressions = timed = 0
    sources: dict[str, int] = {}
    for base, head in pairs:
        cmp = compare_documents(base, head, rule=rule, allow_missing=True)
        c = cmp.counts
        timed += c["regression"] + c["improvement"] + c["within_noise"]
        regressions += c["regression"]
        failed += cmp.failed
        for r in cmp.rows:
            if r.stats is not None and r.stats.spread_source:
                sources[r.stats.spread_source] = sources.get(r.stats.spread_source, 0) + 1
    out: dict = {
        "same_code": {
            "gates": len(pairs),
            "failed_gates": failed,
            "job_comparisons": timed,
            "job_regressions": regressions,
            "spread_sources": sources,
        },
        "planted": {},
    }
    for label, (frac, docs) in heads.items():
        trials = caught = jobs = jobs_caught = control_false = control = 0
        changes: list[float] = []
        for head in docs:
            for base in same:
                cmp = compare_documents(base, head, rule=rule, allow_missing=True)
                rows = [r for r in cmp.rows if _planted_row(r, mode)]
                trials += 1
                caught += bool(rows) and all(r.outcome == "regression" for r in rows)
                jobs += len(rows)
                jobs_caught += sum(r.outcome == "regression" for r in rows)
                changes += [r.stats.change for r in rows if r.stats is not None and r.stats.change is not None]
                others = [r for r in cmp.rows if (r.op, r.impl) != PLANTED_IMPL and r.stats is not None]
                control += len(others)
                control_false += sum(r.outcome == "regression" for r in others)
        out["planted"][label] = {
            "slowdown": frac,
            "trials": trials,
            "caught": caught,
            "planted_jobs": jobs,
            "planted_jobs_caught": jobs_caught,
            "median_change": float(np.median(changes)) if changes else None,
            "control_job_comparisons": control,
            "control_false_failures": control_false,
        }
    return out


def repetitions(args: argparse.Namespace) -> None:
    """Grade ``--repeat N`` runs with no history, truncated to each k <= N repetitions (module docstring)."""
    global PLANTED_IMPL
    PLANTED_IMPL = tuple(args.planted_impl.split("/"))  # type: ignore[assignment]
    folder = Path(args.dir)
    rule = GradingRule(threshold=args.threshold, alpha=args.alpha)
    same = _docs(folder, args.same)
    planted = {label: (float(frac), _docs(folder, label)) for label, frac in (p.split(":") for p in args.planted)}
    n = min(
        (j.timing.n_repetitions for d in same for j in d.jobs if j.timing is not None),
        default=1,
    )
    result: dict = {
        "suite": same[0].suite,
        "machine_kind": same[0].environment.machine_kind,
        "cpu": same[0].environment.cpu,
        "alpha": args.alpha,
        "threshold": args.threshold,
        "same_code_runs": len(same),
        "planted_impl": args.planted_impl,
        "planted_mode": args.planted_mode,
        "repeat": n,
        "run_started": {
            label: [d.created_at.isoformat() for d in docs]
            for label, docs in [(args.same, same), *((k, v[1]) for k, v in planted.items())]
        },
        "load_note": args.load_note,
        "by_repetitions": {},
    }
    chosen = None
    for k in range(1, n + 1):
        same_k = [first_repetitions(d, k) for d in same]
        heads_k = {label: (frac, [first_repetitions(d, k) for d in docs]) for label, (frac, docs) in planted.items()}
        fig = _repetition_figures(same_k, heads_k, rule, args.planted_mode)
        result["by_repetitions"][str(k)] = fig
        ok = fig["same_code"]["failed_gates"] == 0 and all(
            p["caught"] >= 0.95 * p["trials"] for p in fig["planted"].values()
        )
        if ok and chosen is None:
            chosen = k
        print(f"k={k}: {json.dumps(fig)}", flush=True)
    result["smallest_repeat_meeting_target"] = chosen
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"smallest --repeat with 0 failed same-code gates and >= 95% caught: {chosen}")


def main() -> None:
    """Parse the command line and run ``collect`` or ``evaluate``."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="run the suite several times per group, interleaved")
    c.add_argument("--suite", required=True)
    c.add_argument("--dir", required=True)
    c.add_argument("--group", action="append", required=True, help="LABEL:SLOWDOWN:RUNS, e.g. p10:0.10:20")
    c.add_argument("--repeat", type=int, default=1, help="deltabench run --repeat N for every run")
    c.add_argument("--planted-everywhere", action="store_true", help="import the planted file at 0 in same groups too")
    c.add_argument("--deadline-s", type=float, default=None, help="start no run the longest so far would end past")
    e = sub.add_parser("evaluate", help="grade the collected runs and write the summary")
    e.add_argument("--dir", required=True)
    e.add_argument("--same", required=True, help="label of the same-code runs")
    e.add_argument("--planted", action="append", default=[], help="LABEL:SLOWDOWN of a planted group")
    e.add_argument("--alpha", type=float, default=0.01)
    e.add_argument("--threshold", type=float, default=0.05)
    e.add_argument("--load-note", default="", help="how loaded the machine was, for the record")
    e.add_argument("--default-spread", type=float, default=None, help="also grade no-history pairs with this sigma")
    e.add_argument("--planted-impl", default="gdn/torch_chunk", help="OP/IMPL the planted groups slowed down")
    e.add_argument("--planted-mode", default=None, help="only these jobs of it count (fwd: the slowed call alone)")
    e.add_argument("--out", required=True)
    r = sub.add_parser("repetitions", help="grade --repeat runs with no history, for each number of repetitions")
    r.add_argument("--dir", required=True)
    r.add_argument("--same", required=True, help="label of the same-code runs")
    r.add_argument("--planted", action="append", default=[], help="LABEL:SLOWDOWN of a planted group")
    r.add_argument("--planted-impl", default="gdn/torch_chunk", help="OP/IMPL the planted groups slowed down")
    r.add_argument("--planted-mode", default=None, help="only these jobs of it count (fwd: the slowed call alone)")
    r.add_argument("--alpha", type=float, default=0.01)
    r.add_argument("--threshold", type=float, default=0.05)
    r.add_argument("--load-note", default="", help="how loaded the machine was, for the record")
    r.add_argument("--out", required=True)
    args = ap.parse_args()
    {"collect": collect, "evaluate": evaluate, "repetitions": repetitions}[args.cmd](args)


if __name__ == "__main__":
    main()
