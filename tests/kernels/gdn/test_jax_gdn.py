"""gdn's JAX subjects (jax_chunk, jax_scan) against the float64 oracle, through the registry's torch wrapper.

Every case checks o, the final state and every gradient by name (random cotangents on o and on the final
state), in both gate regimes. T covers one token, a chunk less one, a chunk plus one and a padded third chunk;
K != V. XLA's CPU compiler runs with its cheap settings: the tests pay a compilation per shape and dtype.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's cheap CPU compiler (kernels/common/jax_compile.py): about 10x faster compiles; these shapes run in
# microseconds anyway.
os.environ.setdefault("DELTABENCH_JAX_FAST_COMPILE", "1")

import pytest
import torch
from deltabench.harness.cases import Case
from deltabench.harness.registry import get_impl
from deltabench.references.gdn import gdn_recurrent, make_inputs

pytest.importorskip("jax")

ARGS = ("q", "k", "v", "g", "beta")
B, H, K, V = 1, 3, 16, 24
# Relative Frobenius error bounds. fp32: float32 math against float64 (seen: <= 2e-6). bf16: the rounding of
# o and of every gradient to bf16 (2^-9 = 2e-3 per element; seen: <= 4e-3).
BOUND = {torch.float32: 2e-5, torch.bfloat16: 1e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error in float64."""
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def run_both(impl, inputs: dict[str, torch.Tensor], seed: int):
    """Forward and backward through `impl` and the oracle with the same random cotangents."""
    gen = torch.Generator().manual_seed(seed)
    names = [n for n in (*ARGS, "initial_state") if n in inputs]
    leaves_ref = {n: inputs[n].clone().requires_grad_(True) for n in names}
    o_ref, s_ref = gdn_recurrent(*(leaves_ref[n] for n in ARGS), initial_state=leaves_ref.get("initial_state"))
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    ds = torch.randn(s_ref.shape, generator=gen, dtype=torch.float64)
    grads_ref = torch.autograd.grad((o_ref * do).sum() + (s_ref * ds).sum(), [leaves_ref[n] for n in names])

    leaves = {n: inputs[n].clone().requires_grad_(True) for n in names}
    o, s = impl(*(leaves[n] for n in ARGS), initial_state=leaves.get("initial_state"))
    grads = torch.autograd.grad(
        (o.double() * do).sum() + (s.double() * ds).sum(), [leaves[n] for n in names], allow_unused=True
    )
    return (o, s, dict(zip(names, grads, strict=True))), (o_ref, s_ref, dict(zip(names, grads_ref, strict=True)))


# Each T once with and once without an initial state (across the two dtypes), both regimes in every case.
CASES = [(T, dt, (T in (1, 65)) != (dt == "bf16")) for T in (1, 63, 65, 130) for dt in ("fp32", "bf16")]


@pytest.mark.parametrize("impl_name", ["jax_chunk", "jax_scan"])
@pytest.mark.parametrize(("T", "dtype", "h0"), CASES, ids=[f"T{t}-{d}-{'h0' if h else 'noh0'}" for t, d, h in CASES])
def test_matches_float64_oracle(impl_name: str, T: int, dtype: str, h0: bool) -> None:
    impl = get_impl("gdn", impl_name)
    for regime in ("typical", "long"):
        inputs = make_inputs(B, T, H, K, V, dtype=DTYPES[dtype], seed=T, regime=regime, initial_state=h0)
        (o, s, grads), (o_ref, s_ref, grads_ref) = run_both(impl, inputs, seed=T + 1)
        assert o.shape == (B, T, H, V) and o.dtype == inputs["v"].dtype
        assert s.shape == (B, H, K, V) and s.dtype == torch.float32
        bound = BOUND[DTYPES[dtype]]
        where = f"{impl_name} T={T} {dtype} {regime} h0={h0}"
        assert rel_err(o, o_ref) < bound, f"o off at {where}"
        # the state is float32 for every input dtype, so it meets the fp32 bound whatever the dtype
        assert rel_err(s, s_ref) < BOUND[torch.float32], f"final state off at {where}"
        assert set(grads) == set(grads_ref) == {*ARGS, *(["initial_state"] if h0 else [])}
        for name, want in grads_ref.items():
            got = grads[name]
            assert got is not None and got.shape == inputs[name].shape, f"d{name} missing at {where}"
            assert got.dtype == inputs[name].dtype, f"d{name} dtype at {where}"
            assert rel_err(got, want) < bound, f"d{name} off at {where}: {rel_err(got, want):.2e}"


