"""Microsecond timing of decode steps on a CUDA device: CUDA-graph replay of N calls back to back.

A decode step takes a few microseconds, less than a host launch and far less than a synchronisation: a timer that
synchronises around each call measures the host. Here N calls are captured in one CUDA graph and replayed with no
host synchronisation between them; a sample is one replay's CUDA-event time divided by N (scope ``call``: the
device's time per call, launch gaps inside the graph included). So that each call reads its state from HBM, as a
served model's next step does after the other layers ran, the calls rotate through enough copies of the inputs
(:func:`rotation_copies`) that one pass over them overflows L2 twice; nothing is flushed, so no flush time is
subtracted from a microsecond figure. Beside it, :func:`time_decode` reports the same calls timed one at a time with
a host synchronisation each (scope ``host``), the figure a naive harness publishes.

A run times every decode job of a torch-facing impl on a GPU with it (:func:`time_job`, the timer
:func:`deltabench.runners.timing.timer_for` gives mode ``decode`` on ``cuda``): the shared stopping rules over
replays of :func:`calls_per_replay` calls, the GPU's state read after each batch of them
(:func:`deltabench.runners.hwstate.sample_in_windows`), samples labelled ``cuda_graph``, no L2 flush, and a note
with the copies, the calls per replay and the host-synchronised figure. An
impl whose call cannot be captured in a CUDA graph (one that synchronises with the host) is timed by CUDA events
instead, and its note says why. ``python benchmarks/gpu/decode_timer.py`` prints both scopes per decode-h200 job.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from . import cuda as cuda_timer
from .cuda_integrity import KernelTrace, replay_span_ns, timer_agreement_record
from .hwstate import hardware_records
from .timing import Timed, TimerRequest, summarize

__all__ = [
    "DecodeTiming",
    "calls_per_replay",
    "capture_replays",
    "rotation_copies",
    "time_decode",
    "time_graph_replay",
    "time_job",
    "timer_agreement",
]

_L2_OVERFLOW = 2  # one pass over the copies moves this many times the L2 size
# Calls a run's replay holds at least: the graph's own launch (a few us between the start event and its first kernel)
# is then under a tenth of a microsecond a call; more copies than that are each called once a replay.
MIN_CALLS_PER_REPLAY = 32


def rotation_copies(call_bytes: float, l2_bytes: float, *, most: int = 512) -> int:
    """How many copies of a call's inputs (`call_bytes`: its state and tokens) the calls rotate through so that a
    pass over them moves twice `l2_bytes`, each call then finding its data evicted: at least 2, at most `most`."""
    if call_bytes <= 0:
        raise ValueError(f"a call moves a positive number of bytes, got {call_bytes}")
    return max(2, min(most, math.ceil(_L2_OVERFLOW * l2_bytes / call_bytes)))


def calls_per_replay(copies: int) -> int:
    """How many calls a run's graph replays at once for `copies` input copies: each copy once, and at least
    :data:`MIN_CALLS_PER_REPLAY`."""
    if copies < 1:
        raise ValueError(f"a replay rotates through at least one copy of the inputs, got {copies}")
    return max(copies, MIN_CALLS_PER_REPLAY)


def capture_replays(calls: list[Callable[[], Any]], *, per_replay: int) -> Callable[[int], list[float]]:
    """Capture `per_replay` calls (cycling through `calls`, each warmed up once first) in one CUDA graph; return
    ``measure(n)``: `n` replays, back to back with no host synchronisation between them, each one's milliseconds
    per call (one synchronisation after all `n`)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # capture wants each callable warmed up (compiled, autotuned) on a side stream
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(per_replay):
            calls[i % len(calls)]()
    graph.replay()  # the first replay uploads the graph: not a sample
    torch.cuda.synchronize()

    def measure(n: int) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for start, end in zip(starts, ends, strict=True):
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / per_replay for s, e in zip(starts, ends, strict=True)]

    return measure


def time_graph_replay(calls: list[Callable[[], Any]], *, per_replay: int, replays: int) -> list[float]:
    """Microseconds per call of `per_replay` calls (cycling through `calls`) captured in one CUDA graph, one sample
    per replay (`replays` of them), with no host synchronisation between calls or replays."""
    return [1e3 * ms for ms in capture_replays(calls, per_replay=per_replay)(replays)]


# Replays of the CUPTI pass after the timing (each of the run's calls per replay).
AGREEMENT_REPLAYS = 5


