"""The GPU's hardware state while a job is timed: SM and memory clocks, power, temperature and clock-event
(throttle) reasons per sample window, read through NVML (the nvidia-ml-py package, ``pynvml``).

Why: a run taken while the GPU was power- or thermally-throttled, or at a clock below its usual one, reads as a
regression of the code. So each sample window's state is recorded with the timing, and the samples of a window
taken under a power or thermal throttle, or at an SM clock below :data:`CLOCK_TOLERANCE` times the run's norm (the
median SM clock of its windows), are excluded from the level and counted in the record (:func:`judge_windows`).

NVML is imported lazily: on a machine without it (a CPU host, no driver) :meth:`NvmlMonitor.open` gives a monitor
whose record says "not available" and why, and every sample is kept. Locking the clocks (:func:`lock_clocks`) needs
root or the driver's permission; when it is refused the reason is returned for the environment record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from deltabench.harness.document import HARDWARE_CHECKS, CheckRecord

from .timing import Collected, adaptive_samples

__all__ = [
    "CLOCK_TOLERANCE",
    "THROTTLE_REASONS",
    "HardwareRecord",
    "NvmlMonitor",
    "WindowState",
    "clock_lock_note",
    "filter_samples",
    "hardware_records",
    "judge_windows",
    "lock_clocks",
    "locked_clocks",
    "sample_in_windows",
]


CLOCKS_CHECK, THROTTLE_CHECK = HARDWARE_CHECKS

# A window whose SM clock is below this fraction of the run's median SM clock is not at the run's norm: boost
# clocks on an H200 move by a few tens of MHz around ~1980 MHz under load (about 1-2%), so 3% leaves that alone
# and catches a clock step.
CLOCK_TOLERANCE = 0.97

# NVML clock-event reason bits that mean the clock was held down by power or heat (nvmlClocksEventReason*), by name.
THROTTLE_REASONS: dict[str, int] = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}


@dataclasses.dataclass(frozen=True)
class WindowState:
    """The GPU's state over one sample window (read at its end)."""

    sm_clock_mhz: float
    mem_clock_mhz: float
    power_w: float
    temperature_c: float
    reasons: int  # NVML clock-event reason bits

    def throttles(self) -> list[str]:
        """The power and thermal throttle reasons active in this window, by name."""
        return [name for name, bit in THROTTLE_REASONS.items() if self.reasons & bit]


class HardwareRecord(BaseModel):
    """A timed job's hardware state: per-measure (min, median, max) over its windows, and which windows' samples were
    excluded and why. ``available`` False: no NVML here (``reason`` says why); every sample was kept."""

    model_config = ConfigDict(frozen=True)

    available: bool
    reason: str = ""
    windows: int = 0
    excluded_windows: int = 0
    excluded_samples: int = 0
    sm_clock_mhz: tuple[float, float, float] | None = None
    mem_clock_mhz: tuple[float, float, float] | None = None
    power_w: tuple[float, float, float] | None = None
    temperature_c: tuple[float, float, float] | None = None
    throttle_windows: dict[str, int] = {}  # windows with each throttle reason active
    low_clock_windows: int = 0  # windows below CLOCK_TOLERANCE x the run's median SM clock
    clock_norm_mhz: float | None = None


def _spread(values: Sequence[float]) -> tuple[float, float, float]:
    return (float(min(values)), float(statistics.median(values)), float(max(values)))


def judge_windows(
    states: Sequence[WindowState], tolerance: float = CLOCK_TOLERANCE
) -> tuple[list[bool], HardwareRecord]:
    """Which windows' samples to keep (not throttled, SM clock at least `tolerance` x the median of the windows'),
    and the record of all of them."""
    if not states:
        return [], HardwareRecord(available=True, reason="no sample window recorded")
    norm = statistics.median(s.sm_clock_mhz for s in states)
    throttled: dict[str, int] = {}
    keep = []
    low = 0
    for s in states:
        names = s.throttles()
        for name in names:
            throttled[name] = throttled.get(name, 0) + 1
        slow = s.sm_clock_mhz < tolerance * norm
        low += slow
        keep.append(not names and not slow)
    record = HardwareRecord(
        available=True,
        windows=len(states),
        excluded_windows=keep.count(False),
        sm_clock_mhz=_spread([s.sm_clock_mhz for s in states]),
        mem_clock_mhz=_spread([s.mem_clock_mhz for s in states]),
        power_w=_spread([s.power_w for s in states]),
        temperature_c=_spread([s.temperature_c for s in states]),
        throttle_windows=throttled,
        low_clock_windows=low,
        clock_norm_mhz=float(norm),
    )
    return keep, record


