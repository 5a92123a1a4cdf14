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

How it is computed, fast enough for a dashboard's first view of a 100-job comparison (~10 ms, was ~180 ms):

- the rank test uses scipy's ``method="auto"`` choice per pair: the exact null distribution when a side has at most
  8 samples and nothing ties, else the normal approximation with tie and continuity corrections (accurate to far
  below any alpha at 9+ samples a side; the runners stop at 10 or more). Pairs of equal sizes go through one
  vectorised scipy call; the p-values are those of one call per pair.
- the bootstrap reads each resample's median off the sorted sample at the median positions of the sorted resample
  indices (resampling sorted values keeps their order), so one seeded index matrix per (n_base, n_head) serves
  every job of that size: each job's interval is exactly what it gets alone with the same seed, and the
  distribution is the plain percentile bootstrap's (tests/harness/test_stats.py checks it against the textbook one).

When raw samples are missing on a side (e.g. a pytest-benchmark file saved without ``--benchmark-save-data``), the
decision falls back to a normal approximation on the log ratio from each side's relative standard error.

Outcomes beyond timing: a head job that is incorrect, failed, timed out or ran out of memory while its base was not
failing is a *correctness failure*, always a gate failure whatever the timings. A job missing on one side, failing on
both, unsupported, or measured on a different machine class or major software is *not comparable*.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from .document import Environment, JobResult, ResultDocument, TimingStats
from .series import JobKey, context_mismatch, job_key

