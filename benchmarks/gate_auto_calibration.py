"""Calibrate ``deltabench run --repeat auto --base-ref`` and the gate on it: false failures on same-code pairs and
the power to catch a planted slowdown, each pair one interleaved invocation.

Each pair runs the suite from a scratch git repository whose committed ``planted.py`` (a copy of
``benchmarks/cpu/planted_slowdown.py`` with the fraction fixed at 0) is the base side's, and whose working-tree
copy is the head's: fraction 0 for a same-code pair, ``--fraction`` for a planted one (the base side imports the
committed copy, ``runners.interleave``). Pairs alternate (same, planted, same, ...) so both kinds see the same
machine states. Each pair is then gated (``deltabench gate --base OUT.base.json --head OUT.json``) and its exit
code, verdict counts, and the planted impl's rows (outcome, minimum detectable change, repetitions) are kept.

Figures: same-code gates failed (exit 1: the false-failure rate, target <= alpha), ended unknown (exit 3) or same;
planted pairs whose planted jobs (``--planted-impl``, ``--planted-mode``) were all graded regressions (the power),
and the repetitions used. The issue's targets on the H200: >= 100 same-code pairs with false failures <= 2%, and
>= 20 planted 5% pairs caught >= 80%; on the CPU the same figures for 20% steps::

    python benchmarks/gate_auto_calibration.py --suite benchmarks/gpu/gate-calibration-h200.toml --device cuda \\
        --same 100 --planted 20 --fraction 0.05 --planted-impl gdn/triton_chunk --planted-mode fwd \\
        --dir /tmp/auto --out benchmarks/results/gate-calibration/gate-auto-h200.json
    python benchmarks/gate_auto_calibration.py --suite benchmarks/cpu/gate-calibration.toml --device cpu \\
        --same 20 --planted 20 --fraction 0.20 --dir /tmp/auto-cpu --out /tmp/gate-auto-cpu.json

A live pair costs >= 6 + 6 fresh processes (about a minute on the H200: 120 pairs are two hours), so ``record`` and
``replay`` calibrate from stored runs instead. ``record`` makes K same-code and P planted runs of the suite
(``deltabench run --repeat R``: R fresh processes a job, each run importing the planted file, at 0 or ``--fraction``;
``--chunk C``: C runs an invocation of ``--repeat C*R``, cut into runs of R by ``runners.replay.split_repetitions``,
one process tree, correctness gate and document for C runs; same and planted invocations alternate while both last;
an invocation already recorded whole is not made again, so a call cut short is taken up by the next), starting no
invocation that would end past ``--deadline-s``; ``replay`` replays the
sequential rule of ``run --repeat auto --max-repeat 20`` (``runners.replay``: the gate's own comparison at each look) on
every ordered same-code pair (i, j), i != j (K (K - 1) pairs: a false failure is a regression verdict), and on every
(same i, planted j) pair (K P pairs: power is the planted jobs all graded regressions)::

    python benchmarks/gate_auto_calibration.py record --suite benchmarks/gpu/gate-auto-h200.toml --same 11 \\
        --planted 2 --fraction 0.05 --repeat 6 --chunk 4 --planted-impl gdn/triton_chunk --dir runs --deadline-s 480
    python benchmarks/gate_auto_calibration.py replay --dir runs --planted-impl gdn/triton_chunk \\
        --threshold 0.05 --threshold 0.02 --out benchmarks/results/gate-calibration/gate-auto-h200.json

What differs from live pairs, and how the figures say so: (1) the two runs of a pair were made minutes apart, not
interleaved round by round, so a drift of the machine between them reaches the test as a change: for false failures a
harder test than the live gate's; (2) the pairs share runs (each run is in 2 (K - 1) same-code pairs), so they are not
independent: the JSON names the distinct runs and gives a 95% interval from a bootstrap over runs (resampling the
recorded runs, then all their ordered pairs), and the one-sided 95% Clopper-Pearson bound on the floor(K / 2) disjoint
pairs (each run used once: independent pairs); (3) a run recorded with fewer repetitions than the cap cannot show a look
past them: a job still unknown there is counted ``truncated`` (not a failure, not caught), the repetitions each pair
used say how often that happened.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from deltabench.harness.document import ResultDocument

PLANTED_SOURCE = Path(__file__).parent / "cpu" / "planted_slowdown.py"
_FRACTION_LINE = 'FRACTION = float(os.environ.get("DELTABENCH_PLANTED_SLOWDOWN", "0.10"))'


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=calibration", "-c", "user.email=calibration@localhost", *args],
        check=True,
        capture_output=True,
    )


def _planted(fraction: float) -> str:
    """planted_slowdown.py with its fraction fixed (not read from the environment, which both sides share)."""
    text = PLANTED_SOURCE.read_text()
    if _FRACTION_LINE not in text:
        raise SystemExit(f"{PLANTED_SOURCE}: its FRACTION line changed; update {__file__}")
    return text.replace(_FRACTION_LINE, f"FRACTION = {fraction!r}")


def scratch_repo(folder: Path) -> Path:
    """A git repository whose HEAD holds planted.py at fraction 0 (the base side of every pair)."""
    repo = folder / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    _git(repo, "init", "-q")
    (repo / "planted.py").write_text(_planted(0.0))
    _git(repo, "add", "planted.py")
    _git(repo, "commit", "-q", "-m", "base: no slowdown")
    return repo


def run_pair(repo: Path, out: Path, args: argparse.Namespace, fraction: float) -> dict:
    """One interleaved `--repeat auto` invocation with the head's planted.py at `fraction`, then its gate."""
    (repo / "planted.py").write_text(_planted(fraction))
    env = {**os.environ, "DELTABENCH_PLANTED_IMPL": args.planted_impl}
    run = [sys.executable, "-m", "deltabench.cli.app", "run", "--suite", str(Path(args.suite).resolve())]
    run += ["--device", args.device, "--import", "planted.py", "--repeat", "auto", "--max-repeat", str(args.max_repeat)]
    run += ["--base-ref", "HEAD", "--out", str(out), "--no-db", "-q", "--format", "csv"]
    started = time.perf_counter()
    done = subprocess.run(run, cwd=repo, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"run failed (exit {done.returncode}): {done.stderr[-2000:]}")
    cmp_path = out.with_name(out.name.replace(".json", ".cmp.json"))
    base = out.with_name(out.name.replace(".json", ".base.json"))
    gate = [sys.executable, "-m", "deltabench.cli.app", "gate", "--base", str(base), "--head", str(out)]
    code = subprocess.run([*gate, "--json", str(cmp_path)], env=env, capture_output=True, check=False).returncode
    cmp = json.loads(cmp_path.read_text())
    op, impl = args.planted_impl.split("/")
    planted = [
        {
            "shape": r["shape"],
            "mode": r["mode"],
            "outcome": r["outcome"],
            "verdict": r["verdict"],
            "mdc": (r["stats"] or {}).get("min_detectable_change"),
            "change": (r["stats"] or {}).get("change"),
            "repetitions": (r["stats"] or {}).get("head_repetitions"),
        }
        for r in cmp["rows"]
        if r["op"] == op and r["impl"] == impl and (args.planted_mode is None or r["mode"] == args.planted_mode)
    ]
    return {"fraction": fraction, "exit": code, "verdicts": cmp["verdicts"], "planted": planted, "seconds": seconds}


