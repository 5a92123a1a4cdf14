"""The JAX subjects (jax_chunk, jax_scan) of gdn and gdn2 against the float64 oracle, through the registry's torch
wrapper.

One test body serves both ops. Every case checks o, the final state and every gradient by name (random cotangents on
o and on the final state), in both gate regimes. T covers one token, a chunk less one, a chunk plus one and a padded
third chunk; K != V. XLA's CPU compiler runs with its cheap settings: the tests pay a compilation per op, shape and
dtype. Case ids start with the op and the impl (``gdn2-jax_scan-T63-bf16-h0``).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's cheap CPU compiler (kernels/common/jax/jax_compile.py): about 10x faster compiles; these shapes run in
# microseconds anyway.
os.environ.setdefault("DELTABENCH_JAX_FAST_COMPILE", "1")

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from deltabench.harness.cases import Case
from deltabench.harness.registry import get_impl
from deltabench.references import gdn, gdn2

pytest.importorskip("jax")


def _all_channels_strong(g: torch.Tensor) -> None:
    g.fill_(-30.0)


def _even_channels_strong(g: torch.Tensor) -> None:
    g[..., ::2] = -30.0  # even channels forget at once, odd ones keep their regime's decay


@dataclass(frozen=True)
class JaxOp:
    """What the shared tests need to know of one op."""

    args: tuple[str, ...]  # positional arguments after q, k, v, in the op's order
    oracle: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    make_inputs: Callable[..., dict[str, torch.Tensor]]
    # Sets a log-decay of -30 a token in place: gdn's scalar gate everywhere; gdn2's per-channel gate on the even
    # channels, beside slow ones.
    strong_decay: Callable[[torch.Tensor], None]


OPS = {
    "gdn": JaxOp(("q", "k", "v", "g", "beta"), gdn.gdn_recurrent, gdn.make_inputs, _all_channels_strong),
    "gdn2": JaxOp(("q", "k", "v", "g", "b", "w"), gdn2.gdn2_recurrent, gdn2.make_inputs, _even_channels_strong),
}
IMPL_NAMES = ("jax_chunk", "jax_scan")
B, H, K, V = 1, 3, 16, 24
# Relative Frobenius error bounds. fp32: float32 math against float64 (seen: <= 2e-6). bf16: the rounding of
# o and of every gradient to bf16 (2^-9 = 2e-3 per element; seen: <= 4e-3).
BOUND = {torch.float32: 2e-5, torch.bfloat16: 1e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error in float64."""
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def run_both(op: JaxOp, impl, inputs: dict[str, torch.Tensor], seed: int):
    """Forward and backward through `impl` and the oracle with the same random cotangents."""
    args = op.args
    gen = torch.Generator().manual_seed(seed)
    names = [n for n in (*args, "initial_state") if n in inputs]
    leaves_ref = {n: inputs[n].clone().requires_grad_(True) for n in names}
    o_ref, s_ref = op.oracle(*(leaves_ref[n] for n in args), initial_state=leaves_ref.get("initial_state"))
    do = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    ds = torch.randn(s_ref.shape, generator=gen, dtype=torch.float64)
    grads_ref = torch.autograd.grad((o_ref * do).sum() + (s_ref * ds).sum(), [leaves_ref[n] for n in names])

    leaves = {n: inputs[n].clone().requires_grad_(True) for n in names}
    o, s = impl(*(leaves[n] for n in args), initial_state=leaves.get("initial_state"))
    grads = torch.autograd.grad(
        (o.double() * do).sum() + (s.double() * ds).sum(), [leaves[n] for n in names], allow_unused=True
    )
    return (o, s, dict(zip(names, grads, strict=True))), (o_ref, s_ref, dict(zip(names, grads_ref, strict=True)))


# Each T once with and once without an initial state (across the two dtypes), both regimes in every case.
CASES = [(T, dt, (T in (1, 65)) != (dt == "bf16")) for T in (1, 63, 65, 130) for dt in ("fp32", "bf16")]
SUBJECTS = [(op, impl) for op in OPS for impl in IMPL_NAMES]


@pytest.mark.parametrize(("T", "dtype", "h0"), CASES, ids=[f"T{t}-{d}-{'h0' if h else 'noh0'}" for t, d, h in CASES])
@pytest.mark.parametrize(("op_name", "impl_name"), SUBJECTS, ids=[f"{o}-{i}" for o, i in SUBJECTS])
def test_matches_float64_oracle(op_name: str, impl_name: str, T: int, dtype: str, h0: bool) -> None:
    op = OPS[op_name]
    impl = get_impl(op_name, impl_name)
    for regime in ("typical", "long"):
        inputs = op.make_inputs(B, T, H, K, V, dtype=DTYPES[dtype], seed=T, regime=regime, initial_state=h0)
        (o, s, grads), (o_ref, s_ref, grads_ref) = run_both(op, impl, inputs, seed=T + 1)
        assert o.shape == (B, T, H, V) and o.dtype == inputs["v"].dtype
        assert s.shape == (B, H, K, V) and s.dtype == torch.float32
        bound = BOUND[DTYPES[dtype]]
        where = f"{op_name} {impl_name} T={T} {dtype} {regime} h0={h0}"
        assert rel_err(o, o_ref) < bound, f"o off at {where}"
        # the state is float32 for every input dtype, so it meets the fp32 bound whatever the dtype
        assert rel_err(s, s_ref) < BOUND[torch.float32], f"final state off at {where}"
        assert set(grads) == set(grads_ref) == {*op.args, *(["initial_state"] if h0 else [])}
        for name, want in grads_ref.items():
            got = grads[name]
            assert got is not None and got.shape == inputs[name].shape, f"d{name} missing at {where}"
            assert got.dtype == inputs[name].dtype, f"d{name} dtype at {where}"
            assert rel_err(got, want) < bound, f"d{name} off at {where}: {rel_err(got, want):.2e}"


