"""deltabench's Pallas GDN-2 kernels for a GPU (``pallas_gpu_chunk``; KDA through them), checked without a GPU:

* in Pallas' interpreter on the CPU, through the registry's torch wrapper, against the float64 oracle: o, the
  final state and every gradient by name, fp32 and bf16, both gate regimes, with and without an initial state,
  T within one chunk, at a chunk multiple and past one, K and V not powers of two (padded inside); the value
  columns split over programs (their key-side gradient shares summed); then through the harness's own gate, and
  two bugs planted inside the kernels (a wrong decay, the last block dropped) that the gate must reject;
* lowered for CUDA (``jax.export`` with ``platforms=["cuda"]``): Pallas' Triton lowering runs on this host, so an
  operation it cannot lower or a tile that is not a power of two fails here (Triton's own compiler passes, which
  follow, run only with a GPU).

Interpreted programs are slow to compile: shapes are tiny and reused.
"""

from __future__ import annotations

import os
import re

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

from deltabench.kernels.gdn2.jax.pallas import gpu as pallas_gpu  # noqa: E402
from deltabench.kernels.gdn2.jax.pallas import gpu_chunk  # noqa: E402

B, H, K, V = 1, 2, 16, 24
# Relative Frobenius error bounds, as tests/kernels/gdn2/test_pallas.py: fp32 float32 math against float64;
# bf16 the rounding of o and of each gradient to bf16.
BOUND = {"fp32": 2e-5, "bf16": 1e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
OPS = {
    "gdn2": (("q", "k", "v", "g", "b", "w"), gdn2.gdn2_recurrent, gdn2.make_inputs),
    "kda": (("q", "k", "v", "g", "beta"), kda.kda_recurrent, kda.make_inputs),
}
IMPL = "pallas_gpu_chunk"


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


def _check_against_oracle(
    fn, op: str, T: int, dtype: str, h0: bool, regime: str, where: str, K: int = K, V: int = V, state_bound=None
) -> None:
    """o and every gradient within `dtype`'s bound of the float64 oracle, the final state (float32 whatever the
    inputs) within `state_bound`: default `dtype`'s too, as bf16 inputs' default products round the state's
    operands to bf16 (the gate's own bound for it)."""
    args, oracle, make_inputs = OPS[op]
    inputs = make_inputs(B, T, H, K, V, dtype=DTYPES[dtype], seed=T, regime=regime, initial_state=h0)
    gen = torch.Generator().manual_seed(T + 1)
    do = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    ds = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)
    o, s, grads = _grads(fn, args, inputs, do, ds)
    o_ref, s_ref, grads_ref = _grads(oracle, args, {n: t.double() for n, t in inputs.items()}, do, ds)
    assert o.shape == (B, T, H, V) and o.dtype == inputs["v"].dtype, where
    assert s.shape == (B, H, K, V) and s.dtype == torch.float32, where
    assert rel_err(o, o_ref) < BOUND[dtype], f"o off at {where}: {rel_err(o, o_ref):.2e}"
    state_bound = BOUND[dtype] if state_bound is None else state_bound
    assert rel_err(s, s_ref) < state_bound, f"final state off at {where}: {rel_err(s, s_ref):.2e}"
    assert set(grads) == {*args, *(["initial_state"] if h0 else [])}
    for name, want in grads_ref.items():
        got = grads[name]
        assert got.shape == inputs[name].shape and got.dtype == inputs[name].dtype, f"d{name} at {where}"
        assert rel_err(got, want) < BOUND[dtype], f"d{name} off at {where}: {rel_err(got, want):.2e}"


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
    for regime in ("typical", "long"):
        where = f"{op} T={T} {dtype} {regime} h0={h0}"
        _check_against_oracle(get_impl(op, IMPL), op, T, dtype, h0, regime, where)


