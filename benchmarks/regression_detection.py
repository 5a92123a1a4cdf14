"""How well deltabench's regression statistics work on the noise its runners really see (a script, not a test).

Four parts, each printed as a table:

1. **Measured CPU noise.** A small torch kernel timed through ``runners/cpu.py`` (the runner's own timer) in
   ``--runs`` independent runs: the spread of samples within a run (robust sigma of log(sample / median), outlier
   share), the run-to-run spread of medians, and the gate's verdict on consecutive pairs of those real runs
   (false failures), and on real runs padded with a 10% busy-wait (detections).
2. **The gate's within-run criteria** (``harness.regression.GradingRule``) on synthetic samples: lognormal noise
   with occasional outliers (the H200 model: 1% noise, 2% of samples +5..40%) and the CPU's measured distribution
   (resampled), at the sample counts the runners stop at (10 to 50): false-failure rate on two samples of one
   distribution (must be <= alpha), and the share of 5% and 10% slowdowns caught.
3. **Change points** (``harness/changepoints.find_change_points``) on 100-point histories: false change points
   per 100-point history without a step (must be <= 1%), and the share of 5% steps found within two points of
   where they happened (must be >= 95%), at 1% noise with outliers and at the CPU's measured run-to-run noise.
4. **The gate on real runs** (``deltabench run``, one process per job, runs minutes apart), as measured by
   ``benchmarks/gate_calibration.py`` and stored in ``benchmarks/results/gate-calibration/gate-calibration-*.json``
   (the CPU's, then the H200's): failed gates and
   false failures per job on same-code runs (no history, and with the other runs as history), the old within-run
   rule on the same pairs, and the share of planted 10% / 20% slowdowns caught with and without history; and
   (4c) runs made with ``deltabench run --repeat N`` graded with no history, for each number of repetitions k <= N
   (``gate-repeat-*.json`` there): the gate then takes the spread between a job's repetitions; and (4d) base
   and head run interleaved in one ``run --base-ref`` invocation (``gate-interleave-*.json`` there). Parts 1-3
   never see the variance between processes and machine states; part 4 is the figure that holds for CI.

Usage::

    python benchmarks/regression_detection.py [--trials 1000] [--runs 30] [--skip-cpu] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from deltabench.regression import GradingRule, RunSpread, default_spread
from deltabench.regression.changepoints import find_change_points

Sampler = Callable[[np.random.Generator, int], np.ndarray]
# The summaries gate_calibration.py and gate_interleave_summary.py wrote (benchmarks/results/README.md).
SUMMARIES = Path(__file__).parent / "results" / "gate-calibration"
# The CPU's runs first, then the H200's.
REAL_RUNS = sorted(SUMMARIES.glob("gate-calibration-*.json"), key=lambda p: ("h200" in p.name, p.name))
# Runs made with `deltabench run --repeat N`, graded with no history (benchmarks/gate_calibration.py repetitions).
REPEAT_RUNS = sorted(SUMMARIES.glob("gate-repeat-*.json"))
# Base and head interleaved in one `deltabench run --base-ref` invocation (benchmarks/cpu/gate_interleave.sh, tallied
# by gate_interleave_summary.py).
INTERLEAVED_RUNS = sorted(SUMMARIES.glob("gate-interleave-*.json"))


def compare_samples(
    base: np.ndarray,
    head: np.ndarray,
    *,
    alpha: float = 0.01,
    n_resamples: int = 2000,
    spread: RunSpread | None = None,
) -> tuple[str, float]:
    """(outcome, ratio) of one pair under the gate's rule; `spread` defaults to the accelerator default (1%), whose
    bound sits under the 5% threshold, so the within-run criteria decide, as they do on a GPU."""
    rule = GradingRule(alpha=alpha, n_resamples=n_resamples)
    v = rule.grade_samples([(base, head)], [spread or default_spread("accelerator")])[0]
    return v.outcome, v.evidence.ratio


def lognormal_with_outliers(noise: float = 0.01, outlier_share: float = 0.02) -> Sampler:
    """Relative timings: lognormal `noise`, plus `outlier_share` of samples slowed by 5..40% (a busy neighbour)."""

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.exp(rng.normal(0.0, noise, n))
        out = rng.random(n) < outlier_share
        x[out] *= 1.0 + rng.uniform(0.05, 0.40, out.sum())
        return x

    return draw


def empirical(relative: np.ndarray) -> Sampler:
    """Resample measured relative timings (sample / its run's median)."""

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(relative, size=n, replace=True)

    return draw


def robust_sigma(logs: np.ndarray) -> float:
    """1.4826 * MAD: the standard deviation for normal data, unmoved by outliers."""
    return float(1.4826 * np.median(np.abs(logs - np.median(logs))))


# ------------------------------------------------------------------------------------------------ 1. CPU noise


def measure_cpu(runs: int, budget_s: float) -> dict[str, object]:
    """Time a small torch kernel `runs` times through the CPU runner; also a 10%-padded copy for detections."""
    import torch

    from deltabench.runners.cpu import time_callable

    torch.set_num_threads(1)
    torch.manual_seed(0)
    a, b = torch.randn(96, 96), torch.randn(96, 96)

    def kernel() -> None:
        c = a
        for _ in range(8):
            c = torch.tanh(c @ b)

    def padded(extra_s: float) -> Callable[[], None]:
        def fn() -> None:
            kernel()
            end = time.perf_counter() + extra_s
            while time.perf_counter() < end:  # busy-wait: a real 10% more work, with the kernel's own noise
                pass

        return fn

    base_runs, slow_runs = [], []
    for _ in range(runs):
        t = time_callable(kernel, budget_s=budget_s, min_reps=10, max_reps=400, warmup_s=0.5)
        base_runs.append(np.asarray(t.samples_ms))
        s = time_callable(padded(0.10 * t.median_ms / 1e3), budget_s=budget_s, min_reps=10, max_reps=400, warmup_s=0.5)
        slow_runs.append(np.asarray(s.samples_ms))
    rel = np.concatenate([r / np.median(r) for r in base_runs])
    logs = np.log(rel)
    sigma = robust_sigma(logs)
    medians = np.array([np.median(r) for r in base_runs])
    # In-process runs a second apart: no history, so the CPU's default run-to-run spread applies, as in a gate.
    cpu = default_spread("cpu")
    pairs = [compare_samples(base_runs[i], base_runs[i + 1], spread=cpu) for i in range(runs - 1)]
    detections = [compare_samples(base_runs[i], slow_runs[i], spread=cpu) for i in range(runs)]
    return {
        "relative": rel,
        "sigma": sigma,
        "outlier_share": float(np.mean(np.abs(logs) > 5 * sigma)),
        "p99": float(np.quantile(rel, 0.99) - 1.0),
        "run_cv": float(robust_sigma(np.log(medians / np.median(medians)))),
        "median_ms": float(np.median(medians)),
        "n_median": int(np.median([r.size for r in base_runs])),
        "pair_false": sum(p[0] == "regression" for p in pairs),
        "pair_n": len(pairs),
        "pair_ratios": [p[1] for p in pairs],
        "slow_detected": sum(d[0] == "regression" for d in detections),
        "slow_n": len(detections),
        "slow_ratio": float(np.median([d[1] for d in detections])),
    }


# ------------------------------------------------------------------------------------------------ 2. the gate


def gate_rates(draw: Sampler, n: int, trials: int, rng: np.random.Generator, alpha: float) -> dict[str, float]:
    """False failures on one distribution; detections of 5% and 10% slowdowns (n samples a side)."""
    same = slow5 = slow10 = 0
    for _ in range(trials):
        base = draw(rng, n)
        same += compare_samples(base, draw(rng, n), alpha=alpha, n_resamples=500)[0] == "regression"
        slow5 += compare_samples(base, 1.05 * draw(rng, n), alpha=alpha, n_resamples=500)[0] == "regression"
        slow10 += compare_samples(base, 1.10 * draw(rng, n), alpha=alpha, n_resamples=500)[0] == "regression"
    return {"false": same / trials, "det5": slow5 / trials, "det10": slow10 / trials}


def gate_rank_test_only(draw: Sampler, n: int, trials: int, rng: np.random.Generator, alpha: float) -> float:
    """How often Mann-Whitney alone (no ratio floor) says 'different' on one distribution: should be ~alpha."""
    from deltabench.regression.samples import mann_whitney_p

    return sum(mann_whitney_p(draw(rng, n), draw(rng, n)) < alpha for _ in range(trials)) / trials


# ------------------------------------------------------------------------------------------------ 3. change points


def changepoint_rates(
    point_noise: Sampler, trials: int, rng: np.random.Generator, step: float = 1.05, n: int = 100
) -> dict[str, float]:
    """False change points per `n`-point history without a step; share of steps found within 2 points."""
    false = 0
    for _ in range(trials):
        false += len(find_change_points(list(enumerate(point_noise(rng, n)))))
    found = misplaced = 0
    for _ in range(trials):
        at = int(rng.integers(10, n - 9))
        v = point_noise(rng, n)
        v[at:] *= step
        cps = find_change_points(list(enumerate(v)))
        hit = any(abs(c.index - at) <= 2 and c.ratio > 1.0 for c in cps)
        found += hit
        misplaced += sum(1 for c in cps if abs(c.index - at) > 2)
    return {"false_per_100": false / trials * 100 / n, "detect": found / trials, "extra": misplaced / trials}


# ------------------------------------------------------------------------------------------------ 4. real runs


def print_real_runs(console: Console, paths: list[Path]) -> None:
    """Part 4: the figures benchmarks/gate_calibration.py measured on real ``deltabench run`` runs."""
    if not paths:
        console.print(
            "4. real runs: no benchmarks/results/gate-calibration/gate-calibration-*.json yet "
            "(run benchmarks/gate_calibration.py)"
        )
        return
    t = Table(title="4. the gate on real runs (deltabench run; benchmarks/gate_calibration.py)")
    for col in ("suite", "runs", "check", "gates failed", "job false failures", "per job", "<= alpha"):
        t.add_column(col, justify="right")
    for path in paths:
        r = json.loads(path.read_text())
        checks = (
            ("all ordered pairs, no history", r["pairwise_no_history"]),
            ("each vs the others as history", r["leave_one_out_history"]),
            ("old median rule, all ordered pairs", r["old_within_run_rule_pairwise"]),
        )
        for name, c in checks:
            rate = c["job_regressions"] / max(c["job_comparisons"], 1)
            t.add_row(
                r["suite"],
                str(r["same_code_runs"]),
                name,
                f"{c['failed_gates']}/{c['gates']}",
                f"{c['job_regressions']}/{c['job_comparisons']}",
                f"{rate:.2%}",
                "yes" if rate <= r["alpha"] else "NO",
            )
    console.print(t)
    t = Table(title="4b. planted slowdowns (one impl, same name, --import), caught")
    cols = ("suite", "planted in", "slowdown", "with history (runs)", "no history", "control false failures")
    for col in (*cols, "median change"):
        t.add_column(col, justify="right")
    for path in paths:
        r = json.loads(path.read_text())
        for p in r["planted"].values():
            h, n = p["with_history"], p["no_history"]
            med = p["observed_change_vs_history"]["median"]
            t.add_row(
                r["suite"],
                r.get("planted_impl", "gdn/torch_chunk") + (f" {p['mode']}" if p.get("mode") else ""),
                f"{p['slowdown']:.0%}",
                f"{h['caught']}/{h['trials']} = {h['caught'] / max(h['trials'], 1):.0%} ({h['history_runs']})",
                f"{n['caught']}/{n['trials']} = {n['caught'] / max(n['trials'], 1):.0%}",
                str(p["control_false_failures"]),
                "-" if med is None else f"{med:+.1%}",
            )
    console.print(t)
    for path in paths:
        r = json.loads(path.read_text())
        s, m = r["run_to_run_spread"], r["run_to_run_spread_of_medians"]
        console.print(
            f"{r['suite']}: run-to-run spread over {r['same_code_runs']} runs, per job, of the best time: median "
            f"{s['median']:.1%}, p90 {s['p90']:.1%}, max {s['max']:.1%} (of the median: {m['median']:.1%}, "
            f"{m['p90']:.1%}, {m['max']:.1%}); default spread supported: {r['suggested_default_spread']:.1%} "
            f"(job false failures <= alpha), {r['gate_safe_default_spread']:.1%} (no failed gate). {r['load_note']}"
        )


def print_repeat_runs(console: Console, paths: list[Path]) -> None:
    """Part 4c: repeated runs (``run --repeat N``) graded with no history, per number of repetitions."""
    for path in paths:
        r = json.loads(path.read_text())
        mode = f" {r['planted_mode']}" if r.get("planted_mode") else ""
        t = Table(
            title=f"4c. no history, run --repeat k ({r['suite']}, {r['same_code_runs']} same-code runs; planted: "
            f"{r['planted_impl']}{mode} jobs; alpha {r['alpha']:g}, threshold {r['threshold']:.0%})"
        )
        for col in (
            "k",
            "same-code gates failed",
            "job false failures",
            "per job",
            "<= alpha",
            "planted caught (trials)",
            "planted jobs caught",
            "median change",
            "control false failures",
        ):
            t.add_column(col, justify="right")
        for k, fig in r["by_repetitions"].items():
            same = fig["same_code"]
            rate = same["job_regressions"] / max(same["job_comparisons"], 1)
            for label, p in fig["planted"].items():
                med = p["median_change"]
                t.add_row(
                    k,
                    f"{same['failed_gates']}/{same['gates']}",
                    f"{same['job_regressions']}/{same['job_comparisons']}",
                    f"{rate:.2%}",
                    "yes" if rate <= r["alpha"] else "NO",
                    f"{label} {p['slowdown']:.0%}: {p['caught']}/{p['trials']} "
                    f"= {p['caught'] / max(p['trials'], 1):.0%}",
                    f"{p['planted_jobs_caught']}/{p['planted_jobs']}",
                    "-" if med is None else f"{med:+.1%}",
                    f"{p['control_false_failures']}/{p['control_job_comparisons']}",
                )
        console.print(t)
        console.print(
            f"smallest k with no failed same-code gate and >= 95% caught: {r['smallest_repeat_meeting_target']}. "
            f"{r['load_note']}"
        )


def print_interleaved_runs(console: Console, paths: list[Path]) -> None:
    """Part 4d: base and head interleaved in one invocation (``run --base-ref HEAD --repeat N``), graded by the gate
    with no history."""
    for path in paths:
        r = json.loads(path.read_text())["summary"]
        t = Table(
            title=f"4d. base and head interleaved in one invocation ({r.get('suite')}, {r.get('jobs_per_run')} jobs, "
            f"--repeat {r.get('repeat')}; load average {r.get('load_average')}; {path.name})"
        )
        for col in ("same-code gates failed", "same-code jobs", "planted 20% caught (fwd jobs)", "control jobs"):
            t.add_column(col, justify="right")
        t.add_row(
            r["same_code_gates_failed"], r["same_code_jobs_failed"], r["planted_fwd_caught"], r["control_jobs_failed"]
        )
        console.print(t)


def main() -> None:
    """Run the four parts and print their tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=1000, help="synthetic trials per cell")
    ap.add_argument("--runs", type=int, default=30, help="real CPU runs to measure the noise")
    ap.add_argument("--budget", type=float, default=0.25, help="seconds per real CPU run")
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--skip-cpu", action="store_true", help="skip the real CPU measurement")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real-only", action="store_true", help="only print part 4 (the real-run figures)")
    args = ap.parse_args()
    console = Console(width=160)
    print_real_runs(console, REAL_RUNS)
    print_repeat_runs(console, REPEAT_RUNS)
    print_interleaved_runs(console, INTERLEAVED_RUNS)
    if args.real_only:
        return
    rng = np.random.default_rng(args.seed)
    samplers: dict[str, Sampler] = {"H200 model: 1% lognormal + 2% outliers": lognormal_with_outliers()}
    cpu: dict[str, object] | None = None

    if not args.skip_cpu:
        t0 = time.perf_counter()
        cpu = measure_cpu(args.runs, args.budget)
        t = Table(title=f"1. measured CPU timer noise ({args.runs} runs, {time.perf_counter() - t0:.0f} s)")
        for col in (
            "kernel median",
            "samples/run",
            "within-run sigma",
            "outliers >5 sigma",
            "p99 excess",
            "run-to-run sigma",
            "gate on same-kernel run pairs",
            "gate on +10% busy-wait runs",
        ):
            t.add_column(col, justify="right")
        t.add_row(
            f"{cpu['median_ms']:.3f} ms",
            str(cpu["n_median"]),
            f"{cpu['sigma']:.2%}",
            f"{cpu['outlier_share']:.1%}",
            f"{cpu['p99']:+.1%}",
            f"{cpu['run_cv']:.2%}",
            f"{cpu['pair_false']}/{cpu['pair_n']} failed",
            f"{cpu['slow_detected']}/{cpu['slow_n']} caught (median ratio {cpu['slow_ratio']:.3f})",
        )
        console.print(t)
        samplers["CPU measured (resampled)"] = empirical(np.asarray(cpu["relative"]))

    t = Table(title=f"2. gate (alpha {args.alpha}, threshold 5%): {args.trials} trials per cell")
    for col in ("noise", "n per side", "false failures", "<= alpha", "5% caught", "10% caught", "rank test alone"):
        t.add_column(col, justify="right")
    for name, draw in samplers.items():
        for n in (10, 20, 50):
            r = gate_rates(draw, n, args.trials, rng, args.alpha)
            rank = gate_rank_test_only(draw, n, args.trials, rng, args.alpha)
            t.add_row(
                name,
                str(n),
                f"{r['false']:.2%}",
                "yes" if r["false"] <= args.alpha else "NO",
                f"{r['det5']:.1%}",
                f"{r['det10']:.1%}",
                f"{rank:.2%}",
            )
    console.print(t)

    t = Table(title=f"3. change points on 100-point histories: {args.trials} histories per cell, 5% steps")
    for col in ("point noise", "false per 100 points", "<= 1%", "5% steps found (+-2)", ">= 95%", "extra points"):
        t.add_column(col, justify="right")
    histories: dict[str, Sampler] = {
        "1% lognormal + 2% outliers": lognormal_with_outliers(0.01, 0.02),
        "1% lognormal, no outliers": lognormal_with_outliers(0.01, 0.0),
        "1% lognormal + 5% outliers": lognormal_with_outliers(0.01, 0.05),
    }
    if cpu is not None:
        run_cv = max(float(cpu["run_cv"]), 1e-4)  # type: ignore[arg-type]
        histories[f"CPU run-to-run ({run_cv:.2%}) + 2% outliers"] = lognormal_with_outliers(run_cv, 0.02)
    for name, draw in histories.items():
        r = changepoint_rates(draw, args.trials, rng)
        t.add_row(
            name,
            f"{r['false_per_100']:.2%}",
            "yes" if r["false_per_100"] <= 0.01 else "NO",
            f"{r['detect']:.1%}",
            "yes" if r["detect"] >= 0.95 else "NO",
            f"{r['extra']:.3f}",
        )
    console.print(t)
    if cpu is not None and not math.isnan(float(cpu["run_cv"])):  # type: ignore[arg-type]
        ratios = np.asarray(cpu["pair_ratios"])
        console.print(
            f"real same-kernel run pairs: ratio of medians {ratios.min():.3f}..{ratios.max():.3f} "
            f"(a shared 2-core machine; base and head a second apart)"
        )


if __name__ == "__main__":
    main()
