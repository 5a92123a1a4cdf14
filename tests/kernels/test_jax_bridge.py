"""The torch-facing bridge of deltabench's JAX impls in a PyTorch user's training step: the forward runs once per
forward and backward (its residuals kept, the pullback run over them), the gradients are those of the one-program
JAX training step (``jax_fwd_bwd``, which the bridge's backward used to run, the forward again included), and the
residuals live as torch's own saved tensors do.

Impls: gdn and gdn2 ``jax_chunk``, kda's two Pallas kernels (Pallas' interpreter on the CPU), each with an initial
state, a cotangent on the final state and one input that needs no gradient, in float32 and bf16.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's cheap CPU compiler (kernels/common/jax/jax_compile.py): about 10x faster compiles; these shapes run in
# microseconds anyway.
os.environ.setdefault("DELTABENCH_JAX_FAST_COMPILE", "1")

import importlib
from collections.abc import Callable

import pytest
import torch

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from deltabench.harness.ops import get_op  # noqa: E402
from deltabench.kernels.common.jax.jax_bridge import TorchFacingJaxOp, torch_to_jax  # noqa: E402

# op -> impl -> the module attribute of its torch-facing wrapper
IMPLS = {
    ("gdn", "jax_chunk"): "deltabench.kernels.gdn.jax.jax_chunk:gdn_jax_chunk",
    ("gdn2", "jax_chunk"): "deltabench.kernels.gdn2.jax.jax_chunk:gdn2_jax_chunk",
    ("kda", "pallas_chunk"): "deltabench.kernels.gdn2.jax.pallas.chunk:kda_pallas_chunk",
    ("kda", "pallas_gpu_chunk"): "deltabench.kernels.gdn2.jax.pallas.gpu_chunk:kda_pallas_gpu_chunk",
}
B, T, H, K, V = 1, 70, 2, 16, 32  # T: a chunk and a part of one
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _wrapper(target: str) -> TorchFacingJaxOp:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _inputs(op_name: str, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    return get_op(op_name).make_inputs(B, T, H, K, V, dtype=dtype, seed=seed, initial_state=True)


def _counting(core: Callable[..., tuple[jax.Array, jax.Array]], runs: list[int]) -> Callable[..., tuple]:
    """`core`, appending to `runs` each time a compiled program runs its forward (a host callback in the program:
    it counts runs, not traces)."""

    def counted(*args: jax.Array, scale: float | None = None, initial_state: jax.Array | None = None) -> tuple:
        jax.debug.callback(lambda: runs.append(1))
        return core(*args, scale=scale, initial_state=initial_state)

    return counted


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize(("op_name", "impl"), sorted(IMPLS))
def test_gradients_are_the_one_program_training_steps(op_name: str, impl: str, dtype: str) -> None:
    """Through the bridge, every gradient (the initial state's included) equals what ``jax_fwd_bwd`` computes for
    the same cotangents on o and on the final state; the input that needs no gradient gets None."""
    op = _wrapper(IMPLS[op_name, impl])
    names = get_op(op_name).args
    inputs = _inputs(op_name, DTYPES[dtype])
    frozen = "k"  # needs no gradient: the bridge returns None for it
    leaves = {n: inputs[n].clone().requires_grad_(n != frozen) for n in (*names, "initial_state")}
    o, state = op(*(leaves[n] for n in names), initial_state=leaves["initial_state"])
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o.dtype)
    dstate = torch.randn(state.shape, generator=torch.Generator().manual_seed(2))
    wrt = [t for t in leaves.values() if t.requires_grad]
    got = torch.autograd.grad((o.float() * do.float()).sum() + (state * dstate).sum(), wrt)

    args = tuple(torch_to_jax(inputs[n]) for n in names)
    o_ref, state_ref, want = op.jax_fwd_bwd(
        args, torch_to_jax(do), torch_to_jax(inputs["initial_state"]), torch_to_jax(dstate)
    )
    np.testing.assert_array_equal(np.asarray(o_ref.astype(jnp.float32)), o.float().detach().numpy())
    np.testing.assert_array_equal(np.asarray(state_ref), state.detach().numpy())
    want = [w for w, n in zip(want, leaves, strict=True) if n != frozen]
    for name, g, w in zip([n for n in leaves if n != frozen], got, want, strict=True):
        assert g.dtype == leaves[name].dtype and g.shape == leaves[name].shape, name
        # The same jaxpr compiled as two programs rather than one: most gradients come out bitwise equal, the rest
        # within float32 rounding (kda pallas_chunk's dg under the cheap CPU compiles: 2.6e-8 of its largest
        # element, one float32 ulp at most); the bound, two ulps of the largest element.
        w = torch.from_numpy(np.array(w.astype(jnp.float32)))
        ulp = float(w.abs().max()) * 2**-24
        torch.testing.assert_close(g.float(), w, rtol=0, atol=2 * ulp, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize(
    "core_target",
    [
        "deltabench.kernels.gdn.jax.jax_chunk:chunk_gated_delta_rule_jax",
        "deltabench.kernels.gdn2.jax.pallas.gpu_chunk:chunk_kda_pallas_gpu",
    ],
)
def test_the_forward_runs_once_per_forward_and_backward(core_target: str) -> None:
    """A training step through the bridge runs the JAX forward once (it ran twice when the backward re-ran it);
    a call under ``torch.no_grad()`` runs it once and keeps no residuals."""
    module, _, attr = core_target.partition(":")
    core = getattr(importlib.import_module(module), attr)
    op_name = "gdn" if "gated_delta" in attr else "kda"
    spec = get_op(op_name)
    runs: list[int] = []
    op = TorchFacingJaxOp(_counting(core, runs), name=f"test/{attr}", gates=spec.args[3:])
    inputs = _inputs(op_name, torch.float32)
    leaves = [inputs[n].clone().requires_grad_(True) for n in spec.args]
    for step in range(2):  # the first step compiles; the second runs the compiled programs
        runs.clear()
        o, state = op(*leaves)
        grads = torch.autograd.grad(o.sum() + state.sum(), leaves)
        jax.effects_barrier()
        assert len(runs) == 1, f"step {step}: the forward ran {len(runs)} times"
        assert all(g is not None for g in grads)
    runs.clear()
    with torch.no_grad():
        o, _ = op(*leaves)
    jax.effects_barrier()
    assert len(runs) == 1 and o.grad_fn is None
    assert op.jax_vjp._cache_size() == 1  # the no-grad call ran the forward alone (jax_fn), not the one that keeps


def test_residuals_are_freed_after_the_backward_unless_the_graph_is_retained() -> None:
    """As torch's saved tensors: kept for a second backward under ``retain_graph`` (the same gradients), dropped
    after a backward without it, and a backward through the freed graph raises torch's error."""
    op = _wrapper(IMPLS["gdn", "jax_chunk"])
    names = get_op("gdn").args
    leaves = [t.clone().requires_grad_(True) for t in (_inputs("gdn", torch.float32)[n] for n in names)]
    o, _ = op(*leaves)
    node = o.grad_fn
    assert node.pullback is not None
    first = torch.autograd.grad(o.sum(), leaves, retain_graph=True)
    assert node.pullback is not None
    second = torch.autograd.grad(o.sum(), leaves)
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert node.pullback is None
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(o.sum(), leaves)


def test_a_call_with_no_input_needing_a_gradient_keeps_nothing() -> None:
    op = _wrapper(IMPLS["gdn", "jax_chunk"])
    inputs = _inputs("gdn", torch.float32, seed=3)
    o, state = op(*(inputs[n] for n in get_op("gdn").args))
    assert o.grad_fn is None and state.grad_fn is None and not o.requires_grad
