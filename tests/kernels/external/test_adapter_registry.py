"""The external adapters are listed with the right reason where their package is missing, import cleanly
without it, and their constraints reject the cases the wrapped kernels cannot run."""

from __future__ import annotations

import pytest
import torch

from deltabench.harness.cases import Case
from deltabench.harness.registry import get_impl
from deltabench.kernels.external import flash_qla, flashinfer

# (op, impl) -> the import name its reason must name
ADAPTERS = {
    ("gdn", "fla_chunk"): "fla",
    ("gdn", "fla_recurrent"): "fla",
    ("gdn2", "fla_chunk"): "fla",
    ("kda", "fla_chunk"): "fla",
    ("gdn2", "fla_recurrent"): "fla",
    ("kda", "fla_recurrent"): "fla",
    ("gdn2", "fla_decode"): "fla",
    ("kda", "fla_decode"): "fla",
    ("gdn", "flash_qla"): "flash_qla",
    ("gdn", "flashinfer_decode"): "flashinfer",
    ("gdn", "flashinfer_mtp"): "flashinfer",
    ("gdn", "opengdn_triton"): "opengdn",
    ("gdn", "opengdn_chunkwise"): "opengdn",
    ("gdn2", "atomic_ops_fused"): "atomic_ops",
    ("gdn2", "atomic_ops_auto"): "atomic_ops",
    ("gdn2", "atomic_ops_wy"): "atomic_ops",
    ("gdn2", "atomic_ops_serial"): "atomic_ops",
    ("sdm", "sdm_pkg_chunk"): "sparse_delta_memory",
}


def _row(listing: dict, op: str, impl: str) -> dict:
    rows = [r for r in listing["impls"] if r["op"] == op and r["impl"] == impl]
    assert len(rows) == 1, f"{op}/{impl} listed {len(rows)} times"
    return rows[0]


@pytest.mark.parametrize(("op", "impl"), list(ADAPTERS), ids=[f"{o}-{i}" for o, i in ADAPTERS])
def test_listed_unavailable_with_reason_when_package_missing(listing_without_packages, op, impl):
    row = _row(listing_without_packages, op, impl)
    assert row["available"] is False
    assert row["reason"] == f"needs the Python package {ADAPTERS[(op, impl)]!r}, which is not installed"
    assert row["source"] == "builtin"


def test_fla_chunk_records_the_guard_bypass(listing_without_packages):
    assert "bwd guard bypassed (FLA #640)" in _row(listing_without_packages, "gdn", "fla_chunk")["notes"]
    for op in ("gdn2", "kda"):
        assert "FLA_FLASH_QLA=0" in _row(listing_without_packages, op, "fla_chunk")["notes"]


def test_declared_capabilities(listing_without_packages):
    assert _row(listing_without_packages, "gdn", "fla_recurrent")["backward"] is False
    assert _row(listing_without_packages, "gdn", "flash_qla")["dtypes"] == ["bf16", "fp16"]
    assert _row(listing_without_packages, "gdn", "opengdn_triton")["dtypes"] == ["bf16"]
    assert _row(listing_without_packages, "gdn", "opengdn_chunkwise")["devices"] == ["cpu", "cuda"]


def test_adapter_modules_import_without_their_packages(without_packages):
    assert without_packages["loaded"] == []
    assert without_packages["notes"] == ""  # nothing bypassed until FLA is loaded on a Hopper GPU
    # FLA's dispatch switches are set by the adapter module, before FLA can be imported
    assert without_packages["env"] == ["0", "0"]


def test_calling_an_adapter_without_its_package_names_the_package(without_packages):
    assert without_packages["missing"] == "opengdn"


def _case(**kw) -> Case:
    dims = {"op": "gdn", "B": 1, "T": 64, "H": 2, "K": 128, "V": 128, "dtype": "bf16", "device": "cuda"}
    dims.update(kw)
    return Case(**dims)


