"""Head vs base: did a job get slower? Decided from raw timing samples, graded, with the evidence kept.

The rule (asv's, with a bootstrap interval added; see docs in :func:`compare_samples`):

    ratio  r = median(head) / median(base)
    p        = two-sided Mann-Whitney U p-value of head vs base samples
    [lo, hi] = seeded percentile-bootstrap interval of r at level 1 - alpha (both samples resampled)

    regression   when p < alpha  and  r > 1 + threshold  and  lo > 1
    improvement  when p < alpha  and  r < 1 / (1 + threshold)  and  hi < 1
    within noise otherwise

Why both a test and a minimum ratio: on one distribution the rank test alone fails a fraction alpha of honest
heads by construction, and on GPUs base and head run minutes apart, so a real but harmless 1-2% shift (clocks,
another tenant) is "significant" with hundreds of samples. The ratio floor keeps those from failing CI; the test
keeps a noisy 6% swing on ten samples from failing it. The false-failure rate on two samples of one distribution is
therefore at most alpha / 2 (one tail of the test), and far less in practice since the ratio must also exceed
the threshold (measured in benchmarks/regression_detection.py).

When raw samples are missing on a side (e.g. a pytest-benchmark file saved without ``--benchmark-save-data``), the
decision falls back to a normal approximation on the log ratio from each side's relative standard error.

Outcomes beyond timing: a head job that is incorrect, failed, timed out or ran out of memory while its base was not
failing is a *correctness failure*, always a gate failure whatever the timings. A job missing on one side, failing on
both, unsupported, or measured on a different machine class or major software is *not comparable*.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .document import Environment, JobResult, ResultDocument, TimingStats
from .series import JobKey, context_mismatch, job_key

__all__ = [
    "BAD_STATUSES",
    "OUTCOMES",
    "Comparison",
    "JobComparison",
    "SampleComparison",
    "bootstrap_ratio_ci",
    "compare_documents",
    "compare_jobs",
    "compare_samples",
    "compare_summaries",
    "mann_whitney_p",
    "min_attainable_p",
]

REGRESSION = "regression"
IMPROVEMENT = "improvement"
WITHIN_NOISE = "within_noise"
NOT_COMPARABLE = "not_comparable"
CORRECTNESS_FAILURE = "correctness_failure"
OUTCOMES: tuple[str, ...] = (CORRECTNESS_FAILURE, REGRESSION, IMPROVEMENT, WITHIN_NOISE, NOT_COMPARABLE)
FAILING_OUTCOMES = frozenset({CORRECTNESS_FAILURE, REGRESSION})
BAD_STATUSES = frozenset({"incorrect", "failed", "timeout", "oom"})

DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
# 2000 resamples put the percentile interval's own Monte-Carlo error near 1e-3 of the ratio at 1% noise,
# ten times finer than any threshold anyone sets; more only costs time.
DEFAULT_RESAMPLES = 2000
# Median standard error over mean standard error for normal data (sqrt(pi/2)); the summary fallback only has SEMs.
_MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)


@dataclasses.dataclass(frozen=True)
class SampleComparison:
    """The statistical verdict on two timing samples (head vs base)."""

    outcome: str
    ratio: float
    ci_low: float
    ci_high: float
    level: float
    pvalue: float
    n_base: int
    n_head: int
    method: str
    detail: str = ""


def mann_whitney_p(base: Sequence[float], head: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value of `head` against `base` (1.0 when a side is empty or all values tie)."""
    from scipy.stats import mannwhitneyu

    b, h = np.asarray(base, float), np.asarray(head, float)
    if b.size == 0 or h.size == 0:
        return 1.0
    if np.ptp(np.concatenate([b, h])) == 0.0:
        return 1.0
    return float(mannwhitneyu(h, b, alternative="two-sided").pvalue)


def min_attainable_p(n_base: int, n_head: int) -> float:
    """The smallest two-sided Mann-Whitney p-value samples of these sizes can give: 2 / C(n_base + n_head, n_base).

    When it is above alpha no outcome can be significant, so the samples are too few to judge.
    """
    if n_base < 1 or n_head < 1:
        return 1.0
    log_comb = math.lgamma(n_base + n_head + 1) - math.lgamma(n_base + 1) - math.lgamma(n_head + 1)
    return min(1.0, 2.0 * math.exp(-log_comb))


