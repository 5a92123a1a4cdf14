"""Where the gate's float64 oracle runs and its inputs are drawn: a CUDA case's on its GPU, any other's on the CPU
(correctness/verify.py ``oracle_device``, references/_inputs.py). What runs here is the CPU path; its device-placed
code is the same but for the device argument."""

from __future__ import annotations

import pytest
import torch

from deltabench.correctness import reference_cache as rc
from deltabench.correctness.calls import run_impl
from deltabench.correctness.oracle import oracle_device, oracle_runs
from deltabench.correctness.plan import gate_variants
from deltabench.harness import Case, get_impl, get_op

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_cuda_case_gets_its_gpu_and_any_other_the_cpu() -> None:
    assert oracle_device(Case("gdn", B=1, T=8, H=1, K=4, V=4)) == torch.device("cpu")
    assert oracle_device(Case("gdn", B=1, T=8, H=1, K=4, V=4, device="cuda")).type == "cuda"


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_the_stacked_oracle_on_its_device_is_the_oracle_run_alone_on_the_cpu(mode: str) -> None:
    """Every (seed, variant) run of a case stacked into one oracle call on :func:`oracle_device` (the CPU for a
    CPU case), against the oracle called alone on each run's inputs on the CPU: the same float64 values (1e-12),
    gradients included."""
    spec = get_op("gdn")
    case = Case("gdn", B=1, T=40, H=2, K=8, V=12, dtype="bf16", mode=mode)
    grads = mode != "fwd"
    impl = get_impl("gdn", "torch_chunk")
    items = [
        run_impl(impl, spec, case, v, seed=s, grads=grads) for s in (3, 4) for v in gate_variants(spec, spec.regimes)
    ]
    stacked = oracle_runs(spec, items, limit=1e9)
    assert len(stacked) == len(items)
    for it, run in zip(items, stacked, strict=True):
        leaves = {n: it.inputs[n].detach().to("cpu", torch.float64).requires_grad_(grads) for n in spec.args}
        h0 = it.inputs.get("initial_state")
        h0 = None if h0 is None else h0.detach().double().requires_grad_(grads)
        scale = it.variant.scale(spec, case.dims)
        with torch.enable_grad():
            o, s = spec.oracle(*(leaves[n] for n in spec.args), scale=scale, initial_state=h0)
        assert run.o.device == oracle_device(case) and run.o.dtype == torch.float64
        assert (run.o - o).abs().max().item() <= 1e-12
        assert (run.state - s).abs().max().item() <= 1e-12
        if grads:
            do, dht = it.cot
            wrt = [leaves[n] for n in spec.args] + ([h0] if h0 is not None else [])
            want = torch.autograd.grad([o, s], wrt, [do.double(), dht.double()])
            names = list(spec.args) + (["initial_state"] if h0 is not None else [])
            for name, g in zip(names, want, strict=True):
                assert (run.grads[name] - g).abs().max().item() <= 1e-12, name


def test_the_reference_cache_keys_by_the_cases_device() -> None:
    """A CUDA case's references (drawn and computed on its GPU) never serve a CPU case's, nor the reverse."""
    cpu = Case("gdn", B=1, T=8, H=1, K=4, V=4)
    gpu = cpu.replace(device="cuda")
    assert rc.reference_key(cpu, kind="oracle", grads=False) != rc.reference_key(gpu, kind="oracle", grads=False)


def test_a_gpu_oracle_stacks_runs_with_gradients_up_to_the_forwards_limit() -> None:
    """On a GPU an oracle call costs its launches, not its elements: runs with gradients stack up to the forward's
    limit there, and keep the gradients' limit on the CPU."""
    from deltabench.correctness.oracle import stack_limit
    from deltabench.correctness.plan import ORACLE_MAX_ELEMENTS, ORACLE_MAX_ELEMENTS_GRAD

    cpu = Case("gdn", B=1, T=8, H=1, K=4, V=4, mode="fwd+bwd")
    assert stack_limit(cpu, ORACLE_MAX_ELEMENTS_GRAD) == ORACLE_MAX_ELEMENTS_GRAD
    assert stack_limit(cpu.replace(device="cuda"), ORACLE_MAX_ELEMENTS_GRAD) == ORACLE_MAX_ELEMENTS
    assert stack_limit(cpu.replace(device="cuda"), 1e9) == 1e9
