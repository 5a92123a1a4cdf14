"""Sparse Delta Memory's contract (references/sdm.py's CONTRACT: dims B, T, H, S, D, W, R; int64 slot indices; a bank
state [B, H, S, D]) runs through the harness's gate unchanged: sdm torch_chunk against the float64 oracle. sdm is a
built-in op (harness/ops.py; its impls are declared in kernels/sdm/__init__.py)."""

from __future__ import annotations

import torch

from deltabench.correctness.engine import verify_case
from deltabench.harness import registry
from deltabench.harness.cases import Case
from deltabench.harness.ops import register_op, work
from deltabench.kernels.sdm import sdm_torch_chunk
from deltabench.references import sdm

CASE = {"B": 1, "T": 70, "H": 2, "S": 32, "D": 8, "W": 4, "R": 4}


def test_registering_the_built_in_contract_again_is_harmless() -> None:
    assert register_op(sdm.CONTRACT) is sdm.CONTRACT


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