class TestFlashQlaConstraint:
    def test_rejects_k_64(self):
        assert get_impl("gdn", "flash_qla").constraint(_case(K=64, V=64)) == "K = V = 128 only (got K=64, V=64)"

    def test_rejects_v_other_than_128(self):
        assert "K = V = 128 only" in get_impl("gdn", "flash_qla").constraint(_case(V=64))

    def test_rejects_cpu(self):
        assert get_impl("gdn", "flash_qla").constraint(_case(device="cpu")) == (
            "runs on NVIDIA GPUs only (SM90+), not cpu"
        )

    def test_rejects_fp32_by_dtype(self):
        assert get_impl("gdn", "flash_qla").check_case(_case(dtype="fp32")) == "supports bf16, fp16, not fp32"

    @pytest.mark.parametrize(("cap", "name"), [((8, 0), "sm_80"), ((8, 9), "sm_89"), ((11, 0), "sm_110")])
    def test_rejects_older_or_unknown_gpus(self, cap, name):
        why = flash_qla.unsupported_reason(K=128, V=128, device="cuda", capability=cap)
        assert why is not None and why.startswith("needs an SM90+ GPU") and why.endswith(f"this is {name})")

    def test_rejects_an_odd_number_of_heads(self):
        # an H200 raised inside TileLang at H = 3 ("no available layout found"); H = 6 and 16 run
        why = get_impl("gdn", "flash_qla").constraint(_case(H=3))
        assert why is not None and why.startswith("an even number of heads only (got H=3)")
        assert get_impl("gdn", "flash_qla").constraint(_case(H=6)) is None

    @pytest.mark.parametrize("cap", flash_qla.SUPPORTED_ARCHS)
    def test_accepts_its_gpus_at_128(self, cap):
        assert flash_qla.unsupported_reason(K=128, V=128, device="cuda", capability=cap) is None


@pytest.mark.parametrize("op", ["gdn", "gdn2", "kda"])
def test_fla_chunk_refuses_fp32_which_it_computes_with_tf32(op):
    why = get_impl(op, "fla_chunk").constraint(_case(op=op, dtype="fp32"))
    assert why is not None and "TF32" in why
    assert get_impl(op, "fla_chunk").constraint(_case(op=op, dtype="bf16")) is None


def test_fla_recurrent_keeps_fp32():
    assert get_impl("gdn", "fla_recurrent").constraint(_case(dtype="fp32")) is None


def test_fla_rejects_wide_heads_and_fla_recurrent_backward():
    assert get_impl("gdn", "fla_chunk").constraint(_case(K=512, V=512)).startswith("K and V up to 256")
    assert get_impl("kda", "fla_chunk").constraint(_case(op="kda", K=64, V=64)) is None
    assert get_impl("gdn", "fla_recurrent").check_case(_case(mode="fwd+bwd")) == "forward only (no backward)"


def test_opengdn_triton_is_bf16_cuda_only():
    impl = get_impl("gdn", "opengdn_triton")
    assert impl.check_case(_case(dtype="fp16")) == "supports bf16, not fp16"
    assert impl.devices == ("cuda",)
    assert impl.constraint(_case(K=1024, V=64)).startswith("K and V up to 512")


def test_packages_hidden_are_the_ones_named(adapter_packages):
    assert {ADAPTERS[key] for key in ADAPTERS} <= set(adapter_packages)


def test_fla_recurrent_runs_decode_steps():
    """FLA's fused_recurrent_gated_delta_rule is its decode path: fla_recurrent takes mode decode (forward only)."""
    from deltabench.harness import Case, get_impl

    impl = get_impl("gdn", "fla_recurrent")
    case = Case("gdn", B=1, T=1, H=16, K=128, V=128, dtype="bf16", mode="decode", device="cuda")
    assert not impl.modes and not impl.supports_backward
    why = impl.check_case(case) or ""
    assert "forward only" not in why and "mode" not in why


@pytest.mark.parametrize(("op", "impl"), [(op, i) for op in ("gdn2", "kda") for i in ("fla_recurrent", "fla_decode")])
def test_fla_token_serial_kernels_take_decode_steps(op, impl):
    """gdn2's and kda's fused_recurrent kernels are forward only; fla_decode is a decode step writing its state in
    place (fused_recurrent_*_fwd(inplace_final_state=True))."""
    got = get_impl(op, impl)
    assert not got.supports_backward
    assert (got.modes, got.state_in_place) == ((("decode",), True) if impl == "fla_decode" else ((), False))
    assert got.constraint(_case(op=op, K=512, V=512)).startswith("K and V up to 256")
    assert got.constraint(_case(op=op, dtype="fp32")) is None  # no tensor-core products: fp32 stays fp32


