"""Statistics on timing samples, free of any verdict: rank tests, bootstrap intervals of the ratio of medians,
median ratios, and the spread of a series' run medians.

How it is computed, fast enough for a dashboard's first view of a 100-job comparison (~10 ms):

- the rank test uses scipy's ``method="auto"`` choice per pair: the exact null distribution when a side has at most
  8 samples and nothing ties, else the normal approximation with tie and continuity corrections (accurate to far
  below any alpha at 9+ samples a side; the runners stop at 10 or more). Pairs of equal sizes go through one
  vectorised scipy call; the p-values are those of one call per pair.
- the bootstrap reads each resample's median off the sorted sample at the median positions of the sorted resample
  indices (resampling sorted values keeps their order), so one seeded index matrix per (n_base, n_head) serves
  every job of that size: each job's interval is exactly what it gets alone with the same seed, and the
  distribution is the plain percentile bootstrap's (tests/harness/test_regression_samples.py checks it against the
  textbook one).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from deltabench.harness.document import TimingStats

__all__ = [
    "DEFAULT_RESAMPLES",
    "bootstrap_ratio_ci",
    "bootstrap_ratio_cis",
    "mann_whitney_p",
    "mann_whitney_ps",
    "median_ratios",
    "min_attainable_p",
    "rel_se_of_median",
]

# 2000 resamples put the percentile interval's own Monte-Carlo error near 1e-3 of the ratio at 1% noise,
# ten times finer than any threshold anyone sets; more only costs time.
DEFAULT_RESAMPLES = 2000
# Median standard error over mean standard error for normal data (sqrt(pi/2)); the summary fallback only has SEMs.
_MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
_DEFAULT_LEVEL = 0.99


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
    level: float = _DEFAULT_LEVEL,
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
    level: float = _DEFAULT_LEVEL,
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


def median_ratios(arrays: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[float]:
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


def rel_se_of_median(t: TimingStats) -> float:
    """Relative standard error of a job's median: from its samples when stored, else its recorded ``sem_rel``
    (the runners record the median's standard error over the median)."""
    n = len(t.samples_ms)
    if n >= 2:
        s = np.asarray(t.samples_ms, float)
        return float(_MEDIAN_SE_FACTOR * np.std(s, ddof=1) / math.sqrt(n) / np.median(s))
    return t.sem_rel
