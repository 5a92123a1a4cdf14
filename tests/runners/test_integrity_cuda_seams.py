"""The GPU-side integrity defences' decisions, on real numbers, and what of them runs without a GPU
(runners/cuda_integrity.py): the CUPTI kernel-time cross-check, its 'not available' record, and ghost replay of
Triton launches under the Triton interpreter."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest
import torch

from deltabench.harness.cases import Case
from deltabench.harness.ops import get_op, make_case_inputs
from deltabench.harness.registry import get_impl
from deltabench.runners import cuda_integrity, integrity
from deltabench.runners.closures import build_subject
from deltabench.runners.timing import time_on_host_clock

# An H200-sized job: 20 calls the events timed at 0.412 ms each; its three kernels a call, back to back on one
# stream (each starting 2 us after the previous one ended), busy 0.401 ms of each.
EVENTS_MS = [0.412] * 20
HONEST = [(c * 1_000_000 + a, c * 1_000_000 + b) for c in range(20) for a, b in ((0, 150_000), (152_000, 302_000),
                                                                                  (304_000, 405_000))]  # fmt: skip


def test_busy_time_counts_concurrent_kernels_once() -> None:
    assert cuda_integrity.busy_ns([(0, 100), (50, 150), (50, 60), (400, 500)]) == 250
    assert cuda_integrity.busy_ns([]) == 0


def test_kernels_within_the_events_pass() -> None:
    record = cuda_integrity.kernel_time_record(EVENTS_MS, HONEST)
    assert record.passed and record.gating and record.check == "integrity:kernel_time"
    assert record.value == pytest.approx(0.401 / 0.412, rel=1e-6)


def test_a_stream_left_running_fails() -> None:
    """The same kernels, with the events seeing only a 4 us placeholder a call on the timed stream: the work ran on
    a side stream past each end event."""
    placeholder = [0.004] * 20
    record = cuda_integrity.kernel_time_record(placeholder, HONEST + [(c * 1_000_000, c * 1_000_000 + 4_000)
                                                                      for c in range(20)])  # fmt: skip
    assert not record.passed
    assert "outside the timed events" in record.detail
    # at the bound: 10% over the events, and 3 us a call, still pass; just past it fails
    limit_ns = sum(EVENTS_MS) * 1e6 * 1.1 + 3_000 * 20
    assert cuda_integrity.kernel_time_record(EVENTS_MS, [(0, int(limit_ns))]).passed
    assert not cuda_integrity.kernel_time_record(EVENTS_MS, [(0, int(limit_ns) + 1_000)]).passed


def test_decode_timer_scopes_agree_within_half_a_microsecond_or_three_percent() -> None:
    """The decode timer's call scope (CUDA graph) against its kernel scope (CUPTI sum): H200 figures of a one-kernel
    step (3.30 us a call, 3.12 us of kernel) agree; an adapter's 15.6 us call of 4 kernels summing 4.1 us does not,
    and the record says why without failing the job."""
    close = cuda_integrity.timer_agreement_record(3.30, 3.12, 1.0, 75.0)
    assert close.passed and not close.gating and close.check == "integrity:timer_agreement"
    assert close.value == pytest.approx(0.18) and close.threshold == 0.5
    assert "call 3.30 us" in close.detail and "kernel 3.12 us" in close.detail and "host 75.0 us" in close.detail
    apart = cuda_integrity.timer_agreement_record(15.6, 4.1, 4.0, 90.0)
    assert not apart.passed and "launch gaps" in apart.detail
    # the bound: 0.5 us below 16.7 us a call, 3% above it
    assert cuda_integrity.timer_agreement_record(10.0, 9.51, 1.0, 50.0).passed
    assert not cuda_integrity.timer_agreement_record(10.0, 9.49, 1.0, 50.0).passed
    assert cuda_integrity.timer_agreement_record(340.0, 330.0, 1.0, 400.0).passed
    assert not cuda_integrity.timer_agreement_record(340.0, 329.0, 1.0, 400.0).passed
    none = cuda_integrity.timer_agreement_record(3.3, None, 0, 75.0, "cupti-python is not installed")
    assert none.passed and none.value is None and "not available" in none.detail


def test_a_call_of_several_kernels_agrees_through_its_span_and_reports_its_launch_gaps() -> None:
    """An adapter's 15.6 us call of 4 kernels summing 4.1 us: CUPTI's span of the call (15.4 us) agrees with the
    events, the 11.3 us of launch gaps are reported; a span the events do not see (work left outside the timed call,
    or an events clock running slow) fails, and so does a kernels' sum past the span (work beside the call)."""
    gaps = cuda_integrity.timer_agreement_record(15.6, 4.1, 4.0, 90.0, span_us=15.4)
    assert gaps.passed and "span 15.40 us" in gaps.detail and "launch gaps 11.30 us" in gaps.detail
    assert not cuda_integrity.timer_agreement_record(15.6, 4.1, 4.0, 90.0, span_us=14.9).passed
    beside = cuda_integrity.timer_agreement_record(15.6, 17.0, 4.0, 90.0, span_us=15.5)
    assert not beside.passed and "exceeds their span" in beside.detail