def _configured(**options) -> gpu_chunk.TorchFacingJaxOp:
    """The gdn2 kernels with non-default tiling or products, torch-facing."""
    return gpu_chunk.TorchFacingJaxOp(
        lambda *a, **kw: gpu_chunk.chunk_gdn2_pallas_gpu(*a, **options, **kw), name=str(options), gates=("g", "b", "w")
    )


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_value_blocks_match_float64_oracle(dtype: str) -> None:
    """V = 24 padded to 32 and split into two programs of 16 columns: the forward's blocks and the sum of the
    backward's key-side gradient shares."""
    for regime in ("typical", "long"):
        _check_against_oracle(_configured(block_v=16), "gdn2", 100, dtype, True, regime, f"block_v=16 {regime}")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_key_blocks_match_float64_oracle(dtype: str) -> None:
    """K = 80 padded to 128: the pairwise scores summed over four blocks of 32 key columns in the prepare, and the
    scores' gradients a program per block of 32 (the last one all padding)."""
    assert pallas_gpu.SCORES_BLOCK_K == 32
    for regime in ("typical", "long"):
        _check_against_oracle(get_impl("gdn2", IMPL), "gdn2", 100, dtype, True, regime, f"K=80 {regime}", K=80, V=40)


def test_bf16x3_products_pass_at_bf16() -> None:
    """Three bf16 products a matmul (the split is written out, so the interpreter computes what the tensor cores
    would): within the bf16 bounds, the final state within fp32's (seen: <= 1e-5 here)."""
    for regime in ("typical", "long"):
        where = f"bf16x3 {regime}"
        _check_against_oracle(_configured(dots="bf16x3"), "gdn2", 100, "bf16", True, regime, where, state_bound=2e-5)


def test_strong_decay_stays_finite() -> None:
    """g = -30 a token on the even channels beside slow ones: exp(G) / exp(G) factoring would overflow float32
    within a chunk; the kernels' pairwise exp(min(G_i - G_j, 0)) stays finite and exact."""
    args, oracle, make_inputs = OPS["gdn2"]
    inputs = make_inputs(B, 100, H, K, V, seed=5)
    inputs["g"][..., ::2] = -30.0
    do = torch.randn(B, 100, H, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ds = torch.zeros(B, H, K, V, dtype=torch.float64)
    o, s, grads = _grads(get_impl("gdn2", IMPL), args, inputs, do, ds)
    o_ref, s_ref, grads_ref = _grads(oracle, args, {n: t.double() for n, t in inputs.items()}, do, ds)
    assert all(torch.isfinite(t).all() for t in (o, s, *grads.values()))
    assert rel_err(o, o_ref) < 2e-5 and rel_err(s, s_ref) < 2e-5
    assert max(rel_err(grads[n], grads_ref[n]) for n in args) < 2e-5


def test_stage_entry_points_give_what_the_whole_kernels_use() -> None:
    """gdn2_gpu_prepare alone makes the forward's prepared chunks, and the backward stopped after the cotangent's
    walk gives its initial-state cotangent: the stage timings (benchmarks/gpu/gdn2_pallas.py --stages) time the
    same work."""
    t = gdn2.make_inputs(B, 100, H, K, V, seed=3, initial_state=True)
    args = [jnp.asarray(t[n].numpy()) for n in OPS["gdn2"][0]]
    h0_t = jnp.swapaxes(jnp.asarray(t["initial_state"].numpy()), -1, -2)
    do = jnp.asarray(torch.randn(B, 100, H, V, generator=torch.Generator().manual_seed(4)).numpy())
    kw = {"interpret": True, "dots": "fp32"}
    _, _, states_t, prepared = pallas_gpu.gdn2_gpu_forward(*args, h0_t, scale=0.25, store_states=True, **kw)
    alone = pallas_gpu.gdn2_gpu_prepare(*args, **kw)
    assert len(prepared) == 6 and len(alone) == 6
    for got, want in zip([alone[i] for i in (0, 2, 3, 4, 5)], prepared[:5], strict=True):  # W, q_d, k_d, P, T
        assert jnp.array_equal(got, want)
    whole = pallas_gpu.gdn2_gpu_backward(*args, do, states_t, h0_t, prepared, scale=0.25, **kw)
    dstates_t, dh0_t = pallas_gpu.gdn2_gpu_backward(
        *args, do, states_t, h0_t, prepared, scale=0.25, dstate_only=True, **kw
    )
    assert dstates_t.shape == states_t.shape
    assert jnp.array_equal(dh0_t[:, :, :V, :K], whole[-1])


@pytest.mark.parametrize("op", OPS)
def test_passes_the_verification_gate(op: str) -> None:
    """The harness's gate (oracle, every gradient, streaming, both initial-state variants) accepts the kernels."""
    report = verify_case(get_impl(op, IMPL), Case(op, B, 100, H, K, V, mode="fwd+bwd"), seeds=1, extra_seed=False)
    assert report.passed, [r for r in report.records if r.gating and not r.passed]
    checked = {r.check for r in report.records if r.gating}
    assert {"output", "final_state", "grad:q", "grad:g", "grad:initial_state"} <= checked
    assert any(c.startswith("streaming:") for c in checked)


# --- planted bugs: inside the kernels, rejected by the gate ------------------------------------------------------


@pytest.fixture
def planted_impl(monkeypatch: pytest.MonkeyPatch) -> Iterator[callable]:
    """Registers the kernels with a bug patched into their shared helpers as ``gdn2/pallas_gpu_planted``."""

    def make_op(bug: str) -> object:
        return gpu_chunk.TorchFacingJaxOp(gpu_chunk.chunk_gdn2_pallas_gpu, name=f"planted {bug}", gates=("g", "b", "w"))

    yield from planting(monkeypatch, make_op, "pallas_gpu_planted")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("bug", BUGS)
def test_planted_kernel_bug_is_rejected(planted_impl, bug: str, dtype: str) -> None:
    planted_impl(bug)
    case = Case("gdn2", B, 100, H, K, V, dtype=dtype, mode="fwd")
    # stopped at its first failure, as a job's gate is: the dropped block leaves a sweep length under one chunk with
    # no chunk at all, which the per-chunk kernels cannot even be called with (a crash, after the wrong answers)
    impl = get_impl("gdn2", "pallas_gpu_planted")
    report = verify_case(impl, case, seeds=1, extra_seed=False, stop_at_failure=True)
    assert not report.passed
    failed = {r.check for r in report.records if r.gating and not r.passed}
    assert {"output", "final_state"} & failed, failed


# --- lowered for CUDA on this host ------------------------------------------------------------------------------


def _cuda_export(fn, *shapes):
    """``fn`` exported for CUDA. Pallas' Triton kernels are custom calls without JAX's serialisation guarantee,
    which export refuses unless told: lowering is what is checked here, nothing is serialised."""
    from jax import export

    triton = export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
    sds = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
    return export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=[triton])(*sds).mlir_module()