@pytest.mark.parametrize("op_name", OPS)
def test_pure_jax_functions_agree_with_the_torch_wrapper(op_name: str) -> None:
    """``jax_fn`` (what the JAX runner times) gives the torch wrapper's numbers; ``jax_fwd_bwd`` its gradients."""
    import jax.numpy as jnp
    import numpy as np

    op = OPS[op_name]
    jax_chunk = getattr(importlib.import_module(f"deltabench.kernels.{op_name}.jax.jax_chunk"), f"{op_name}_jax_chunk")
    inputs = op.make_inputs(B, 65, H, K, V, seed=3, initial_state=True)
    args = tuple(jnp.asarray(inputs[n].numpy()) for n in op.args)
    h0 = jnp.asarray(inputs["initial_state"].numpy())
    o_jax, s_jax = jax_chunk.jax_fn(*args, initial_state=h0)
    o_t, s_t = jax_chunk(*(inputs[n] for n in op.args), initial_state=inputs["initial_state"])
    np.testing.assert_array_equal(np.asarray(o_jax), o_t.numpy())
    np.testing.assert_array_equal(np.asarray(s_jax), s_t.numpy())

    do = torch.randn(o_t.shape, generator=torch.Generator().manual_seed(0))
    leaves = {n: inputs[n].clone().requires_grad_(True) for n in (*op.args, "initial_state")}
    o, _ = jax_chunk(*(leaves[n] for n in op.args), initial_state=leaves["initial_state"])
    want = torch.autograd.grad((o * do).sum(), list(leaves.values()))
    o2, _, got = jax_chunk.jax_fwd_bwd(args, jnp.asarray(do.numpy()), h0)
    np.testing.assert_allclose(np.asarray(o2), o_t.numpy(), rtol=1e-6, atol=1e-6)
    for name, g_jax, g_torch in zip(leaves, got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g_jax), g_torch.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("op_name", OPS)
def test_strong_decay_stays_finite(op_name: str) -> None:
    """g = -30 per token (gdn: everywhere; gdn2: on the even channels, beside slow ones) would overflow any
    exp(G) / exp(G) factoring within a chunk in float32; the pairwise decays exp(G_i - G_j), i >= j, stay finite."""
    op = OPS[op_name]
    inputs = op.make_inputs(B, 130, H, K, V, seed=5)  # a shape compiled above: no new compilation
    op.strong_decay(inputs["g"])
    leaves = {n: inputs[n].clone().requires_grad_(True) for n in op.args}
    o, s = get_impl(op_name, "jax_chunk")(*(leaves[n] for n in op.args))
    grads = torch.autograd.grad(o.sum() + s.sum(), list(leaves.values()))
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert all(torch.isfinite(g_).all() for g_ in grads)
    o_ref, s_ref = op.oracle(*(inputs[n] for n in op.args))
    assert rel_err(o, o_ref) < 2e-5 and rel_err(s, s_ref) < 2e-5


@pytest.mark.parametrize("op_name", OPS)
def test_registered_for_the_runner(op_name: str) -> None:
    for name in IMPL_NAMES:
        impl = get_impl(op_name, name)
        assert impl.backend == "jax" and impl.dtypes == ("fp32", "bf16") and impl.supports_backward
        assert set(impl.devices) == {"cpu", "cuda", "tpu"}
        assert impl.check_case(Case(op_name, 1, 64, 2, 16, 16, dtype="bf16", mode="fwd+bwd")) is None
        assert "fp16" in (impl.check_case(Case(op_name, 1, 64, 2, 16, 16, dtype="fp16")) or "")
    why = get_impl(op_name, "jax_scan").check_case(Case(op_name, 8, 4096, 6, 128, 128))
    assert why and "GiB" in why


@pytest.mark.parametrize("op_name", OPS)
def test_passes_the_verification_gate(op_name: str) -> None:
    """The harness's own gate (oracle, gradients, streaming, both initial-state variants) accepts jax_chunk."""
    from deltabench.correctness.engine import verify_case

    op = OPS[op_name]
    report = verify_case(
        get_impl(op_name, "jax_chunk"), Case(op_name, B, 65, H, K, V, mode="fwd+bwd"), seeds=1, extra_seed=False
    )
    failing = [r for r in report.records if r.gating and not r.passed]
    assert report.passed, failing
    checked = {r.check for r in report.records if r.gating}
    q_and_gate_grads = {f"grad:{n}" for n in ("q", *op.args[3:])}  # args[3:]: the gates, after q, k, v
    assert {"output", "final_state", *q_and_gate_grads, "grad:initial_state"} <= checked
