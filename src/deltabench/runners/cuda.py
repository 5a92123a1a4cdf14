"""CUDA timer: events around each call, the L2 cache flushed before each sample, optional CUDA graphs.

Only torch is imported here. Statistics and stopping rules are the shared ones of
:mod:`deltabench.runners.timing`: the first call (compilation, autotuning) is timed apart on the host
clock, warm-up until two consecutive timings agree within 10%, then samples until the standard error of
the median is under the target or the budget ends. The job runner reaches it through
:data:`deltabench.runners.timing.TIMERS` (:func:`time_job`), for a torch-facing impl on a GPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from deltabench.harness.document import TimingStats

from .cuda_integrity import KernelTrace, kernel_time_record, synchronize_all
from .hwstate import HardwareRecord, NvmlMonitor, hardware_records, sample_in_windows
from .timing import TIMING_DEFAULTS, Collected, Timed, TimerRequest, summarize

__all__ = ["L2_FLUSH_BYTES", "device_monitor", "sample_with_gpu_state", "time_callable", "time_job"]

# Larger than any current GPU's L2 (H200: 60 MiB), so writing it evicts the subject's inputs.
L2_FLUSH_BYTES = 256 * 2**20
_flush_buffers: dict[int, torch.Tensor] = {}


def _flush_buffer() -> torch.Tensor:
    dev = torch.cuda.current_device()
    if dev not in _flush_buffers:
        _flush_buffers[dev] = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    return _flush_buffers[dev]


_monitors: dict[int, NvmlMonitor] = {}


def device_monitor() -> NvmlMonitor:
    """The NVML monitor of the current CUDA device, found by its PCI bus id (opened once per process)."""
    dev = torch.cuda.current_device()
    if dev not in _monitors:
        p = torch.cuda.get_device_properties(dev)
        bus = getattr(p, "pci_bus_id", None)
        if bus is None:
            _monitors[dev] = NvmlMonitor(None, None, "not available: torch does not give the device's PCI bus id")
        else:
            domain, device = getattr(p, "pci_domain_id", 0), getattr(p, "pci_device_id", 0)
            _monitors[dev] = NvmlMonitor.open_pci(f"{domain:08x}:{bus:02x}:{device:02x}.0")
    return _monitors[dev]


def sample_with_gpu_state(measure: Callable[[int], list[float]], **rules: Any) -> tuple[Collected, HardwareRecord]:
    """:func:`~deltabench.runners.hwstate.sample_in_windows` over `measure` under the stopping `rules`, the current
    CUDA device's state read after each batch (:func:`device_monitor`; every sample kept where NVML is not)."""
    monitor = device_monitor()
    state = monitor.sample if monitor.available else None
    return sample_in_windows(measure, state, reason=monitor.reason, **rules)


def _event_measure(
    fn: Callable[[], Any], flush: torch.Tensor | None, guard: Any = None
) -> Callable[[int], list[float]]:
    """`n` samples, one event pair each, flushing L2 before each; one synchronisation of every device per batch. A
    `guard` (``runners.integrity.TimedCallGuard``) is told of each call outside the events (its perturbation before
    the flush, so the flush evicts it), and of the batch's samples once they are known."""

    def measure(n: int) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for start, end in zip(starts, ends, strict=True):
            if guard is not None:
                guard.before()
            if flush is not None:
                flush.zero_()  # outside the events: the flush is never timed
            start.record()
            out = fn()
            end.record()
            if guard is not None:
                guard.after(out, None)  # a sampled call's outputs copied on this stream, right after its end event
        synchronize_all()  # every stream of every device: nothing a batch launched is still running after it
        got = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
        if guard is not None:
            guard.settle(got)
        return got

    return measure


