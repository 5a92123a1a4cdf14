"""Score deltabench's change-point detector (``regression.changepoints``) and Apache Otava's (``otava.analysis``,
E-divisive with a t-test, Hunter's split and merge) on otava-test-data's labelled series: precision, recall and F1.

The series are otava-test-data's ``CombinationGenerator(seed=42).generate_with_noise_variants()``: each building
block (constant, noise, outlier, step, regression and fix, banding, variance change, phase change, multiple changes)
at lengths 50 and 500, without noise and with normal noise of sigma 2, 5 and 10 around a level of 100. A detection
counts as a true positive when it lies within ``TOLERANCE`` points of a labelled change point not yet matched;
labels are matched at most once. Two totals: every label, and the level shifts only (``step``,
``regression_start``, ``regression_end``, ``phase``): outliers and variance changes are labelled change points in
otava-test-data, but a regression gate wants neither to open a new segment (a lone slow run is not a regression).

Usage::

    python benchmarks/changepoints_f1.py --markdown docs/reference/changepoints.md

Needs apache-otava (the ``stats`` extra) and otava-test-data (the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

TOLERANCE = 5  # points either side of a label that still find it
LEVEL_SHIFTS = frozenset({"step", "regression_start", "regression_end", "phase"})
OTAVA_WINDOW = 50  # Otava's default window and p-value (``otava.analysis.compute_change_points``)
OTAVA_MAX_PVALUE = 0.001


@dataclasses.dataclass
class Score:
    """True positives, false positives and false negatives, and the derived figures."""

    tp: int = 0
    fp: int = 0
    fn: int = 0

    def add(self, other: Score) -> None:
        """Add `other`'s counts to this score."""
        self.tp, self.fp, self.fn = self.tp + other.tp, self.fp + other.fp, self.fn + other.fn

    @property
    def precision(self) -> float:
        """TP / (TP + FP); 1 when nothing was detected."""
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        """TP / (TP + FN); 1 when there was nothing to find."""
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    @property
    def f1(self) -> float:
        """The harmonic mean of precision and recall."""
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


def match(found: Sequence[int], labels: Sequence[int], tolerance: int = TOLERANCE) -> Score:
    """Greedy matching of detections to labels, nearest first, each label at most once."""
    free = sorted(labels)
    tp = 0
    for idx in sorted(found):
        near = [lab for lab in free if abs(lab - idx) <= tolerance]
        if near:
            free.remove(min(near, key=lambda lab: abs(lab - idx)))
            tp += 1
    return Score(tp=tp, fp=len(found) - tp, fn=len(free))


def ours(data: np.ndarray) -> list[int]:
    """deltabench's detector on the series (values shifted positive: it works on log timings)."""
    from deltabench.regression.changepoints import find_change_points

    shift = max(0.0, 1.0 - float(np.min(data)))  # timings are positive; the generators' levels are ~100
    return [cp.index for cp in find_change_points(list(enumerate((data + shift).tolist())))]


def otava(data: np.ndarray) -> list[int]:
    """Apache Otava's detector with its defaults; a series it raises on (e.g. a noise-free step at a window's edge)
    counts as no detections."""
    from otava.analysis import compute_change_points

    try:
        # a list, not an array: otava slices the series by interval and raises on an array of a noise-free step
        cps, _ = compute_change_points(data.tolist(), window_len=OTAVA_WINDOW, max_pvalue=OTAVA_MAX_PVALUE)
    except ValueError:
        return []
    return [int(cp.index) for cp in cps]


DETECTORS: dict[str, Callable[[np.ndarray], list[int]]] = {"deltabench": ours, "otava": otava}


def evaluate(tolerance: int = TOLERANCE) -> dict[str, dict[str, Score]]:
    """Per detector, per pattern family (and the totals ``all`` and ``level shifts``), the summed score."""
    from otava_test_data.generators.combiner import CombinationGenerator

    series = CombinationGenerator(seed=42).generate_with_noise_variants()
    out: dict[str, dict[str, Score]] = {}
    for name, detect in DETECTORS.items():
        scores: dict[str, Score] = collections.defaultdict(Score)
        started = time.perf_counter()
        for ts in series:
            family = ts.generator_name.split("+")[0]
            found = detect(np.asarray(ts.data, float))
            labels = [cp.index for cp in ts.change_points]
            shifts = [cp.index for cp in ts.change_points if cp.change_type in LEVEL_SHIFTS]
            s = match(found, labels, tolerance)
            scores[family].add(s)
            scores["all"].add(s)
            scores["level shifts"].add(match(found, shifts, tolerance))
        scores["_seconds"] = Score(tp=round(1000 * (time.perf_counter() - started)))
        out[name] = dict(scores)
    return out


def markdown(results: dict[str, dict[str, Score]], tolerance: int = TOLERANCE) -> str:
    """The table: one row per pattern family and total, precision / recall / F1 per detector."""
    names = list(results)
    rows = [k for k in results[names[0]] if k not in ("all", "level shifts", "_seconds")]
    head = "| series | " + " | ".join(f"{n} P | {n} R | {n} F1" for n in names) + " |"
    lines = [
        f"Labelled series of otava-test-data (seed 42, lengths 50 and 500, noise sigma 0, 2, 5, 10); a detection "
        f"within {tolerance} points of a label is a hit. Written by `benchmarks/changepoints_f1.py`.",
        "",
        head,
        "|---|" + "--:|" * (3 * len(names)),
    ]
    for key in [*sorted(rows), "all", "level shifts"]:
        cells = []
        for n in names:
            s = results[n][key]
            cells.append(f"{s.precision:.2f} | {s.recall:.2f} | {s.f1:.2f}")
        label = f"**{key}**" if key in ("all", "level shifts") else key
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Time for all series: " + ", ".join(f"{n} {results[n]['_seconds'].tp} ms" for n in names) + "."]
    return "\n".join(lines) + "\n"


PAGE = """# Change-point detectors scored

The dashboard's history and its regressions list mark where a series' timing stepped. Two detectors were scored on
the labelled series of [otava-test-data](https://pypi.org/project/otava-test-data/) (`benchmarks/changepoints_f1.py`
wrote this page):

- **deltabench**: `regression.changepoints.find_change_points`, PELT (ruptures) on log timings with outlier clipping
  and a Welch t-test merge. The gate's history segmentation uses it (its calibration used its defaults).
- **otava**: Apache Otava's `compute_change_points` (E-divisive means, Student-t significance, Hunter's split and
  merge; window 50, p < 0.001). The dashboard uses it (`regression.changepoints.DASHBOARD_DETECTOR`): it scores the
  higher F1 over all labels and over level shifts.

P is precision, R recall. Outliers and variance changes are labels in otava-test-data, but neither detector opens a
segment for them: a lone slow run is not a regression. So the level-shift total leaves them out. A change point is
*confirmed* once a later run than the one where the step appeared shows the new level too. The regressions list
calls only confirmed slowdowns regressions, and each alert names the benchmark, shape, measure, effect and the runs
the step lies between, once per job and run.

"""


def main(argv: Sequence[str] | None = None) -> int:
    """Score both detectors; print the table, and write it to ``--markdown`` when given."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", type=Path, help="write the table (markdown) here")
    ap.add_argument("--tolerance", type=int, default=TOLERANCE, help="points either side of a label that count")
    args = ap.parse_args(argv)
    table = markdown(evaluate(args.tolerance), args.tolerance)
    print(table)
    if args.markdown is not None:
        args.markdown.write_text(PAGE + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
