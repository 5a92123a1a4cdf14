"""The GPU hardware-state record (NVML): on a machine without NVML it says "not available" and keeps every sample;
windows under a power or thermal throttle, or below the run's clock norm, are excluded and counted."""

from __future__ import annotations

import time

import pytest

from deltabench.cli.app import main
from deltabench.runners.hwstate import (
    NvmlMonitor,
    WindowState,
    filter_samples,
    hardware_records,
    judge_windows,
    lock_clocks,
    sample_in_windows,
)

_OK = WindowState(sm_clock_mhz=1980.0, mem_clock_mhz=3201.0, power_w=520.0, temperature_c=61.0, reasons=0)


def test_without_nvml_the_record_says_not_available_and_keeps_every_sample() -> None:
    monitor = NvmlMonitor.open(0)
    if monitor.available:  # a GPU host: the live record is checked on the device
        return
    assert monitor.sample() is None and monitor.reason.startswith("not available")
    assert lock_clocks(monitor, 1980).startswith("not available")
    kept, record = filter_samples([[1.0, 1.1], [1.2]], None, reason=monitor.reason)
    assert kept == [1.0, 1.1, 1.2] and not record.available and record.reason.startswith("not available")


def test_throttled_and_slow_clock_windows_are_excluded_and_counted() -> None:
    power_capped = WindowState(1980.0, 3201.0, 700.0, 62.0, reasons=0x4)
    hot = WindowState(1975.0, 3201.0, 690.0, 88.0, reasons=0x40 | 0x1)  # thermal, and GPU idle (not a throttle)
    slow_clock = WindowState(1755.0, 3201.0, 500.0, 60.0, reasons=0)
    states = [_OK, _OK, power_capped, _OK, hot, slow_clock, _OK]
    keep, record = judge_windows(states)
    assert keep == [True, True, False, True, False, False, True]
    assert record.throttle_windows == {"sw_power_cap": 1, "hw_thermal_slowdown": 1}
    assert record.low_clock_windows == 1 and record.clock_norm_mhz == 1980.0 and record.excluded_windows == 3
    assert record.sm_clock_mhz == (1755.0, 1980.0, 1980.0) and record.temperature_c[2] == 88.0
    windows = [[1.0, 1.0], [1.01], [1.3, 1.3], [1.0], [1.2], [1.15], [1.02]]
    kept, rec = filter_samples(windows, states)
    assert kept == [1.0, 1.0, 1.01, 1.0, 1.02] and rec.excluded_samples == 4 and rec.available


def test_a_run_throttled_throughout_keeps_its_samples_and_says_so() -> None:
    hot = WindowState(1600.0, 3201.0, 700.0, 90.0, reasons=0x20)
    kept, rec = filter_samples([[2.0], [2.1]], [hot, hot])
    assert kept == [2.0, 2.1] and rec.excluded_windows == 2 and "all samples kept" in rec.reason


def _busy_measure(n: int) -> list[float]:
    """`n` host-clock samples of a little arithmetic: a real measure, as the CPU timer's."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        sum(i * i for i in range(2000))
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def test_each_sample_batch_is_a_window_and_throttled_batches_leave_the_level() -> None:
    """adaptive_samples over a real measure, the GPU state read after each batch from a replayed sequence (an
    H200's clocks with a power cap in the third batch and a clock step in the fifth): the warm-up's read is not a
    window, the capped and slow batches' samples are left out of the samples, and the records say so."""
    capped = WindowState(1980.0, 3201.0, 700.0, 63.0, reasons=0x4)
    stepped = WindowState(1700.0, 3201.0, 450.0, 60.0, reasons=0)
    batch_states = [_OK, _OK, capped, _OK, stepped]
    calls: list[int] = []

    def measure(n: int) -> list[float]:
        calls.append(n)
        return _busy_measure(n)

    def state() -> WindowState:
        batch = len(calls) - 2  # warmup_s=0: exactly one warm-up call, measure(1), before the batches
        return capped if batch < 0 else batch_states[batch] if batch < len(batch_states) else _OK

    got, record = sample_in_windows(
        measure, state, budget_s=60.0, min_reps=12, max_reps=12, warmup_s=0.0, target_sem=1e-12, batch_s=1e-9
    )
    assert got.warmup == 1 and calls[0] == 1 and calls[1:] == [1] * 12  # batches of one sample: 12 windows
    assert record.available and record.windows == 12
    assert record.throttle_windows == {"sw_power_cap": 1} and record.low_clock_windows == 1
    assert record.excluded_windows == 2 and record.excluded_samples == 2 and len(got.samples_ms) == 10
    clocks, throttle = hardware_records(record)
    assert clocks.check == "hardware:clocks" and clocks.value == 1980.0 and not clocks.gating
    assert "SM 1700-1980 MHz (median 1980)" in clocks.detail and "over 12 sample windows" in clocks.detail
    assert throttle.check == "hardware:throttle" and not throttle.gating and not throttle.passed
    assert throttle.detail.startswith("2 of 12 windows excluded (sw_power_cap 1, SM clock below 97% of 1980 MHz 1)")
    _, quiet = sample_in_windows(_busy_measure, lambda: _OK, budget_s=60.0, min_reps=5, max_reps=5, warmup_s=0.0)
    assert hardware_records(quiet)[1].passed and quiet.excluded_windows == 0


def test_without_a_state_source_every_sample_is_kept_and_the_record_says_why() -> None:
    got, record = sample_in_windows(
        _busy_measure,
        None,
        reason="not available: nvidia-ml-py is not installed",
        budget_s=0.01,
        min_reps=20,
        max_reps=20,
        warmup_s=0.01,
    )
    assert len(got.samples_ms) == 20 and not record.available
    (only,) = hardware_records(record)
    assert only.check == "hardware:clocks" and only.value is None and only.passed and not only.gating
    assert only.detail == "not available: nvidia-ml-py is not installed"


def test_lock_clocks_without_nvml_says_why_and_the_note_lasts_only_for_the_run() -> None:
    from deltabench.runners.hwstate import clock_lock_note, locked_clocks

    if NvmlMonitor.open(0).available:  # a GPU host: locking is never tried from the tests
        return
    with locked_clocks(1980) as note:
        assert note.startswith("not locked: not available") and clock_lock_note() == note
    assert clock_lock_note() == ""


def test_lock_clocks_is_for_a_cuda_run_with_a_clock_in_mhz(capsys: pytest.CaptureFixture[str]) -> None:
    for value in ("1980", "5"):
        with pytest.raises(SystemExit) as stop:
            main(["run", "--suite", "smoke", "--device", "cpu", "--lock-clocks", value, "--no-db", "-q"])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"--lock-clocks {value}: give an SM clock in MHz (100 to 5000) for a run on cuda")
        assert len(err.splitlines()) == 1
