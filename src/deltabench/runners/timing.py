"""Timing shared by every timer (CPU clock, CUDA events, CUDA graphs, JAX): the defaults, the table that picks a
timer for a backend and a platform, and the statistics.

- :data:`TIMING_DEFAULTS` (:class:`TimingDefaults`): the budget, target, repetition and warm-up settings every
  timer, suite (``harness.suites.TimingSettings``) and job starts from;
- :data:`TIMERS`: ``(backend, platform) -> Timer``, read by :func:`timer_for` (the job runner's one way to time a
  job): the host clock on the CPU, CUDA events on a GPU, JAX's own timing (``block_until_ready``) on the JAX
  device for a JAX impl, whichever the platform; a decode step of a torch-facing impl on a GPU (a few
  microseconds, less than a host synchronisation) by :data:`DECODE_GRAPH` instead (runners/decode_timer.py).

Every timer follows the same rules, implemented once here by :func:`adaptive_samples`:

1. the first call is timed apart, as ``compile_s`` (compilation and autotuning happen there);
2. warm-up calls follow until two consecutive timings agree within 10%, or a cap (time or count) is hit;
3. repetitions until the standard error of the median is under ``target_sem`` of it (0.5% by default),
   or the time budget ends, or ``max_reps`` is reached; every raw sample is kept and the reason for
   stopping is recorded.

The standard error of the median is estimated as ``1.2533 * stdev / sqrt(n)`` (its asymptotic value
for normally distributed samples), which is cheap enough to recompute while sampling.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from deltabench.harness.document import CheckRecord, MemoryStats, TimingStats
from deltabench.harness.timing_defaults import TIMING_DEFAULTS, TimingDefaults, stopping_rules

__all__ = [
    "TIMERS",
    "TIMING_DEFAULTS",
    "WARMUP_AGREEMENT",
    "Collected",
    "Timed",
    "Timer",
    "TimerRequest",
    "TimingDefaults",
    "adaptive_samples",
    "merge_repetitions",
    "quantile",
    "sem_rel",
    "stopping_rules",
    "summarize",
    "time_on_host_clock",
    "timer_for",
]

WARMUP_AGREEMENT = 0.10  # two consecutive warm-up timings within 10% of each other: warm
_MEDIAN_SE_FACTOR = 1.2533  # sqrt(pi/2): asymptotic SE of the median over SE of the mean (normal samples)
_UNKNOWN_SEM = 1.0  # stands for "unknown" with fewer than two samples (JSON has no infinity)
# The clocks, resolved when deltabench's runner is imported, before any user module: a module that replaces
# time.perf_counter_ns does not change what the timers read (runners/integrity.py checks it did not try).
_clock_ns = time.perf_counter_ns
_clock_s = time.perf_counter


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The `q`-quantile (0..1) of already sorted values, with linear interpolation (numpy's default)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def sem_rel(samples_ms: Sequence[float]) -> float:
    """Standard error of the median over the median, ``1.2533 * stdev / sqrt(n) / median``."""
    n = len(samples_ms)
    if n < 2:
        return _UNKNOWN_SEM
    med = statistics.median(samples_ms)
    if med <= 0:
        return _UNKNOWN_SEM
    return _MEDIAN_SE_FACTOR * statistics.stdev(samples_ms) / math.sqrt(n) / med


def summarize(
    samples_ms: Sequence[float],
    *,
    clock: str,
    warmup: int = 0,
    l2_flush: bool = False,
    compile_s: float | None = None,
    stop_reason: str = "",
) -> TimingStats:
    """Summarise raw samples (milliseconds) into a :class:`TimingStats`, keeping every sample.

    Example::

        >>> summarize([1.0, 2.0, 3.0, 4.0], clock="cpu_monotonic").median_ms
        2.5
    """
    if not samples_ms:
        raise ValueError("summarize needs at least one sample")
    values = [float(x) for x in samples_ms]
    ordered = sorted(values)
    return TimingStats(
        clock=clock,
        samples_ms=values,
        median_ms=statistics.median(ordered),
        q1_ms=quantile(ordered, 0.25),
        q3_ms=quantile(ordered, 0.75),
        mean_ms=statistics.fmean(values),
        stdev_ms=statistics.stdev(values) if len(values) > 1 else 0.0,
        sem_rel=sem_rel(values),
        warmup=warmup,
        l2_flush=l2_flush,
        compile_s=compile_s,
        stop_reason=stop_reason,
    )


def merge_repetitions(timings: Sequence[TimingStats]) -> TimingStats:
    """One job's timings from its repetitions (``deltabench run --repeat N``, one worker process each, in order) as
    one :class:`TimingStats`: every sample, tagged with its repetition's index, summarised together; the first
    repetition's compile time, warm-up count and stop reason (the first call compiled there).

    The summary (median, quartiles, SEM) pools the samples as one run's; the regression gate reads the repetition
    indices to see how far whole processes move (``harness.regression.noise``).
    """
    if not timings:
        raise ValueError("merge_repetitions needs at least one repetition")
    if len(timings) == 1:
        return timings[0]
    first = timings[0]
    samples = [x for t in timings for x in t.samples_ms]
    merged = summarize(
        samples,
        clock=first.clock,
        warmup=first.warmup,
        l2_flush=first.l2_flush,
        compile_s=first.compile_s,
        stop_reason=first.stop_reason,
    )
    merged.repetitions = [r for r, t in enumerate(timings) for _ in t.samples_ms]
    return merged


@dataclasses.dataclass
class Collected:
    """What :func:`adaptive_samples` gathered: the kept samples, the warm-up count and why it stopped."""

    samples_ms: list[float]
    warmup: int
    stop_reason: str


def adaptive_samples(
    measure: Callable[[int], list[float]],
    *,
    budget_s: float,
    target_sem: float = TIMING_DEFAULTS.target_sem,
    min_reps: int = TIMING_DEFAULTS.min_reps,
    max_reps: int = TIMING_DEFAULTS.max_reps,
    warmup_s: float = TIMING_DEFAULTS.warmup_s,
    max_warmup: int = 100,
    batch_s: float = 0.02,
) -> Collected:
    """Warm up, then sample until the median is known to `target_sem` or the budget ends.

    `measure(n)` runs the subject `n` times and returns `n` timings in milliseconds (a CUDA timer
    records `n` event pairs and synchronises once; the CPU timer reads the clock around each call).
    The first call (compilation) must already have been made and timed by the caller.
    """
    if min_reps < 1 or max_reps < min_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps (got {min_reps}, {max_reps})")
    # Warm-up: until two consecutive timings agree within 10%, or the warm-up cap (time or count).
    warmup = 0
    prev: float | None = None
    t0 = _clock_s()
    while True:
        (cur,) = measure(1)
        warmup += 1
        if prev is not None and abs(cur - prev) <= WARMUP_AGREEMENT * min(cur, prev):
            break
        if warmup >= max_warmup or _clock_s() - t0 >= warmup_s:
            break
        prev = cur
    # Repetitions, in batches of about `batch_s` so that checking the SEM stays cheap for tiny kernels.
    per_call_s = max(cur / 1e3, 1e-7)
    batch = max(1, min(int(batch_s / per_call_s), 1000))
    samples: list[float] = []
    start = _clock_s()
    while True:
        n = min(batch, max_reps - len(samples))
        samples.extend(measure(n))
        if len(samples) >= min_reps and sem_rel(samples) < target_sem:
            reason = f"sem<{target_sem:.2%}"
            break
        if len(samples) >= max_reps:
            reason = "max_reps"
            break
        if _clock_s() - start >= budget_s and len(samples) >= min_reps:
            reason = "budget"
            break
    return Collected(samples_ms=samples, warmup=warmup, stop_reason=reason)


def time_on_host_clock(
    call: Callable[[], object],
    *,
    clock: str,
    budget_s: float,
    target_sem: float,
    min_reps: int,
    max_reps: int,
    warmup_s: float,
    first_call_s: float | None,
    guard: Any = None,
) -> TimingStats:
    """Time the zero-argument `call` on the host's monotonic nanosecond clock, one reading around each call.

    What the CPU and JAX timers share: the first call timed apart as ``compile_s`` (unless the caller already
    made it and passes its duration as `first_call_s`), then :func:`adaptive_samples`, then :func:`summarize`
    with the samples labelled `clock`. `call` must return only once its work is done (the JAX timer's blocks
    on the outputs).

    A `guard` (``runners.integrity.TimedCallGuard``) is told of every call after the first, outside the clock
    readings: ``before()`` each (it perturbs the inputs), ``after(output, ms)`` each, ``start()`` and ``stop()``
    around them all.
    """
    if first_call_s is None:
        t0 = _clock_ns()
        call()
        first_call_s = (_clock_ns() - t0) / 1e9

    def measure(n: int) -> list[float]:
        out = []
        for _ in range(n):
            start = _clock_ns()
            call()
            out.append((_clock_ns() - start) / 1e6)
        return out

    def guarded(n: int) -> list[float]:
        out = []
        for _ in range(n):
            guard.before()
            start = _clock_ns()
            result = call()
            ms = (_clock_ns() - start) / 1e6
            guard.after(result, ms)
            out.append(ms)
        return out

    if guard is not None:
        guard.start()
    try:
        got = adaptive_samples(
            guarded if guard is not None else measure,
            budget_s=budget_s,
            target_sem=target_sem,
            min_reps=min_reps,
            max_reps=max_reps,
            warmup_s=warmup_s,
        )
    finally:
        if guard is not None:
            guard.stop()
    return summarize(
        got.samples_ms, clock=clock, warmup=got.warmup, compile_s=first_call_s, stop_reason=got.stop_reason
    )


@dataclasses.dataclass(frozen=True)
class TimerRequest:
    """What a timer is given: one job's subject and everything it was built from.

    Attributes:
        subject: the zero-argument closure of the job's mode (``runners.closures.build_subject``), already called
            once (the first call, `first_call_s` seconds, compilation included).
        impl, case, inputs: the registered impl, the job's case and its inputs (a JAX timer rebuilds the call
            natively from them).
        settings: the job's timing settings (``TimingSettings``; any object with :class:`TimingDefaults`'s
            attributes).
    """

    subject: Callable[[], object]
    impl: Any
    case: Any
    inputs: dict[str, Any]
    settings: Any
    first_call_s: float | None = None
    guard: Any = None  # runners.integrity.TimedCallGuard, for a timer that takes one (the host clock's)

    @property
    def rules(self) -> dict[str, Any]:
        """The settings' stopping rules as the timers' keyword arguments."""
        return stopping_rules(self.settings)


@dataclasses.dataclass
class Timed:
    """A timer's answer: the timing, the memory it measured itself (the JAX timer's XLA figures), a note, and
    whether the request's integrity guard saw the timed calls."""

    timing: TimingStats
    memory: MemoryStats | None = None
    note: str = ""
    guarded: bool = False  # the request's guard saw every timed call
    # What the timer saw besides the time: the GPU's state (hardware:*), its own integrity records (kernel_time).
    records: list[CheckRecord] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Timer:
    """One way of timing a job: its name, the clock its samples are labelled with and its entry point.

    The entry point, ``"module:function"`` taking a :class:`TimerRequest` and returning :class:`Timed`, is
    imported on first use: the CUDA timer imports torch and the JAX timer JAX, which this module must not.
    """

    name: str
    clock: str
    target: str
    takes_guard: bool = False  # it calls the request's subject and tells its guard of each call

    def load(self) -> Callable[[TimerRequest], Timed]:
        """The timer's function."""
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)

    def __call__(self, request: TimerRequest) -> Timed:
        """Time `request`'s job."""
        return self.load()(request)