def test_the_replay_span_counts_gaps_inside_a_replay_not_between_replays() -> None:
    """Two replays of two kernels each (ns): 0-10, 15-25 | 1000-1010, 1020-1030: spans 25 + 30, not 1030."""
    intervals = [(1020, 1030), (0, 10), (1000, 1010), (15, 25)]
    assert cuda_integrity.replay_span_ns(intervals, 2) == 55
    assert cuda_integrity.replay_span_ns(intervals, 3) is None  # a replay traced in part
    assert cuda_integrity.replay_span_ns([], 2) is None


def test_without_cupti_the_record_says_not_available() -> None:
    try:
        import cupti  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("cupti-python is installed here")
    with cuda_integrity.KernelTrace() as trace:
        pass
    assert trace.intervals is None and "cupti-python is not installed" in trace.why_not
    record = cuda_integrity.kernel_time_record([], trace.intervals, trace.why_not)
    assert record.passed and not record.gating and record.detail.startswith("not available: cupti-python")


def test_ghost_decisions() -> None:
    assert cuda_integrity.ghost_record(4, False, 1.3, 1e-4).passed  # the kernels' outputs missing: they ran
    computed_elsewhere = cuda_integrity.ghost_record(4, False, 2e-7, 1e-4)
    assert not computed_elsewhere.passed and "computed elsewhere" in computed_elsewhere.detail
    assert not cuda_integrity.ghost_record(4, True, 2e-7, 1e-4).passed  # the last call's buffers handed back
    assert not cuda_integrity.ghost_record(0, False, 2e-7, 1e-4).gating  # no Triton launch: nothing to judge
    assert not cuda_integrity.ghost_record(0, True, 0.0, 1e-4).passed  # ... unless it handed back the last buffers
    assert cuda_integrity.ghost_record(3, False, None, 1e-4, "IndexError").passed  # broke without its kernels


_cached: dict[str, object] = {}


def _cached_triton(q, k, v, g, beta, scale=None, initial_state=None):
    """A Triton impl that runs its kernels once per q tensor, then hands back that output."""
    if _cached.get("q") is not q:
        _cached.update(q=q, out=get_impl("gdn", "triton_chunk")(q, k, v, g, beta, scale=scale,
                                                                 initial_state=initial_state))  # fmt: skip
    return _cached["out"]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter from the start")
@pytest.mark.parametrize(("which", "passes"), [("honest", True), ("cached", False)])
def test_ghost_replay_under_the_interpreter(which: str, passes: bool) -> None:
    """The real ghost call, Triton launches skipped in the interpreter: the honest triton_chunk's outputs go wrong
    (it ran), the cached one's stay the last call's."""
    case = Case(op="gdn", B=1, T=16, H=1, K=8, V=8, dtype="fp32", mode="fwd", device="cpu")
    impl = get_impl("gdn", "triton_chunk")
    inputs = make_case_inputs(get_op("gdn"), case)
    subject = build_subject(impl, case, inputs)
    if which == "cached":
        _cached.clear()
        subject.fn = lambda: _cached_triton(*(subject.held[n] for n in ("q", "k", "v", "g", "beta")))
    subject()  # the first call, untimed, as the job runner makes it (Triton imports what it needs there)
    guard = integrity.TimedCallGuard(impl, case, subject, inputs)
    with torch.no_grad():
        time_on_host_clock(
            subject, clock="cpu_monotonic", budget_s=0.0, target_sem=1.0, min_reps=2, max_reps=2, warmup_s=0.0,
            first_call_s=0.0, guard=guard,
        )  # fmt: skip
    assert guard.ghost is not None and guard.ghost.check == "integrity:ghost"
    assert guard.ghost.passed is passes, guard.ghost.detail
    assert ("launches skipped: outputs off" if passes else "handed back the last timed call's") in guard.ghost.detail


