"""The JAX timer: sane statistics, compile time apart, XLA memory figures, and run_timing in every mode."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's cheap CPU compiler (kernels/common/jax/jax_compile.py): about 10x faster compiles; these shapes run in
# microseconds anyway.
os.environ.setdefault("DELTABENCH_JAX_FAST_COMPILE", "1")

import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from deltabench.harness.cases import Case  # noqa: E402
from deltabench.harness.ops import get_op, make_case_inputs  # noqa: E402
from deltabench.harness.registry import get_impl  # noqa: E402
from deltabench.runners import jax as jax_runner  # noqa: E402

QUICK = {"budget_s": 0.05, "min_reps": 5, "max_reps": 200, "warmup_s": 0.05}


def assert_sane(stats, *, min_reps: int = 5) -> None:
    """What every timing must satisfy, whatever the machine's load."""
    assert stats.clock == "jax"
    assert len(stats.samples_ms) >= min_reps
    assert all(s > 0 for s in stats.samples_ms)
    assert min(stats.samples_ms) <= stats.q1_ms <= stats.median_ms <= stats.q3_ms <= max(stats.samples_ms)
    assert stats.compile_s is not None and stats.compile_s > 0
    assert stats.warmup >= 1
    assert stats.stop_reason in {"sem<0.50%", "budget", "max_reps"}
    assert stats.l2_flush is False


def test_time_callable_times_the_compiled_call_and_reports_compilation_apart() -> None:
    x = jnp.ones((256, 256), jnp.float32)
    f = jax.jit(lambda a: jnp.tanh(a @ a) @ a)
    stats = jax_runner.time_callable(lambda: f(x), **QUICK)
    assert_sane(stats)
    # compilation happened in the first call, which is no sample: a later call is far faster than it
    assert stats.compile_s * 1e3 > stats.median_ms


def test_time_callable_blocks_on_the_result() -> None:
    """Asynchronous dispatch must not hide the work: a 16x larger matmul takes measurably longer."""
    small, big = jnp.ones((64, 64)), jnp.ones((1024, 1024))
    f = jax.jit(lambda a: a @ a)
    t_small = jax_runner.time_callable(lambda: f(small), **QUICK).median_ms
    t_big = jax_runner.time_callable(lambda: f(big), **QUICK).median_ms
    assert t_big > 2 * t_small


def test_time_callable_takes_a_first_call_timed_elsewhere() -> None:
    f = jax.jit(lambda a: a * 2)
    x = jnp.ones(8)
    f(x).block_until_ready()
    stats = jax_runner.time_callable(lambda: f(x), first_call_s=1.25, **QUICK)
    assert stats.compile_s == 1.25


def test_device_peak_bytes_is_an_int_or_none() -> None:
    peak = jax_runner.device_peak_bytes()
    # the CPU keeps no such counter; GPUs and TPUs do
    assert peak is None if jax.devices()[0].platform == "cpu" else isinstance(peak, int) and peak > 0


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd", "bwd"])
def test_run_timing_times_a_registered_jax_impl(mode: str) -> None:
    case = Case("gdn", 1, 70, 2, 8, 8, mode=mode, initial_state=True)
    inputs = get_op("gdn").make_inputs(1, 70, 2, 8, 8, seed=0, initial_state=True)
    stats, memory = jax_runner.run_timing(get_impl("gdn", "jax_chunk"), case, inputs, **QUICK)
    assert_sane(stats)
    assert memory is not None and memory.peak_bytes > 0
    assert memory.method == jax_runner.XLA_MEMORY_METHOD
    if mode == "fwd":
        # the program's arguments are exactly the inputs (q, k, v, g, beta, initial_state)
        assert memory.inputs_bytes == sum(t.numel() * t.element_size() for t in inputs.values())
        # its extra memory holds at least the outputs: o [B,T,H,V] and the final state [B,H,K,V], float32
        assert memory.peak_bytes >= (70 * 2 * 8 + 2 * 8 * 8) * 4


def test_run_timing_rejects_an_impl_without_pure_jax_functions() -> None:
    case = Case("gdn", 1, 8, 1, 4, 4)
    inputs = get_op("gdn").make_inputs(1, 8, 1, 4, 4)
    with pytest.raises(TypeError, match="jax_fn"):
        jax_runner.run_timing(get_impl("gdn", "torch_recurrent"), case, inputs, **QUICK)


def test_run_timing_times_a_decode_step_as_the_forward() -> None:
    """Mode decode is the forward from the given state: the compiled program's arguments are exactly the inputs
    (a pullback's would be its residuals and the cotangents)."""
    case = Case("gdn", 2, 4, 2, 8, 8, mode="decode")
    inputs = make_case_inputs(get_op("gdn"), case)
    stats, memory = jax_runner.run_timing(get_impl("gdn", "jax_chunk"), case, inputs, **QUICK)
    assert_sane(stats)
    assert memory is not None
    assert memory.inputs_bytes == sum(t.numel() * t.element_size() for t in inputs.values())