def timer_agreement(measure: Callable[[int], list[float]], per_replay: int, timed_us: float, host_us: float) -> Any:
    """``integrity:timer_agreement`` (runners/cuda_integrity.py): :data:`AGREEMENT_REPLAYS` more replays of
    `measure` (:func:`capture_replays`' ``measure``, `per_replay` calls a replay) traced by CUPTI; their events' time
    a call against the summed durations of the device work (kernels, copies, fills) they traced. The same replays on
    both sides: a GPU whose clocks moved since the timing (`timed_us`, its median a call) does not read as a timer
    that disagrees."""
    with KernelTrace() as trace:
        if trace.intervals is None:
            return timer_agreement_record(timed_us, None, 0, host_us, trace.why_not)
        per_call_ms = measure(AGREEMENT_REPLAYS)
    calls = AGREEMENT_REPLAYS * per_replay
    kernel_us = sum(end - start for start, end in trace.intervals) / 1e3 / calls
    span_ns = replay_span_ns(trace.intervals, AGREEMENT_REPLAYS)
    span_us = None if span_ns is None else span_ns / 1e3 / calls
    call_us = 1e3 * sum(per_call_ms) / len(per_call_ms)
    return timer_agreement_record(call_us, kernel_us, len(trace.intervals) / calls, host_us, span_us=span_us)


def _host_us(fn: Callable[[], Any], reps: int) -> list[float]:
    """Microseconds of `fn` timed on the host clock, one call at a time, synchronised after each."""
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(1e6 * (time.perf_counter() - t0))
    return out


@dataclasses.dataclass
class DecodeTiming:
    """A decode step's microseconds per call: the graph replays' median (scope call) and a host-synchronised call's
    (scope host), and how they were made (copies rotated through, calls per replay, every replay's figure)."""

    graph_us: float
    host_us: float
    copies: int
    per_replay: int
    samples_us: list[float]


def _copies(impl: Any, case: Any, inputs: dict[str, Any]) -> tuple[int, list[Any]]:
    """How many input copies `case`'s calls rotate through (:func:`rotation_copies` on this GPU's L2), and a subject
    per copy beyond the first (each its own clone of `inputs`, so that an in-place state update stays its own)."""
    from deltabench.harness.ops import work
    from deltabench.runners.closures import build_subject

    step = work(case.op, case.dims, case.dtype, "decode")
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    copies = rotation_copies(step["bytes"], l2)
    more = []
    for _ in range(copies - 1):
        own = {n: x.clone() if isinstance(x, torch.Tensor) else x for n, x in inputs.items()}
        more.append(build_subject(impl, case, own))
    return copies, more


def time_job(request: TimerRequest) -> Timed:
    """The run's timer for a decode job on a GPU: the job's subject and :func:`rotation_copies` - 1 more over copies
    of its inputs, :func:`calls_per_replay` calls of them captured in one CUDA graph and replayed under the job's
    stopping rules; samples are milliseconds per call (clock ``cuda_graph``, no L2 flush). A call that cannot be
    captured falls back to the CUDA-events timer, with the reason in the note."""
    copies, more = _copies(request.impl, request.case, request.inputs)
    per_replay = calls_per_replay(copies)
    try:
        measure = capture_replays([request.subject, *more], per_replay=per_replay)
    except Exception as exc:  # a host synchronisation inside the call: not capturable, so not timed this way
        torch.cuda.synchronize()
        timed = cuda_timer.time_job(request)
        why = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        timed.note = f"decode timer: the call is not capturable in a CUDA graph ({why}); timed by CUDA events"
        return timed
    got, record = cuda_timer.sample_with_gpu_state(measure, **request.rules)  # as the CUDA timer reads the GPU
    host = statistics.median(_host_us(request.subject, 20))
    timing = summarize(
        got.samples_ms, clock="cuda_graph", warmup=got.warmup, l2_flush=False,
        compile_s=request.first_call_s, stop_reason=got.stop_reason,
    )  # fmt: skip
    note = (
        f"decode timer: {per_replay} calls a CUDA-graph replay over {copies} copies of the inputs (L2 overflowed, "
        f"not flushed); a host-synchronised call {host:.1f} us"
    )
    agreement = timer_agreement(measure, per_replay, 1e3 * timing.median_ms, host)
    if not agreement.passed:
        note += f"; flagged, timer scopes disagree: {agreement.detail}"
    return Timed(timing, note=note, records=[*hardware_records(record), agreement])


def time_decode(impl: Any, case: Any, *, per_replay: int = 200, replays: int = 50) -> DecodeTiming:
    """Time `impl` (a registered impl) at the decode `case` (on ``cuda``) with :func:`time_graph_replay`, its inputs
    rotated through :func:`rotation_copies` copies, and on the host clock for comparison."""
    from deltabench.harness.ops import get_op, make_case_inputs
    from deltabench.runners.closures import build_subject

    if case.mode != "decode" or case.device != "cuda":
        raise ValueError(f"time_decode times a decode case on cuda, got {case.mode} on {case.device}")
    inputs = make_case_inputs(get_op(case.op), case)
    copies, more = _copies(impl, case, inputs)
    per_replay = max(per_replay, copies)  # every copy at least once a replay
    subjects = [build_subject(impl, case, inputs), *more]
    samples = time_graph_replay(subjects, per_replay=per_replay, replays=replays)
    host = _host_us(subjects[0], max(20, replays))
    return DecodeTiming(
        graph_us=statistics.median(samples), host_us=statistics.median(host), copies=copies,
        per_replay=per_replay, samples_us=samples,
    )  # fmt: skip