def _capture(body: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def _replay_ms(graph: torch.cuda.CUDAGraph, n: int) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def _graph_measure(fn: Callable[[], Any], flush: torch.Tensor | None, calls: int) -> Callable[[int], list[float]]:
    """Capture `calls` x (flush, fn) in one graph; a sample is one replay over `calls`, minus the flush.

    The flush's own cost per call is measured from a graph of `calls` flushes alone (median of 10
    replays) and subtracted, so a sample is the subject's time without host launch overhead.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # capture needs the callable warmed up on a side stream first
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    def body() -> None:
        for _ in range(calls):
            if flush is not None:
                flush.zero_()
            fn()

    graph = _capture(body)
    flush_ms = 0.0
    if flush is not None:
        flush_graph = _capture(lambda: [flush.zero_() for _ in range(calls)])
        flush_ms = statistics.median(_replay_ms(flush_graph, 10)) / calls

    def measure(n: int) -> list[float]:
        return [max(t / calls - flush_ms, 0.0) for t in _replay_ms(graph, n)]

    return measure


def time_callable(
    fn: Callable[[], Any],
    *,
    budget_s: float = TIMING_DEFAULTS.budget_s,
    target_sem: float = TIMING_DEFAULTS.target_sem,
    min_reps: int = TIMING_DEFAULTS.min_reps,
    max_reps: int = TIMING_DEFAULTS.max_reps,
    warmup_s: float = TIMING_DEFAULTS.warmup_s,
    l2_flush: bool = TIMING_DEFAULTS.l2_flush,
    cuda_graph: bool = TIMING_DEFAULTS.cuda_graph,
    graph_calls: int = TIMING_DEFAULTS.graph_calls,
    first_call_s: float | None = None,
    hardware: list[HardwareRecord] | None = None,
    guard: Any = None,
) -> TimingStats:
    """Time the zero-argument closure `fn` on the current CUDA device.

    Each sample is bracketed by CUDA events after an L2 flush (``l2_flush``); with ``cuda_graph`` the
    subject is captured ``graph_calls`` times in a CUDA graph and the flush's cost is subtracted. The
    first call is timed on the host clock (``compile_s``) unless the caller passes `first_call_s`. The GPU's
    clocks, power, temperature and throttle reasons are read after each batch of samples (NVML, where it is):
    batches under a throttle or below the run's clock norm are left out (runners/hwstate.py); the record of
    it is appended to `hardware` when given. A `guard` (``runners.integrity.TimedCallGuard``) sees every timed
    call of the events' timing (never a graph's), and is told how many samples the clocks left out.
    """
    torch.cuda.synchronize()
    if first_call_s is None:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        first_call_s = time.perf_counter() - t0
    flush = _flush_buffer() if l2_flush else None
    if cuda_graph:
        measure, clock = _graph_measure(fn, flush, graph_calls), "cuda_graph"
        guard = None
    else:
        measure, clock = _event_measure(fn, flush, guard), "cuda_events"
    if guard is not None:
        guard.start()
    try:
        got, record = sample_with_gpu_state(
            measure,
            budget_s=budget_s,
            target_sem=target_sem,
            min_reps=min_reps,
            max_reps=max_reps,
            warmup_s=warmup_s,
        )
    finally:
        if guard is not None:
            guard.stop()
    if guard is not None:
        guard.dropped = record.excluded_samples
    if hardware is not None:
        hardware.append(record)
    return summarize(
        got.samples_ms,
        clock=clock,
        warmup=got.warmup,
        l2_flush=l2_flush,
        compile_s=first_call_s,
        stop_reason=got.stop_reason,
    )


# The CUPTI pass after the timing: this many calls, each between events, with nothing else on the device.
KERNEL_TIME_CALLS = 20


def kernel_time_pass(fn: Callable[[], Any], calls: int = KERNEL_TIME_CALLS) -> Any:
    """``integrity:kernel_time`` (runners/cuda_integrity.py): `calls` calls of `fn` between events, no flush,
    traced by CUPTI; the kernels' busy time on every stream against the events' sum. Without cupti-python, a note
    and no calls."""
    with KernelTrace() as trace:
        if trace.intervals is None:
            return kernel_time_record([], None, trace.why_not)
        ms = _event_measure(fn, None)(calls)
    return kernel_time_record(ms, trace.intervals, trace.why_not)


def time_job(request: TimerRequest) -> Timed:
    """The table's CUDA timer: `request`'s subject between CUDA events (graph replays with ``cuda_graph``), with the
    job's settings; its records are the GPU's state while it was timed (``hardware:*``) and, with the request's
    integrity guard (its events' timed calls guarded), a CUPTI pass after (``integrity:kernel_time``)."""
    settings = request.settings
    hardware: list[HardwareRecord] = []
    guard = None if settings.cuda_graph else request.guard
    timing = time_callable(
        request.subject,
        **request.rules,
        l2_flush=settings.l2_flush,
        cuda_graph=settings.cuda_graph,
        first_call_s=request.first_call_s,
        hardware=hardware,
        guard=guard,
    )
    records = [r for rec in hardware for r in hardware_records(rec)]
    if guard is not None:
        records.append(kernel_time_pass(request.subject))
    return Timed(timing, guarded=guard is not None, records=records)