def bootstrap_ratio_ci(
    base: Sequence[float],
    head: Sequence[float],
    *,
    level: float = 1 - DEFAULT_ALPHA,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of median(head) / median(base) at `level`, seeded (same inputs, same interval).

    Both samples are resampled independently with replacement; the interval is the (1-level)/2 and (1+level)/2
    quantiles of the resampled ratios.
    """
    b, h = np.asarray(base, float), np.asarray(head, float)
    if b.size == 0 or h.size == 0:
        raise ValueError("bootstrap needs at least one sample on each side")
    rng = np.random.default_rng(seed)
    # Chunked so a 10k-sample job does not allocate a 2000 x 10k index matrix at once.
    ratios = np.empty(n_resamples)
    chunk = max(1, 4_000_000 // max(b.size, h.size))
    for start in range(0, n_resamples, chunk):
        m = min(chunk, n_resamples - start)
        mb = np.median(b[rng.integers(0, b.size, (m, b.size))], axis=1)
        mh = np.median(h[rng.integers(0, h.size, (m, h.size))], axis=1)
        ratios[start : start + m] = mh / mb
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(ratios, [tail, 1.0 - tail])
    return float(lo), float(hi)


def _grade(ratio: float, lo: float, hi: float, p: float, *, threshold: float, alpha: float) -> tuple[str, str]:
    """Apply the rule of the module docstring; return (outcome, detail)."""
    significant = p < alpha
    if significant and ratio > 1.0 + threshold and lo > 1.0:
        return REGRESSION, ""
    if significant and ratio < 1.0 / (1.0 + threshold) and hi < 1.0:
        return IMPROVEMENT, ""
    change = ratio - 1.0
    if not significant and (ratio > 1.0 + threshold or ratio < 1.0 / (1.0 + threshold)):
        return WITHIN_NOISE, f"~ {change:+.1%} is not significant (p={p:.2g} >= {alpha:g})"
    if significant and abs(change) > 0.0:
        return WITHIN_NOISE, f"{change:+.1%} is significant but within the {threshold:.0%} threshold"
    return WITHIN_NOISE, ""


def compare_samples(
    base: Sequence[float],
    head: Sequence[float],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> SampleComparison:
    """Grade head vs base from raw samples (any time unit, same on both sides).

    regression: Mann-Whitney p < alpha, ratio of medians > 1 + threshold, and the (1 - alpha) bootstrap interval
    of the ratio above 1; improvement: the mirror image (ratio < 1 / (1 + threshold)); otherwise within noise,
    with a detail saying whether a large change was not significant (asv's ``~``) or a significant one was small.
    """
    b, h = np.asarray(base, float), np.asarray(head, float)
    if b.size == 0 or h.size == 0:
        raise ValueError("compare_samples needs at least one sample on each side")
    if np.any(b <= 0) or np.any(h <= 0):
        raise ValueError("timings must be positive")
    ratio = float(np.median(h) / np.median(b))
    level = 1.0 - alpha
    if min_attainable_p(b.size, h.size) >= alpha:
        return SampleComparison(
            WITHIN_NOISE,
            ratio,
            math.nan,
            math.nan,
            level,
            1.0,
            b.size,
            h.size,
            "too few samples",
            f"too few samples to judge at alpha={alpha:g} ({b.size} base, {h.size} head)",
        )
    lo, hi = bootstrap_ratio_ci(b, h, level=level, n_resamples=n_resamples, seed=seed)
    p = mann_whitney_p(b, h)
    outcome, detail = _grade(ratio, lo, hi, p, threshold=threshold, alpha=alpha)
    return SampleComparison(outcome, ratio, lo, hi, level, p, b.size, h.size, "bootstrap+mann-whitney", detail)


def _rel_se_of_median(t: TimingStats) -> float:
    """Relative standard error of a job's median: from its samples when stored, else its recorded ``sem_rel``
    (the runners record the median's standard error over the median)."""
    n = len(t.samples_ms)
    if n >= 2:
        s = np.asarray(t.samples_ms, float)
        return float(_MEDIAN_SE_FACTOR * np.std(s, ddof=1) / math.sqrt(n) / np.median(s))
    return t.sem_rel


def compare_summaries(
    base: TimingStats,
    head: TimingStats,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
) -> SampleComparison:
    """Grade head vs base from summaries only: a z-test on log(median ratio) with each side's relative SE.

    Used when a side stored no raw samples. Same grading rule as :func:`compare_samples`; the interval is the normal
    one on the log scale.
    """
    from scipy.stats import norm

    ratio = head.median_ms / base.median_ms
    se = math.hypot(_rel_se_of_median(base), _rel_se_of_median(head))
    level = 1.0 - alpha
    nb, nh = len(base.samples_ms), len(head.samples_ms)
    if not se > 0.0 or not math.isfinite(se):
        return SampleComparison(
            WITHIN_NOISE, ratio, math.nan, math.nan, level, 1.0, nb, nh, "summary", "no spread recorded: cannot judge"
        )
    z = abs(math.log(ratio)) / se
    p = float(2.0 * norm.sf(z))
    half = float(norm.isf(alpha / 2.0)) * se
    lo, hi = ratio * math.exp(-half), ratio * math.exp(half)
    outcome, detail = _grade(ratio, lo, hi, p, threshold=threshold, alpha=alpha)
    detail = "; ".join(filter(None, ["from summaries (no raw samples)", detail]))
    return SampleComparison(outcome, ratio, lo, hi, level, p, nb, nh, "summary", detail)


@dataclasses.dataclass(frozen=True)
class JobComparison:
    """One matched job, head vs base: its outcome and the evidence."""

    key: JobKey
    outcome: str
    reason: str = ""
    base_status: str | None = None
    head_status: str | None = None
    base_median_ms: float | None = None
    head_median_ms: float | None = None
    stats: SampleComparison | None = None

    @property
    def op(self) -> str:
        """The job's op."""
        return self.key[0]

    @property
    def impl(self) -> str:
        """The job's impl."""
        return self.key[1]

    @property
    def ratio(self) -> float | None:
        """median(head) / median(base), when both were timed."""
        return self.stats.ratio if self.stats else None

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form for JSON."""
        op, impl, shape, dtype, mode = self.key
        d: dict[str, Any] = {
            "op": op,
            "impl": impl,
            "shape": shape,
            "dtype": dtype,
            "mode": mode,
            "outcome": self.outcome,
            "reason": self.reason,
            "base_status": self.base_status,
            "head_status": self.head_status,
            "base_median_ms": self.base_median_ms,
            "head_median_ms": self.head_median_ms,
        }
        if self.stats is not None:
            s = dataclasses.asdict(self.stats)
            s.pop("outcome")
            d["stats"] = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in s.items()}
        return d


def _timing_ok(job: JobResult) -> bool:
    return job.timing is not None and job.timing.median_ms > 0


def compare_jobs(
    base: JobResult | None,
    head: JobResult | None,
    *,
    base_env: Environment | None = None,
    head_env: Environment | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> JobComparison:
    """Grade one job: correctness first (a broken head fails whatever the timings), then comparability, then timing."""
    if base is None and head is None:
        raise ValueError("compare_jobs needs a job on at least one side")
    key = job_key(head if head is not None else base)  # type: ignore[arg-type]
    bs = base.status if base is not None else None
    hs = head.status if head is not None else None
    common = {"key": key, "base_status": bs, "head_status": hs}
    if base is not None and base.timing is not None:
        common["base_median_ms"] = base.timing.median_ms
    if head is not None and head.timing is not None:
        common["head_median_ms"] = head.timing.median_ms

    if head is None:
        return JobComparison(outcome=NOT_COMPARABLE, reason="missing in head", **common)
    if hs in BAD_STATUSES:
        why = f"head {hs}" + (f": {head.reason}" if head.reason else "")
        if bs in BAD_STATUSES:
            return JobComparison(outcome=NOT_COMPARABLE, reason=f"failing on both sides ({why}; base {bs})", **common)
        was = "new in head" if base is None else f"base {bs}"
        return JobComparison(outcome=CORRECTNESS_FAILURE, reason=f"{why} ({was})", **common)
    if base is None:
        return JobComparison(outcome=NOT_COMPARABLE, reason="missing in base (new job)", **common)
    if hs == "unsupported" or bs == "unsupported":
        side = "head" if hs == "unsupported" else "base"
        why = (head if side == "head" else base).reason
        return JobComparison(outcome=NOT_COMPARABLE, reason=f"unsupported in {side}: {why}".rstrip(": "), **common)
    if bs in BAD_STATUSES:
        return JobComparison(outcome=NOT_COMPARABLE, reason=f"base was {bs}; head is {hs} now", **common)
    if base_env is not None and head_env is not None:
        mismatch = context_mismatch(base_env, head_env)
        if mismatch:
            return JobComparison(outcome=NOT_COMPARABLE, reason=f"different context: {mismatch}", **common)
    if not (_timing_ok(base) and _timing_ok(head)):
        side = "base" if not _timing_ok(base) else "head"
        return JobComparison(outcome=NOT_COMPARABLE, reason=f"no timing in {side}", **common)
    bt, ht = base.timing, head.timing
    assert bt is not None and ht is not None
    if len(bt.samples_ms) >= 1 and len(ht.samples_ms) >= 1:
        stats = compare_samples(bt.samples_ms, ht.samples_ms, threshold=threshold, alpha=alpha, seed=seed)
    else:
        stats = compare_summaries(bt, ht, threshold=threshold, alpha=alpha)
    return JobComparison(outcome=stats.outcome, reason=stats.detail, stats=stats, **common)


@dataclasses.dataclass
class Comparison:
    """Head vs base over two runs: one :class:`JobComparison` per job key found on either side."""

    base_run_id: str
    head_run_id: str
    threshold: float
    alpha: float
    rows: list[JobComparison]
    context_mismatch: str | None = None
    base_commit: str | None = None
    head_commit: str | None = None

    @property
    def counts(self) -> dict[str, int]:
        """Number of jobs per outcome (every outcome present, zero or not)."""
        c = dict.fromkeys(OUTCOMES, 0)
        for r in self.rows:
            c[r.outcome] += 1
        return c

    @property
    def failed(self) -> bool:
        """True when any job regressed or failed its correctness gate: the CI gate exits 1."""
        return any(r.outcome in FAILING_OUTCOMES for r in self.rows)

    def by_outcome(self, outcome: str) -> list[JobComparison]:
        """Rows with this outcome, worst ratio first for regressions and best first for improvements."""
        rows = [r for r in self.rows if r.outcome == outcome]
        if outcome == IMPROVEMENT:
            return sorted(rows, key=lambda r: r.ratio or 1.0)
        return sorted(rows, key=lambda r: -(r.ratio or 1.0))

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form for JSON."""
        return {
            "base_run_id": self.base_run_id,
            "head_run_id": self.head_run_id,
            "base_commit": self.base_commit,
            "head_commit": self.head_commit,
            "threshold": self.threshold,
            "alpha": self.alpha,
            "context_mismatch": self.context_mismatch,
            "failed": self.failed,
            "counts": self.counts,
            "rows": [r.to_dict() for r in self.rows],
        }


def _latest_by_key(doc: ResultDocument) -> dict[JobKey, JobResult]:
    """One job per key: the highest attempt wins, and among equals the last listed (a retry supersedes)."""
    out: dict[JobKey, JobResult] = {}
    for job in doc.jobs:
        k = job_key(job)
        if k not in out or job.attempt >= out[k].attempt:
            out[k] = job
    return out


def compare_documents(
    base: ResultDocument,
    head: ResultDocument,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> Comparison:
    """Match the jobs of two runs by (op, impl, shape, dtype, mode) and grade each (see the module docstring)."""
    if not 0.0 <= threshold < 10.0:
        raise ValueError(f"threshold must be a fraction in [0, 10), got {threshold}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    bj, hj = _latest_by_key(base), _latest_by_key(head)
    keys = list(hj) + [k for k in bj if k not in hj]
    rows = [
        compare_jobs(
            bj.get(k),
            hj.get(k),
            base_env=base.environment,
            head_env=head.environment,
            threshold=threshold,
            alpha=alpha,
            seed=seed,
        )
        for k in keys
    ]
    return Comparison(
        base_run_id=base.run_id,
        head_run_id=head.run_id,
        threshold=threshold,
        alpha=alpha,
        rows=rows,
        context_mismatch=context_mismatch(base.environment, head.environment),
        base_commit=base.environment.git_commit,
        head_commit=head.environment.git_commit,
    )
