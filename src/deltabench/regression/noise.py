"""How far a job's timing moves between runs of unchanged code: the run-to-run noise model the gate decides with.

Most of the variance between two runs of the same code is between processes and machine states (clock frequency,
cache and memory placement, neighbours on a shared machine), which the samples inside one run never see: two smoke
runs of one commit on a loaded two-core machine differ by up to 4.9x in a job's median while each run's own samples
are tight. So the gate compares a head run with the spread of whole runs, not only with the base run's samples.

**Run level.** Each run of a job is summarised by its best (minimum) sample, :func:`run_level`: timing noise on a
shared machine is added time (preemption, a neighbour's cache traffic), so the best sample tracks the code's own
cost while the median moves with the machine's load. Measured on the same smoke runs: the run-to-run spread of the
best time is about a fifth of the median's (benchmarks/NOTES.md, "Regression gate calibration"); conbench reduces
each result to its best repetition for the same reason. A side stored without raw samples falls back to its median.

A run made with ``deltabench run --repeat N`` holds each job's samples from N worker processes
(``TimingStats.repetitions``); its run level is the median of the repetitions' best samples
(:func:`repetition_levels`), which estimates what one process's best sample is, as a run of one repetition does.

Where the spread of run levels comes from, best first (``rule.GradingRule`` takes them in this order):

- **history**: the run levels of the series' past runs on the same machine class and major software (conbench's
  lookback distribution). The newest :data:`HISTORY_WINDOW` runs up to the base, cut at the series' last change
  point (a real step is not noise). With ``k >= MIN_HISTORY_RUNS`` levels ``y_i = log(level_i)`` of mean ``c`` and
  standard deviation ``s``, a head run of unchanged code falls above the one-sided prediction bound
  ``c + t(1 - alpha; k - 1) * s * sqrt(1 + 1/k)`` with probability alpha (Student-t prediction interval, as
  Bencher's ``t_test`` threshold; exact for normal run effects).
- **repetitions**: no usable history, but both runs were made with ``--repeat N``, N >= :data:`MIN_REPETITIONS`
  (:func:`spread_from_repetitions`). The repetitions of a job in one run are separate processes, interleaved with
  every other job's, so they see the process and machine-state variance that one process's samples never see.
  On the shared two-core machine that variance is far from normal: a process sits in a fast or a slow state for
  its whole life (gdn torch_chunk's best time 0.55 ms in most processes, 0.7-0.9 ms in others), and how many
  processes are slow, and how far, varies from run to run with the machine's load. So each run is summarised by
  the mean log level of its faster half of repetitions (:func:`faster_half`), and the difference of the two runs'
  is studentised by its Welch standard error (:func:`studentised_difference`): a run whose repetitions scatter
  (some processes slowed) counts for less than one whose repetitions agree. The null distribution is the
  permutation one: were base and head the same code, their levels would be exchangeable, so the statistic is
  recomputed over every split of the pooled levels into n_b and n_h (:data:`EXACT_SPLITS` at most; beyond that
  as many seeded random splits, the observed one among them). Studentising keeps the permutation test close to
  its level when the two runs' repetitions differ in spread, not only when they are exchangeable. The bound is
  the ``1 - alpha / m`` quantile, ``m`` the number of jobs of the comparison judged on repetitions (Bonferroni),
  so a comparison of unchanged code whose two runs saw the same machine states fails with probability at most
  about alpha whatever its size. What no within-run test sees is a state that holds for one job through a whole
  run and not through the other: on the shared two-core machine, where the load moved 3-11 between runs minutes
  apart, same-code gates failed 1-5 of 10 at 7-14 repetitions (benchmarks/NOTES.md, "run --repeat"); a history
  is the noise model there.
- **interleaved repetitions**: both runs came from one ``deltabench run --base-ref REF --repeat N`` invocation
  (``runners.interleave``): repetition r of a job ran on the base code and on the head code back to back, each in a
  fresh process, base first in half the pairs. Then both sides' repetitions are drawn from the same machine states,
  which is exactly the exchangeability the permutation null above assumes and separate runs lacked, so the same
  statistic is used, and it comes before a history: the history's runs saw other machine states than the head did,
  while the interleaved base saw the same ones. The paired alternative (a sign-flip test on the N within-pair
  differences, pair r having run back to back) was considered and not taken: its null has 2^N splits, so its
  smallest p-value is 2^-N (1/128 at N = 7) against 1 / C(2N, N) (1/3432) for the two-sample split, and at
  alpha / m over a comparison's m jobs it could reject nothing below N = 12 (m = 24); and the pairing buys little
  here, since what moves a repetition is the state of its own process (fast or slow for its whole life), which the
  two processes of a pair draw independently, not the moment they share. Unrestricted splits over a design whose
  pairs do share a moment are conservative (a moment's effect adds the same spread to both sides' levels and to the
  null), not liberal.
- **default**: no usable history (one base run). The spread is then unknown; a change counts only beyond
  ``z(1 - alpha) * sqrt(2) * sigma_default`` (head and base each carry one run effect), with ``sigma_default`` the
  run-to-run spread measured for the machine class (:data:`DEFAULT_SPREADS`, from ``benchmarks/gate_calibration.py``).
  Smaller changes are reported "within noise: run-to-run spread unknown".
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_SPREADS",
    "EXACT_SPLITS",
    "HISTORY_WINDOW",
    "MIN_HISTORY_RUNS",
    "MIN_REPETITIONS",
    "RUN_LEVEL",
    "SAME_RUN",
    "RunSpread",
    "default_spread",
    "faster_half",
    "normal_isf",
    "permutation_bound",
    "permutation_null",
    "repetition_levels",
    "run_level",
    "same_run_spread",
    "spread_from_history",
    "spread_from_repetitions",
    "spreads_from_histories",
    "student_t_isf",
    "studentised_difference",
]

# What a run of a job is summarised by (module docstring); shown in reasons and the evidence.
RUN_LEVEL = "best time"

# Fewest run levels that give a spread. Student-t allows 3, but on a shared machine run effects are heavy-tailed:
# with 3-4 runs of the same-code smoke runs the gate failed 2 of 2 and 3 of 5 gates (benchmarks/NOTES.md); a
# shorter history is treated as none.
MIN_HISTORY_RUNS = 5
# Fewest repetitions on each side for a within-run test: the permutation test's smallest p-value is
# 1 / C(n_b + n_h, n_b), 1/252 = 0.004 at 5 + 5 and 1/70 = 0.014 at 4 + 4, so fewer than 5 a side can never reject
# at alpha = 0.01. A comparison of m such jobs needs C(n_b + n_h, n_b) > m / alpha (7 a side for 24 jobs).
MIN_REPETITIONS = 5
# Splits of the pooled levels enumerated exactly up to this many (C(14, 7) = 3432, C(16, 8) = 12870); beyond it
# this many seeded random splits: a quantile at 1 - 0.01/24 then rests on ~8 splits above it, and 24 jobs of 10 + 10
# repetitions cost ~0.5 s.
EXACT_SPLITS = 20_000
# Heavy tails are judged from pooled leave-one-out residuals only with at least this many of them (e.g. 10 jobs
# with 5 runs): a far percentile of fewer is mostly their maximum, which would widen bounds at random.
MIN_TAIL_RESIDUALS = 50
_TAIL_QUANTILE = 0.975  # far enough out to see heavy tails, close enough in to be estimated from ~200 residuals

# Newest runs of a series the spread is estimated from: long enough for a stable estimate, short enough that a
# machine's slow drift (a driver update inside one major version) does not widen it.
HISTORY_WINDOW = 30
# A history of identical levels (a coarse clock, a cached result) would give s = 0 and make any difference
# "beyond noise"; a tenth of a percent is below what any run-to-run measurement here showed.
MIN_SPREAD = 0.001

# Run-to-run spread (standard deviation of log run levels) assumed when a job has no history, by machine class.
# Measured, not guessed (benchmarks/NOTES.md, "Regression gate calibration"; benchmarks/gate_calibration.py):
# - cpu: the smallest spread at which no-history gates on the 20 ordered pairs of 5 same-code `deltabench run
#   --suite smoke` runs on the two-core CI machine fail none (77.4%; job comparisons fail at most alpha from 48%).
#   That machine was shared (load average 8.6-11.7 on 2 cores): some jobs' best times moved up to 10x between runs,
#   so without history only a change beyond ~13x can fail there. A quieter machine measures its own
#   (`--default-spread`).
# - accelerators: 5 back-to-back processes of one job on an H200 (benchmarks/measurement_quality.py, 2026-11-30) spread
#   0.2-0.5% max-min; 1% keeps a margin for autotuning and clock state until the H200 calibration
#   (benchmarks/gpu/gate_calibration.sh) replaces it with a measured figure.
DEFAULT_SPREADS: dict[str, float] = {"cpu": 0.78, "accelerator": 0.01}
SAME_RUN = "same run"  # RunSpread.source of two impls compared within one run


@dataclasses.dataclass(frozen=True)
class RunSpread:
    """The run-to-run spread of one job's run level: ``sigma`` on the log scale, where it came from, and the centre
    the head is compared with when it came from history."""

    sigma: float
    source: str  # "history", "repetitions", "default" or "same run" (two impls of one run: no run-to-run effect)
    runs: int = 0  # run levels (history) or base repetitions (repetitions) it was estimated from; 0 for a default
    center_ms: float | None = None  # history: geometric mean of its run levels; repetitions: of the base's
    tail: float = 1.0  # widening of the history bound for heavy-tailed run effects (:func:`spreads_from_histories`)
    head_runs: int = 0  # repetitions: the head's repetitions
    head_center_ms: float | None = None  # repetitions: exp of the mean log level of the head's faster half
    base_logs: tuple[float, ...] = ()  # repetitions: the base's log levels (the permutation null is built from both)
    head_logs: tuple[float, ...] = ()
    family: int = 1  # repetitions: jobs of the comparison judged on repetitions (the bound is at alpha / family)
    interleaved: bool = False  # repetitions: base and head ran interleaved in one invocation (`run --base-ref`)
    measured: bool = False  # default: the user measured it on this machine (`gate --default-spread`), not assumed

    @property
    def evidence(self) -> bool:
        """True when the spread was measured for these runs or this machine (history, repetitions, the same run,
        or a default the user measured); False for the machine class's assumed default. Only measured evidence can
        call a job the same (``result``, "Verdicts")."""
        return self.source != "default" or self.measured

    def bound(self, alpha: float) -> float:
        """The log-ratio a head of unchanged code exceeds with probability `alpha` (one-sided), against
        :attr:`center_ms` (history, repetitions) or against the base run (default)."""
        if self.source == "history":
            return self.tail * student_t_isf(alpha, self.runs - 1) * self.sigma * math.sqrt(1.0 + 1.0 / self.runs)
        if self.source == "repetitions":
            return permutation_bound(self.base_logs, self.head_logs, alpha / self.family)
        return normal_isf(alpha) * math.sqrt(2.0) * self.sigma

    def describe(self) -> str:
        """Where the spread came from, for a verdict's reason: ``"spread 2.1% over 6 past runs"``."""
        if self.source == "history":
            widened = f", bound widened {self.tail:.1f}x for heavy tails" if self.tail > 1.0 else ""
            return f"spread {self.sigma:.1%} over {self.runs} past runs{widened}"
        if self.source == "repetitions":
            family = f", bound at alpha/{self.family} over {self.family} jobs" if self.family > 1 else ""
            if self.interleaved:
                return (
                    f"spread between repetitions of base and head interleaved in one invocation ({self.runs} base, "
                    f"{self.head_runs} head; standard error {self.sigma:.1%}{family})"
                )
            return (
                f"within-run spread between repetitions ({self.runs} base, {self.head_runs} head; no history; "
                f"standard error {self.sigma:.1%}{family})"
            )
        if self.source == SAME_RUN:
            return "two impls of one run: no run-to-run effect between them, judged on the run's own samples"
        return f"run-to-run spread unknown: default {self.sigma:.1%}"


