"""deltabench's Pallas GDN-2 kernels (and KDA through them), checked two ways without a TPU:

* in Pallas' interpreter on the CPU, through the registry's torch wrapper, against the float64 oracle: o, the
  final state and every gradient by name (the fused forward and the fused backward kernels), fp32 and bf16, both
  gate regimes, with and without an initial state, T within one chunk, at a chunk multiple and past one; the
  backward kernel against its plain-JAX reference; then through the harness's own gate, and two bugs planted
  inside the kernel (a wrong decay, the last block dropped) that the gate must reject;
* lowered for the TPU (``jax.export`` with ``platforms=["tpu"]``): the Pallas-to-Mosaic lowering runs on this
  host, so a block shape Mosaic refuses or an operation it cannot lower fails here (the layout passes that
  follow run only in libtpu, on a TPU).

Interpreted programs are slow to compile: shapes are tiny and reused.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("DELTABENCH_JAX_FAST_COMPILE", "1")

from collections.abc import Iterator

import pytest
import torch

from deltabench.correctness.engine import verify_case
from deltabench.harness import Case, get_impl
from deltabench.harness.devices import absent_reason
from deltabench.references import gdn2, kda

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from pallas_planted import BUGS, planting  # noqa: E402

from deltabench.kernels.gdn2.jax.pallas import chunk as pallas_chunk  # noqa: E402
from deltabench.kernels.gdn2.jax.pallas import forward as pallas_forward  # noqa: E402

B, H, K, V = 1, 2, 16, 24
# Relative Frobenius error bounds, as tests/kernels/test_jax_impls.py: fp32 float32 math against float64 (seen
# here: <= 3e-6); bf16 the rounding of o and of each gradient to bf16 (seen: <= 3e-3).
BOUND = {"fp32": 2e-5, "bf16": 1e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
OPS = {
    "gdn2": (("q", "k", "v", "g", "b", "w"), gdn2.gdn2_recurrent, gdn2.make_inputs),
    "kda": (("q", "k", "v", "g", "beta"), kda.kda_recurrent, kda.make_inputs),
}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error in float64."""
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def _grads(fn, args, inputs, do, ds):
    names = [n for n in (*args, "initial_state") if n in inputs]
    leaves = {n: inputs[n].clone().requires_grad_(True) for n in names}
    o, s = fn(*(leaves[n] for n in args), initial_state=leaves.get("initial_state"))
    grads = torch.autograd.grad((o.double() * do).sum() + (s.double() * ds).sum(), [leaves[n] for n in names])
    return o, s, dict(zip(names, grads, strict=True))


# (op, T, dtype, initial state): T=40 within one chunk, 64 a chunk multiple, 100 a partial second chunk.
CASES = [
    ("gdn2", 100, "fp32", True),
    ("gdn2", 100, "bf16", False),
    ("gdn2", 64, "fp32", False),
    ("gdn2", 40, "bf16", True),
    ("kda", 100, "bf16", True),
    ("kda", 64, "fp32", False),
]


@pytest.mark.parametrize(
    ("op", "T", "dtype", "h0"), CASES, ids=[f"{o}-T{t}-{d}-{'h0' if h else 'noh0'}" for o, t, d, h in CASES]
)
def test_matches_float64_oracle(op: str, T: int, dtype: str, h0: bool) -> None:
    args, oracle, make_inputs = OPS[op]
    impl = get_impl(op, "pallas_chunk")
    for regime in ("typical", "long"):
        inputs = make_inputs(B, T, H, K, V, dtype=DTYPES[dtype], seed=T, regime=regime, initial_state=h0)
        gen = torch.Generator().manual_seed(T + 1)
        do = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
        ds = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)
        o, s, grads = _grads(impl, args, inputs, do, ds)
        o_ref, s_ref, grads_ref = _grads(oracle, args, {n: t.double() for n, t in inputs.items()}, do, ds)
        where = f"{op} T={T} {dtype} {regime} h0={h0}"
        assert o.shape == (B, T, H, V) and o.dtype == inputs["v"].dtype, where
        assert s.shape == (B, H, K, V) and s.dtype == torch.float32, where
        assert rel_err(o, o_ref) < BOUND[dtype], f"o off at {where}: {rel_err(o, o_ref):.2e}"
        assert rel_err(s, s_ref) < BOUND["fp32"], f"final state off at {where}: {rel_err(s, s_ref):.2e}"
        assert set(grads) == {*args, *(["initial_state"] if h0 else [])}
        for name, want in grads_ref.items():
            got = grads[name]
            assert got.shape == inputs[name].shape and got.dtype == inputs[name].dtype, f"d{name} at {where}"
            assert rel_err(got, want) < BOUND[dtype], f"d{name} off at {where}: {rel_err(got, want):.2e}"


