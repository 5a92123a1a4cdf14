"""The gate's bounds per regime and per tensor size (correctness/tolerances.py) reach the records they are meant for,
and only those: the strong regime's bf16 gradient bound judges gradients drawn in the strong regime and no other,
and the few-element bound judges tensors of fewer than FEW_ELEMENTS elements and no other. Each is shown on a
planted error that one bound lets through and the other rejects, through the public API as a user's kernel is
verified.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from grad_scale import ScaleGrad

from deltabench.correctness.engine import verify_case
from deltabench.correctness.tolerances import FEW_ELEMENT_TOLERANCES, FEW_ELEMENTS, REGIME_TOLERANCES, TOLERANCES
from deltabench.harness import Case, get_impl, register_impl
from deltabench.harness import registry as _registry

SHAPE = {"B": 1, "T": 100, "H": 2, "K": 16, "V": 24}
# A relative error of 1.2e-2 on one gradient: over the typical bf16 bound (9e-3), under the strong one (4e-2).
ERROR = 0.012


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _regime_of(g: torch.Tensor) -> str:
    """The gate regime a gdn log-decay was drawn in (references/_inputs.py): ``long`` keeps every log-decay in
    [-0.05, 0]; ``strong`` puts half the heads in [-5, -0.5] (a fifth of all values under -2.5, where ``typical``,
    logsigmoid of a normal draw, puts under 1%)."""
    g = g.detach()
    if float(g.min()) >= -0.05:
        return "long"
    return "strong" if float((g < -2.5).float().mean()) > 0.1 else "typical"


def dk_off_in(regime: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """gdn's correct ``torch_chunk``, its dk off by ERROR (relative) on inputs drawn in `regime` only."""
    correct = get_impl("gdn", "torch_chunk")

    def fn(q, k, v, g, beta, scale=None, initial_state=None):
        if _regime_of(g) == regime:
            k = ScaleGrad.apply(k, 1.0 + ERROR)
        return correct(q, k, v, g, beta, scale=scale, initial_state=initial_state)

    return fn


def dg_dropped_at_t1() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """gdn's correct ``torch_chunk`` whose T = 1 path returns no gradient for g (zero): a bug only the length
    sweep's T = 1 run reaches, where dg has B*H = 2 elements."""
    correct = get_impl("gdn", "torch_chunk")

    def fn(q, k, v, g, beta, scale=None, initial_state=None):
        if q.shape[1] == 1:
            g = ScaleGrad.apply(g, 0.0)
        return correct(q, k, v, g, beta, scale=scale, initial_state=initial_state)

    return fn


@contextlib.contextmanager
def planted(name: str, fn: Callable[..., Any]) -> Iterator[Any]:
    register_impl("gdn", name, backend="torch", devices=("cpu",), dtypes=("fp32", "bf16"))(fn)
    try:
        yield get_impl("gdn", name)
    finally:
        _registry._REGISTRY.pop(("gdn", name), None)


def _grad_k(report: Any, regime: str) -> list[Any]:
    return [r for r in report.records if r.check == "grad:k" and r.metric == "rel_fro" and r.regime == regime]


def test_an_error_within_the_strong_bound_passes_in_the_strong_regime_only() -> None:
    """dk off by 1.2e-2: the gate passes it when only strong-regime inputs carry it (bound 4e-2) and rejects it,
    on grad:k in the typical regime and nowhere else, when typical inputs carry it (bound 9e-3)."""
    case = Case("gdn", **SHAPE, dtype="bf16", mode="fwd+bwd")
    with planted("test_dk_off_in_strong", dk_off_in("strong")) as impl:
        strong_only = verify_case(impl, case, seeds=1, extra_seed=False)
    assert strong_only.passed, [(r.check, r.regime, r.value, r.threshold) for r in strong_only.failures]
    seen = _grad_k(strong_only, "strong")
    assert seen and all(r.value > 0.9 * ERROR for r in seen)  # the error is there, and judged by the strong bound
    assert {r.threshold for r in seen} == {REGIME_TOLERANCES[("bf16", "strong")]["gradient"]}
    assert all(r.value < 0.5 * ERROR for r in _grad_k(strong_only, "typical") + _grad_k(strong_only, "long"))

    with planted("test_dk_off_in_typical", dk_off_in("typical")) as impl:
        typical_only = verify_case(impl, case, seeds=1, extra_seed=False)
    assert not typical_only.passed
    assert {(r.check, r.regime) for r in typical_only.failures} == {("grad:k", "typical")}
    failed = [r for r in typical_only.failures if r.metric == "rel_fro"]
    assert all(r.threshold == TOLERANCES["bf16"]["gradient"] and r.value > 0.9 * ERROR for r in failed)


def test_the_few_element_bound_judges_tiny_tensors_and_still_rejects_a_dropped_gradient() -> None:
    """At T = 1 (B1-H2) dg has 2 elements and gets the few-element bound, every tensor of 64 elements or more the
    regime's; a T = 1 path that drops dg (relative error 1) fails there, by more than 3x that bound."""
    case = Case("gdn", **SHAPE, dtype="bf16", mode="fwd+bwd")
    few = FEW_ELEMENT_TOLERANCES["bf16"]["gradient"]
    with planted("test_dg_dropped_at_t1", dg_dropped_at_t1()) as impl:
        report = verify_case(impl, case, seeds=1, extra_seed=False)
    at_t1 = [r for r in report.records if r.metric == "rel_fro" and r.reference.startswith("oracle at B1-T1-")]
    assert at_t1
    by_check = {r.check: r for r in at_t1}
    assert by_check["grad:g"].threshold == by_check["grad:beta"].threshold == few
    # B*T*H*K = 32 < FEW_ELEMENTS: at T = 1 every gradient of this small case is a few-element tensor; the longer
    # lengths' (dg: B*T*H >= 128 elements) keep the regime's bounds, below
    assert by_check["grad:q"].threshold == few
    assert 32 < FEW_ELEMENTS <= 64
    assert {(r.check, r.reference) for r in report.failures} == {("grad:g", by_check["grad:g"].reference)}
    assert by_check["grad:g"].value >= 3 * few
    elsewhere = [r for r in report.records if r.check == "grad:g" and r.metric == "rel_fro" and r not in at_t1]
    assert elsewhere and all(r.threshold < few for r in elsewhere)


def test_the_report_row_shows_the_record_nearest_its_bound() -> None:
    """Rows merge regimes, whose bounds differ: the row shows the record nearest its own bound, not the largest
    value (a strong-regime 1.3e-2 under 4e-2 is further from failing than a typical 8.5e-3 under 9e-3)."""
    from deltabench.cli.verify import summarize_records
    from deltabench.correctness.checks import compare

    ref = torch.ones(64)
    where = {"seed": 0, "initial_state": True, "reference": "oracle"}
    strong = compare("grad:g", ref * 1.013, ref, threshold=0.04, regime="strong", **where)
    typical = compare("grad:g", ref * 1.0085, ref, threshold=0.009, regime="typical", **where)
    (row,) = [r for r in summarize_records(strong + typical) if r["metric"] == "rel_fro"]
    assert row["passed"] and row["threshold"] == 0.009 and row["value"] == pytest.approx(0.0085, rel=1e-4)