# A comparison asks for the same few quantiles for each of its jobs (one alpha, one history length): scipy's
# distribution calls cost ~0.1 ms each, a fifth of a first view's CPU before they were kept.
@functools.lru_cache(maxsize=256)
def student_t_isf(upper: float, df: int) -> float:
    """Student's t quantile with `upper` probability above it at `df` degrees of freedom (scipy's ``t.isf``)."""
    from scipy.stats import t

    return float(t.isf(upper, df))


@functools.lru_cache(maxsize=64)
def normal_isf(upper: float) -> float:
    """The standard normal quantile with `upper` probability above it (scipy's ``norm.isf``)."""
    from scipy.stats import norm

    return float(norm.isf(upper))


def same_run_spread() -> RunSpread:
    """The spread between two impls timed in one run: no run-to-run effect separates them (one machine, one
    software state, one invocation), so a change is judged on the run's own samples: their interval and the
    threshold. Drift within the run is what the threshold is for."""
    return RunSpread(sigma=0.0, source=SAME_RUN)


def default_spread(machine_kind: str | None) -> RunSpread:
    """The measured default spread of a machine class (CPU machines vs accelerators) for jobs without history."""
    key = "cpu" if (machine_kind or "cpu").lower().startswith("cpu") else "accelerator"
    return RunSpread(sigma=DEFAULT_SPREADS[key], source="default")


