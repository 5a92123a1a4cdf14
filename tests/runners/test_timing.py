"""The shared timing statistics: summaries of known samples and the stopping rules."""

from __future__ import annotations

import itertools
import math
import statistics
import time

import pytest

from deltabench.runners import cpu
from deltabench.runners.timing import adaptive_samples, quantile, sem_rel, summarize


def test_summarize_known_samples():
    samples = [4.0, 1.0, 3.0, 2.0, 10.0]
    s = summarize(samples, clock="cpu_monotonic", warmup=2, compile_s=0.5, stop_reason="budget")
    assert s.samples_ms == samples  # raw samples kept, in order
    assert s.median_ms == 3.0
    assert s.q1_ms == 2.0 and s.q3_ms == 4.0 and s.iqr_ms == 2.0  # numpy's linear interpolation
    assert s.mean_ms == 4.0
    assert s.stdev_ms == pytest.approx(statistics.stdev(samples))
    assert s.sem_rel == pytest.approx(1.2533 * statistics.stdev(samples) / math.sqrt(5) / 3.0)
    assert (s.warmup, s.compile_s, s.stop_reason, s.clock) == (2, 0.5, "budget", "cpu_monotonic")


def test_summarize_one_sample_and_none():
    one = summarize([2.5], clock="cuda_events")
    assert one.median_ms == one.q1_ms == one.q3_ms == 2.5 and one.stdev_ms == 0.0
    assert one.sem_rel == 1.0  # unknown: stands in for infinity, which JSON cannot carry
    with pytest.raises(ValueError):
        summarize([], clock="cpu_monotonic")


def test_quantile_and_sem():
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.25) == pytest.approx(1.75)
    assert sem_rel([5.0] * 10) == 0.0


def _scripted(values):
    it = iter(values)
    return lambda n: [next(it) for _ in range(n)]


def test_warmup_ends_when_two_consecutive_timings_agree():
    # cold, cold, then 1.0 and 1.05 agree within 10%: three warm-up calls after the first pair disagree
    measure = _scripted(itertools.chain([9.0, 5.0, 1.0, 1.05], itertools.repeat(1.0)))
    got = adaptive_samples(measure, budget_s=10, min_reps=5, max_reps=50)
    assert got.warmup == 4
    assert got.samples_ms[:5] == [1.0] * 5
    assert got.stop_reason == "sem<0.50%"  # constant samples: the SEM target is met at min_reps
    assert len(got.samples_ms) >= 5


def test_noisy_samples_stop_at_max_reps_or_budget():
    noisy = itertools.cycle([1.0, 3.0])
    got = adaptive_samples(lambda n: [next(noisy) for _ in range(n)], budget_s=10, min_reps=3, max_reps=40)
    assert got.stop_reason == "max_reps" and len(got.samples_ms) == 40

    def slow(n):
        time.sleep(0.01 * n)
        return [next(noisy) for _ in range(n)]

    got = adaptive_samples(slow, budget_s=0.2, min_reps=3, max_reps=10_000, warmup_s=0.01)
    assert got.stop_reason == "budget" and 3 <= len(got.samples_ms) < 1000


def test_cpu_timer_stops_on_the_sem_target():
    stats = cpu.time_callable(lambda: time.sleep(0.002), budget_s=20, target_sem=0.02, min_reps=10)
    assert stats.stop_reason == "sem<2.00%"
    assert stats.sem_rel < 0.02
    assert stats.clock == "cpu_monotonic"
    assert 2.0 <= stats.median_ms < 20
    assert stats.compile_s is not None and stats.warmup >= 1