def test_pure_jax_functions_agree_with_the_torch_wrapper() -> None:
    """``jax_fn`` (what the JAX runner times) gives the torch wrapper's numbers; ``jax_fwd_bwd`` its gradients."""
    import jax.numpy as jnp
    import numpy as np
    from deltabench.kernels.gdn.jax_chunk import gdn_jax_chunk

    inputs = make_inputs(B, 65, H, K, V, seed=3, initial_state=True)
    args = tuple(jnp.asarray(inputs[n].numpy()) for n in ARGS)
    h0 = jnp.asarray(inputs["initial_state"].numpy())
    o_jax, s_jax = gdn_jax_chunk.jax_fn(*args, initial_state=h0)
    o_t, s_t = gdn_jax_chunk(*(inputs[n] for n in ARGS), initial_state=inputs["initial_state"])
    np.testing.assert_array_equal(np.asarray(o_jax), o_t.numpy())
    np.testing.assert_array_equal(np.asarray(s_jax), s_t.numpy())

    do = torch.randn(o_t.shape, generator=torch.Generator().manual_seed(0))
    leaves = {n: inputs[n].clone().requires_grad_(True) for n in (*ARGS, "initial_state")}
    o, _ = gdn_jax_chunk(*(leaves[n] for n in ARGS), initial_state=leaves["initial_state"])
    want = torch.autograd.grad((o * do).sum(), list(leaves.values()))
    o2, _, got = gdn_jax_chunk.jax_fwd_bwd(args, jnp.asarray(do.numpy()), h0)
    np.testing.assert_allclose(np.asarray(o2), o_t.numpy(), rtol=1e-6, atol=1e-6)
    for name, g_jax, g_torch in zip(leaves, got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g_jax), g_torch.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_strong_decay_stays_finite() -> None:
    """g = -30 per token would overflow any exp(G) / exp(G) factoring within a chunk; pairwise decays stay finite."""
    inputs = make_inputs(B, 130, H, K, V, seed=5)  # a shape compiled above: no new compilation
    inputs["g"] = torch.full_like(inputs["g"], -30.0)
    leaves = {n: inputs[n].clone().requires_grad_(True) for n in ARGS}
    o, s = get_impl("gdn", "jax_chunk")(*(leaves[n] for n in ARGS))
    grads = torch.autograd.grad(o.sum() + s.sum(), list(leaves.values()))
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert all(torch.isfinite(g_).all() for g_ in grads)
    o_ref, s_ref = gdn_recurrent(*(inputs[n] for n in ARGS))
    assert rel_err(o, o_ref) < 2e-5 and rel_err(s, s_ref) < 2e-5


def test_registered_for_the_runner() -> None:
    for name in ("jax_chunk", "jax_scan"):
        impl = get_impl("gdn", name)
        assert impl.backend == "jax" and impl.dtypes == ("fp32", "bf16") and impl.supports_backward
        assert set(impl.devices) == {"cpu", "cuda", "tpu"}
        assert impl.check_case(Case("gdn", 1, 64, 2, 16, 16, dtype="bf16", mode="fwd+bwd")) is None
        assert "fp16" in (impl.check_case(Case("gdn", 1, 64, 2, 16, 16, dtype="fp16")) or "")
    why = get_impl("gdn", "jax_scan").check_case(Case("gdn", 8, 4096, 6, 128, 128))
    assert why and "GiB" in why


def test_passes_the_verification_gate() -> None:
    """The harness's own gate (oracle, gradients, streaming, both initial-state variants) accepts jax_chunk."""
    from deltabench.harness.verify import verify_case

    report = verify_case(
        get_impl("gdn", "jax_chunk"), Case("gdn", B, 65, H, K, V, mode="fwd+bwd"), seeds=1, extra_seed=False
    )
    failing = [r for r in report.records if r.gating and not r.passed]
    assert report.passed, failing
    checked = {r.check for r in report.records if r.gating}
    assert {"output", "final_state", "grad:q", "grad:g", "grad:beta", "grad:initial_state"} <= checked