def repetition_levels(samples_ms: Sequence[float], repetitions: Sequence[int]) -> list[float]:
    """Each repetition's level (its best sample), in repetition order; one level when the samples carry no
    repetition indices (a run of one repetition)."""
    if not len(repetitions):
        return [float(min(samples_ms))] if len(samples_ms) else []
    best: dict[int, float] = {}
    for r, x in zip(repetitions, samples_ms, strict=True):
        best[r] = min(best.get(r, math.inf), float(x))
    return [best[r] for r in sorted(best)]


def run_level(samples_ms: Sequence[float], median_ms: float, repetitions: Sequence[int] = ()) -> float:
    """A run's level for the run-to-run model: its best sample (the median of its repetitions' best samples when it
    has several), or its median when no raw samples were stored."""
    if not len(samples_ms):
        return float(median_ms)
    # statistics.median: the same value as numpy's on these few levels, without numpy's per-call cost (a comparison
    # takes a level of every job of 30 runs).
    return float(statistics.median(repetition_levels(samples_ms, repetitions)))


def faster_half(logs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) of the faster half (the ceil(n / 2) smallest, at least 2) of each row of log levels."""
    n = logs.shape[-1]
    m = max(2, math.ceil(n / 2))
    low = np.sort(logs, axis=-1)[..., :m]
    return low.mean(axis=-1), low.var(axis=-1, ddof=1) / m


def studentised_difference(base_logs: np.ndarray, head_logs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(difference, standard error) of the faster halves' mean log levels, head minus base, row by row; the error
    is Welch's, floored at :data:`MIN_SPREAD` (repetitions that all agree would otherwise make any change infinite
    standard errors)."""
    mb, vb = faster_half(base_logs)
    mh, vh = faster_half(head_logs)
    return mh - mb, np.maximum(np.sqrt(vb + vh), MIN_SPREAD)


