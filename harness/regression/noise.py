"""How far a job's timing moves between runs of unchanged code: the run-to-run noise model the gate decides with.

Most of the variance between two runs of the same code is between processes and machine states (clock frequency,
cache and memory placement, neighbours on a shared machine), which the samples inside one run never see: two smoke
runs of one commit on a two-core machine differ by up to +90% on some jobs while each run's own samples are tight.
So the gate compares a head's run median with the spread of *run medians*, not only with the base run's samples.

Where that spread comes from, best first:

- **history**: the medians of the series' past runs on the same machine class and major software (conbench's
  lookback distribution). The newest :data:`HISTORY_WINDOW` runs up to the base, cut at the series' last change
  point (a real step is not noise). With ``k >= MIN_HISTORY_RUNS`` run medians ``y_i = log(median_i)`` of mean
  ``c`` and standard deviation ``s``, a head run of unchanged code falls above the one-sided prediction bound
  ``c + t(1 - alpha; k - 1) * s * sqrt(1 + 1/k)`` with probability alpha (Student-t prediction interval, as
  Bencher's ``t_test`` threshold; exact for normal run effects).
- **default**: no usable history (one base run). The spread is then unknown; a change counts only beyond
  ``z(1 - alpha) * sqrt(2) * sigma_default`` (head and base each carry one run effect), with ``sigma_default`` the
  run-to-run spread measured for the machine class (:data:`DEFAULT_SPREADS`, from ``benchmarks/
  regression_detection.py --calibrate``). Smaller changes are reported "within noise: run-to-run spread unknown".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "DEFAULT_SPREADS",
    "HISTORY_WINDOW",
    "MIN_HISTORY_RUNS",
    "RunSpread",
    "default_spread",
    "spread_from_history",
]

# Fewest run medians that give a spread (df = 2): fewer leave the t quantile unbounded in practice.
MIN_HISTORY_RUNS = 3
# Newest runs of a series the spread is estimated from: long enough for a stable estimate, short enough that a
# machine's slow drift (a driver update inside one major version) does not widen it.
HISTORY_WINDOW = 30
# A history of identical medians (a coarse clock, a cached result) would give s = 0 and make any difference
# "beyond noise"; a tenth of a percent is below what any run-to-run measurement here showed.
MIN_SPREAD = 0.001

# Run-to-run spread (standard deviation of log run medians) assumed when a job has no history, by machine class.
# Measured, not guessed (benchmarks/NOTES.md, "Regression gate calibration"):
# - cpu: 5 same-code `deltabench run --suite smoke` runs on the two-core CI machine under light concurrent load;
#   the 90th percentile over the 40 timed jobs of each job's spread of log medians.
# - accelerators: 5 back-to-back processes of one job on an H200 (benchmarks/h200/measurement_quality.md) spread
#   0.2-0.5% max-min; 1% keeps a margin for autotuning and clock state until the H200 calibration
#   (benchmarks/gpu/gate_calibration.sh) replaces it with a measured figure.
DEFAULT_SPREADS: dict[str, float] = {"cpu": 0.06, "accelerator": 0.01}


@dataclasses.dataclass(frozen=True)
class RunSpread:
    """The run-to-run spread of one job's median: ``sigma`` on the log scale, where it came from, and the centre
    the head is compared with when it came from history."""

    sigma: float
    source: str  # "history" or "default"
    runs: int = 0  # run medians it was estimated from (0 for a default)
    center_ms: float | None = None  # geometric mean of those run medians; None: the base run is the reference

    def bound(self, alpha: float) -> float:
        """The log-ratio a head of unchanged code exceeds with probability `alpha` (one-sided), against
        :attr:`center_ms` (history) or against the base run (default)."""
        from scipy.stats import norm, t

        if self.source == "history":
            return float(t.isf(alpha, self.runs - 1)) * self.sigma * math.sqrt(1.0 + 1.0 / self.runs)
        return float(norm.isf(alpha)) * math.sqrt(2.0) * self.sigma

    def describe(self) -> str:
        """Where the spread came from, for a verdict's reason: ``"spread 2.1% over 6 past runs"``."""
        if self.source == "history":
            return f"spread {self.sigma:.1%} over {self.runs} past runs"
        return f"run-to-run spread unknown: default {self.sigma:.1%}"


def default_spread(machine_kind: str | None) -> RunSpread:
    """The measured default spread of a machine class (CPU machines vs accelerators) for jobs without history."""
    key = "cpu" if (machine_kind or "cpu").lower().startswith("cpu") else "accelerator"
    return RunSpread(sigma=DEFAULT_SPREADS[key], source="default")


def _current_segment(medians: np.ndarray) -> np.ndarray:
    """The medians after the series' last change point: a real step in the history is a change, not noise."""
    if medians.size < 2 * MIN_HISTORY_RUNS:
        return medians
    from ..changepoints import find_change_points

    found = find_change_points(list(enumerate(medians.tolist())))
    return medians[found[-1].index :] if found else medians


def spread_from_history(medians_ms: Sequence[float]) -> RunSpread | None:
    """The spread of a series' run medians (oldest first, the base run's included), or None with fewer than
    :data:`MIN_HISTORY_RUNS` usable ones (then :func:`default_spread` applies)."""
    m = np.asarray([v for v in medians_ms if v is not None and math.isfinite(v) and v > 0], float)
    m = _current_segment(m[-HISTORY_WINDOW:])
    if m.size < MIN_HISTORY_RUNS:
        return None
    y = np.log(m)
    sigma = max(float(np.std(y, ddof=1)), MIN_SPREAD)
    return RunSpread(sigma=sigma, source="history", runs=int(m.size), center_ms=float(np.exp(y.mean())))