HOST_CLOCK = Timer("host clock", "cpu_monotonic", "deltabench.runners.cpu:time_job", takes_guard=True)
CUDA_EVENTS = Timer(
    "CUDA events", "cuda_events", "deltabench.runners.cuda:time_job", takes_guard=True
)  # cuda_graph: "cuda_graph"
JAX_NATIVE = Timer("JAX on its device", "jax", "deltabench.runners.jax:time_job")
# Mode decode of a torch-facing impl on a GPU: CUDA-graph replays of many calls, inputs rotated past L2.
DECODE_GRAPH = Timer("CUDA-graph decode replays", "cuda_graph", "deltabench.runners.decode_timer:time_job")

# Every (backend, platform) a job can have. Torch-facing impls (torch, Triton, CUDA extensions) are timed by the
# clock of the platform their tensors are on; a JAX impl by JAX itself on the JAX device the case names. Torch has
# no TPU, so only JAX impls have a TPU row: a torch-facing job on a TPU has no timer, not the host's.
TIMERS: dict[tuple[str, str], Timer] = {
    **{(backend, "cpu"): HOST_CLOCK for backend in ("torch", "triton", "cuda")},
    **{(backend, "cuda"): CUDA_EVENTS for backend in ("torch", "triton", "cuda")},
    **{("jax", platform): JAX_NATIVE for platform in ("cpu", "cuda", "tpu")},
}


def timer_for(backend: str, platform: str, mode: str = "fwd") -> Timer:
    """The timer of an impl of `backend` on `platform` (``cpu``, ``cuda``, ``tpu``; a device's index is ignored)
    for a job of `mode`: the table's, but :data:`DECODE_GRAPH` for a decode step the table would time by CUDA events.

    Example::

        >>> timer_for("jax", "tpu").name
        'JAX on its device'
        >>> timer_for("triton", "cuda:0", "decode").name
        'CUDA-graph decode replays'
    """
    platform = platform.partition(":")[0]
    try:
        timer = TIMERS[(backend, platform)]
        return DECODE_GRAPH if mode == "decode" and timer is CUDA_EVENTS else timer
    except KeyError:
        known = ", ".join(f"{b} on {p}" for b, p in TIMERS)
        raise ValueError(f"no timer for a {backend} impl on {platform} (timers: {known})") from None
