"""One timer interface: the table picks a timer by backend and platform, and the timing defaults live in one place."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("DELTABENCH_JAX_FAST_COMPILE", "1")  # XLA's cheap CPU compiler: these shapes are tiny

import pytest

from deltabench.harness.cases import Case
from deltabench.harness.devices import PLATFORMS
from deltabench.harness.ops import get_op, make_case_inputs
from deltabench.harness.registry import BACKENDS, get_impl
from deltabench.harness.suites import TimingSettings
from deltabench.runners import cpu
from deltabench.runners.closures import build_subject
from deltabench.runners.timing import (
    CUDA_EVENTS,
    DECODE_GRAPH,
    HOST_CLOCK,
    JAX_NATIVE,
    TIMERS,
    TIMING_DEFAULTS,
    TimerRequest,
    timer_for,
)

# What each (backend, platform) is timed by; None: no timer (torch has no TPU, so a torch-facing impl there
# must not be timed on the host and filed as a TPU result).
EXPECTED = {
    ("torch", "cpu"): HOST_CLOCK,
    ("triton", "cpu"): HOST_CLOCK,
    ("cuda", "cpu"): HOST_CLOCK,
    ("jax", "cpu"): JAX_NATIVE,
    ("torch", "cuda"): CUDA_EVENTS,
    ("triton", "cuda"): CUDA_EVENTS,
    ("cuda", "cuda"): CUDA_EVENTS,
    ("jax", "cuda"): JAX_NATIVE,
    ("torch", "tpu"): None,
    ("triton", "tpu"): None,
    ("cuda", "tpu"): None,
    ("jax", "tpu"): JAX_NATIVE,
}


def test_the_expectations_cover_every_backend_on_every_platform() -> None:
    assert set(EXPECTED) == {(b, p) for b in BACKENDS for p in PLATFORMS}


@pytest.mark.parametrize(("backend", "platform"), list(EXPECTED), ids=[f"{b}-{p}" for b, p in EXPECTED])
def test_the_table_picks_the_timer_of_each_backend_on_each_platform(backend: str, platform: str) -> None:
    expected = EXPECTED[(backend, platform)]
    if expected is None:
        with pytest.raises(ValueError, match=f"no timer for a {backend} impl on {platform}"):
            timer_for(backend, platform)
    else:
        assert timer_for(backend, platform) is expected
        assert timer_for(backend, f"{platform}:1") is expected  # a device's index does not change its timer


@pytest.mark.parametrize(("backend", "platform"), list(EXPECTED), ids=[f"{b}-{p}" for b, p in EXPECTED])
def test_a_decode_step_on_a_gpu_is_timed_by_graph_replays(backend: str, platform: str) -> None:
    """Mode decode of a torch-facing impl on a GPU (a few microseconds, under a host synchronisation) goes to the
    decode timer; every other mode there, and decode anywhere else, keeps the table's timer."""
    expected = EXPECTED[(backend, platform)]
    if expected is None:
        with pytest.raises(ValueError, match="no timer"):
            timer_for(backend, platform, "decode")
        return
    want = DECODE_GRAPH if expected is CUDA_EVENTS else expected
    assert timer_for(backend, platform, "decode") is want
    assert timer_for(backend, f"{platform}:0", "decode") is want
    for mode in ("fwd", "fwd+bwd", "bwd"):
        assert timer_for(backend, platform, mode) is expected


def test_the_timers_label_their_samples_with_their_clock() -> None:
    assert (HOST_CLOCK.clock, CUDA_EVENTS.clock, JAX_NATIVE.clock) == ("cpu_monotonic", "cuda_events", "jax")
    assert DECODE_GRAPH.clock == "cuda_graph"  # a replay of many calls, as the CUDA timer's graph mode labels it
    assert set(TIMERS.values()) == {HOST_CLOCK, CUDA_EVENTS, JAX_NATIVE}


@pytest.mark.parametrize("timer", [HOST_CLOCK, CUDA_EVENTS, JAX_NATIVE, DECODE_GRAPH], ids=lambda t: t.name)
def test_each_timers_entry_point_resolves(timer) -> None:
    if timer is JAX_NATIVE:
        pytest.importorskip("jax")
    fn = timer.load()
    assert callable(fn) and f"{fn.__module__}:{fn.__name__}" == timer.target


def _request(impl_name: str, settings: TimingSettings) -> TimerRequest:
    case = Case("gdn", 1, 16, 1, 8, 8, dtype="fp32", mode="fwd", device="cpu")
    impl = get_impl("gdn", impl_name)
    inputs = make_case_inputs(get_op("gdn"), case)
    subject = build_subject(impl, case, inputs)
    subject()
    return TimerRequest(subject, impl, case, inputs, settings, first_call_s=0.125)


def test_a_torch_job_on_the_cpu_is_timed_on_the_host_clock_with_its_settings() -> None:
    settings = TimingSettings(budget_s=0.01, min_reps=7, max_reps=7, warmup_s=0.0)
    timed = timer_for("torch", "cpu")(_request("torch_chunk", settings))
    assert timed.timing.clock == "cpu_monotonic"
    assert len(timed.timing.samples_ms) == 7 and timed.timing.stop_reason in {"max_reps", "sem<0.50%"}
    assert timed.timing.compile_s == 0.125  # the job's own first call, not a second one
    assert timed.memory is None and timed.note == ""


def test_the_jax_timer_times_a_jax_impl_natively_and_a_torch_facing_one_on_the_host() -> None:
    pytest.importorskip("jax")
    settings = TimingSettings(budget_s=0.01, min_reps=3, max_reps=3, warmup_s=0.0)
    native = timer_for("jax", "cpu")(_request("jax_chunk", settings))
    assert native.timing.clock == "jax" and len(native.timing.samples_ms) == 3
    assert native.memory is not None and native.note == "timed natively in JAX (runners.jax)"
    # No pure-JAX function to call (a torch-facing wrapper): its torch call, on the clock of the CPU.
    wrapped = timer_for("jax", "cpu")(_request("torch_chunk", settings))
    assert wrapped.timing.clock == "cpu_monotonic" and len(wrapped.timing.samples_ms) == 3


def test_the_timing_defaults_live_in_one_place() -> None:
    """A suite's unset [timing] fields and every timer's keyword defaults are TIMING_DEFAULTS'."""
    shared = dataclasses.asdict(TIMING_DEFAULTS)
    settings = TimingSettings().model_dump()
    assert {k: settings[k] for k in settings if k in shared} == {k: v for k, v in shared.items() if k in settings}
    from deltabench.runners import cuda

    timers = [cpu.time_callable, cuda.time_callable]
    if importlib.util.find_spec("jax") is not None:
        from deltabench.runners import jax as jax_runner

        timers += [jax_runner.time_callable, jax_runner.run_timing]
    for fn in timers:
        for name, param in inspect.signature(fn).parameters.items():
            if name in shared:
                assert param.default == shared[name], f"{fn.__module__}.{fn.__name__}: {name}"