def spread_from_repetitions(base_levels: Sequence[float], head_levels: Sequence[float]) -> RunSpread | None:
    """The within-run evidence of a job from its repetitions' levels (:func:`repetition_levels`) in the base and the
    head run: each run's faster-half level (``center_ms``, ``head_center_ms``), both runs' log levels (the
    permutation bound is built from them), and the standard error of the difference (``sigma``); None when a side
    has fewer than :data:`MIN_REPETITIONS` usable levels."""
    b, h = _usable(base_levels), _usable(head_levels)
    if b.size < MIN_REPETITIONS or h.size < MIN_REPETITIONS:
        return None
    yb, yh = np.log(b), np.log(h)
    _, se = studentised_difference(yb, yh)
    return RunSpread(
        sigma=float(se),
        source="repetitions",
        runs=int(b.size),
        center_ms=float(np.exp(faster_half(yb)[0])),
        head_runs=int(h.size),
        head_center_ms=float(np.exp(faster_half(yh)[0])),
        base_logs=tuple(yb.tolist()),
        head_logs=tuple(yh.tolist()),
    )


@functools.lru_cache(maxsize=16)
def _splits(n_base: int, n_head: int) -> np.ndarray:
    """Which positions of the pooled (base, then head) levels are the base, split by split: every split when there
    are at most :data:`EXACT_SPLITS`, else that many seeded random ones with the observed split first."""
    n = n_base + n_head
    if math.comb(n, n_base) <= EXACT_SPLITS:
        idx = np.array(list(itertools.combinations(range(n), n_base)))
    else:
        rng = np.random.default_rng(0)
        idx = np.argsort(rng.random((EXACT_SPLITS, n)), axis=1)[:, :n_base]
        idx[0] = np.arange(n_base)
    mask = np.zeros((len(idx), n), bool)
    np.put_along_axis(mask, idx, True, axis=1)
    mask.setflags(write=False)  # shared between calls
    return mask


@functools.lru_cache(maxsize=1024)
def permutation_null(base_logs: tuple[float, ...], head_logs: tuple[float, ...]) -> np.ndarray:
    """The studentised difference (:func:`studentised_difference`) over the splits of the pooled levels into
    ``len(base_logs)`` and ``len(head_logs)`` (:func:`_splits`), sorted: its distribution were the two runs the
    same code."""
    nb, nh = len(base_logs), len(head_logs)
    mask = _splits(nb, nh)
    y = np.broadcast_to(np.asarray(base_logs + head_logs, float), mask.shape)
    d, se = studentised_difference(y[mask].reshape(-1, nb), y[~mask].reshape(-1, nh))
    return np.sort(d / se)


