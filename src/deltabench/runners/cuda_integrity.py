"""The integrity defences that need a GPU or a kernel language: streams, the CUPTI kernel-time cross-check, and ghost
replay of Triton launches. Their decisions are plain functions of numbers (:func:`kernel_time_record`,
:func:`ghost_record`), tested on any machine; what gathers the numbers (:class:`KernelTrace`, :func:`ghost_launches`)
needs CUDA, cupti-python or Triton, each an optional import.

Streams. ``torch.cuda.synchronize()`` is ``cudaDeviceSynchronize`` on the current device: it returns once every
stream of this process on that device is idle, torch's pool streams (created non-blocking) and streams made
through the driver alike, but says nothing of another device. So the CUDA timer synchronises every visible device
at the end of each batch (:func:`synchronize_all`). That alone does not keep work out of a sample: the events
bracket the current stream only, and a kernel a call leaves running on a side stream finishes after its end event,
unmeasured. Two defences see it: the guard's copy of a sampled call's outputs is queued on the current stream right
after the end event, so it reads outputs the side stream has not finished (``integrity:recheck`` fails); and the
CUPTI trace of a short untimed pass (:class:`KernelTrace`) sees every kernel on every stream, whose busy time must
fit within the events' (``integrity:kernel_time``).

Ghost replay (``integrity:ghost``, Triton impls): after the timed loop the inputs get fresh factors and the subject
is called once with every Triton launch made a no-op (compiled, never run). Outputs right for those inputs were
computed without the impl's kernels; outputs in the very buffers of the last timed call were handed back without
running one. Either fails the record.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from deltabench.harness.document import CheckRecord

from .integrity_records import integrity_record

__all__ = [
    "KERNEL_TIME_SLACK_US",
    "KERNEL_TIME_TOLERANCE",
    "KernelTrace",
    "busy_ns",
    "ghost_launches",
    "ghost_record",
    "kernel_time_record",
    "replay_span_ns",
    "synchronize_all",
    "timer_agreement_record",
]

# The kernels' busy time may exceed the events' sum by this share (the events' own resolution, about 0.5 us,
# and a kernel's launch latency inside a sample) plus this much a call, before work is said to run outside them.
KERNEL_TIME_TOLERANCE = 0.10
KERNEL_TIME_SLACK_US = 3.0

# A decode step's CUDA-graph time a call (scope call) and its kernels' CUPTI sum (scope kernel) agree within the
# larger of these: the events' own resolution spread over a replay's calls, and a share for a launch gap in the graph.
AGREEMENT_US = 0.5
AGREEMENT_SHARE = 0.03


_record = integrity_record


def synchronize_all() -> None:
    """Wait for every stream of every visible CUDA device of this process."""
    import torch

    for d in range(torch.cuda.device_count()):
        torch.cuda.synchronize(d)


def busy_ns(intervals: Sequence[tuple[int, int]]) -> int:
    """The time covered by at least one of the kernels' ``(start, end)`` intervals (ns): concurrent kernels count
    once, so streams working side by side inside a sample are not taken for work outside it.

    Example::

        >>> busy_ns([(0, 10), (5, 20), (30, 40)])
        30
    """
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def kernel_time_record(
    events_ms: Sequence[float], intervals: Sequence[tuple[int, int]] | None, why_not: str = ""
) -> CheckRecord:
    """``integrity:kernel_time``: the kernels' busy time over a pass (every stream, from CUPTI) against the sum of
    its event-timed samples. More busy time than the events saw (beyond :data:`KERNEL_TIME_TOLERANCE` and
    :data:`KERNEL_TIME_SLACK_US` a call) is work the events missed: a kernel left running on another stream, or
    launched after the end event. `intervals` None: CUPTI not available, a passing note naming `why_not`."""
    if intervals is None:
        return _record("kernel_time", "ratio", None, None, True, f"not available: {why_not}", gating=False)
    events_ns = sum(events_ms) * 1e6
    busy = busy_ns(intervals)
    limit_ns = events_ns * (1 + KERNEL_TIME_TOLERANCE) + KERNEL_TIME_SLACK_US * 1e3 * len(events_ms)
    ratio = busy / events_ns if events_ns > 0 else None
    detail = (
        f"{len(intervals)} kernels busy {busy / 1e6:.3f} ms over {len(events_ms)} calls the events timed at "
        f"{events_ns / 1e6:.3f} ms"
    )
    if busy > limit_ns:
        detail += ": kernel work outside the timed events (a stream left running, or work launched after them)"
    elif not intervals:
        detail = f"no kernel seen in {len(events_ms)} calls the events timed at {events_ns / 1e6:.3f} ms"
    return _record("kernel_time", "ratio", ratio, 1 + KERNEL_TIME_TOLERANCE, busy <= limit_ns, detail)


def replay_span_ns(intervals: Sequence[tuple[int, int]], replays: int) -> int | None:
    """The device's own time of `replays` graph replays (ns): each replay's first start to its last end, summed,
    so the launch gaps between a replay's kernels count and the host's time between replays does not. A graph
    replays the same work each time, so the sorted intervals fall into `replays` groups of equal count; None when
    they do not (a replay traced in part)."""
    if replays < 1 or not intervals or len(intervals) % replays:
        return None
    ordered = sorted(intervals)
    per = len(ordered) // replays
    groups = [ordered[i : i + per] for i in range(0, len(ordered), per)]
    return sum(max(end for _, end in group) - group[0][0] for group in groups)


def timer_agreement_record(
    call_us: float,
    kernel_us: float | None,
    kernels_per_call: float,
    host_us: float,
    why_not: str = "",
    span_us: float | None = None,
) -> CheckRecord:
    """``integrity:timer_agreement`` of a microsecond timing, its three scopes: the CUDA-graph replay's time a call
    (`call_us`, scope call, the events' clock), the CUPTI sum of its kernels' and copies' durations a call
    (`kernel_us`, scope kernel) and a host-synchronised call (`host_us`, scope host, reported, never held to them).

    The events' call time must agree with the device's own clock of the same scope, within the larger of
    :data:`AGREEMENT_US` and :data:`AGREEMENT_SHARE` of the call: CUPTI's span of the call (`span_us`,
    :func:`replay_span_ns` a call: the kernels with the launch gaps between them) where the trace gives it, else
    the kernels' sum; and the kernels' sum may not exceed the span (that would be work beside the call's own).
    The gaps (span - sum) are reported: a call of several kernels pays them, a one-kernel step has none.
    Disagreement flags the figure (the record fails) but is not a wrong answer, so it never fails the job.
    `kernel_us` None: CUPTI not available (`why_not`), a passing note."""
    scopes = f"call {call_us:.2f} us (CUDA graph), host {host_us:.1f} us (synchronised each call)"
    if kernel_us is None:
        detail = f"{scopes}; kernel time not available: {why_not}"
        return _record("timer_agreement", "abs_us", None, None, True, detail, gating=False)
    bound = max(AGREEMENT_US, AGREEMENT_SHARE * call_us)
    detail = f"{scopes}, kernel {kernel_us:.2f} us (CUPTI sum of {kernels_per_call:.3g} kernels and copies a call)"
    device_us = kernel_us if span_us is None else span_us
    if span_us is not None:
        detail += f", span {span_us:.2f} us (CUPTI, launch gaps {span_us - kernel_us:.2f} us a call)"
    gap = abs(call_us - device_us)
    passed = gap <= bound and (span_us is None or kernel_us <= span_us + bound)
    if gap > bound:
        detail += f": the events and CUPTI differ by {gap:.2f} us > {bound:.2f}" + (
            " (launch gaps between the call's kernels are in its call time)"
            if span_us is None and kernels_per_call > 1.01
            else ""
        )
    elif not passed:
        detail += ": the kernels' sum exceeds their span (work running beside the call's own)"
    return _record("timer_agreement", "abs_us", gap, bound, passed, detail, gating=False)


class KernelTrace:
    """Every kernel's, copy's and fill's ``(start, end)`` on the device while in use (``with KernelTrace() as
    trace``), from CUPTI's activity API through cupti-python (``pip install cupti-python``): a copy (a state cloned
    with ``cudaMemcpyAsync``) is device work a call does as much as a kernel is. :attr:`why_not` says why there is
    no trace (cupti-python absent, or CUPTI refused kernels); :attr:`intervals` is then None. Copies and fills are
    traced where CUPTI takes them (:attr:`kinds` names what was)."""

    def __init__(self) -> None:
        self.intervals: list[tuple[int, int]] | None = None
        self.why_not = ""
        self.kinds: list[str] = []
        self._cupti: Any = None
        self._enabled: list[Any] = []

    def __enter__(self) -> KernelTrace:
        try:
            from cupti import cupti
        except ImportError:
            self.why_not = "cupti-python is not installed (pip install cupti-python)"
            return self
        found: list[tuple[int, int]] = []
        kinds = cupti.ActivityKind

        def requested() -> tuple[int, int]:
            return 8 * 2**20, 0  # buffer bytes, records (0: as many as fit)

        def completed(activities: Any) -> None:
            for a in activities:
                if a.kind in self._enabled:
                    found.append((int(a.start), int(a.end)))

        try:
            cupti.activity_register_callbacks(requested, completed)
            cupti.activity_enable(kinds.CONCURRENT_KERNEL)
        except Exception as exc:  # an older driver, another profiler attached
            self.why_not = f"CUPTI refused: {type(exc).__name__}: {exc}"
            return self
        self._enabled = [kinds.CONCURRENT_KERNEL]
        for kind in (getattr(kinds, name, None) for name in ("MEMCPY", "MEMSET")):
            try:
                if kind is not None:
                    cupti.activity_enable(kind)
                    self._enabled.append(kind)
            except Exception:  # kernels alone still answer what kernel_time asks
                continue
        self.kinds = [str(getattr(k, "name", k)).lower() for k in self._enabled]
        self._cupti, self.intervals = cupti, found
        return self

    def __exit__(self, *exc: object) -> None:
        cupti = self._cupti
        if cupti is None:
            return
        try:
            synchronize_all()
            cupti.activity_flush_all(1)
            for kind in self._enabled:
                cupti.activity_disable(kind)
        except Exception as err:
            self.intervals, self.why_not = None, f"CUPTI flush failed: {type(err).__name__}: {err}"


@contextlib.contextmanager
def ghost_launches() -> Iterator[list[int]]:
    """Every Triton launch made a no-op while in use (the kernel is compiled, never run); yields a one-item list,
    the count of launches skipped. Yields a count of -1 when Triton is not installed."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        yield [-1]
        return
    count = [0]
    originals = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}

    def skip(original: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            if not warmup:
                count[0] += 1
            return original(self, *args, grid=grid, warmup=True, **kwargs)

        return run

    for cls, original in originals.items():
        cls.run = skip(original)
    try:
        yield count
    finally:
        for cls, original in originals.items():
            cls.run = original


def ghost_record(launches: int, same_buffers: bool, error: float | None, bound: float, note: str = "") -> CheckRecord:
    """``integrity:ghost``: the verdict of a call made with every Triton launch a no-op, on inputs no call saw
    before. `launches`: the launches skipped (0 or less: no Triton kernel to judge); `same_buffers`: its outputs
    are the last timed call's own tensors; `error`: their rel_fro against the reference for the new inputs (None:
    the call raised, `note` says how); `bound`: the gate's bound there."""
    if same_buffers:
        detail = f"{max(launches, 0)} launches skipped, and the call handed back the last timed call's output tensors"
        return _record("ghost", "rel_fro", error, bound, False, detail)
    if launches <= 0:
        why = "Triton is not installed" if launches < 0 else "no Triton launch in the call"
        return _record("ghost", "launches", float(max(launches, 0)), None, True, f"not applicable: {why}", gating=False)
    if error is None:
        return _record("ghost", "rel_fro", None, bound, True, f"{launches} launches skipped: the call raised ({note})")
    ran = not error <= bound
    detail = f"{launches} launches skipped: outputs off by rel_fro {error:.2e}" + (
        "" if ran else f" <= {bound:.1e}: right without the kernels, so they were computed elsewhere"
    )
    return _record("ghost", "rel_fro", error, bound, ran, detail)
