"""The grading rule: one object that decides whether a job got slower and keeps the evidence and the reason.

The run-to-run evidence, in this order (:meth:`GradingRule.run_to_run`; ``noise`` defines each):

1. **history**: the series has >= 5 past runs; ``level`` = a run's best sample (``noise.run_level``: the median of
   its repetitions' best samples when it has several, its median when no raw samples were stored), ``reference``
   = the centre of the series' recent run levels;
2. **repetitions**: both runs were made with ``--repeat N``, N >= 5 (``noise.MIN_REPETITIONS``); ``level`` = the
   geometric mean of the head's faster half of repetitions (each repetition's best sample), ``reference`` = the
   base's; the bound is the studentised permutation bound of that difference at alpha / m, m the jobs of the
   comparison judged this way. When the two runs were interleaved in one invocation (``run --base-ref``), this
   comes first, before a history: the base then saw the machine states the head saw (``noise``, "interleaved
   repetitions", also for why the test stays the two-sample one rather than a paired one);
3. **default**: neither; ``level`` as in 1, ``reference`` = the base run's level, and the spread is the machine
   class's measured default: a change under its bound is "within noise: run-to-run spread unknown".

Then:

    change   = level(head) / reference - 1
    p        = two-sided Mann-Whitney U p-value of head vs base samples
    [lo, hi] = seeded percentile-bootstrap interval of median(head) / median(base) at level 1 - alpha
    bound    = the run-to-run noise bound at one-sided alpha (``RunSpread.bound``: a Student-t prediction bound from
               the history's spread, the permutation bound of the repetitions, or z * sqrt(2) * the machine class's
               measured default spread)

    regression   when change > threshold  and p < alpha and lo > 1  and log(1 + change) > bound
    improvement  the mirror image
    within noise otherwise, the reason naming the first criterion the change did not pass

Interleaved repetitions (``run --base-ref``) drop the two within-run criteria on pooled samples (p and [lo, hi]):
there the permutation test on the repetitions' levels is the within-run test, exact under no change since both sides
drew the same machine states, while the rank test and the bootstrap treat samples of one process as independent of
each other, which they are not. A worker process sits in a fast or a slow state for its whole life, so pooled medians
move with how many processes were slow: on the two-core CI machine a same-code interleaved job of 10 + 10
repetitions had a best-time bound of 2.5% but a 99.5% interval of its ratio of medians [0.83, 0.98], which alone
would have kept any change under 8% from being seen.

Why each criterion: the threshold keeps real but harmless 1-2% shifts from failing CI; the within-run test keeps a
noisy swing on a few samples from failing it; the run-to-run bound is what makes the false-failure rate on unchanged
code hold on real runs, because the samples of one run never see the variance between processes and machine states.
A head of unchanged code fails with probability at most alpha per job (one tail of the bound), less since the other
criteria must also hold; ``benchmarks/regression_detection.py`` measures it on synthetic and on real runs.

Verdict (``result``, "Verdicts"): a regression or an improvement is *different*. A change within noise is *same*
only when the evidence could have seen a threshold-sized change; else *unknown*. What it could have seen is its
minimum detectable change at alpha,

    mdc = exp(max(bound, w)) - 1,   w = half the width of the log interval [lo, hi]

the change at which the run-to-run criterion and the interval criterion start to flag (a change of exactly that
size is flagged about half the time; Pinpoint's thresholds by sample size play the same role). Same needs
``mdc <= threshold``, the change seen within the threshold (either way), and a measured spread (``RunSpread.evidence``):
a run of one repetition without history has only the machine class's assumed spread, so it is unknown however
small its change, and so is a job with too few samples to judge or no recorded spread.

When raw samples are missing on a side (e.g. a pytest-benchmark file saved without ``--benchmark-save-data``), the
within-run part is a z-test on the log ratio from each side's relative standard error.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from deltabench.harness.document import TimingStats

from .noise import (
    RUN_LEVEL,
    SAME_RUN,
    RunSpread,
    normal_isf,
    repetition_levels,
    run_level,
    spread_from_repetitions,
)
from .result import DIFFERENT, IMPROVEMENT, REGRESSION, SAME, UNKNOWN, WITHIN_NOISE, TimingEvidence
from .samples import (
    DEFAULT_RESAMPLES,
    bootstrap_ratio_cis,
    mann_whitney_ps,
    median_ratios,
    min_attainable_p,
    rel_se_of_median,
)

__all__ = ["DEFAULT_ALPHA", "DEFAULT_THRESHOLD", "GradingRule", "Verdict"]

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A timing verdict: the outcome, its reason, and the evidence it was decided on."""

    outcome: str
    reason: str
    evidence: TimingEvidence
    verdict: str = UNKNOWN  # same / different / unknown (module docstring, "Verdict")