__all__ = [
    "BAD_STATUSES",
    "OUTCOMES",
    "Comparison",
    "JobComparison",
    "RunJobs",
    "SampleComparison",
    "bootstrap_ratio_ci",
    "bootstrap_ratio_cis",
    "compare_documents",
    "compare_job_pairs",
    "compare_jobs",
    "compare_sample_pairs",
    "compare_samples",
    "compare_summaries",
    "mann_whitney_p",
    "mann_whitney_ps",
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


# What JobComparison.to_dict shows of a SampleComparison (the outcome is the row's own).
_SAMPLE_STATS_FIELDS = tuple(f.name for f in dataclasses.fields(SampleComparison) if f.name != "outcome")


def mann_whitney_p(base: Sequence[float], head: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value of `head` against `base` (1.0 when a side is empty or all values tie)."""
    return mann_whitney_ps([(base, head)])[0]


# scipy's method="auto" rule: the exact null distribution when a side has at most this many samples and nothing
# ties, else the normal approximation with tie and continuity corrections. mann_whitney_ps applies the same rule,
# so a p-value does not depend on whether it was computed alone or in a batch.
_EXACT_MAX_N = 8


def mann_whitney_ps(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> list[float]:
    """Two-sided Mann-Whitney U p-values of each (base, head) pair, as :func:`mann_whitney_p` gives them one by one.

    Which method: scipy's ``"auto"`` choice, made per pair. The exact null distribution when a side has at most 8
    samples and no value ties; otherwise the normal approximation (tie-corrected, with continuity correction), whose
    error at 9+ samples a side is far below the alpha values a gate uses. The runners stop at 10 samples or more, so
    nearly every job takes the asymptotic path, and pairs of equal sizes are computed in one vectorised scipy call
    (the per-pair call costs ~0.3 ms, mostly overhead: a 100-job comparison spent ~30 ms here).
    """
    from scipy.stats import mannwhitneyu

    out = [1.0] * len(pairs)
    groups: dict[tuple[int, int], list[int]] = {}
    arrays = [(np.asarray(b, float), np.asarray(h, float)) for b, h in pairs]
    for i, (b, h) in enumerate(arrays):
        if b.size == 0 or h.size == 0 or np.ptp(np.concatenate([b, h])) == 0.0:
            continue  # nothing to rank: p = 1
        if min(b.size, h.size) <= _EXACT_MAX_N:
            out[i] = float(mannwhitneyu(h, b, alternative="two-sided").pvalue)  # "auto": exact unless ties
        else:
            groups.setdefault((b.size, h.size), []).append(i)
    for idx in groups.values():
        b2 = np.stack([arrays[i][0] for i in idx])
        h2 = np.stack([arrays[i][1] for i in idx])
        ps = mannwhitneyu(h2, b2, alternative="two-sided", method="asymptotic", axis=1).pvalue
        for i, p in zip(idx, np.atleast_1d(ps), strict=True):
            out[i] = float(p)
    return out


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
    quantiles of the resampled ratios. Same result as :func:`bootstrap_ratio_cis` gives for this pair in a batch.
    """
    return bootstrap_ratio_cis([(base, head)], level=level, n_resamples=n_resamples, seed=seed)[0]


def _resampled_median_positions(rng: np.random.Generator, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """For `m` resamples (with replacement) of `n` sorted values: the two positions whose mean is each median.

    The resample of sorted ``x`` at indices ``idx`` sorts as ``x[sort(idx)]``, so its median is read off the sorted
    indices; one index matrix then serves every job with `n` samples, and the values are never gathered or sorted.
    """
    idx = rng.integers(0, n, (m, n), dtype=np.int16 if n <= np.iinfo(np.int16).max else np.int64)
    idx.sort(axis=1)
    return idx[:, (n - 1) // 2].astype(np.intp), idx[:, n // 2].astype(np.intp)


_Positions = tuple[np.ndarray, np.ndarray, np.ndarray]


def _distinct_position_pairs(lo: np.ndarray, hi: np.ndarray, n: int) -> _Positions:
    """The distinct (lo, hi) position pairs of the resamples and, per resample, which of them it has:
    ``(lo_distinct, hi_distinct, at)`` with ``lo == lo_distinct[at]`` and ``hi == hi_distinct[at]``.

    Resampled medians of `n` values fall on few position pairs (~60 of 2,000 resamples at n=20), so a group's
    sums of the two values are formed once per distinct pair and then gathered per resample: one gather of the
    resample matrix instead of two and an addition (the same sums, so the same medians).
    """
    codes, at = np.unique(lo * n + hi, return_inverse=True)
    out = (codes // n, codes % n, at.astype(np.intp))
    for a in out:
        a.setflags(write=False)  # shared between calls: nobody may change them
    return out


@functools.lru_cache(maxsize=256)
def _median_positions(seed: int, nb: int, nh: int, n_resamples: int) -> tuple[tuple[int, _Positions, _Positions], ...]:
    """The resampled median positions of a (n_base, n_head) group, chunk by chunk: (start, base, head), each side's
    as :func:`_distinct_position_pairs` gives them.

    They depend only on the seed and the sizes, so they are drawn once per process and shared by every comparison
    with those sizes (a dashboard compares many runs of the same suites); ~32 KB an entry at 2,000 resamples.
    """
    rng = np.random.default_rng(seed)
    # Chunked so a 10k-sample job does not allocate a 2000 x 10k index matrix at once.
    chunk = max(1, 4_000_000 // max(nb, nh))
    out = []
    for start in range(0, n_resamples, chunk):
        m = min(chunk, n_resamples - start)
        b_lo, b_hi = _resampled_median_positions(rng, nb, m)
        h_lo, h_hi = _resampled_median_positions(rng, nh, m)
        out.append((start, _distinct_position_pairs(b_lo, b_hi, nb), _distinct_position_pairs(h_lo, h_hi, nh)))
    return tuple(out)


def bootstrap_ratio_cis(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    level: float = 1 - DEFAULT_ALPHA,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> list[tuple[float, float]]:
    """:func:`bootstrap_ratio_ci` of every (base, head) pair, vectorised over pairs of equal sample sizes.

    Each pair's interval is exactly the one :func:`bootstrap_ratio_ci` gives for it alone: pairs with the same
    (n_base, n_head) share one seeded set of resample indices (as separate calls with the same seed would draw),
    and each pair's medians are read from its sorted samples at the resampled median positions.
    """
    arrays = [(np.asarray(b, float), np.asarray(h, float)) for b, h in pairs]
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (b, h) in enumerate(arrays):
        if b.size == 0 or h.size == 0:
            raise ValueError("bootstrap needs at least one sample on each side")
        groups.setdefault((b.size, h.size), []).append(i)
    tail = (1.0 - level) / 2.0
    out: list[tuple[float, float]] = [(math.nan, math.nan)] * len(arrays)
    for (nb, nh), idx in groups.items():
        bs = np.sort(np.stack([arrays[i][0] for i in idx]), axis=1)
        hs = np.sort(np.stack([arrays[i][1] for i in idx]), axis=1)
        ratios = np.empty((len(idx), n_resamples))
        for start, (b_lo, b_hi, b_at), (h_lo, h_hi, h_at) in _median_positions(seed, nb, nh, n_resamples):
            mb = (bs[:, b_lo] + bs[:, b_hi])[:, b_at]  # twice the medians: the factor cancels in the ratio
            mh = (hs[:, h_lo] + hs[:, h_hi])[:, h_at]
            np.divide(mh, mb, out=ratios[:, start : start + b_at.size])
        # Rows sorted first: np.quantile moves the axis and partitions along the strided one (~4 ms for 100 x 2,000
        # ratios), slower than sorting the contiguous rows and then partitioning sorted data (~2.4 ms). The same
        # order statistics either way, so the same interval.
        ratios.sort(axis=1)
        lo, hi = np.quantile(ratios, [tail, 1.0 - tail], axis=1)
        for i, a, z in zip(idx, lo, hi, strict=True):
            out[i] = (float(a), float(z))
    return out


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
    return compare_sample_pairs([(base, head)], threshold=threshold, alpha=alpha, n_resamples=n_resamples, seed=seed)[0]


def _median_ratios(arrays: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[float]:
    """median(head) / median(base) of each (base, head) pair, one ``np.median(axis=1)`` per group of equal sizes.

    The same values as ``np.median(h) / np.median(b)`` pair by pair (the same order statistics, averaged the same
    way), without ~20 us of numpy call overhead per median: a 100-job comparison spent ~4 ms here.
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (b, h) in enumerate(arrays):
        groups.setdefault((b.size, h.size), []).append(i)
    out = [math.nan] * len(arrays)
    for idx in groups.values():
        mb = np.median(np.stack([arrays[i][0] for i in idx]), axis=1)
        mh = np.median(np.stack([arrays[i][1] for i in idx]), axis=1)
        for i, r in zip(idx, (mh / mb).tolist(), strict=True):
            out[i] = r
    return out


def compare_sample_pairs(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> list[SampleComparison]:
    """:func:`compare_samples` of every (base, head) pair, the same verdicts, with the bootstrap and the rank test
    vectorised over the pairs (a comparison of two runs grades all its jobs in one call)."""
    arrays = [(np.asarray(b, float), np.asarray(h, float)) for b, h in pairs]
    for b, h in arrays:
        if b.size == 0 or h.size == 0:
            raise ValueError("compare_samples needs at least one sample on each side")
        if np.any(b <= 0) or np.any(h <= 0):
            raise ValueError("timings must be positive")
    level = 1.0 - alpha
    judged = [i for i, (b, h) in enumerate(arrays) if min_attainable_p(b.size, h.size) < alpha]
    cis = bootstrap_ratio_cis([arrays[i] for i in judged], level=level, n_resamples=n_resamples, seed=seed)
    ps = mann_whitney_ps([arrays[i] for i in judged])
    evidence = {i: (ci, p) for i, ci, p in zip(judged, cis, ps, strict=True)}
    ratios = _median_ratios(arrays)
    out = []
    for i, (b, h) in enumerate(arrays):
        ratio = ratios[i]
        if i not in evidence:
            out.append(
                SampleComparison(
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
            )
            continue
        (lo, hi), p = evidence[i]
        outcome, detail = _grade(ratio, lo, hi, p, threshold=threshold, alpha=alpha)
        out.append(SampleComparison(outcome, ratio, lo, hi, level, p, b.size, h.size, "bootstrap+mann-whitney", detail))
    return out


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
            # Field by field: dataclasses.asdict deep-copies recursively, and every field here is a scalar.
            values = ((k, getattr(self.stats, k)) for k in _SAMPLE_STATS_FIELDS)
            d["stats"] = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in values}
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
    return compare_job_pairs(
        [(base, head)], base_env=base_env, head_env=head_env, threshold=threshold, alpha=alpha, seed=seed
    )[0]


def _verdict_before_timing(
    base: JobResult | None, head: JobResult | None, mismatch: str | None, common: dict[str, Any]
) -> JobComparison | None:
    """The outcome when status or context settles it (correctness, comparability), else None: timings decide."""
    bs, hs = common["base_status"], common["head_status"]
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
    if mismatch:
        return JobComparison(outcome=NOT_COMPARABLE, reason=f"different context: {mismatch}", **common)
    if not (_timing_ok(base) and _timing_ok(head)):
        side = "base" if not _timing_ok(base) else "head"
        return JobComparison(outcome=NOT_COMPARABLE, reason=f"no timing in {side}", **common)
    return None


def compare_job_pairs(
    pairs: Sequence[tuple[JobResult | None, JobResult | None]],
    *,
    base_env: Environment | None = None,
    head_env: Environment | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> list[JobComparison]:
    """:func:`compare_jobs` of every (base, head) pair, the jobs with raw samples on both sides graded in one
    vectorised :func:`compare_sample_pairs` call."""
    out: list[JobComparison | None] = []
    commons: list[dict[str, Any]] = []
    sampled: list[int] = []
    # The same two environments for every pair: their mismatch is worked out once, not once a job.
    mismatch = context_mismatch(base_env, head_env) if base_env is not None and head_env is not None else None
    for base, head in pairs:
        if base is None and head is None:
            raise ValueError("compare_jobs needs a job on at least one side")
        common: dict[str, Any] = {
            "key": job_key(head if head is not None else base),  # type: ignore[arg-type]
            "base_status": base.status if base is not None else None,
            "head_status": head.status if head is not None else None,
        }
        if base is not None and base.timing is not None:
            common["base_median_ms"] = base.timing.median_ms
        if head is not None and head.timing is not None:
            common["head_median_ms"] = head.timing.median_ms
        commons.append(common)
        verdict = _verdict_before_timing(base, head, mismatch, common)
        if verdict is None:
            bt, ht = base.timing, head.timing  # type: ignore[union-attr]
            assert bt is not None and ht is not None
            if len(bt.samples_ms) >= 1 and len(ht.samples_ms) >= 1:
                sampled.append(len(out))
            else:
                stats = compare_summaries(bt, ht, threshold=threshold, alpha=alpha)
                verdict = JobComparison(outcome=stats.outcome, reason=stats.detail, stats=stats, **common)
        out.append(verdict)
    graded = compare_sample_pairs(
        [(pairs[i][0].timing.samples_ms, pairs[i][1].timing.samples_ms) for i in sampled],  # type: ignore[union-attr]
        threshold=threshold,
        alpha=alpha,
        seed=seed,
    )
    for i, stats in zip(sampled, graded, strict=True):
        out[i] = JobComparison(outcome=stats.outcome, reason=stats.detail, stats=stats, **commons[i])
    return [r for r in out if r is not None]


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


class RunJobs(Protocol):
    """What :func:`compare_documents` reads of a run: a :class:`ResultDocument`, or the lean
    ``db.queries.ComparisonInput`` the dashboard loads (jobs with their timings, no verification records)."""

    @property
    def run_id(self) -> str:
        """The run's id."""
        ...

    @property
    def environment(self) -> Environment:
        """Where it ran (machine class and software decide comparability)."""
        ...

    @property
    def jobs(self) -> Sequence[JobResult]:
        """Its jobs in document order."""
        ...


def _latest_by_key(doc: RunJobs) -> dict[JobKey, JobResult]:
    """One job per key: the highest attempt wins, and among equals the last listed (a retry supersedes)."""
    out: dict[JobKey, JobResult] = {}
    for job in doc.jobs:
        k = job_key(job)
        if k not in out or job.attempt >= out[k].attempt:
            out[k] = job
    return out


def compare_documents(
    base: ResultDocument | RunJobs,
    head: ResultDocument | RunJobs,
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
    rows = compare_job_pairs(
        [(bj.get(k), hj.get(k)) for k in keys],
        base_env=base.environment,
        head_env=head.environment,
        threshold=threshold,
        alpha=alpha,
        seed=seed,
    )
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
