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


@pytest.mark.parametrize("used", ["o", "final_state"])
def test_an_output_the_loss_leaves_unused_gets_a_zero_cotangent(used: str) -> None:
    """For an output the loss does not use, torch hands the backward zeros (it materialises missing gradients):
    the gradients are the one-program step's with a zero cotangent there."""
    op = _wrapper(IMPLS["gdn", "jax_chunk"])
    names = get_op("gdn").args
    inputs = _inputs("gdn", torch.float32, seed=4)
    leaves = [inputs[n].clone().requires_grad_(True) for n in names]
    o, state = op(*leaves)
    ct = torch.randn((o if used == "o" else state).shape, generator=torch.Generator().manual_seed(5))
    got = torch.autograd.grad(((o if used == "o" else state) * ct).sum(), leaves)

    do, dstate = (ct, torch.zeros(state.shape)) if used == "o" else (torch.zeros(o.shape), ct)
    args = tuple(torch_to_jax(inputs[n]) for n in names)
    _, _, want = op.jax_fwd_bwd(args, torch_to_jax(do), None, torch_to_jax(dstate))
    for name, g, w in zip(names, got, want, strict=True):
        torch.testing.assert_close(g, torch.from_numpy(np.array(w)), rtol=0, atol=0, msg=lambda m, n=name: f"d{n}: {m}")


def _jax_sees_a_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


@pytest.mark.skipif(not torch.cuda.is_available() or not _jax_sees_a_gpu(), reason="needs CUDA in torch and JAX")
def test_on_cuda_a_training_step_queues_without_the_host_waiting_and_reads_what_torch_wrote() -> None:
    """On a GPU the crossings synchronise nothing on the host: behind a long sleep on torch's stream, a training
    step through the bridge returns while the GPU still sleeps; and the inputs and cotangent, written by torch
    just before the call, reach the JAX programs written (the gradients are the one-program step's)."""
    op = _wrapper(IMPLS["gdn", "jax_chunk"])
    names = get_op("gdn").args
    inputs = {n: t.cuda() for n, t in _inputs("gdn", torch.float32, seed=6).items()}
    do = torch.randn((B, T, H, V), generator=torch.Generator().manual_seed(7)).cuda()
    args = tuple(torch_to_jax(inputs[n]) for n in names)
    _, _, want = jax.block_until_ready(op.jax_fwd_bwd(args, torch_to_jax(do), None, None))
    for step in range(2):  # the first compiles, which may wait on anything; the second must not wait
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000_000)  # about half a second of the GPU's clock, on torch's stream
        leaves = [(inputs[n] * 1).requires_grad_(True) for n in names]  # written behind the sleep
        o, _ = op(*leaves)
        got = torch.autograd.grad((o * (do * 1)).sum(), leaves)
        queued = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        if step == 1:
            assert queued, "the host waited for the GPU during the training step"
        for name, g, w in zip(names, got, want, strict=True):
            w = torch.from_numpy(np.array(w)).cuda()
            ulp = float(w.abs().max()) * 2**-24
            torch.testing.assert_close(g, w, rtol=0, atol=2 * ulp, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.skipif(not torch.cuda.is_available() or not _jax_sees_a_gpu(), reason="needs CUDA in torch and JAX")
def test_on_cuda_a_capture_in_a_torch_cuda_graph_is_refused() -> None:
    """JAX's programs run outside torch's graph: a call inside a capture raises rather than record half a step."""
    op = _wrapper(IMPLS["gdn", "jax_chunk"])
    inputs = {n: t.cuda() for n, t in _inputs("gdn", torch.float32, seed=8).items()}
    args = [inputs[n] for n in get_op("gdn").args]
    op(*args)  # compiled outside the capture
    with pytest.raises(RuntimeError, match="cannot be captured"), torch.cuda.graph(torch.cuda.CUDAGraph()):
        op(*args)
