"""The sdm gate where the chunked reference's backward does not fit at the full shape (the flagship's T = 8192 on a
GPU): outputs and final states against its forward at the full T, gradients against it at a shorter T and against
the oracle at the reduced case; how that T is chosen; and the wide-pool slot draw that keeps the flagship's input
draws cheap."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from grad_scale import ScaleGrad

from deltabench.correctness.engine import verify_case
from deltabench.correctness.plan import LARGEST_CHUNK, fitting_T
from deltabench.harness.cases import Case
from deltabench.harness.registry import get_impl
from deltabench.references import sdm

# T = 384: six chunks, above the oracle's reduced T (256), so a bug past T = 256 is seen only at the full shape and
# at the shorter gradient T (320).
CASE = Case("sdm", B=1, T=384, H=2, S=32, D=8, W=4, R=4, dtype="fp32", mode="fwd+bwd")
GRAD_T = 320

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _gate(fn: Any, **kw: Any):  # type: ignore[no-untyped-def]
    return verify_case(
        fn, CASE, seeds=1, extra_seed=False, reference="torch_chunk", regimes=["typical", "collisions"], **kw
    )


def _recurrent_with_v_grad_scaled_past(t: int, factor: float) -> Any:
    """torch_recurrent whose gradient of v is `factor` times too large when the call has more than `t` tokens."""
    honest = get_impl("sdm", "torch_recurrent")

    def planted(k_idx, k_val, q_idx, q_val, v, g, beta, **kw):  # type: ignore[no-untyped-def]
        if v.shape[1] > t:
            v = ScaleGrad.apply(v, factor)
        return honest(k_idx, k_val, q_idx, q_val, v, g, beta, **kw)

    return planted


def test_degraded_reference_checks_forward_at_full_T_and_gradients_where_they_fit() -> None:
    report = _gate(get_impl("sdm", "torch_recurrent"), grad_reference_T=GRAD_T)
    assert report.passed, [(r.check, r.reference, r.detail) for r in report.failures]
    assert f"at full T forward only, fwd+bwd at T={GRAD_T}" in report.reference
    full = [r for r in report.records if (r.reference or "").startswith("torch_chunk_fp32 forward only")]
    assert full and {r.check for r in full} == {"output", "final_state"}
    assert all(f"fits at T={GRAD_T}, not T={CASE.T}" in r.reference for r in full)
    at_grad_t = [r for r in report.records if f"T{GRAD_T}" in (r.reference or "")]
    assert {"grad:v", "grad:k_val", "grad:q_val", "grad:g", "grad:beta", "grad:initial_bank"} <= {
        r.check for r in at_grad_t
    }
    # every (seed, variant) there: 2 regimes x with and without an initial state
    assert {(r.regime, r.initial_state) for r in at_grad_t if r.check == "grad:v"} == {
        (rg, h0) for rg in ("typical", "collisions") for h0 in (False, True)
    }
    assert any(r.check == "grad:v" and (r.reference or "").startswith("oracle at") for r in report.records)


def test_without_the_cut_the_full_shape_compares_gradients() -> None:
    report = _gate(get_impl("sdm", "torch_recurrent"))  # on the CPU: the full T
    assert report.passed and "forward only" not in report.reference
    assert any(r.check == "grad:v" and r.reference == "torch_chunk_fp32" for r in report.records)


def test_a_gradient_bug_past_the_reduced_T_is_rejected_under_the_degraded_reference() -> None:
    report = _gate(_recurrent_with_v_grad_scaled_past(256, 1.02), grad_reference_T=GRAD_T)
    assert not report.passed
    failed = {(r.check, r.reference.split(" (")[0]) for r in report.failures}
    assert ("grad:v", f"torch_chunk_fp32 at {CASE.replace(T=GRAD_T, B=1).shape_id}") in failed
    # the reduced case's oracle (T = 256) and the full shape's forward cannot see it: the shorter T is what rejects
    assert all(c == "grad:v" for c, _ in failed)


def test_an_output_bug_past_the_gradient_T_is_rejected_by_the_full_shape_forward() -> None:
    honest = get_impl("sdm", "torch_recurrent")

    def planted(*args, **kw):  # type: ignore[no-untyped-def]
        y, bank = honest(*args, **kw)
        if y.shape[1] > GRAD_T:  # the last tokens' outputs 2% off, seen only at the full T
            y = torch.cat([y[:, :GRAD_T], y[:, GRAD_T:] * 1.02], dim=1)
        return y, bank

    report = _gate(planted, grad_reference_T=GRAD_T)
    failed = {(r.check, r.reference) for r in report.failures}
    assert any(c == "output" and ref.startswith("torch_chunk_fp32 forward only") for c, ref in failed), failed
    assert not any(f"T{GRAD_T}" in ref or ref.startswith("oracle at") for _, ref in failed), failed


def test_fitting_T_takes_the_longest_T_within_the_budget() -> None:
    gib = 2**30
    per_chunk = 1.75 * gib  # sdm's flagship reference, fwd+bwd in fp32
    need = (2 * per_chunk, 4 * per_chunk, 2 * LARGEST_CHUNK, 4 * LARGEST_CHUNK)
    assert fitting_T(8192, *need, budget=70 * gib) == 2560
    assert fitting_T(1000, *need, budget=1e15) == 1000  # fits whole: the case's T, not a multiple of a chunk
    assert fitting_T(8192, *need, budget=1.0) == 2 * LARGEST_CHUNK  # never below two chunks
    assert fitting_T(8192, *need, budget=70 * gib - 1) == 2496


def test_wide_pool_slots_are_distinct_in_range_seeded_and_uniform() -> None:
    gen = torch.Generator().manual_seed(3)
    x = sdm._distinct_slots(gen, (4, 512, 2), 65536, 64)
    assert x.shape == (4, 512, 2, 64) and x.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < 65536
    s = x.sort(-1).values
    assert not bool((s[..., 1:] == s[..., :-1]).any())
    assert torch.equal(x, sdm._distinct_slots(torch.Generator().manual_seed(3), (4, 512, 2), 65536, 64))
    # 2 of 64 slots (the rejection path, many repeats): each position's slot uniform over the pool
    z = sdm._distinct_slots(torch.Generator().manual_seed(1), (64_000,), 64, 2)
    assert bool((z[:, 0] != z[:, 1]).all())
    for col in (0, 1):
        counts = torch.bincount(z[:, col], minlength=64).double()
        chi2 = float(((counts - 1000) ** 2 / 1000).sum())
        assert chi2 < 130, chi2  # 63 degrees of freedom: p < 1e-6 above this


def test_narrow_pool_slots_keep_their_ranking_draw() -> None:
    x = sdm._distinct_slots(torch.Generator().manual_seed(5), (1, 40, 2), 97, 64)
    keys = torch.rand(1, 40, 2, 97, generator=torch.Generator().manual_seed(5))
    assert torch.equal(x, keys.argsort(dim=-1)[..., :64])