class TestFlashInferConstraint:
    """What FlashInfer's GDN decode entry points assert, said before a call: device, GPU, dtype, T, head dims."""

    def _why(self, entry: str = "decode", **kw):
        args = {"T": 1, "K": 128, "V": 128, "dtype": "bf16", "device": "cuda", "capability": (9, 0)} | kw
        return flashinfer.unsupported_reason(entry=entry, **args)

    def test_accepts_its_h200_shapes(self):
        assert self._why() is None
        assert self._why("mtp", T=8) is None
        assert self._why("mtp", T=2, K=256, V=256, dtype="fp16", capability=(10, 0)) is None

    def test_decode_takes_one_token_and_mtp_more(self):
        assert self._why(T=2) == (
            "gated_delta_rule_decode takes one new token (T = 1), got T=2: flashinfer_mtp takes T > 1"
        )
        assert self._why("mtp", T=1) == (
            "gated_delta_rule_mtp is FlashInfer's multi-token path (T > 1): flashinfer_decode takes T = 1"
        )

    @pytest.mark.parametrize(
        ("kw", "start"),
        [
            ({"device": "cpu"}, "FlashInfer's GDN decode kernels run on NVIDIA GPUs only"),
            ({"capability": (8, 0)}, "FlashInfer's GDN decode kernels need an SM90+ GPU (this is sm_80)"),
            ({"dtype": "fp32"}, "FlashInfer's GDN decode takes q, k, v in fp16 or bf16"),
            ({"K": 64}, "FlashInfer's GDN decode needs K and V of at least 128"),
            ({"V": 144}, "FlashInfer's GDN decode needs V a multiple of 32"),
        ],
    )
    def test_refusals(self, kw, start):
        for entry, T in (("decode", 1), ("mtp", 4)):
            why = self._why(entry, **{"T": T, **kw})
            assert why is not None and why.startswith(start), why

    def test_declared_as_in_place_decode_steps(self):
        for name in ("flashinfer_decode", "flashinfer_mtp"):
            impl = get_impl("gdn", name)
            assert (impl.modes, impl.state_in_place, impl.supports_backward) == (("decode",), True, False)
            assert impl.dtypes == ("bf16", "fp16")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flashinfer_gates_give_back_g_and_beta(dtype):
    """FlashInfer's own gate formulas, applied to what flashinfer_gates returns, give back deltabench's g and beta
    within the rounding of its fp16/bf16 pre-activations (the edges g = 0 and beta in {0, 1} exactly)."""
    gen = torch.Generator().manual_seed(0)
    g = torch.cat([torch.nn.functional.logsigmoid(torch.randn(2, 4, 16, generator=gen) * 3), torch.zeros(1, 4, 16)])
    beta = torch.cat([torch.rand(2, 4, 16, generator=gen), torch.ones(1, 4, 16)]).to(dtype)
    beta[0, 0, 0] = 0.0
    A_log, a, dt_bias, b = flashinfer.flashinfer_gates(g, beta, dtype)
    assert (a.dtype, b.dtype, A_log.dtype, dt_bias.dtype) == (dtype, dtype, torch.float32, torch.float32)
    assert a.shape == b.shape == g.shape and A_log.shape == dt_bias.shape == (16,)
    # FlashInfer: g = -exp(A_log) * softplus(a + dt_bias) (softplus linear above 20), beta = sigmoid(b)
    x = a.float() + dt_bias
    g_back = -A_log.exp() * torch.where(x > 20, x, torch.nn.functional.softplus(x))
    eps = torch.finfo(dtype).eps
    # rounding a to `dtype` moves it by at most |a| eps / 2, and g by softplus'(a) = sigmoid(a) times that
    # (a = -inf at g = 0, where that product is nan: those rows are checked exactly below)
    bound = torch.nan_to_num(a.float().abs() * torch.sigmoid(a.float()) * eps / 2) + 1e-6
    assert torch.all((g_back - g).abs() <= bound), ((g_back - g).abs() - bound).max()
    assert torch.equal(g_back[2], g[2])  # g = 0 exactly
    beta_back = torch.sigmoid(b.float())
    assert torch.allclose(beta_back, beta.float(), rtol=0, atol=eps / 4)  # beta(1 - beta) |logit beta| <= 0.23
    assert beta_back[0, 0, 0] == 0 and torch.all(beta_back[2] == 1)
