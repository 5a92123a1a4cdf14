"""JAX timer: native JAX timing of a jitted function on any backend (CPU, GPU, TPU), with the shared statistics.

The rules are those of every deltabench timer (:mod:`.timing`), with JAX's specifics:

* the function is jitted once and compiled ahead of the first sample (``jit(...).lower(...).compile()``); the
  compilation plus the first call is ``compile_s``, reported apart from the samples;
* JAX dispatches asynchronously, so every sample is ``fn()`` followed by ``jax.block_until_ready`` of its outputs
  on a monotonic nanosecond clock; samples are labelled ``clock="jax"``;
* inputs are JAX arrays placed on the device before timing: nothing crosses between torch and JAX in the timed
  region.

Memory: XLA's buffer assignment of the compiled program gives the call's extra memory exactly (temporaries plus
outputs, the inputs apart) on every backend; a training step is two programs, the forward keeping its residuals
and the pullback over them (:func:`training_step_memory`); the device's own counters
(``memory_stats()['peak_bytes_in_use']``, GPU and TPU only) are read by :func:`device_peak_bytes`.

The job runner reaches this timer through :data:`deltabench.runners.timing.TIMERS` (:func:`time_job`), for a JAX
impl on any platform.

Importing this module imports JAX (the torch runners never import it).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

import jax

from deltabench.harness.cases import has_backward
from deltabench.harness.document import MemoryStats, TimingStats
from deltabench.kernels.common.jax import jax_bridge

from .timing import HOST_CLOCK, TIMING_DEFAULTS, Timed, TimerRequest, time_on_host_clock, timer_for

__all__ = [
    "CLOCK",
    "XLA_MEMORY_METHOD",
    "compiled_memory",
    "device_peak_bytes",
    "has_jax_fn",
    "jax_ops_of",
    "run_timing",
    "time_callable",
    "time_job",
    "training_step_memory",
]

CLOCK = "jax"
XLA_MEMORY_METHOD = (
    "XLA buffer assignment of the compiled programs: temporaries + outputs, net of the inputs "
    "(fwd+bwd: the forward's, or its outputs and residuals held + the pullback's, the larger)"
)


def time_callable(
    fn: Callable[[], Any],
    *,
    budget_s: float = TIMING_DEFAULTS.budget_s,
    target_sem: float = TIMING_DEFAULTS.target_sem,
    min_reps: int = TIMING_DEFAULTS.min_reps,
    max_reps: int = TIMING_DEFAULTS.max_reps,
    warmup_s: float = TIMING_DEFAULTS.warmup_s,
    first_call_s: float | None = None,
) -> TimingStats:
    """Time the zero-argument closure `fn`, which calls jitted JAX code, blocking on its outputs each sample.

    The first call (JAX traces and compiles there) is timed apart as ``compile_s``; a caller that compiled
    ahead (as :func:`run_timing` does) passes that duration as `first_call_s`. Warm-up and repetitions follow
    :func:`deltabench.runners.timing.adaptive_samples`.

    Example::

        f = jax.jit(chunk_gated_delta_rule_jax)
        stats = time_callable(lambda: f(q, k, v, g, beta), budget_s=0.5)
        stats.median_ms, stats.compile_s
    """
    return time_on_host_clock(
        lambda: jax.block_until_ready(fn()),
        clock=CLOCK,
        budget_s=budget_s,
        target_sem=target_sem,
        min_reps=min_reps,
        max_reps=max_reps,
        warmup_s=warmup_s,
        first_call_s=first_call_s,
    )


def device_peak_bytes(device: jax.Device | None = None) -> int | None:
    """The device's ``peak_bytes_in_use`` since the process started (GPU, TPU), or None where JAX keeps no
    such counter (the CPU). It cannot be reset: only a fresh process gives one call's peak."""
    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # some backends raise rather than return None
        return None
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return int(stats["peak_bytes_in_use"])


def compiled_memory(compiled: Any) -> MemoryStats | None:
    """Extra memory of one call of a compiled JAX program (``jit(f).lower(...).compile()``), from XLA's buffer
    assignment: temporaries plus outputs (less outputs aliased to inputs), the inputs reported apart."""
    measured = _program_bytes(compiled)
    if measured is None:
        return None
    return MemoryStats(peak_bytes=measured[0], inputs_bytes=measured[1], method=XLA_MEMORY_METHOD)


