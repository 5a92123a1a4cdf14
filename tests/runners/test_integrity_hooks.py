"""``integrity:hooks`` and the guard's per-call logic, on real calls (no worker process): what the interpreter watch
refuses, who may end it, what the guard does before each call and when it decides to sample one."""

from __future__ import annotations

import ctypes
import gc
import signal
import sys

import pytest
import torch

from deltabench.harness.cases import Case
from deltabench.harness.ops import get_op, make_case_inputs
from deltabench.harness.registry import get_impl
from deltabench.runners import integrity, integrity_hooks
from deltabench.runners.closures import build_subject
from deltabench.runners.timing import time_on_host_clock


def test_the_watch_refuses_introspection_and_notes_it() -> None:
    token = integrity_hooks.arm()
    try:
        with pytest.raises(integrity_hooks.Refused):
            gc.get_objects()
        with pytest.raises(integrity_hooks.Refused):
            sys._getframe(0)
        try:
            raise ValueError
        except ValueError as exc:
            with pytest.raises(integrity_hooks.Refused):
                _ = exc.__traceback__.tb_frame
        with pytest.raises(integrity_hooks.Refused):
            ctypes.c_long.from_address(id(token))
        ctypes.addressof(ctypes.c_long(1))  # ctypes itself is left alone (some kernels launch through it)
        sum(range(10))  # so is an ordinary call
    finally:
        noted = integrity_hooks.disarm(token)
    assert noted == ["gc.get_objects", "sys._getframe", "tb_frame of a traceback", "ctypes.cdata"]
    gc.get_objects()  # disarmed: allowed again


def test_only_the_token_ends_the_watch() -> None:
    token = integrity_hooks.arm()
    try:
        with pytest.raises(integrity_hooks.Refused):
            integrity_hooks.arm()  # nobody re-arms it meanwhile
        assert integrity_hooks.disarm(object()) is None
        with pytest.raises(integrity_hooks.Refused):
            gc.get_referrers(token)  # still armed
    finally:
        assert integrity_hooks.disarm(token) is None  # the attempts are reported: no clean list of refusals
    token = integrity_hooks.arm()
    with pytest.raises(integrity_hooks.Refused):
        gc.get_referrers(token)
    assert integrity_hooks.disarm(token) == ["gc.get_referrers"]


def test_no_audit_hook_after_the_watch() -> None:
    """Another audit hook could read the token off the arm event: none is added."""
    seen: list[str] = []
    sys.addaudithook(lambda event, args: seen.append(event))
    integrity_hooks.disarm(integrity_hooks.arm())
    assert seen == []


def test_the_state_names_an_armed_timer_and_a_profile_function() -> None:
    before = integrity_hooks.InterpreterState()
    assert before.changes(before) == []
    signal.setitimer(signal.ITIMER_VIRTUAL, 10.0)
    sys.setprofile(lambda *a: None)
    try:
        now = integrity_hooks.InterpreterState()
    finally:
        sys.setprofile(None)
        signal.setitimer(signal.ITIMER_VIRTUAL, 0.0)
    assert now.changes(before) == ["interval timer VIRTUAL armed", "a profile or trace function is set"]


def _guarded(impl_call, *, reps: int = 40) -> integrity.TimedCallGuard:
    """A guard over `impl_call` (gdn's signature) timed for `reps` calls at a small case."""
    case = Case(op="gdn", B=1, T=16, H=1, K=8, V=8, dtype="fp32", mode="fwd", device="cpu")
    inputs = make_case_inputs(get_op("gdn"), case)
    impl = get_impl("gdn", "torch_chunk")
    subject = build_subject(impl, case, inputs)
    subject.fn = lambda: impl_call(*(subject.held[n] for n in ("q", "k", "v", "g", "beta")))
    guard = integrity.TimedCallGuard(impl, case, subject, inputs)
    time_on_host_clock(
        subject, clock="cpu_monotonic", budget_s=10.0, target_sem=0.0, min_reps=reps, max_reps=reps,
        warmup_s=0.0, first_call_s=0.0, guard=guard,
    )  # fmt: skip
    return guard


def test_every_call_finds_its_last_output_poisoned() -> None:
    """Not only the sampled ones: a poisoned output tells an impl nothing about which calls are re-checked."""
    impl = get_impl("gdn", "torch_chunk")
    seen: list[bool] = []
    last: list = []

    def call(*args):
        seen.append(bool(last) and bool(torch.isnan(last[-1][0]).any()))
        last.append(impl(*args))
        return last[-1]

    guard = _guarded(call)
    assert len(seen) >= 40 and all(seen[1:]) and not seen[0]
    assert all(r.passed for r in guard.records(None) if r.check != "integrity:wall_clock")


def test_a_sampled_call_looks_like_any_other_before_it_returns() -> None:
    """The guard acts on a sampled call only after it returned: the state an impl can see before the call (the
    guard's snapshots) is the same whether or not it will be sampled."""
    impl = get_impl("gdn", "torch_chunk")
    snapshots_at_entry: list[int] = []
    holder: list[integrity.TimedCallGuard] = []

    def call(*args):
        if holder:
            snapshots_at_entry.append(len(holder[0].snapshots))
        return impl(*args)

    # the guard made by _guarded is needed inside the calls: build it the same way, then time with it
    case = Case(op="gdn", B=1, T=16, H=1, K=8, V=8, dtype="fp32", mode="fwd", device="cpu")
    inputs = make_case_inputs(get_op("gdn"), case)
    subject = build_subject(impl, case, inputs)
    subject.fn = lambda: call(*(subject.held[n] for n in ("q", "k", "v", "g", "beta")))
    guard = integrity.TimedCallGuard(impl, case, subject, inputs)
    holder.append(guard)
    time_on_host_clock(
        subject, clock="cpu_monotonic", budget_s=10.0, target_sem=0.0, min_reps=40, max_reps=40,
        warmup_s=0.0, first_call_s=0.0, guard=guard,
    )  # fmt: skip
    sampled = sorted(s.index for s in guard.snapshots)
    assert sampled and sampled[0] < 4
    for i in sampled:  # at a sampled call's entry, the snapshots of the calls before it only
        assert snapshots_at_entry[i] == sum(1 for j in sampled if j < i)
