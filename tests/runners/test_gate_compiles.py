"""How the runner's gate compiles a JAX impl on the CPU: the programs the job times are compiled as usual and
checked as such; the other programs the gate runs once each are compiled with XLA's cheap settings, and the checks
they serve still catch what they are there to catch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

jax = pytest.importorskip("jax")

from deltabench.harness.cases import Case  # noqa: E402
from deltabench.harness.ops import get_op  # noqa: E402
from deltabench.harness.registry import register_impl  # noqa: E402
from deltabench.kernels.common.jax.jax_bridge import TorchFacingJaxOp, cheap_compiles  # noqa: E402
from deltabench.kernels.common.jax.jax_compile import FAST_CPU_COMPILE_FLAGS, cheap_cpu_compile_options  # noqa: E402
from deltabench.kernels.gdn.jax.jax_chunk import chunk_gated_delta_rule_jax  # noqa: E402
from deltabench.runners.base import JobSpec  # noqa: E402
from deltabench.runners.job import execute  # noqa: E402

SPEC = get_op("gdn")
_SMALL_JOB = {"gate": {"seeds": 1, "extra_seed": False}, "timing": {"budget_s": 0.02, "min_reps": 2, "warmup_s": 0.0}}


def _op(name: str, core=chunk_gated_delta_rule_jax) -> TorchFacingJaxOp:
    """A JAX gdn op of its own: jit shares compiled programs among the wrappers of one function, so each op here
    wraps a fresh one, and what it compiled is its own."""

    def fresh(q, k, v, g, beta, scale=None, initial_state=None):
        return core(q, k, v, g, beta, scale=scale, initial_state=initial_state)

    return TorchFacingJaxOp(fresh, name=name, gates=("g", "beta"))


def test_the_cheap_options_are_the_fast_compile_flags() -> None:
    assert cheap_cpu_compile_options() == {
        "xla_cpu_use_fusion_emitters": False,
        "xla_backend_optimization_level": 0,
        "xla_llvm_disable_expensive_passes": True,
    }
    assert len(cheap_cpu_compile_options()) == len(FAST_CPU_COMPILE_FLAGS)


def test_inside_new_programs_compile_cheaply_and_those_compiled_before_are_reused() -> None:
    op = _op("test/cheap")
    x = SPEC.make_inputs(1, 20, 2, 8, 8, seed=1)
    args = [x[n] for n in SPEC.args]
    o_usual, _ = op(*args)  # outside: as usual
    with cheap_compiles():
        o_again, _ = op(*args)  # the same program: reused, not compiled again
        o_scaled, _ = op(*args, scale=0.3)  # a new one: cheap
        leaves = [t.clone().requires_grad_(True) for t in args]
        o, state = op(*leaves)
        grads = torch.autograd.grad((o * o.detach()).sum() + state.sum(), leaves)
    assert op.jax_fn._cache_size() == 1
    assert op._cheap["fn"]._cache_size() == 1
    for kind, usual in (("vjp", op.jax_vjp), ("pull", op.jax_pull)):
        assert usual._cache_size() == 0 and op._cheap[kind]._cache_size() == 1
    torch.testing.assert_close(o_again, o_usual, rtol=0, atol=0)
    # the cheap programs compute what the usual ones do, to float32 rounding
    o_scaled_usual, _ = op(*args, scale=0.3)
    assert op.jax_fn._cache_size() == 2
    torch.testing.assert_close(o_scaled, o_scaled_usual, rtol=1e-5, atol=1e-6)
    leaves = [t.clone().requires_grad_(True) for t in args]
    o, state = op(*leaves)
    usual_grads = torch.autograd.grad((o * o.detach()).sum() + state.sum(), leaves)
    assert op.jax_vjp._cache_size() == 1 and op.jax_pull._cache_size() == 1
    for got, want in zip(grads, usual_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_the_job_gate_compiles_cheaply_beyond_the_timed_program(mode: str) -> None:
    op = _op(f"test/gate_{mode}")
    name = f"cheap_gate_{mode.replace('+', '_')}"
    register_impl("gdn", name, backend="jax", devices=("cpu",), dtypes=("fp32",))(op)
    case = Case("gdn", 1, 20, 2, 8, 8, dtype="fp32", mode=mode, device="cpu")
    result = execute(JobSpec.for_case(case, name, **_SMALL_JOB))
    assert result.status == "ok", result.reason
    kinds = {"fn": op.jax_fn} if mode == "fwd" else {"vjp": op.jax_vjp, "pull": op.jax_pull}
    for kind, usual in kinds.items():
        # the first call's programs, the ones timed; the gate compiled no other as usual
        assert usual._cache_size() == 1
        # other lengths, an initial state, a non-default scale: compiled with the cheap options
        assert op._cheap[kind]._cache_size() >= 4
    assert "timed natively in JAX" in result.notes


def _ignores_scale(q, k, v, g, beta, scale=None, initial_state=None):
    """Right at the default scale (the first call's and the timed program's), wrong at any other."""
    return chunk_gated_delta_rule_jax(q, k, v, g, beta, scale=None, initial_state=initial_state)


def test_a_bug_only_a_cheap_program_shows_fails_the_job() -> None:
    op = _op("test/ignores_scale", _ignores_scale)
    register_impl("gdn", "cheap_gate_planted_scale", backend="jax", devices=("cpu",), dtypes=("fp32",))(op)
    case = Case("gdn", 1, 20, 2, 8, 8, dtype="fp32", mode="fwd", device="cpu")
    result = execute(JobSpec.for_case(case, "cheap_gate_planted_scale", **_SMALL_JOB))
    assert result.status == "incorrect"
    failed = [r for r in result.verification if r.gating and not r.passed]
    assert failed and all("scale=0.6/sqrt(K)" in (r.reference or "") for r in failed if r.check == "output")
    assert op._cheap["fn"]._cache_size() >= 1 and op.jax_fn._cache_size() == 1


TIMER_SHARES = """
import sys, jax, torch
from pathlib import Path
from deltabench.harness.cases import Case
from deltabench.harness.ops import get_op
from deltabench.harness.registry import get_impl
from deltabench.runners.closures import build_subject
from deltabench.runners.jax import run_timing

jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # every program written: a count of programs
cache = Path(sys.argv[1])
case = Case("gdn", 1, 20, 2, 8, 8, dtype="fp32", mode="fwd+bwd", device="cpu")
inputs = get_op("gdn").make_inputs(1, 20, 2, 8, 8, seed=0)
impl = get_impl("gdn", "jax_chunk")
build_subject(impl, case, inputs)()
programs = lambda: [len(list(cache.glob(f"jit_{name}-*"))) for name in ("vjp", "pull", "fwd_bwd")]
after_first_call = programs()
run_timing(impl, case, inputs, budget_s=0.01, min_reps=1, warmup_s=0.0)
print(*after_first_call, *programs())
"""


def test_the_timer_runs_the_fwd_bwd_programs_of_the_first_call(tmp_path: Path) -> None:
    """In a fresh process with a persistent cache that keeps every program: the JAX timer's fwd+bwd programs (the
    forward keeping its residuals, the pullback) are those the first call (the torch-facing forward and backward)
    compiled: hits, no entry of their own, and no one-program training step compiled by either."""
    env = {**os.environ, "DELTABENCH_JAX_CACHE_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", TIMER_SHARES, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1", "0", "1", "1", "0"]