def filter_samples(
    windows: Sequence[Sequence[float]], states: Sequence[WindowState] | None, *, reason: str = ""
) -> tuple[list[float], HardwareRecord]:
    """The samples of the windows to keep (:func:`judge_windows`), flattened, and the record with the excluded
    count. `states` None: no NVML (`reason` says why), every sample kept. If every window would be excluded, all are
    kept and the record says so: a run throttled throughout still has a timing, flagged."""
    flat = [float(x) for w in windows for x in w]
    if states is None:
        return flat, HardwareRecord(available=False, reason=reason or "not available")
    if len(states) != len(windows):
        raise ValueError(f"{len(states)} window states for {len(windows)} sample windows")
    keep, record = judge_windows(states)
    kept = [float(x) for w, k in zip(windows, keep, strict=True) if k for x in w]
    if not kept:
        note = "every window throttled or below the clock norm: all samples kept"
        return flat, record.model_copy(update={"reason": note})
    return kept, record.model_copy(update={"excluded_samples": len(flat) - len(kept)})


class NvmlMonitor:
    """Reads one GPU's state through NVML; :meth:`open` never raises: without NVML the monitor is unavailable and
    :attr:`reason` says why."""

    def __init__(self, nvml: Any, handle: Any, reason: str = "") -> None:
        self._nvml = nvml
        self._handle = handle
        self.reason = reason

    @property
    def available(self) -> bool:
        """True when NVML answered for the device."""
        return self._handle is not None

    @classmethod
    def _open(cls, find: str, key: int | str) -> NvmlMonitor:
        """A monitor of the GPU NVML's `find` function (a ``nvmlDeviceGetHandleBy*`` name) gives for `key`, or an
        unavailable one saying why."""
        try:
            import pynvml
        except ImportError:
            return cls(None, None, "not available: nvidia-ml-py is not installed")
        try:
            pynvml.nvmlInit()
            handle = getattr(pynvml, find)(key)
        except pynvml.NVMLError as exc:
            return cls(None, None, f"not available: {exc}")
        return cls(pynvml, handle)

    @classmethod
    def open(cls, index: int = 0) -> NvmlMonitor:
        """A monitor of GPU `index` (NVML's order), or an unavailable one saying why."""
        return cls._open("nvmlDeviceGetHandleByIndex", index)

    @classmethod
    def open_pci(cls, bus_id: str) -> NvmlMonitor:
        """A monitor of the GPU at PCI `bus_id` (``"0000:65:00.0"``; what CUDA calls device i under any
        ``CUDA_VISIBLE_DEVICES``), or an unavailable one saying why."""
        return cls._open("nvmlDeviceGetHandleByPciBusId", bus_id)

    def sample(self) -> WindowState | None:
        """The device's state now (call at the end of each sample window); None when unavailable or NVML fails."""
        if self._handle is None:
            return None
        n, h = self._nvml, self._handle
        try:
            reasons_fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
                n.nvmlDeviceGetCurrentClocksThrottleReasons
            )
            return WindowState(
                sm_clock_mhz=float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                mem_clock_mhz=float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
                power_w=n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                temperature_c=float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
                reasons=int(reasons_fn(h)),
            )
        except n.NVMLError:
            return None


def lock_clocks(monitor: NvmlMonitor, sm_mhz: int) -> str:
    """Lock the SM clock at `sm_mhz` (``--lock-clocks``); "" when done, else why not (no NVML, no permission), for
    the environment record."""
    if not monitor.available:
        return monitor.reason
    n = monitor._nvml
    try:
        n.nvmlDeviceSetGpuLockedClocks(monitor._handle, sm_mhz, sm_mhz)
    except n.NVMLError as exc:
        return f"clocks not locked: {exc}"
    return ""


def sample_in_windows(
    measure: Callable[[int], list[float]],
    state: Callable[[], WindowState | None] | None,
    *,
    reason: str = "",
    **rules: Any,
) -> tuple[Collected, HardwareRecord]:
    """:func:`~deltabench.runners.timing.adaptive_samples` over `measure` with `rules`, reading `state` (the GPU's
    state now, e.g. :meth:`NvmlMonitor.sample`) after each batch of samples: a batch is a sample window. The
    collected samples are those :func:`filter_samples` keeps; the record says what was excluded. `state` None, or a
    window it could not read: no hardware state (`reason` says why), every sample kept."""
    windows: list[tuple[list[float], WindowState | None]] = []

    def windowed(n: int) -> list[float]:
        got = measure(n)
        windows.append((got, state() if state is not None else None))
        return got

    got = adaptive_samples(windowed, **rules)
    timed = windows[got.warmup :]  # each warm-up step is one measure(1); every later call a sample batch
    if sum(len(w) for w, _ in timed) != len(got.samples_ms):
        raise RuntimeError("sample windows do not add up to the samples collected")
    states = [st for _, st in timed]
    if state is None or any(st is None for st in states):
        return got, HardwareRecord(available=False, reason=reason or "not available: a window's state was not read")
    kept, record = filter_samples([w for w, _ in timed], states)  # type: ignore[arg-type]
    return dataclasses.replace(got, samples_ms=kept), record


