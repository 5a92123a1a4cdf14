"""Change points in a series' history: where a timing stepped, by how much, and how surely.

Pure functions on a list of ``(x, value)`` points in history order, where ``x`` is any label (a commit, a date, a
run id) and ``value`` is a positive timing, or that run's raw samples (their median is taken).

Method, in the spirit of Hunter / Apache Otava (candidates, then a significance test per change point):

1. Work on ``log(value)``: timing noise is relative, so a 5% step is the same size at 0.1 ms and at 100 ms.
2. Estimate the point-to-point noise robustly, ``sigma = 1.4826 * MAD(diff(y)) / sqrt(2)``: steps are rare, so the
   differences are noise almost everywhere.
3. Clip each point to within ``clip * sigma`` of a running median of 5, so a lone outlier (a throttled run, a busy
   neighbour) cannot open a segment of its own while a step, which the running median follows, survives.
4. Candidate change points from ``ruptures``' PELT with the L2 cost (its C ``KernelCPD``, linear kernel) on
   ``y / sigma``, with a penalty of ``penalty * ln(n)`` per change point (BIC-like, as asv's step fit uses).
5. Each candidate is tested by Welch's t-test between the segments on either side; the least significant one is
   merged away and the neighbours re-tested until every change point has ``p < max_pvalue`` (Otava's merge step).

Defaults meet the figures in benchmarks/regression_detection.py: at 1% lognormal noise with occasional outliers,
more than 95% of 5% steps found within two points of where they happened, and under 1% of 100-point histories
without a step raise a false change point.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DASHBOARD_DETECTOR",
    "ChangePoint",
    "change_points_of_values",
    "dashboard_change_points",
    "find_change_points",
    "find_change_points_otava",
    "point_values",
    "robust_noise",
]

# Defaults calibrated with benchmarks/regression_detection.py (see the module docstring).
DEFAULT_MAX_PVALUE = 0.001
DEFAULT_PENALTY = 5.0
DEFAULT_MIN_SIZE = 3
DEFAULT_CLIP = 3.0
_MEDIAN_WINDOW = 5
# Floor on the relative noise: a history of identical numbers (a cached result, a coarse clock) would give
# sigma = 0 and make every rounding step "significant".
_MIN_SIGMA = 1e-4


@dataclasses.dataclass(frozen=True)
class ChangePoint:
    """A step in a series: the first point of the new level, its size and its significance."""

    index: int
    x: Any
    before: float
    after: float
    pvalue: float
    n_before: int
    n_after: int

    @property
    def ratio(self) -> float:
        """after / before, from the segments' medians: above 1 means the timing got slower."""
        return self.after / self.before

    @property
    def confirmed(self) -> bool:
        """True when a later run than the one where the step appeared shows the new level too: the dashboard calls
        a change point a regression only then, never on the newest run alone."""
        return self.n_after >= 2

    @property
    def direction(self) -> str:
        """``"slower"`` or ``"faster"`` (for timings; the other way round for throughputs)."""
        return "slower" if self.ratio > 1.0 else "faster"

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form for JSON."""
        d = dataclasses.asdict(self)
        d["x"] = self.x if isinstance(self.x, (str, int, float)) or self.x is None else str(self.x)
        d["ratio"] = self.ratio
        d["direction"] = self.direction
        d["confirmed"] = self.confirmed
        return d


def point_values(points: Sequence[tuple[Hashable, float | Sequence[float]]]) -> tuple[list[Any], np.ndarray]:
    """Split ``(x, value or samples)`` points into labels and positive values (the median of each sample list)."""
    xs, vals = [], []
    for x, v in points:
        val = float(np.median(np.asarray(v, float))) if isinstance(v, (Sequence, np.ndarray)) else float(v)
        if not (val > 0.0 and math.isfinite(val)):
            raise ValueError(f"point {x!r}: a timing must be positive and finite, got {val}")
        xs.append(x)
        vals.append(val)
    return xs, np.asarray(vals, float)


def _median(a: np.ndarray) -> float:
    """``np.median`` of a 1-d float array, the same value (the middle element, or the mean of the two middle ones)
    without its generic reduction's cost (~20 us a call; a comparison segments ~100 histories)."""
    n = a.size
    half = n // 2
    if n % 2:
        return float(np.partition(a, half)[half])
    part = np.partition(a, (half - 1, half))
    return float((part[half - 1] + part[half]) / 2.0)