def test_the_wall_clock_record_lets_the_timer_leave_out_only_the_samples_it_declared() -> None:
    """The CUDA timer leaves out the samples of batches taken under a GPU throttle (runners/hwstate.py) and tells
    the guard how many (``dropped``): a timing that lacks exactly those, the rest unchanged and in order, passes;
    one that lacks more, or whose samples were changed, fails."""
    from deltabench.runners.timing import summarize

    case = Case(op="gdn", B=1, T=16, H=1, K=8, V=8, dtype="fp32", mode="fwd", device="cpu")
    impl = get_impl("gdn", "torch_chunk")
    inputs = make_case_inputs(get_op("gdn"), case)
    subject = build_subject(impl, case, inputs)
    subject()
    guard = integrity.TimedCallGuard(impl, case, subject, inputs)
    with torch.no_grad():
        timing = time_on_host_clock(
            subject, clock="cpu_monotonic", budget_s=0.0, target_sem=1.0, min_reps=8, max_reps=8, warmup_s=0.0,
            first_call_s=0.0, guard=guard,
        )  # fmt: skip
    samples = list(timing.samples_ms)
    kept = summarize(samples[:3] + samples[5:], clock="cpu_monotonic")  # two samples of one window left out

    def wall(t: object, dropped: int) -> object:
        guard.dropped = dropped
        (record,) = [r for r in guard.records(t) if r.check == "integrity:wall_clock"]
        return record

    assert wall(timing, 0).passed
    assert wall(kept, 2).passed, wall(kept, 2).detail
    assert "not the ones measured" in wall(kept, 0).detail and not wall(kept, 0).passed
    assert not wall(kept, 1).passed
    changed = summarize([samples[0] * 0.5, *samples[1:3], *samples[5:]], clock="cpu_monotonic")
    assert "not the ones measured" in wall(changed, 2).detail


class _FakeCupti:
    """CUPTI's activity API as cupti-python exposes it, with a device that ran one kernel and one copy; `refuse`
    names the activity kinds it will not enable."""

    class ActivityKind:
        CONCURRENT_KERNEL, MEMCPY, MEMSET = "CONCURRENT_KERNEL", "MEMCPY", "MEMSET"

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.refuse, self.enabled = refuse, []

    def activity_register_callbacks(self, requested: Any, completed: Any) -> None:
        self.completed = completed

    def activity_enable(self, kind: str) -> None:
        if kind in self.refuse:
            raise RuntimeError(f"{kind} not supported")
        self.enabled.append(kind)

    def activity_disable(self, kind: str) -> None:
        self.enabled.remove(kind)

    def activity_flush_all(self, flag: int) -> None:
        ran = [("CONCURRENT_KERNEL", 0, 2_000), ("MEMCPY", 2_500, 262_000), ("MEMSET", 300_000, 300_100)]
        self.completed([types.SimpleNamespace(kind=k, start=a, end=b) for k, a, b in ran])


@pytest.mark.parametrize(("refuse", "traced"), [((), 3), (("MEMCPY", "MEMSET"), 1)])
def test_the_trace_holds_copies_where_cupti_takes_them(
    monkeypatch: pytest.MonkeyPatch, refuse: tuple[str, ...], traced: int
) -> None:
    """A state cloned by a copy is device work of the call (torch_decode's 260 us at B 512 were one): traced with
    the kernels; where CUPTI refuses copies, the kernels are still traced, and every kind is disabled after."""
    fake = _FakeCupti(refuse)
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(cupti=fake))
    monkeypatch.setattr(cuda_integrity, "synchronize_all", lambda: None)
    with cuda_integrity.KernelTrace() as trace:
        pass
    assert trace.intervals is not None and len(trace.intervals) == traced
    assert trace.kinds[0] == "concurrent_kernel" and len(trace.kinds) == traced and fake.enabled == []