def summarize(pairs: list[dict]) -> dict:
    """False failures and unknowns of the same-code pairs, power on the planted ones."""
    same = [p for p in pairs if p["fraction"] == 0.0]
    planted = [p for p in pairs if p["fraction"] > 0.0]
    caught = [p for p in planted if p["planted"] and all(r["outcome"] == "regression" for r in p["planted"])]
    return {
        "same_pairs": len(same),
        "same_failed": sum(p["exit"] == 1 for p in same),
        "same_unknown": sum(p["exit"] == 3 for p in same),
        "same_passed": sum(p["exit"] == 0 for p in same),
        "false_failure_rate": sum(p["exit"] == 1 for p in same) / len(same) if same else None,
        "planted_pairs": len(planted),
        "planted_caught": len(caught),
        "power": len(caught) / len(planted) if planted else None,
        "repetitions": sorted(r["repetitions"] for p in pairs for r in p["planted"] if r["repetitions"]),
        "seconds": sum(p["seconds"] for p in pairs),
    }


def _whole(path: Path, reps: int) -> ResultDocument | None:
    """The document at `path` when it holds `reps` repetitions of every job, else None."""
    from deltabench.runners.replay import recorded_repetitions

    if not path.is_file():
        return None
    doc = ResultDocument.from_json(path.read_text())
    have = recorded_repetitions(doc)
    return doc if have and min(have.values()) >= reps and doc.meta.get("complete", True) is not False else None


