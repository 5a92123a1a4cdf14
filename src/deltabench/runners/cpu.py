"""CPU timer: a monotonic nanosecond clock around each call, with deltabench's shared statistics.

Timings from this clock are labelled ``cpu_monotonic`` (shown as "CPU") wherever they appear: they
measure the host, never a device. The job runner reaches it through :data:`deltabench.runners.timing.TIMERS`
(:func:`time_job`), for a torch-facing impl on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deltabench.harness.document import TimingStats

from .timing import TIMING_DEFAULTS, Timed, TimerRequest, time_on_host_clock

__all__ = ["CLOCK", "time_callable", "time_job"]

CLOCK = "cpu_monotonic"


def time_callable(
    fn: Callable[[], Any],
    *,
    budget_s: float = TIMING_DEFAULTS.budget_s,
    target_sem: float = TIMING_DEFAULTS.target_sem,
    min_reps: int = TIMING_DEFAULTS.min_reps,
    max_reps: int = TIMING_DEFAULTS.max_reps,
    warmup_s: float = TIMING_DEFAULTS.warmup_s,
    first_call_s: float | None = None,
    guard: Any = None,
) -> TimingStats:
    """Time the zero-argument closure `fn` on the host clock.

    The first call is timed apart (``compile_s``); then warm-up and repetitions follow the rules of
    :func:`deltabench.runners.timing.adaptive_samples`. Inputs must be built outside `fn`. A caller
    that already made and timed the first call (the job runner does, before the correctness gate)
    passes its duration as `first_call_s`; a `guard` (``runners.integrity.TimedCallGuard``) sees every timed
    call (``timing.time_on_host_clock``).

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
        guard=guard,
    )


def time_job(request: TimerRequest) -> Timed:
    """The table's host-clock timer: `request`'s subject on the host clock, with the job's settings."""
    timing = time_callable(request.subject, **request.rules, first_call_s=request.first_call_s, guard=request.guard)
    return Timed(timing, guarded=request.guard is not None)
