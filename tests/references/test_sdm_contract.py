"""Sparse Delta Memory's contract (references/sdm.py's CONTRACT: dims B, T, H, S, D, W, R; int64 slot indices; a bank
state [B, H, S, D]) runs through the harness's gate unchanged: sdm torch_chunk against the float64 oracle. The op is
registered here only (its harness wiring, suites and impl declarations, is a step of its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from deltabench.harness import document, registry
from deltabench.harness.cases import Case
from deltabench.harness.ops import OPS, register_op, work
from deltabench.harness.registry import register_impl
from deltabench.harness.verify import verify_case
from deltabench.kernels.sdm import sdm_torch_chunk
from deltabench.references import sdm

CASE = {"B": 1, "T": 70, "H": 2, "S": 32, "D": 8, "W": 4, "R": 4}


@pytest.fixture(autouse=True)
def _sdm_registered() -> Iterator[None]:
    register_op(sdm.CONTRACT)
    register_impl("sdm", "torch_chunk", backend="torch", devices=("cpu",), dtypes=("fp32", "bf16"))(sdm_torch_chunk)
    yield
    OPS.pop("sdm", None)
    for key in [k for k in registry._REGISTRY if k[0] == "sdm"]:
        del registry._REGISTRY[key]
    document._registered_ops.discard("sdm")


def test_sdm_torch_chunk_passes_the_gate_in_every_sdm_regime() -> None:
    torch.set_num_threads(1)
    case = Case("sdm", **CASE, dtype="fp32", mode="fwd+bwd")
    assert case.shape_id == "B1-T70-H2-D8-R4-S32-W4"
    report = verify_case(registry.get_impl("sdm", "torch_chunk"), case, seeds=1, extra_seed=False)
    assert report.passed, [f"{r.check} {r.regime} {r.detail}" for r in report.failures]
    checks = {r.check for r in report.records}
    assert {"output", "final_state", "grad:k_val", "grad:q_val", "grad:v", "grad:g", "grad:initial_bank"} <= checks
    assert not {"grad:k_idx", "grad:q_idx"} & checks  # int64 slot indices have no gradient
    assert {r.regime for r in report.records if r.check == "output"} >= set(sdm.SDM_REGIMES)
    assert work("sdm", case.dims, "fp32", "fwd")["flops"] == 1 * 70 * 2 * 8 * (6 * 4 + 2 * 4)


def test_the_gate_catches_an_sdm_impl_that_ignores_its_key_weighted_decay_option() -> None:
    def ignores_option(*args, key_weighted_decay=False, **kwargs):  # type: ignore[no-untyped-def]
        return sdm_torch_chunk(*args, key_weighted_decay=False, **kwargs)

    case = Case("sdm", **CASE, dtype="fp32", mode="fwd")
    report = verify_case(ignores_option, case, seeds=1, extra_seed=False, regimes=["typical", "key_weighted"])
    assert not report.passed
    assert {r.regime for r in report.failures if r.check == "output"} == {"key_weighted"}