def record(argv: list[str]) -> int:
    """Record K same-code and P planted ``--repeat R`` runs (module docstring), `--chunk` runs an invocation."""
    from gate_calibration import run_suite

    from deltabench.runners.replay import split_repetitions

    ap = argparse.ArgumentParser(prog="gate_auto_calibration.py record", description=record.__doc__)
    ap.add_argument("--suite", required=True)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--same", type=int, default=11, help="same-code runs K (K (K - 1) ordered pairs)")
    ap.add_argument("--planted", type=int, default=2, help="planted runs P (K P pairs)")
    ap.add_argument("--fraction", type=float, default=0.05)
    ap.add_argument("--repeat", type=int, default=20, help="repetitions R a run records (the cap, or fewer)")
    ap.add_argument("--chunk", type=int, default=1, help="runs one invocation records (--repeat chunk*R, then cut)")
    ap.add_argument("--planted-impl", default="gdn/torch_chunk")
    ap.add_argument("--deadline-s", type=float, default=None, help="start no invocation that would end past this")
    args = ap.parse_args(argv)
    os.environ["DELTABENCH_PLANTED_IMPL"] = args.planted_impl
    blocks_dir = args.dir / "blocks"
    blocks_dir.mkdir(parents=True, exist_ok=True)
    plan = {
        kind: [min(args.chunk, n - i) for i in range(0, n, args.chunk)]
        for kind, n in (("same", args.same), ("planted", args.planted))
    }
    queues = {kind: list(enumerate(blocks)) for kind, blocks in plan.items()}
    order = []  # same and planted blocks alternate while both last: both kinds see the machine's same states
    while any(queues.values()):
        order += [(kind, *q.pop(0)) for kind, q in queues.items() if q]
    started, per_rep, made = time.perf_counter(), 0.0, {"same": 0, "planted": 0}
    for kind, b, runs in order:
        reps = runs * args.repeat
        if args.deadline_s is not None and time.perf_counter() - started + per_rep * reps > args.deadline_s:
            print(
                f"deadline {args.deadline_s:.0f} s: no room for {kind} block {b} ({per_rep * reps:.0f} s)", flush=True
            )
            break
        path = blocks_dir / f"{kind}-block{b:02d}.json"
        doc = _whole(path, reps)
        if doc is None:  # not recorded yet, or cut short: a call that ran out of time is taken up by the next
            fraction = args.fraction if kind == "planted" else 0.0
            seconds = run_suite(args.suite, path, reps, fraction, import_planted=True)
            per_rep = max(per_rep, seconds / reps)
            doc = _whole(path, reps)
            if doc is None:
                print(f"{path.name}: no whole document of {reps} repetitions, left out", flush=True)
                continue
        for part in split_repetitions(doc, args.repeat) if args.chunk > 1 else [doc]:
            (args.dir / f"{kind}_{made[kind]:03d}.json").write_text(part.to_json())
            made[kind] += 1
    call = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": made}
    call["seconds"] = time.perf_counter() - started
    index = args.dir / "record.json"  # one entry a call: a call that took up a cut one adds its own
    calls = json.loads(index.read_text())["calls"] if index.is_file() else []
    summary = {"calls": [*calls, call], "runs": made}
    index.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary), flush=True)
    return 0


