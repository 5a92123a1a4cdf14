"""The GPU hardware-state record (NVML): on a machine without NVML it says "not available" and keeps every sample;
windows under a power or thermal throttle, or below the run's clock norm, are excluded and counted."""

from __future__ import annotations

from deltabench.runners.hwstate import NvmlMonitor, WindowState, filter_samples, judge_windows, lock_clocks

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
