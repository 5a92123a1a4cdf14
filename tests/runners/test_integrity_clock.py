"""``integrity:clock``: what a module can replace after deltabench's runner was imported, and the record naming it.
The replacements are planted here (and undone by monkeypatch), as a user module would make them at its import."""

from __future__ import annotations

import statistics
import time

import pytest

import deltabench.runners.job  # resolves the job runner's functions, as a worker does first)
from deltabench.correctness import checks
from deltabench.runners import integrity, timing


def test_nothing_replaced_passes() -> None:
    record = integrity.clock_record()
    assert record.passed and record.check == "integrity:clock"
    assert {"time.perf_counter_ns", "deltabench.runners.job.execute"} <= set(integrity.guarded_functions())


@pytest.mark.parametrize(
    ("owner", "name", "dotted"),
    [
        (time, "perf_counter_ns", "time.perf_counter_ns"),
        (statistics, "median", "statistics.median"),
        (timing, "summarize", "deltabench.runners.timing.summarize"),
        (checks, "rel_fro", "deltabench.correctness.checks.rel_fro"),
        (deltabench.runners.job, "_time", "deltabench.runners.job._time"),
        (integrity.TimedCallGuard, "records", "deltabench.runners.integrity.TimedCallGuard.records"),
    ],
)
def test_a_replaced_function_is_named(owner, name: str, dotted: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(owner, name, lambda *a, **k: 0)
    record = integrity.clock_record()
    assert not record.passed and record.gating
    assert dotted in record.detail


def test_a_swapped_timer_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(timing.TIMERS, ("torch", "cpu"), timing.CUDA_EVENTS)
    assert "deltabench.runners.timing.TIMERS" in integrity.clock_record().detail


def test_the_timer_reads_the_clock_resolved_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock slowed tenfold after import leaves the host timer's samples as they are."""
    real = time.perf_counter_ns

    def busy() -> None:
        end = real() + 2_000_000
        while real() < end:
            pass

    monkeypatch.setattr(time, "perf_counter_ns", lambda: real() // 10)
    monkeypatch.setattr(time, "perf_counter", lambda: real() / 1e10)
    stats = timing.time_on_host_clock(
        busy, clock="cpu_monotonic", budget_s=0.05, target_sem=0.5, min_reps=3, max_reps=5, warmup_s=0.0,
        first_call_s=None,
    )  # fmt: skip
    assert stats.median_ms >= 1.9