def _rate_interval(hits: np.ndarray, runs_a: int, runs_b: int | None, draws: int = 2000) -> list[float]:
    """95% percentile interval of a pair rate under a bootstrap over runs: `hits[i, j]` is 1 when pair (i, j)
    counted (NaN: no such pair), i a same-code run and j a same-code run (`runs_b` None: the diagonal left out) or
    a planted one; the runs of each kind are resampled with replacement and all their pairs counted again."""
    rng = np.random.default_rng(0)
    rates = []
    for _ in range(draws):
        a = rng.integers(0, runs_a, runs_a)
        b = a if runs_b is None else rng.integers(0, runs_b, runs_b)
        sub = hits[np.ix_(a, b)]
        if runs_b is None:
            sub = np.where(a[:, None] == a[None, :], np.nan, sub)  # a run against itself is no pair
        if np.isfinite(sub).any():
            rates.append(float(np.nanmean(sub)))
    return [float(np.percentile(rates, 2.5)), float(np.percentile(rates, 97.5))] if rates else [math.nan, math.nan]


def _clopper_pearson_upper(k: int, n: int, level: float = 0.95) -> float:
    """One-sided upper confidence bound of a binomial rate after k events in n independent trials."""
    from scipy.stats import beta

    return 1.0 if k >= n else float(beta.ppf(level, k + 1, n - k))


def replay_pairs(
    same: list[ResultDocument], planted: list[ResultDocument], args: argparse.Namespace, threshold: float
) -> dict:
    """Every ordered same-code pair and every (same, planted) pair replayed at `threshold`: the figures (module
    docstring) and one row a pair."""
    from deltabench.regression import GradingRule
    from deltabench.regression.result import REGRESSION, UNKNOWN
    from deltabench.runners.replay import replay_sequential

    rule = GradingRule(threshold=threshold)
    op, impl = args.planted_impl.split("/")
    k, p = len(same), len(planted)
    rows = []
    failed = np.full((k, k), np.nan)
    caught = np.full((k, max(p, 1)), np.nan)
    for (i, base), (j, head) in itertools.product(enumerate(same), enumerate(same + planted)):
        if i == j:
            continue
        jobs, cmp = replay_sequential(base, head, max_repeat=args.max_repeat, rule=rule)
        kind = "same" if j < k else "planted"
        ours = [
            v
            for key, v in jobs.items()
            if key[:2] == (op, impl) and (args.planted_mode is None or key[4] == args.planted_mode)
        ]
        row = {
            "kind": kind,
            "base": i,
            "head": j if j < k else j - k,
            "verdicts": cmp.verdicts,
            "regressions": sum(v.row.outcome == REGRESSION for v in jobs.values()),
            "unknown": sum(v.row.verdict == UNKNOWN for v in jobs.values()),
            "truncated": sum(v.truncated for v in jobs.values()),
            "repetitions": max(v.repetitions for v in jobs.values()),
            "planted": [
                {
                    "mode": v.row.mode,
                    "outcome": v.row.outcome,
                    "verdict": v.row.verdict,
                    "change": v.row.stats.change if v.row.stats else None,
                    "mdc": v.row.stats.min_detectable_change if v.row.stats else None,
                    "repetitions": v.repetitions,
                    "truncated": v.truncated,
                }
                for v in ours
            ],
        }
        rows.append(row)
        if kind == "same":
            failed[i, j] = float(row["regressions"] > 0)
        else:
            caught[i, j - k] = float(bool(ours) and all(v.row.outcome == REGRESSION for v in ours))
    same_rows = [r for r in rows if r["kind"] == "same"]
    planted_rows = [r for r in rows if r["kind"] == "planted"]
    n_failed = sum(r["regressions"] > 0 for r in same_rows)
    n_caught = int(np.nansum(caught)) if p else 0
    disjoint = k // 2
    return {
        "threshold": threshold,
        "distinct_runs": {"same": k, "planted": p},
        "same_pairs": len(same_rows),
        "same_failed": n_failed,
        "same_unknown": sum(r["unknown"] > 0 and r["regressions"] == 0 for r in same_rows),
        "same_truncated": sum(r["truncated"] > 0 for r in same_rows),
        "false_failure_rate": n_failed / len(same_rows) if same_rows else None,
        "false_failure_ci95_bootstrap_over_runs": _rate_interval(failed, k, None) if same_rows else None,
        "false_failure_upper95_disjoint_pairs": _clopper_pearson_upper(
            sum(failed[2 * m, 2 * m + 1] > 0 for m in range(disjoint)), disjoint
        )
        if disjoint
        else None,
        "planted_pairs": len(planted_rows),
        "planted_caught": n_caught,
        "planted_truncated": sum(any(x["truncated"] for x in r["planted"]) for r in planted_rows),
        "power": n_caught / len(planted_rows) if planted_rows else None,
        "power_ci95_bootstrap_over_runs": _rate_interval(caught, k, p) if p else None,
        "repetitions_same": sorted(r["repetitions"] for r in same_rows),
        "repetitions_planted": sorted(x["repetitions"] for r in planted_rows for x in r["planted"]),
        "pairs": rows,
    }