def _nan_none(x: float) -> float | None:
    return None if math.isnan(x) else x


@dataclasses.dataclass(frozen=True)
class GradingRule:
    """The gate's decision rule (module docstring) with its parameters."""

    threshold: float = DEFAULT_THRESHOLD
    alpha: float = DEFAULT_ALPHA
    n_resamples: int = DEFAULT_RESAMPLES
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold < 10.0:
            raise ValueError(f"threshold must be a fraction in [0, 10), got {self.threshold}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")

    @property
    def level(self) -> float:
        """The bootstrap interval's level, 1 - alpha."""
        return 1.0 - self.alpha

    def decide(
        self,
        *,
        change: float,
        pvalue: float,
        ci: tuple[float, float],
        spread: RunSpread,
        statistic: str = RUN_LEVEL,
    ) -> tuple[str, str]:
        """(outcome, reason) for a change of the run level (`statistic`) against the reference, with the within-run
        evidence and the spread."""
        slower = change > 0.0
        size = f"{change:+.1%} ({statistic})"
        if (
            abs(change) <= 0.0
            or (slower and change <= self.threshold)
            or (not slower and 1.0 / (1.0 + change) - 1.0 <= self.threshold)
        ):
            return WITHIN_NOISE, f"{size} is within the {self.threshold:.0%} threshold"
        if spread.source == "repetitions" and spread.interleaved:
            pass  # the permutation test on the repetitions is the within-run test (module docstring)
        elif not pvalue < self.alpha:
            return WITHIN_NOISE, f"~ {size} is not significant within the runs (p={pvalue:.2g} >= {self.alpha:g})"
        lo, hi = ci
        if spread.source == "repetitions" and spread.interleaved:
            pass
        elif (slower and not lo > 1.0) or (not slower and not hi < 1.0):
            interval = f"the {self.level:.0%} interval of the ratio of medians [{lo:.3f}, {hi:.3f}]"
            if lo <= 1.0 <= hi:
                return WITHIN_NOISE, f"~ {size}: {interval} holds 1"
            return WITHIN_NOISE, f"~ {size}, but the medians moved the other way: {interval}"
        bound = spread.bound(self.alpha)
        if abs(math.log1p(change)) <= bound:
            limit = math.expm1(bound if slower else -bound)
            if spread.source in ("history", "repetitions"):
                return WITHIN_NOISE, f"{size} is within run-to-run noise ({limit:+.1%} at alpha, {spread.describe()})"
            return (
                WITHIN_NOISE,
                f"within noise: run-to-run spread unknown (no history, no repetitions); {size} does not pass the "
                f"{limit:+.1%} a single run must show (default spread {spread.sigma:.1%})",
            )
        outcome = REGRESSION if slower else IMPROVEMENT
        if spread.source == SAME_RUN:
            return outcome, (
                f"{size} vs the base impl in the same run: beyond the {self.threshold:.0%} threshold, significant "
                f"(p={pvalue:.2g}), its {self.level:.0%} interval [{lo:.3f}, {hi:.3f}] excludes 1 ({spread.describe()})"
            )
        where = {"history": "past runs", "repetitions": "base run's repetitions"}.get(spread.source, "base run")
        if spread.interleaved:
            where = "interleaved base's repetitions"
        return outcome, (
            f"{size} vs the {where}: beyond the {self.threshold:.0%} threshold, significant (p={pvalue:.2g}) and "
            f"beyond run-to-run noise ({math.expm1(bound if slower else -bound):+.1%}, {spread.describe()})"
        )

    def min_detectable_change(self, spread: RunSpread, ci: tuple[float, float]) -> float | None:
        """The smallest change either way the rule could flag with this evidence (module docstring, "Verdict"):
        the wider of the run-to-run bound and the interval's half-width on the log scale; None without an
        interval."""
        if spread.source == "repetitions" and spread.interleaved:
            return math.expm1(spread.bound(self.alpha))  # the permutation test alone decides (module docstring)
        lo, hi = ci
        if not (lo > 0.0 and hi > 0.0 and math.isfinite(lo) and math.isfinite(hi)):
            return None
        width = 0.5 * math.log(hi / lo)
        return math.expm1(max(spread.bound(self.alpha), width))

    def call(self, outcome: str, change: float, spread: RunSpread, mdc: float | None) -> tuple[str, str]:
        """(verdict, what to add to the reason) of a graded job (module docstring, "Verdict")."""
        if outcome != WITHIN_NOISE:
            return DIFFERENT, ""
        seen = "" if mdc is None else f"smallest detectable change {mdc:+.1%}"
        if mdc is None or not mdc <= self.threshold:
            why = seen or "no interval"
            return UNKNOWN, f"; UNKNOWN: cannot tell a {self.threshold:.0%} change from noise ({why})"
        if not spread.evidence:
            return UNKNOWN, f"; UNKNOWN: run-to-run spread assumed, not measured ({seen})"
        if abs(math.log1p(change)) > math.log1p(self.threshold):
            return UNKNOWN, f"; UNKNOWN: {change:+.1%} is beyond the {self.threshold:.0%} threshold ({seen})"
        return SAME, f"; SAME: a {self.threshold:.0%} change would have been seen ({seen})"

    def run_to_run(
        self,
        given: RunSpread,
        base_levels: Sequence[float],
        head_levels: Sequence[float],
        *,
        interleaved: bool = False,
    ) -> tuple[RunSpread, float, float]:
        """(spread, head level, reference) a job's change is judged with, from the evidence in the module
        docstring's order: `given` when it is a history (unless the runs were `interleaved` and have enough
        repetitions); else the repetitions' spread when both sides have enough repetition levels
        (``noise.repetition_levels``); else `given` (the machine class's default)."""
        if given.source != "history" or interleaved:
            within = spread_from_repetitions(base_levels, head_levels)
            if within is not None:
                assert within.center_ms is not None and within.head_center_ms is not None
                within = dataclasses.replace(within, interleaved=interleaved)
                return within, within.head_center_ms, within.center_ms
        head_level = float(np.median(head_levels))
        reference = given.center_ms if given.center_ms is not None else float(np.median(base_levels))
        return given, head_level, reference

    def _verdict(
        self,
        ratio: float,
        ci: tuple[float, float],
        p: float,
        nb: int,
        nh: int,
        method: str,
        spread: RunSpread,
        head_level: float,
        reference: float,
        repetitions: tuple[int, int] = (1, 1),
    ) -> Verdict:
        change = head_level / reference - 1.0
        if method == "summary":
            statistic = "median"
        elif spread.source == "repetitions":
            statistic = f"{RUN_LEVEL}, faster half of {spread.head_runs} vs {spread.runs} repetitions"
        else:
            statistic = RUN_LEVEL
        outcome, reason = self.decide(change=change, pvalue=p, ci=ci, spread=spread, statistic=statistic)
        mdc = self.min_detectable_change(spread, ci)
        verdict, note = self.call(outcome, change, spread, mdc)
        reason += note
        evidence = TimingEvidence(
            ratio=ratio,
            ci_low=_nan_none(ci[0]),
            ci_high=_nan_none(ci[1]),
            level=self.level,
            pvalue=p,
            n_base=nb,
            n_head=nh,
            method=method,
            detail=reason,
            reference_ms=reference,
            change=change,
            spread=spread.sigma,
            spread_source=spread.source,
            history_runs=spread.runs if spread.source == "history" else 0,
            noise_bound=math.expm1(spread.bound(self.alpha)),
            base_repetitions=repetitions[0],
            head_repetitions=repetitions[1],
            min_detectable_change=mdc,
        )
        return Verdict(outcome, reason, evidence, verdict)

    def grade_samples(
        self,
        pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
        spreads: Sequence[RunSpread],
        repetitions: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None,
        *,
        interleaved: bool = False,
    ) -> list[Verdict]:
        """Grade each (base samples, head samples) pair against its run-to-run noise: `spreads` holds each pair's
        history spread or the machine class's default, `repetitions` each sample's repetition index per side
        (``TimingStats.repetitions``; empty: one repetition), from which :meth:`run_to_run` takes the within-run
        spread when there is no history, or first when the two runs were `interleaved` in one invocation
        (``run --base-ref``). The bootstrap and the rank test are vectorised over the pairs (a
        comparison of two runs grades all its jobs in one call)."""
        arrays = [(np.asarray(b, float), np.asarray(h, float)) for b, h in pairs]
        reps = list(repetitions) if repetitions is not None else [((), ())] * len(arrays)
        if len(reps) != len(arrays):
            raise ValueError("repetitions must name one (base, head) pair of indices per pair of samples")
        for b, h in arrays:
            if b.size == 0 or h.size == 0:
                raise ValueError("grading needs at least one sample on each side")
            if np.any(b <= 0) or np.any(h <= 0):
                raise ValueError("timings must be positive")
        judged = [i for i, (b, h) in enumerate(arrays) if min_attainable_p(b.size, h.size) < self.alpha]
        sub = [arrays[i] for i in judged]
        cis = bootstrap_ratio_cis(sub, level=self.level, n_resamples=self.n_resamples, seed=self.seed)
        ps = mann_whitney_ps(sub)
        evidence = {i: (ci, p) for i, ci, p in zip(judged, cis, ps, strict=True)}
        ratios = median_ratios(arrays)
        levels = {
            i: (repetition_levels(arrays[i][0], reps[i][0]), repetition_levels(arrays[i][1], reps[i][1]))
            for i in evidence
        }
        noise = {i: self.run_to_run(spreads[i], *levels[i], interleaved=interleaved) for i in evidence}
        # The jobs judged on their repetitions share alpha (Bonferroni): a comparison of unchanged code fails with
        # probability at most alpha however many jobs it has (noise.py, "repetitions").
        family = sum(n[0].source == "repetitions" for n in noise.values())
        for i, (spread, head_level, reference) in noise.items():
            if spread.source == "repetitions":
                noise[i] = (dataclasses.replace(spread, family=family), head_level, reference)
        out = []
        for i, (b, h) in enumerate(arrays):
            if i not in evidence:
                reason = (
                    f"too few samples to judge at alpha={self.alpha:g} ({b.size} base, {h.size} head); "
                    "UNKNOWN: no change could have been seen"
                )
                ev = TimingEvidence(
                    ratio=ratios[i],
                    ci_low=None,
                    ci_high=None,
                    level=self.level,
                    pvalue=1.0,
                    n_base=b.size,
                    n_head=h.size,
                    method="too few samples",
                    detail=reason,
                )
                out.append(Verdict(WITHIN_NOISE, reason, ev))
                continue
            ci, p = evidence[i]
            spread, head_level, reference = noise[i]
            out.append(
                self._verdict(
                    ratios[i],
                    ci,
                    p,
                    b.size,
                    h.size,
                    "bootstrap+mann-whitney",
                    spread,
                    head_level,
                    reference,
                    (len(levels[i][0]), len(levels[i][1])),
                )
            )
        return out

    def grade_summaries(self, base: TimingStats, head: TimingStats, spread: RunSpread) -> Verdict:
        """Grade from summaries only (a side stored no raw samples): the within-run part is a z-test on
        log(median ratio) with each side's relative standard error, its interval the normal one on the log scale."""
        from scipy.stats import norm

        ratio = head.median_ms / base.median_ms
        se = math.hypot(rel_se_of_median(base), rel_se_of_median(head))
        nb, nh = len(base.samples_ms), len(head.samples_ms)
        if not se > 0.0 or not math.isfinite(se):
            reason = "no spread recorded: cannot judge; UNKNOWN: no change could have been seen"
            ev = TimingEvidence(
                ratio=ratio,
                ci_low=None,
                ci_high=None,
                level=self.level,
                pvalue=1.0,
                n_base=nb,
                n_head=nh,
                method="summary",
                detail=reason,
            )
            return Verdict(WITHIN_NOISE, reason, ev)
        p = float(2.0 * norm.sf(abs(math.log(ratio)) / se))
        half = normal_isf(self.alpha / 2.0) * se
        ci = (ratio * math.exp(-half), ratio * math.exp(half))
        reference = spread.center_ms if spread.center_ms is not None else run_level([], base.median_ms)
        v = self._verdict(ratio, ci, p, nb, nh, "summary", spread, run_level([], head.median_ms), reference)
        reason = f"{v.reason} (from summaries: no raw samples)"
        return Verdict(v.outcome, reason, v.evidence.model_copy(update={"detail": reason}), v.verdict)