def permutation_bound(base_logs: tuple[float, ...], head_logs: tuple[float, ...], level: float) -> float:
    """The change of the faster-half log level that unchanged code exceeds with probability at most `level` in
    either direction: the permutation null's upper quantile (the smallest ``q`` with ``P(S > q) <= level``), or the
    mirror one for a faster head, whichever is wider, times the observed standard error."""
    null = permutation_null(base_logs, head_logs)
    k = math.floor(level * null.size)  # at most k of the splits may lie beyond the bound, each way
    upper, lower = float(null[null.size - 1 - k]), float(null[k])
    _, se = studentised_difference(np.asarray(base_logs), np.asarray(head_logs))
    # A hair wider: the observed split is one of the null's, and the change it is compared with is computed another
    # way (a ratio of levels); rounding must not put the most extreme split beyond itself.
    return max(upper, -lower, 0.0) * float(se) * (1.0 + 1e-9) + 1e-12


def _current_segment(levels: np.ndarray) -> np.ndarray:
    """The levels after the series' last change point: a real step in the history is a change, not noise."""
    if levels.size < 2 * MIN_HISTORY_RUNS:
        return levels
    from .changepoints import change_points_of_values

    found = change_points_of_values(range(levels.size), levels)
    return levels[found[-1].index :] if found else levels


def _usable(levels_ms: Sequence[float]) -> np.ndarray:
    """The positive, finite levels, in order."""
    return np.asarray([v for v in levels_ms if v is not None and math.isfinite(v) and v > 0], float)


def spread_from_history(levels_ms: Sequence[float]) -> RunSpread | None:
    """The spread of a series' run levels (:func:`run_level`, oldest first, the base run's included), or None with
    fewer than :data:`MIN_HISTORY_RUNS` usable ones (then :func:`default_spread` applies)."""
    m = _current_segment(_usable(levels_ms)[-HISTORY_WINDOW:])
    if m.size < MIN_HISTORY_RUNS:
        return None
    y = np.log(m)
    sigma = max(float(np.std(y, ddof=1)), MIN_SPREAD)
    return RunSpread(sigma=sigma, source="history", runs=int(m.size), center_ms=float(np.exp(y.mean())))


def _loo_residuals(y: np.ndarray) -> list[float]:
    """Each level against the others' prediction bound scale: (y_i - mean_-i) / (sd_-i * sqrt(1 + 1/(k-1))), which
    is Student-t with k - 2 degrees of freedom when run effects are normal."""
    k = y.size
    # Row i holds the levels without the i-th, in order: one reduction per row for all k at once.
    rest = np.broadcast_to(y, (k, k))[~np.eye(k, dtype=bool)].reshape(k, k - 1)
    sd = np.maximum(np.std(rest, axis=1, ddof=1), MIN_SPREAD)
    return ((y - rest.mean(axis=1)) / (sd * math.sqrt(1.0 + 1.0 / (k - 1)))).tolist()


def spreads_from_histories(levels_by_key: Mapping[Any, Sequence[float]]) -> dict[Any, RunSpread]:
    """:func:`spread_from_history` of every job of a run, with the bounds widened together when the history shows
    heavier tails than the Student-t bound assumes.

    Why: a few runs estimate each job's spread, and on a shared machine run effects are heavy-tailed (a job's best
    time 4-10x in one run of unchanged code, benchmarks/NOTES.md), so a bound from 4-5 runs fails far more than
    alpha of unchanged heads. The jobs of one run share the machine, so their histories are pooled: each history
    level is compared with the bound the other levels give (leave one out), and if the 97.5th percentile of those
    residuals exceeds the Student-t quantile the bound assumes, every job's bound is widened by that ratio (never
    narrowed). Judged only with :data:`MIN_TAIL_RESIDUALS` residuals or more. On normal run effects the estimate's
    own noise widens bounds a little at times (under 1.22x in 95% of 40-job, 5-run histories).
    """

    spreads = {key: spread_from_history(levels) for key, levels in levels_by_key.items()}
    found = {key: s for key, s in spreads.items() if s is not None}
    residuals: list[float] = []
    dfs: list[int] = []
    for key, spread in found.items():
        if spread.runs >= 4:  # leave one out still gives a spread with 2 degrees of freedom
            y = np.log(_usable(levels_by_key[key])[-spread.runs :])
            residuals += _loo_residuals(y)
            dfs.append(spread.runs - 2)
    if len(residuals) < MIN_TAIL_RESIDUALS:
        return found
    expected = student_t_isf(1.0 - _TAIL_QUANTILE, int(np.median(dfs)))
    tail = max(1.0, float(np.quantile(residuals, _TAIL_QUANTILE)) / expected)
    if tail == 1.0:
        return found
    return {key: dataclasses.replace(s, tail=tail) for key, s in found.items()}