def robust_noise(y: np.ndarray) -> float:
    """Robust standard deviation of the point-to-point noise of `y` (MAD of first differences / sqrt 2)."""
    if y.size < 3:
        return _MIN_SIGMA
    d = np.diff(y)
    mad = _median(np.abs(d - _median(d)))
    return max(1.4826 * mad / math.sqrt(2.0), _MIN_SIGMA)


def _running_median(y: np.ndarray, window: int) -> np.ndarray:
    """The median of each point's `window` (odd) neighbours, the series' ends repeated: each window's middle element
    after a partition, which is what ``np.median`` takes of an odd count."""
    half = window // 2
    # np.pad(y, half, mode="edge") by hand: the same array, without np.pad's argument handling (half of this call).
    padded = np.concatenate((np.repeat(y[:1], half), y, np.repeat(y[-1:], half)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, window)
    return np.partition(windows, half, axis=1)[:, half]


def _welch_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided Welch t-test p-value; segments of one repeated value compare by equality.

    The same arithmetic as ``scipy.stats.ttest_ind(a, b, equal_var=False)`` (its variance is the second central
    moment times n / (n - 1), its p-value ``2 * stdtr(df, -|t|)``), written out: scipy's call costs ~0.4 ms of
    argument handling, and a comparison tests the change points of every job's 30-run history (~100 jobs).
    """
    from scipy.special import stdtr

    na, nb = a.size, b.size
    if na < 2 or nb < 2:
        return 1.0
    if np.ptp(a) == 0.0 and np.ptp(b) == 0.0:
        return 0.0 if a[0] != b[0] else 1.0
    ma, mb = a.mean(), b.mean()
    vna = ((a - ma) ** 2).mean() * (na / (na - 1)) / na
    vnb = ((b - mb) ** 2).mean() * (nb / (nb - 1)) / nb
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (vna + vnb) ** 2 / (vna**2 / (na - 1) + vnb**2 / (nb - 1))
        t = np.divide(ma - mb, np.sqrt(vna + vnb))
    if np.isnan(df):  # both variances zero: any df gives the same p-value
        df = 1.0
    return float(2 * stdtr(df, -np.abs(t)))


def _pvalues(y: np.ndarray, bounds: list[int]) -> list[float]:
    """p-value of each inner boundary between its neighbouring segments (bounds include 0 and n)."""
    return [_welch_p(y[bounds[i - 1] : bounds[i]], y[bounds[i] : bounds[i + 1]]) for i in range(1, len(bounds) - 1)]


def find_change_points(
    points: Sequence[tuple[Hashable, float | Sequence[float]]],
    *,
    max_pvalue: float = DEFAULT_MAX_PVALUE,
    penalty: float = DEFAULT_PENALTY,
    min_size: int = DEFAULT_MIN_SIZE,
    clip: float = DEFAULT_CLIP,
    min_change: float = 0.0,
) -> list[ChangePoint]:
    """Change points of a timing history, oldest first (see the module docstring for the method).

    Args:
        points: ``(x, value)`` in history order; value is a positive timing or a list of raw samples.
        max_pvalue: a change point survives only if Welch's t-test between its segments gives p below this.
        penalty: PELT's cost per change point, in units of ``ln(n)`` on noise-standardised log values.
        min_size: fewest points a segment may have (a step in the last ``min_size - 1`` points waits for more).
        clip: outlier clipping, in noise standard deviations around a running median of 5.
        min_change: drop change points whose ``|ratio - 1|`` is below this (0 keeps every significant one).

    Returns:
        One :class:`ChangePoint` per step, with the medians of the segments on either side.

    Example::

        >>> pts = [(i, 1.0) for i in range(30)] + [(30 + i, 1.1) for i in range(30)]
        >>> [(c.index, round(c.ratio, 2)) for c in find_change_points(pts)]
        [(30, 1.1)]
    """
    xs, vals = point_values(points)
    return change_points_of_values(
        xs, vals, max_pvalue=max_pvalue, penalty=penalty, min_size=min_size, clip=clip, min_change=min_change
    )


def change_points_of_values(
    xs: Sequence[Hashable],
    vals: np.ndarray,
    *,
    max_pvalue: float = DEFAULT_MAX_PVALUE,
    penalty: float = DEFAULT_PENALTY,
    min_size: int = DEFAULT_MIN_SIZE,
    clip: float = DEFAULT_CLIP,
    min_change: float = 0.0,
) -> list[ChangePoint]:
    """:func:`find_change_points` of values already split from their labels (:func:`point_values`): `vals`
    positive and finite, `xs` their labels. For callers holding an array of levels: building and checking a point
    per value cost a sixth of a history's segmentation."""
    import ruptures

    n = vals.size
    if n < 2 * min_size:
        return []
    y = np.log(vals)
    sigma = robust_noise(y)
    level = _running_median(y, _MEDIAN_WINDOW)
    yc = level + np.clip(y - level, -clip * sigma, clip * sigma)
    # KernelCPD with the linear kernel is PELT with the L2 cost, implemented in C (ruptures' Python Pelt is ~1000x
    # slower on the same problem).
    algo = ruptures.KernelCPD(kernel="linear", min_size=min_size).fit((yc / sigma).reshape(-1, 1))
    bounds = [0, *(int(b) for b in algo.predict(pen=penalty * math.log(n)))]
    if bounds[-1] != n:
        bounds.append(n)
    # Merge the least significant boundary away until every remaining one passes (its neighbours' segments grow,
    # so their p-values are recomputed each round).
    while len(bounds) > 2:
        ps = _pvalues(yc, bounds)
        worst = int(np.argmax(ps))
        if ps[worst] < max_pvalue:
            break
        del bounds[worst + 1]
    ps = _pvalues(yc, bounds)
    return _change_points(xs, vals, bounds, ps, min_change)


def _change_points(
    xs: Sequence[Hashable], vals: np.ndarray, bounds: list[int], pvalues: Sequence[float], min_change: float
) -> list[ChangePoint]:
    """One :class:`ChangePoint` per inner bound of the segmentation `bounds` (0, ..., len(vals)), with the medians
    of the segments either side and `pvalues[i]` for the i-th inner bound; steps smaller than `min_change` dropped."""
    out = []
    for i in range(1, len(bounds) - 1):
        a, b = vals[bounds[i - 1] : bounds[i]], vals[bounds[i] : bounds[i + 1]]
        cp = ChangePoint(
            index=bounds[i],
            x=xs[bounds[i]],
            before=float(np.median(a)),
            after=float(np.median(b)),
            pvalue=float(pvalues[i - 1]),
            n_before=a.size,
            n_after=b.size,
        )
        if abs(cp.ratio - 1.0) >= min_change:
            out.append(cp)
    return out


# The detector the dashboard's history and regressions use: Apache Otava's, which scored the higher F1 on
# otava-test-data's labelled series (docs/reference/changepoints.md, benchmarks/changepoints_f1.py): 0.73 against
# 0.48 on level shifts, mostly from its precision on phase changes, where the PELT detector above opens many short
# segments. The gate's history segmentation (noise.py) keeps the detector above, whose defaults its calibration used.
DASHBOARD_DETECTOR = "otava"
OTAVA_WINDOW = 50  # Otava's defaults (otava.analysis.compute_change_points)
OTAVA_MAX_PVALUE = 0.001


def find_change_points_otava(
    points: Sequence[tuple[Hashable, float | Sequence[float]]],
    *,
    window: int = OTAVA_WINDOW,
    max_pvalue: float = OTAVA_MAX_PVALUE,
    min_change: float = 0.0,
) -> list[ChangePoint]:
    """Change points of a timing history, oldest first, found by Apache Otava (E-divisive means with a Student-t
    significance test, Hunter's split and merge; the apache-otava package), as :class:`ChangePoint` objects with the
    segments' medians either side and Otava's p-value. Same arguments as :func:`find_change_points`."""
    from otava.analysis import compute_change_points

    xs, vals = point_values(points)
    if vals.size < 2 * DEFAULT_MIN_SIZE:
        return []
    # A plain list: otava slices the series interval by interval and raises on a numpy array of a noise-free step.
    found, _ = compute_change_points(vals.tolist(), window_len=window, max_pvalue=max_pvalue)
    bounds = [0, *sorted(int(cp.index) for cp in found), vals.size]
    pvalues = [float(cp.stats.pvalue) for cp in sorted(found, key=lambda cp: int(cp.index))]
    return _change_points(xs, vals, bounds, pvalues, min_change)


def dashboard_change_points(points: Sequence[tuple[Hashable, float | Sequence[float]]]) -> list[ChangePoint]:
    """The change points the dashboard shows: :data:`DASHBOARD_DETECTOR`'s (Otava's when apache-otava is installed,
    else :func:`find_change_points`)."""
    if DASHBOARD_DETECTOR == "otava":
        try:
            import otava.analysis  # noqa: F401
        except ImportError:
            return find_change_points(points)
        return find_change_points_otava(points)
    return find_change_points(points)
