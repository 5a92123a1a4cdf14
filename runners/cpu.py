"""CPU timer: a monotonic nanosecond clock around each call, with deltabench's shared statistics.

Timings from this clock are labelled ``cpu_monotonic`` (shown as "CPU") wherever they appear: they
measure the host, never a device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deltabench.harness.document import TimingStats

from .timing import time_on_host_clock

__all__ = ["CLOCK", "time_callable"]

CLOCK = "cpu_monotonic"


def time_callable(
    fn: Callable[[], Any],
    *,
    budget_s: float = 1.0,
    target_sem: float = 0.005,
    min_reps: int = 5,
    max_reps: int = 10_000,
    warmup_s: float = 0.5,
    first_call_s: float | None = None,
) -> TimingStats:
    """Time the zero-argument closure `fn` on the host clock.

    The first call is timed apart (``compile_s``); then warm-up and repetitions follow the rules of
    :func:`deltabench.runners.timing.adaptive_samples`. Inputs must be built outside `fn`. A caller
    that already made and timed the first call (the job runner does, before the correctness gate)
    passes its duration as `first_call_s`.

    Example::

        stats = time_callable(lambda: impl(q, k, v, g, beta), budget_s=0.5)
        stats.median_ms, stats.stop_reason
    """
    return time_on_host_clock(
        fn,
        clock=CLOCK,
        budget_s=budget_s,
        target_sem=target_sem,
        min_reps=min_reps,
        max_reps=max_reps,
        warmup_s=warmup_s,
        first_call_s=first_call_s,
    )