def _mhz(spread: tuple[float, float, float] | None) -> str:
    lo, mid, hi = spread or (0.0, 0.0, 0.0)
    return f"{mid:.0f} MHz" if lo == hi else f"{lo:.0f}-{hi:.0f} MHz (median {mid:.0f})"


def hardware_records(record: HardwareRecord) -> list[CheckRecord]:
    """A job's hardware state as verification records (never gating, shown with its other records):
    ``hardware:clocks`` (the median SM clock; clocks, power and temperature over the windows in its detail) and
    ``hardware:throttle`` (the windows excluded from the level; failed when any was)."""
    if not record.available:
        return [
            CheckRecord(
                check=CLOCKS_CHECK,
                metric="sm_mhz",
                value=None,
                threshold=None,
                passed=True,
                gating=False,
                reference="nvml",
                detail=record.reason,
            )
        ]
    power = record.power_w or (0.0, 0.0, 0.0)
    temp = record.temperature_c or (0.0, 0.0, 0.0)
    clocks = (
        f"SM {_mhz(record.sm_clock_mhz)}, memory {_mhz(record.mem_clock_mhz)}, {power[0]:.0f}-{power[2]:.0f} W, "
        f"{temp[0]:.0f}-{temp[2]:.0f} C over {record.windows} sample windows"
    )
    why = [f"{name} {n}" for name, n in sorted(record.throttle_windows.items())]
    if record.low_clock_windows:
        why.append(
            f"SM clock below {CLOCK_TOLERANCE:.0%} of {record.clock_norm_mhz:.0f} MHz {record.low_clock_windows}"
        )
    throttle = (
        f"{record.excluded_windows} of {record.windows} windows excluded ({', '.join(why)}): "
        f"{record.excluded_samples} samples left out of the level"
        if record.excluded_windows
        else f"no window throttled or below {CLOCK_TOLERANCE:.0%} of the run's {record.clock_norm_mhz or 0:.0f} MHz"
    )
    if record.reason:
        throttle += f"; {record.reason}"
    sm = record.sm_clock_mhz[1] if record.sm_clock_mhz else None
    return [
        CheckRecord(
            check=CLOCKS_CHECK,
            metric="sm_mhz",
            value=sm,
            threshold=None,
            passed=True,
            gating=False,
            reference="nvml",
            detail=clocks,
        ),
        CheckRecord(
            check=THROTTLE_CHECK,
            metric="windows",
            value=float(record.excluded_windows),
            threshold=0.0,
            passed=record.excluded_windows == 0,
            gating=False,
            reference="nvml",
            detail=throttle,
        ),
    ]


_lock_note = ""  # what `locked_clocks` did, for the environment of the run it wraps


def clock_lock_note() -> str:
    """While :func:`locked_clocks` is active: "locked at N MHz" or why not; else ""."""
    return _lock_note


def _visible_indices(count: int) -> list[int]:
    """NVML indices of the GPUs CUDA will use: ``CUDA_VISIBLE_DEVICES`` when it lists indices, else all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    return [int(p) for p in parts if p.isdigit() and int(p) < count]


@contextlib.contextmanager
def locked_clocks(sm_mhz: int) -> Iterator[str]:
    """Lock the SM clock of the GPUs the run will use at `sm_mhz` for the block (``deltabench run --lock-clocks``),
    and give them back to the driver after it; yields "locked at N MHz on GPUs ..." or why not (no NVML, no
    permission: locking needs root or the driver's leave), which the run's environment records
    (:func:`clock_lock_note`). Never on a machine others share: a lock outlives a killed run until the driver
    resets it."""
    global _lock_note
    first = NvmlMonitor.open(0)
    locked: list[NvmlMonitor] = []
    if not first.available:
        note = f"not locked: {first.reason}"
    else:
        count = int(first._nvml.nvmlDeviceGetCount())
        monitors = [NvmlMonitor.open(i) for i in _visible_indices(count)]
        refusals = [why for m in monitors if (why := lock_clocks(m, sm_mhz))]
        locked = [m for m in monitors if m.available]
        note = refusals[0] if refusals else f"locked at {sm_mhz} MHz on {len(locked)} GPU(s)"
        if refusals:
            locked = []  # a partial lock would make the GPUs differ: give every one back
            for m in monitors:
                with contextlib.suppress(Exception):
                    m._nvml.nvmlDeviceResetGpuLockedClocks(m._handle)
    _lock_note = note
    try:
        yield note
    finally:
        _lock_note = ""
        for m in locked:
            with contextlib.suppress(Exception):
                m._nvml.nvmlDeviceResetGpuLockedClocks(m._handle)