def test_strong_decay_stays_finite() -> None:
    """g = -30 a token on the even channels beside slow ones: exp(G) / exp(G) factoring would overflow float32
    within a chunk; the kernel's pairwise exp(min(G_i - G_j, 0)) stays finite and exact."""
    args, oracle, make_inputs = OPS["gdn2"]
    inputs = make_inputs(B, 100, H, K, V, seed=5)  # the fp32 shape compiled above
    inputs["g"][..., ::2] = -30.0
    do = torch.randn(B, 100, H, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ds = torch.zeros(B, H, K, V, dtype=torch.float64)
    o, s, grads = _grads(get_impl("gdn2", "pallas_chunk"), args, inputs, do, ds)
    o_ref, s_ref, grads_ref = _grads(oracle, args, {n: t.double() for n, t in inputs.items()}, do, ds)
    assert all(torch.isfinite(t).all() for t in (o, s, *grads.values()))
    assert rel_err(o, o_ref) < 2e-5 and rel_err(s, s_ref) < 2e-5
    assert max(rel_err(grads[n], grads_ref[n]) for n in args) < 2e-5


def test_fused_backward_matches_its_jax_reference() -> None:
    """The backward kernel against the same algebra in plain JAX (backward.py), from the same forward residual,
    with an initial state and random cotangents on o and on the final state (T = 100: a partial last chunk)."""
    from deltabench.kernels.gdn2.jax.pallas.backward import gdn2_chunk_backward
    from deltabench.kernels.gdn2.jax.pallas.fused_backward import gdn2_fused_backward

    inputs = gdn2.make_inputs(B, 100, H, K, V, seed=11, initial_state=True)
    a = {n: jnp.asarray(t.numpy()) for n, t in inputs.items()}
    args = tuple(a[n] for n in OPS["gdn2"][0])
    h0_t = jnp.swapaxes(a["initial_state"], -1, -2)
    o, ht_t, states_t = pallas_forward.gdn2_fused_forward(*args, h0_t, scale=0.25, store_states=True, interpret=True)
    do = jax.random.normal(jax.random.PRNGKey(0), o.shape)
    d_final_t = jax.random.normal(jax.random.PRNGKey(1), ht_t.shape)
    got = gdn2_fused_backward(*args, do, states_t, d_final_t, scale=0.25, interpret=True)
    states = jnp.transpose(states_t, (2, 0, 1, 4, 3))
    want = gdn2_chunk_backward(args, states, do, jnp.swapaxes(d_final_t, -1, -2), scale=0.25, chunk=64)
    got = (*got[:-1], jnp.swapaxes(got[-1], -1, -2))
    for name, x, y in zip(("dq", "dk", "dv", "dg", "db", "dw", "dh0"), got, want, strict=True):
        err = float(jnp.linalg.norm(x - y) / jnp.linalg.norm(y))
        assert err < 2e-5, f"{name}: {err:.2e}"


@pytest.mark.parametrize("op", OPS)
def test_passes_the_verification_gate(op: str) -> None:
    """The harness's gate (oracle, every gradient, streaming, both initial-state variants) accepts the kernel."""
    report = verify_case(
        get_impl(op, "pallas_chunk"), Case(op, B, 100, H, K, V, mode="fwd+bwd"), seeds=1, extra_seed=False
    )
    assert report.passed, [r for r in report.records if r.gating and not r.passed]
    checked = {r.check for r in report.records if r.gating}
    assert {"output", "final_state", "grad:q", "grad:g", "grad:initial_state"} <= checked
    assert any(c.startswith("streaming:") for c in checked)


# --- planted bugs: inside the kernel, rejected by the gate -------------------------------------------------------


@pytest.fixture
def planted_impl(monkeypatch: pytest.MonkeyPatch) -> Iterator[callable]:
    """Registers the kernels with a bug patched into their shared helpers as ``gdn2/pallas_planted``."""

    def make_op(bug: str) -> object:
        return pallas_chunk.TorchFacingJaxOp(
            pallas_chunk.chunk_gdn2_pallas, name=f"planted {bug}", gates=("g", "b", "w")
        )

    yield from planting(monkeypatch, make_op, "pallas_planted")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("bug", BUGS)
def test_planted_kernel_bug_is_rejected(planted_impl, bug: str, dtype: str) -> None:
    planted_impl(bug)
    case = Case("gdn2", B, 100, H, K, V, dtype=dtype, mode="fwd")
    report = verify_case(get_impl("gdn2", "pallas_planted"), case, seeds=1, extra_seed=False)
    assert not report.passed
    failed = {r.check for r in report.records if r.gating and not r.passed}
    assert {"output", "final_state"} & failed, failed


# --- lowered for the TPU on this host ---------------------------------------------------------------------------


def _tpu_export(fn, *shapes):
    from jax import export

    return export.export(jax.jit(fn), platforms=["tpu"])(*(jax.ShapeDtypeStruct(s, d) for s, d in shapes))


def _gdn2_shapes(T: int, dtype, K_: int = 128, V_: int = 128, Bh: int = 2, Hh: int = 2):
    key, val = (Bh, T, Hh, K_), (Bh, T, Hh, V_)
    return [(key, dtype), (key, dtype), (val, dtype), (key, jnp.float32), (key, dtype), (val, dtype)]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_lowers_for_the_tpu(dtype: str) -> None:
    """Forward alone and forward+backward (the training step) lower to one Mosaic kernel call for the TPU, with
    T = 200 (padded to 4 chunks), an initial state, K = V = 128."""
    dt = jnp.bfloat16 if dtype == "bf16" else jnp.float32
    shapes = [*_gdn2_shapes(200, dt), ((2, 2, 128, 128), jnp.float32)]

    def fwd(*a):
        return pallas_chunk.chunk_gdn2_pallas(*a[:6], initial_state=a[6])

    def train_step(*a):
        def loss(*p):
            o, s = pallas_chunk.chunk_gdn2_pallas(*p[:6], initial_state=p[6])
            return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(s)

        return jax.grad(loss, argnums=tuple(range(7)))(*a)

    text = _tpu_export(fwd, *shapes).mlir_module()
    assert text.count("tpu_custom_call") == 1 and "gdn2_fused_forward" in text, "one fused Mosaic kernel expected"
    text = _tpu_export(train_step, *shapes).mlir_module()
    assert text.count("tpu_custom_call") == 2, "the fused forward and the fused backward expected"
    assert "gdn2_fused_forward" in text and "gdn2_fused_backward" in text


def test_kda_lowers_for_the_tpu() -> None:
    shapes = [*_gdn2_shapes(128, jnp.bfloat16)[:4], ((2, 128, 2), jnp.bfloat16)]
    text = _tpu_export(lambda *a: pallas_chunk.chunk_kda_pallas(*a), *shapes).mlir_module()
    assert "tpu_custom_call" in text


def test_tpu_lowering_rejects_blocks_mosaic_cannot_tile() -> None:
    """The check has teeth: K = 16 makes the [C, K] block of the [B, T, H*K] view narrower than a 128-lane tile
    and not the whole axis, which the Mosaic lowering refuses (the registry's constraint says so up front)."""
    with pytest.raises(ValueError, match="divisible by 8 and 128"):
        _tpu_export(lambda *a: pallas_chunk.chunk_gdn2_pallas(*a), *_gdn2_shapes(64, jnp.float32, K_=16, V_=16))
    # the impl's own constraint (check_case says first that no TPU is visible, on a machine without one)
    why = get_impl("gdn2", "pallas_chunk").constraint(Case("gdn2", 1, 64, 2, 16, 16, device="tpu"))
    assert why and "multiples of 128" in why


def test_registered_with_reasons() -> None:
    for op in OPS:
        impl = get_impl(op, "pallas_chunk")
        assert impl.backend == "jax" and set(impl.devices) == {"cpu", "tpu"} and impl.supports_backward
        assert impl.check_case(Case(op, 1, 100, 2, 16, 24, dtype="bf16", mode="fwd+bwd")) is None
        on_tpu = Case(op, 8, 4096, 6, 128, 128, device="tpu")
        assert impl.constraint(on_tpu) is None and impl.check_case(on_tpu) == absent_reason("tpu")
        assert "interpreter" in (impl.check_case(Case(op, 8, 4096, 6, 128, 128)) or "")
        assert "not cuda" in (impl.check_case(Case(op, 1, 64, 2, 128, 128, device="cuda")) or "")
