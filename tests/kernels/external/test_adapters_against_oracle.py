"""Each adapter whose package and device are present here agrees with the float64 oracle at a small shape.

This is a smoke test of the argument mapping, not the gate (correctness/verify.py is): it runs wherever an adapter can
run, so on the GPU machine (after benchmarks/gpu/install.sh) it exercises FLA, FlashQLA and opengdn for real, and on a
CPU machine with opengdn installed, opengdn's chunkwise path. Elsewhere every case is skipped with the impl's reason.
The "long" gate regime is used: opengdn's own backward gives NaN for dalpha under the "typical" regime (its chunk
decay ratios underflow), which is the gate's business to report, not a mapping error.
"""

from __future__ import annotations

import pytest
import torch

from deltabench.harness.cases import Case, torch_dtype
from deltabench.harness.ops import get_op, make_case_inputs
from deltabench.harness.registry import get_impl

ADAPTERS = [
    ("gdn", "fla_chunk"),
    ("gdn", "fla_recurrent"),
    ("gdn2", "fla_chunk"),
    ("kda", "fla_chunk"),
    ("gdn", "flash_qla"),
    ("gdn", "opengdn_triton"),
    ("gdn", "opengdn_chunkwise"),
]
# Relative Frobenius error allowed at bf16 (FLA and FlashQLA measure about 4e-3 on the H200) and at fp32.
REL_ERR = {"bf16": 2e-2, "fp32": 1e-4}


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


def _case_for(op: str, name: str) -> Case:
    impl = get_impl(op, name)
    device = "cuda" if "cpu" not in impl.devices else "cpu"
    dtype = "fp32" if "fp32" in impl.dtypes and device == "cpu" else "bf16"
    mode = "fwd+bwd" if impl.supports_backward else "fwd"
    # K = V = 128 so FlashQLA can run; T not a multiple of the chunk, to cover the partial last chunk.
    return Case(op, 1, 100, 2, 128, 128, dtype=dtype, regime="long", initial_state=True, mode=mode, device=device)


@pytest.mark.parametrize(("op", "name"), ADAPTERS, ids=[f"{o}-{n}" for o, n in ADAPTERS])
def test_adapter_matches_oracle(op, name):
    impl = get_impl(op, name)
    case = _case_for(op, name)
    why = impl.check_case(case)
    if why:
        pytest.skip(why)
    spec = get_op(op)
    x = spec.make_inputs(
        *(case.B, case.T, case.H, case.K, case.V),
        dtype=torch_dtype(case.dtype),
        device=case.device,
        seed=5,
        regime=case.regime,
        initial_state=True,
    )
    backward = case.mode != "fwd"
    leaves = {n: t.detach().clone().requires_grad_(backward) for n, t in x.items()}
    o, state = impl(**leaves)
    assert o.shape == x["v"].shape and o.dtype == x["v"].dtype
    assert state.dtype == torch.float32 and state.shape == x["initial_state"].shape

    ref = {n: t.detach().double().cpu().requires_grad_(backward) for n, t in x.items()}
    o_ref, state_ref = spec.oracle(**ref)
    tol = REL_ERR[case.dtype]
    assert _rel_err(o.cpu(), o_ref) < tol, "o"
    assert _rel_err(state.cpu(), state_ref) < tol, "final_state"
    if not backward:
        return
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    dstate = torch.randn(state_ref.shape, generator=gen, dtype=torch.float64)
    got = torch.autograd.grad(
        (o.double() * do.to(o.device)).sum() + (state.double() * dstate.to(o.device)).sum(), list(leaves.values())
    )
    want = torch.autograd.grad((o_ref * do).sum() + (state_ref * dstate).sum(), list(ref.values()))
    for n, g_got, g_want in zip(leaves, got, want, strict=True):
        assert torch.isfinite(g_got).all(), f"d{n} not finite"
        assert _rel_err(g_got.cpu(), g_want) < tol, f"d{n}"


# Decode steps: (op, impl, T). flashinfer_decode takes one token; the others a multi-token step.
DECODE_ADAPTERS = [
    ("gdn", "fla_recurrent", 4),
    ("gdn2", "fla_recurrent", 4),
    ("kda", "fla_recurrent", 4),
    ("gdn2", "fla_decode", 4),
    ("kda", "fla_decode", 4),
    ("gdn", "flashinfer_decode", 1),
    ("gdn", "flashinfer_mtp", 4),
    ("gdn", "flash_qla", 4),
]


@pytest.mark.parametrize(("op", "name", "T"), DECODE_ADAPTERS, ids=[f"{o}-{n}" for o, n, _ in DECODE_ADAPTERS])
def test_decode_adapter_steps_from_the_served_state(op, name, T):
    """A decode step from the state a 64-token prefix leaves agrees with the oracle stepping from the same state;
    an impl declared in place leaves the new state in the buffer it was given."""
    impl = get_impl(op, name)
    case = Case(op, B=2, T=T, H=2, K=128, V=128, dtype="bf16", mode="decode", device="cuda")
    why = impl.check_case(case)
    if why:
        pytest.skip(why)
    spec = get_op(op)
    x = make_case_inputs(spec, case)
    h0 = x[spec.state_arg]
    buffer = h0.clone()
    o, state = impl(*(x[n] for n in spec.args), initial_state=buffer)
    if impl.state_in_place:
        state = buffer
    ref = {n: x[n].double().cpu() for n in spec.args}
    o_ref, state_ref = spec.oracle(**ref, initial_state=h0.double().cpu())
    assert o.shape == x["v"].shape and o.dtype == x["v"].dtype
    assert _rel_err(o.cpu(), o_ref) < REL_ERR["bf16"], "o"
    assert _rel_err(state.cpu(), state_ref) < REL_ERR["bf16"], "final_state"


def test_fla_guard_bypass_is_recorded_exactly_where_the_guard_would_fire():
    pytest.importorskip("fla")
    import triton
    from packaging.version import Version

    from deltabench.kernels.external import fla as fla_adapter

    mods = fla_adapter.load_fla()
    chunk_o = mods["chunk_o"]
    old_triton = Version("3.4.0") <= Version(triton.__version__) < Version("3.7.1")
    would_fire = bool(chunk_o.IS_NVIDIA_HOPPER and chunk_o.TRITON_ABOVE_3_4_0 and old_triton)
    assert fla_adapter.GUARD_BYPASSED is would_fire
    assert (fla_adapter.run_notes() != "") is would_fire
    if would_fire:
        assert "FLA #640" in fla_adapter.run_notes()
