"""The external adapters are listed with the right reason where their package is missing, import cleanly
without it, and their constraints reject the cases the wrapped kernels cannot run."""

from __future__ import annotations

import pytest

from deltabench.harness.cases import Case
from deltabench.harness.registry import get_impl
from deltabench.kernels.external import flash_qla

# (op, impl) -> the import name its reason must name
ADAPTERS = {
    ("gdn", "fla_chunk"): "fla",
    ("gdn", "fla_recurrent"): "fla",
    ("gdn2", "fla_chunk"): "fla",
    ("kda", "fla_chunk"): "fla",
    ("gdn", "flash_qla"): "flash_qla",
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