def _gdn2_shapes(T: int, dtype, K_: int = 128, V_: int = 128, Bh: int = 2, Hh: int = 2):
    key, val = (Bh, T, Hh, K_), (Bh, T, Hh, V_)
    return [(key, dtype), (key, dtype), (val, dtype), (key, jnp.float32), (key, dtype), (val, dtype)]


@pytest.mark.parametrize(
    ("dtype", "options"),
    [
        ("bf16", {}),
        ("fp32", {}),
        ("bf16", {"block_v": None}),
        ("bf16", {"dots": "bf16x3", "num_stages": 3}),
        ("bf16", {"grads_warps": 4, "walk_warps": 2}),
    ],
)
def test_lowers_for_cuda(dtype: str, options: dict) -> None:
    """Forward alone and forward+backward (the training step) lower to Triton kernel calls for CUDA, with
    T = 200 (4 chunks, the last partial), an initial state, K = V = 128, whole or split value columns, IEEE
    float32 or bf16x3 products."""
    dt = jnp.bfloat16 if dtype == "bf16" else jnp.float32
    shapes = [*_gdn2_shapes(200, dt), ((2, 2, 128, 128), jnp.float32)]

    def fwd(*a):
        return gpu_chunk.chunk_gdn2_pallas_gpu(*a[:6], initial_state=a[6], **options)

    def train_step(*a):
        def loss(*p):
            o, s = gpu_chunk.chunk_gdn2_pallas_gpu(*p[:6], initial_state=p[6], **options)
            return jnp.sum(o.astype(jnp.float32) ** 2) + jnp.sum(s)

        return jax.grad(loss, argnums=tuple(range(7)))(*a)

    text = _cuda_export(fwd, *shapes)
    assert text.count("__gpu$xla.gpu.triton") == 3, "the chunks' prepare, the state's walk and the output expected"
    for name in ("prepare", "forward", "output"):
        assert f'name = "gdn2_gpu_{name}"' in text, name
    assert "interpret" not in text and "tpu_custom_call" not in text
    text = _cuda_export(train_step, *shapes)
    # the forward's three kernels, then the backward's three (the cotangent's walk over the forward's prepared work,
    # the gradients, the scores' gradients by key blocks): the chunks are prepared once
    assert text.count("__gpu$xla.gpu.triton") == 6
    for name in ("prepare", "forward", "output", "dstate", "backward", "scores_backward"):
        assert f'name = "gdn2_gpu_{name}"' in text, name
    stages = options.get("num_stages", 1)  # the pipelining depth asked for reaches every kernel's Triton call
    assert text.count(f"num_stages = {stages} : i32") == 6
    # the gradient kernel's own warps reach it alone, the walks' the two walks alone
    warps = re.findall(r'name = "(gdn2_gpu_\w+)", num_stages = \d+ : i32, num_warps = (\d+) : i32', text)
    assert len(warps) == 6, warps
    walks = options.get("walk_warps", gpu_chunk.WALK_WARPS)
    own = {"gdn2_gpu_backward": options.get("grads_warps", gpu_chunk.GRADS_WARPS)}
    own |= {"gdn2_gpu_forward": walks, "gdn2_gpu_dstate": walks}
    assert all(int(n) == own.get(name, 4) for name, n in warps), warps


