"""Sequential repetitions (``deltabench run --repeat auto --base-ref REF``): add interleaved repetitions only to the
jobs whose verdict is still unknown, until each is same or different or the repetitions reach ``--max-repeat``.

**Looks.** The run looks at the evidence after :func:`look_schedule`'s numbers of repetitions: first the fewest
whose permutation test can reject at its look's level (below), at least 5 (``noise.MIN_REPETITIONS``), then
doubling, capped at the maximum (6, 12, 20 for one job and the default ``--max-repeat`` of 20; 9, 18, 20 for 24
jobs). After each look a job that is same or different stops; an unknown one gets the next look's repetitions.

**Stopping rule (alpha spending).** A look that may stop the job on a difference is a chance for unchanged code to
be flagged, so looking k times at level alpha would fail unchanged code with probability up to k * alpha. Each of
the L looks of the schedule is therefore made at level alpha / L (Bonferroni alpha spending: the looks' levels sum
to alpha), so the probability that unchanged code is ever called different, at any look, stays <= alpha per job,
and <= alpha per comparison with the jobs' own split of alpha (``noise``, "repetitions"). Both documents record
the schedule (``meta.sequential``), and ``deltabench gate`` grades them at the same alpha / L: the verdict the run
stopped on is the verdict the gate gives. The first look is placed where that level can be reached: n + n
repetitions split C(2n, n) ways, and the test at alpha / (L m) over m jobs rejects only when at least two splits lie
beyond its bound, so the first look needs C(2n, n) >= 2 L m / alpha (n = 6 for one job at L = 3: 924 splits; at 5
its 252 splits could call a job same but never different).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from deltabench.harness.series import JobKey

from .noise import MIN_REPETITIONS
from .result import UNKNOWN, Comparison
from .rule import DEFAULT_ALPHA, GradingRule

__all__ = ["SEQUENTIAL_META", "look_schedule", "looks_of", "sequential_rule", "still_unknown"]

# The key both documents of a sequential run carry in ``meta``: {"schedule": [5, 10, 20], "looks": 3}.
SEQUENTIAL_META = "sequential"


def _doubling(first: int, max_repeat: int) -> list[int]:
    out = [min(first, max_repeat)]
    while out[-1] < max_repeat:
        out.append(min(2 * out[-1], max_repeat))
    return out


def look_schedule(max_repeat: int, jobs: int = 1, alpha: float = DEFAULT_ALPHA) -> list[int]:
    """The repetition counts after which the evidence is looked at (module docstring): the fewest n >= 5 with
    C(2n, n) >= 2 L `jobs` / `alpha` for the schedule's L looks, then doubling, capped at `max_repeat` (at least 5).
    """
    if max_repeat < MIN_REPETITIONS:
        raise ValueError(f"max_repeat must be at least {MIN_REPETITIONS}, got {max_repeat}")
    first = MIN_REPETITIONS
    while first < max_repeat and math.comb(2 * first, first) < 2 * len(_doubling(first, max_repeat)) * jobs / alpha:
        first += 1
    return _doubling(first, max_repeat)


def looks_of(meta: Mapping[str, Any] | None) -> int:
    """The number of looks a document's sequential run was planned with (1 for a run of fixed repetitions)."""
    seq = (meta or {}).get(SEQUENTIAL_META)
    if isinstance(seq, Mapping):
        looks = seq.get("looks")
        if isinstance(looks, int) and looks >= 1:
            return looks
    return 1


def sequential_rule(rule: GradingRule, looks: int) -> GradingRule:
    """`rule` at the level each of `looks` looks spends: alpha / looks (module docstring)."""
    return rule if looks <= 1 else dataclasses.replace(rule, alpha=rule.alpha / looks)


def still_unknown(cmp: Comparison) -> set[JobKey]:
    """The keys of the jobs whose verdict is unknown: those the next look repeats."""
    return {r.key for r in cmp.rows if r.verdict == UNKNOWN}
