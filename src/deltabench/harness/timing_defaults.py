"""The timing settings every timer, suite and job starts from: :data:`TIMING_DEFAULTS`.

They live in the core so that a suite file (harness/suites.py) and the timers (runners/timing.py) read one
definition, and the runners layer sits above the suite format rather than under it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["TIMING_DEFAULTS", "TimingDefaults", "stopping_rules"]


@dataclasses.dataclass(frozen=True)
class TimingDefaults:
    """The timing settings every timer, suite and job starts from (a suite's ``[timing]`` table overrides them).

    Attributes:
        budget_s: time budget for the repetitions.
        target_sem: stop once SE(median)/median is below this.
        min_reps, max_reps: the fewest and most repetitions.
        warmup_s: cap on warm-up time after the first call.
        l2_flush: CUDA: flush L2 before each sample.
        cuda_graph: CUDA: time graph replays of several calls.
        graph_calls: CUDA graphs: calls captured per replay.
    """

    budget_s: float = 2.0
    target_sem: float = 0.005
    min_reps: int = 5
    max_reps: int = 5_000
    warmup_s: float = 1.0
    l2_flush: bool = True
    cuda_graph: bool = False
    graph_calls: int = 10

    def rules(self) -> dict[str, Any]:
        """The settings :func:`adaptive_samples` reads, as keyword arguments of every timer."""
        return stopping_rules(self)


_RULES = ("budget_s", "target_sem", "min_reps", "max_reps", "warmup_s")


def stopping_rules(settings: Any) -> dict[str, Any]:
    """The stopping rules of `settings` (:class:`TimingDefaults` or a suite's ``TimingSettings``) as the timers'
    keyword arguments: ``budget_s``, ``target_sem``, ``min_reps``, ``max_reps``, ``warmup_s``."""
    return {k: getattr(settings, k) for k in _RULES}


TIMING_DEFAULTS = TimingDefaults()