def test_kda_and_odd_widths_lower_for_cuda() -> None:
    """KDA through the same kernels, and K = 96, V = 80 (padded to 128 inside) both lower."""
    shapes = [*_gdn2_shapes(128, jnp.bfloat16)[:4], ((2, 128, 2), jnp.bfloat16)]
    assert "__gpu$xla.gpu.triton" in _cuda_export(lambda *a: gpu_chunk.chunk_kda_pallas_gpu(*a), *shapes)
    odd = _gdn2_shapes(100, jnp.bfloat16, K_=96, V_=80)
    assert "__gpu$xla.gpu.triton" in _cuda_export(lambda *a: gpu_chunk.chunk_gdn2_pallas_gpu(*a), *odd)


def test_cuda_lowering_rejects_tiles_triton_cannot_hold() -> None:
    """The check has teeth: a chunk of 48 tokens makes [48, K] tiles, which Triton's lowering refuses (tensors
    must have power-of-two sizes); the public function refuses such a chunk up front."""
    shapes = [*_gdn2_shapes(96, jnp.float32, K_=16, V_=16), ((2, 2, 16, 16), jnp.float32)]
    with pytest.raises(ValueError, match="power of 2"):
        _cuda_export(lambda *a: pallas_gpu.gdn2_gpu_forward(*a, scale=0.25, chunk=48), *shapes)
    with pytest.raises(ValueError, match="power of two"):
        gpu_chunk.chunk_gdn2_pallas_gpu(*(jnp.zeros(s, d) for s, d in shapes[:6]), chunk_size=48)
    with pytest.raises(ValueError, match="dots must be one of"):
        gpu_chunk.chunk_gdn2_pallas_gpu(*(jnp.zeros(s, d) for s, d in shapes[:6]), dots="tf32")


def test_registered_with_reasons() -> None:
    for op in OPS:
        impl = get_impl(op, IMPL)
        assert impl.backend == "jax" and set(impl.devices) == {"cpu", "cuda"} and impl.supports_backward
        assert impl.check_case(Case(op, 1, 100, 2, 16, 24, dtype="bf16", mode="fwd+bwd")) is None
        on_gpu = Case(op, 8, 4096, 6, 128, 128, dtype="bf16", device="cuda")
        assert impl.constraint(on_gpu) is None and impl.check_case(on_gpu) == absent_reason("cuda")
        # float32 at K = V = 128 asked more shared memory than an H200 has (measured): refused with the reason
        assert "352 KiB of shared memory" in (impl.constraint(on_gpu.replace(dtype="fp32")) or "")
        assert impl.constraint(on_gpu.replace(dtype="fp32", K=64, V=64)) is None
        assert "interpreter" in (impl.check_case(Case(op, 8, 4096, 6, 128, 128)) or "")
        assert "not tpu" in (impl.check_case(Case(op, 1, 64, 2, 128, 128, device="tpu")) or "")
