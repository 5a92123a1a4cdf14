"""atomic-ops' paths through deltabench's gate: its pure-JAX references (and its dispatcher, which falls back to
one of them without a TPU) against the float64 oracle, and its constraints' reasons. Runs where ``atomic_ops``
is installed (the ``external`` extra)."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("DELTABENCH_JAX_FAST_COMPILE", "1")

import pytest

from deltabench.correctness.engine import verify_case
from deltabench.harness.cases import Case
from deltabench.harness.registry import get_impl

pytest.importorskip("atomic_ops")
from deltabench.kernels.external import atomic_ops as adapter

# T = 512: two of its 256-token chunks, so the streaming check splits at 256 (the only split it runs); K != V.
GATED = [
    ("atomic_ops_wy", "fp32", "typical"),
    ("atomic_ops_wy", "bf16", "long"),
    ("atomic_ops_serial", "bf16", "typical"),
    ("atomic_ops_auto", "fp32", "long"),
]


@pytest.mark.parametrize(("impl", "dtype", "regime"), GATED, ids=[f"{i}-{d}-{r}" for i, d, r in GATED])
def test_passes_the_gate(impl: str, dtype: str, regime: str) -> None:
    case = Case("gdn2", 1, 512, 1, 16, 24, dtype=dtype, mode="fwd+bwd", regime=regime)
    report = verify_case(get_impl("gdn2", impl), case, seeds=1, extra_seed=False)
    assert report.passed, [r for r in report.records if r.gating and not r.passed]
    checked = {r.check for r in report.records if r.gating}
    assert {"output", "final_state", "grad:g", "grad:b", "grad:w", "grad:initial_state"} <= checked
    streaming = [r for r in report.records if r.check.startswith("streaming:")]
    split = 255 if impl == "atomic_ops_serial" else 256  # the gate's own split, or the one a chunk-256 path runs
    assert streaming and all(f"T1={split})" in r.reference for r in streaming)


def test_without_a_tpu_the_dispatcher_runs_its_chunked_wy() -> None:
    assert adapter.dispatched_path(128) == "chunked_wy"


def test_constraints_give_reasons() -> None:
    fused, wy, serial = (get_impl("gdn2", n) for n in ("atomic_ops_fused", "atomic_ops_wy", "atomic_ops_serial"))
    assert "runs on tpu, not cpu" in fused.check_case(Case("gdn2", 8, 4096, 6, 128, 128))
    # the constraints themselves: check_case says first that no TPU is visible, on a machine without one
    assert "is_tpu_available() is False" in fused.constraint(Case("gdn2", 8, 4096, 6, 128, 128, device="tpu"))
    assert "d = 128" in fused.constraint(Case("gdn2", 1, 256, 6, 64, 64, device="tpu"))
    assert "seq_len % bt == 0" in wy.check_case(Case("gdn2", 1, 300, 2, 16, 16))
    assert wy.check_case(Case("gdn2", 8, 4096, 6, 128, 128)) is None
    assert serial.check_case(Case("gdn2", 1, 300, 2, 16, 16)) is None
    # with T = 256 there is no split the chunked path runs: the streaming check says so and does not gate
    report = verify_case(wy, Case("gdn2", 1, 256, 1, 16, 16, mode="fwd"), seeds=1, extra_seed=False)
    notes = [r for r in report.records if r.check == "streaming"]
    assert report.passed and notes and all(not r.gating and "runs no split of T=256" in r.detail for r in notes)