def _program_bytes(compiled: Any) -> tuple[int, int] | None:
    """``(extra, arguments)`` bytes of one call of a compiled program by XLA's buffer assignment (extra:
    temporaries plus outputs, less outputs aliased to inputs), or None where XLA gives no analysis."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:
        return None
    if analysis is None:
        return None
    extra = analysis.temp_size_in_bytes + analysis.output_size_in_bytes - analysis.alias_size_in_bytes
    return int(max(extra, 0)), int(analysis.argument_size_in_bytes)


def training_step_memory(forward: Any, pullback: Any) -> MemoryStats | None:
    """Extra memory of the forward that keeps its residuals (compiled ``jax_vjp``) then the pullback over them
    (compiled ``jax_pull``): the larger of the forward's and of the pullback's plus all the forward returned
    (outputs and residuals, held from one to the other, as a training framework holds them)."""
    fwd, bwd = _program_bytes(forward), _program_bytes(pullback)
    if fwd is None or bwd is None:
        return None
    held = forward.memory_analysis().output_size_in_bytes
    return MemoryStats(peak_bytes=max(fwd[0], held + bwd[0]), inputs_bytes=fwd[1], method=XLA_MEMORY_METHOD)


def jax_ops_of(impl: Any) -> Any:
    """The object behind a registered impl that carries ``jax_fn`` / ``jax_fwd_bwd`` (resolving a lazy import)."""
    fn = getattr(impl, "fn", impl)
    target = getattr(fn, "__deltabench_target__", None)
    if target is not None:
        module, _, attr = target.partition(":")
        fn = getattr(importlib.import_module(module), attr)
    if getattr(fn, "jax_fn", None) is None:
        raise TypeError(f"{getattr(impl, 'name', impl)!r} exposes no pure-JAX `jax_fn` to time natively")
    return fn


def has_jax_fn(impl: Any) -> bool:
    """Whether the impl (possibly a lazy import) exposes the pure-JAX ``jax_fn`` this timer needs."""
    try:
        jax_ops_of(impl)
    except Exception:  # no jax_fn, or its module does not import: the impl is timed through its torch face
        return False
    return True


def time_job(request: TimerRequest) -> Timed:
    """The table's JAX timer: `request`'s impl timed natively (:func:`run_timing`) on the JAX device its case names.

    A JAX impl without a pure-JAX ``jax_fn`` (a user's torch-facing wrapper) is timed through its torch-facing
    subject instead, by the clock of the platform its torch tensors are on: CUDA events on a GPU, the host clock
    otherwise (torch has no TPU: there the call returns only once JAX is done, so the host clock measures it).
    """
    if not has_jax_fn(request.impl):
        platform = request.case.device.partition(":")[0]
        return (timer_for("torch", platform) if platform != "tpu" else HOST_CLOCK)(request)
    timing, memory = run_timing(request.impl, request.case, request.inputs, **request.rules)
    return Timed(timing, memory, "timed natively in JAX (runners.jax)")


def _jax_device(name: str) -> jax.Device:
    """The JAX device a case's device names (``cpu``, ``cuda``, ``cuda:1``, ``tpu``)."""
    platform, _, index = name.partition(":")
    return jax_bridge.jax_device(platform, int(index) if index else 0)


def _to_jax(x: Any, device: jax.Device) -> jax.Array:
    """A torch tensor or array-like as a JAX array committed to `device`."""
    if hasattr(x, "detach"):  # a torch tensor: zero-copy where the bridge can
        x = jax_bridge.torch_to_jax(x)
    return jax.device_put(x, device)


def run_timing(
    impl: Any,
    case: Any,
    inputs: dict[str, Any],
    *,
    budget_s: float = TIMING_DEFAULTS.budget_s,
    target_sem: float = TIMING_DEFAULTS.target_sem,
    min_reps: int = TIMING_DEFAULTS.min_reps,
    max_reps: int = TIMING_DEFAULTS.max_reps,
    warmup_s: float = TIMING_DEFAULTS.warmup_s,
) -> tuple[TimingStats, MemoryStats | None]:
    """Time `impl` natively in JAX on `case` and measure its memory; returns ``(TimingStats, MemoryStats|None)``.

    Args:
        impl: a registered impl (or the wrapper itself) exposing ``jax_fn`` and ``jax_fwd_bwd``
            (see ``kernels/common/jax/jax_bridge.TorchFacingJaxOp``).
        case: the job's ``Case`` (its op, mode and device are read).
        inputs: the op's inputs by argument name (torch tensors, as ``OpSpec.make_inputs`` returns them, or JAX
            arrays); ``initial_state`` is used when present.
        budget_s, target_sem, min_reps, max_reps, warmup_s: the shared timing rules (:mod:`.timing`).

    Modes: ``fwd`` times ``jax_fn``; ``fwd+bwd`` times ``jax_vjp`` then ``jax_pull``, the gradient of
    ``sum(o * do)`` for the fixed random ``do`` the torch runners use: the two programs the torch-facing call runs
    (so the first call compiled them and the gate checked them), the forward's residuals held between them;
    ``bwd`` times ``jax_pull`` alone over residuals computed once.
    """
    from deltabench.harness.ops import get_op

    from .closures import cotangent

    ops = jax_ops_of(impl)
    device = _jax_device(case.device)
    arg_names = get_op(case.op).args
    args = tuple(_to_jax(inputs[n], device) for n in arg_names)
    h0 = inputs.get("initial_state")
    h0 = None if h0 is None else _to_jax(h0, device)

    t0 = time.perf_counter()
    if not has_backward(case.mode):  # fwd, and decode: a forward from the state its inputs hold
        compiled = ops.jax_fn.lower(*args, initial_state=h0).compile()
        fn, memory = (lambda: compiled(*args, initial_state=h0)), compiled_memory(compiled)
    else:
        do_torch = cotangent(case, inputs["v"]) if hasattr(inputs["v"], "detach") else None
        do = (
            _to_jax(do_torch, device)
            if do_torch is not None
            else jax.random.normal(jax.random.key(case.seed), args[2].shape, args[2].dtype)
        )
        # zeros on the final state, as the torch-facing backward passes when the loss leaves it unused
        B, _, H, K = args[0].shape
        dfinal = jax.device_put(jax.numpy.zeros((B, H, K, args[2].shape[-1]), jax.numpy.float32), device)
        forward = ops.jax_vjp.lower(args, h0).compile()
        _o, _s, residuals = forward(args, h0)
        pull = ops.jax_pull.lower(residuals, do, dfinal).compile()
        if case.mode == "fwd+bwd":

            def fn() -> Any:
                _o, _s, pullback = forward(args, h0)
                return pull(pullback, do, dfinal)

            memory = training_step_memory(forward, pull)
        else:
            fn, memory = (lambda: pull(residuals, do, dfinal)), compiled_memory(pull)
    jax.block_until_ready(fn())
    first_call_s = time.perf_counter() - t0

    timing = time_callable(
        fn,
        budget_s=budget_s,
        target_sem=target_sem,
        min_reps=min_reps,
        max_reps=max_reps,
        warmup_s=warmup_s,
        first_call_s=first_call_s,
    )
    return timing, memory
