"""Microsecond timing of decode steps on a CUDA device: CUDA-graph replay of N calls back to back.

A decode step takes a few microseconds, less than a host launch and far less than a synchronisation: a timer that
synchronises around each call measures the host. Here N calls are captured in one CUDA graph and replayed with no
host synchronisation between them; a sample is one replay's CUDA-event time divided by N (scope ``call``: the
device's time per call, launch gaps inside the graph included). So that each call reads its state from HBM, as a
served model's next step does after the other layers ran, the calls rotate through enough copies of the inputs
(:func:`rotation_copies`) that one pass over them overflows L2 twice; nothing is flushed, so no flush time is
subtracted from a microsecond figure. Beside it, :func:`time_decode` reports the same calls timed one at a time with
a host synchronisation each (scope ``host``), the figure a naive harness publishes.

Imported lazily (nothing in a run imports it): ``python benchmarks/gpu/decode_timer.py`` tries it on a GPU.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["DecodeTiming", "rotation_copies", "time_decode", "time_graph_replay"]

_L2_OVERFLOW = 2  # one pass over the copies moves this many times the L2 size


def rotation_copies(call_bytes: float, l2_bytes: float, *, most: int = 512) -> int:
    """How many copies of a call's inputs (`call_bytes`: its state and tokens) the calls rotate through so that a
    pass over them moves twice `l2_bytes`, each call then finding its data evicted: at least 2, at most `most`."""
    if call_bytes <= 0:
        raise ValueError(f"a call moves a positive number of bytes, got {call_bytes}")
    return max(2, min(most, math.ceil(_L2_OVERFLOW * l2_bytes / call_bytes)))


def time_graph_replay(calls: list[Callable[[], Any]], *, per_replay: int, replays: int) -> list[float]:
    """Microseconds per call of `per_replay` calls (cycling through `calls`) captured in one CUDA graph, one sample
    per replay (`replays` of them), with no host synchronisation between calls or replays."""
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
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [1e3 * s.elapsed_time(e) / per_replay for s, e in zip(starts, ends, strict=True)]


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


def time_decode(impl: Any, case: Any, *, per_replay: int = 200, replays: int = 50) -> DecodeTiming:
    """Time `impl` (a registered impl) at the decode `case` (on ``cuda``) with :func:`time_graph_replay`, its inputs
    rotated through :func:`rotation_copies` copies, and on the host clock for comparison."""
    from deltabench.harness.ops import get_op, make_case_inputs, work
    from deltabench.runners.closures import build_subject

    if case.mode != "decode" or case.device != "cuda":
        raise ValueError(f"time_decode times a decode case on cuda, got {case.mode} on {case.device}")
    inputs = make_case_inputs(get_op(case.op), case)
    step = work(case.op, case.dims, case.dtype, "decode")
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    copies = rotation_copies(step["bytes"], l2)
    per_replay = max(per_replay, copies)  # every copy at least once a replay
    subjects = []
    for _ in range(copies):
        own = {n: x.clone() if isinstance(x, torch.Tensor) else x for n, x in inputs.items()}
        subjects.append(build_subject(impl, case, own))
    samples = time_graph_replay(subjects, per_replay=per_replay, replays=replays)
    host = _host_us(subjects[0], max(20, replays))
    return DecodeTiming(
        graph_us=statistics.median(samples), host_us=statistics.median(host), copies=copies,
        per_replay=per_replay, samples_us=samples,
    )  # fmt: skip