def replay(argv: list[str]) -> int:
    """Replay ``--repeat auto`` on every ordered pair of recorded runs (module docstring), print and write the
    figures."""
    from gate_calibration import _docs

    ap = argparse.ArgumentParser(prog="gate_auto_calibration.py replay", description=replay.__doc__)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--planted-impl", default="gdn/torch_chunk")
    ap.add_argument("--planted-mode", default="fwd", help="the planted jobs counted (the slowdown follows fwd)")
    ap.add_argument("--max-repeat", type=int, default=20, help="the cap of the replayed run (its looks)")
    ap.add_argument("--threshold", type=float, action="append", help="the gate's threshold (repeatable; default 5%%)")
    ap.add_argument("--note", default="", help="where and how the runs were recorded, for the record")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    same, planted = _docs(args.dir, "same"), _docs(args.dir, "planted")
    started = time.perf_counter()
    figures = [replay_pairs(same, planted, args, t) for t in args.threshold or [0.05]]
    recorded = json.loads((args.dir / "record.json").read_text()) if (args.dir / "record.json").is_file() else None
    logs = [args.dir / "collect.log", args.dir / "blocks" / "collect.log"]
    log = [line for path in logs if path.is_file() for line in path.read_text().splitlines()]
    doc = {
        "method": "replay of run --repeat auto on recorded --repeat runs (benchmarks/gate_auto_calibration.py)",
        "note": args.note,
        "record": recorded,
        "record_log": log,
        "runs": {"same": [d.run_id for d in same], "planted": [d.run_id for d in planted]},
        "replay_seconds": time.perf_counter() - started,
        "figures": figures,
    }
    for f in figures:
        brief = {k: v for k, v in f.items() if k not in ("pairs", "repetitions_same", "repetitions_planted")}
        print(json.dumps(brief))
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``record`` / ``replay`` (module docstring), else the live pairs: run them, print and write the summary."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("record", "replay"):
        return {"record": record, "replay": replay}[argv[0]](argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--same", type=int, default=20, help="same-code pairs")
    ap.add_argument("--planted", type=int, default=20, help="planted pairs")
    ap.add_argument("--fraction", type=float, default=0.20, help="the planted slowdown, e.g. 0.05")
    ap.add_argument("--max-repeat", type=int, default=20)
    ap.add_argument("--planted-impl", default="gdn/torch_chunk")
    ap.add_argument("--planted-mode", default="fwd", help="the planted jobs counted (the busy-wait follows fwd)")
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, help="write the pairs and the summary (JSON) here")
    args = ap.parse_args(argv)
    repo = scratch_repo(args.dir)
    same_i, planted_i = iter(range(args.same)), iter(range(args.planted))
    pairs = []
    for _ in range(max(args.same, args.planted)):
        for kind, it, fraction in (("same", same_i, 0.0), ("planted", planted_i, args.fraction)):
            n = next(it, None)
            if n is None:
                continue
            pair = run_pair(repo, args.dir / f"{kind}-{n:03d}.json", args, fraction)
            pairs.append(pair)
            print(f"{kind} {n}: exit {pair['exit']} {pair['verdicts']} {pair['planted']}", flush=True)
            write(args, pairs)  # after every pair: a session cut short keeps the pairs it ended
    print(json.dumps(summarize(pairs), indent=1))
    return 0


def write(args: argparse.Namespace, pairs: list[dict]) -> None:
    """The pairs so far and their summary, as JSON at ``--out`` (nothing without it)."""
    if args.out is not None:
        doc = {"args": {k: str(v) for k, v in vars(args).items()}, "summary": summarize(pairs), "pairs": pairs}
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    sys.exit(main())
