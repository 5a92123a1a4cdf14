"""The gate's reduced-case checks (the oracle at B=1, T<=256; the length sweep) are made once per memo and reused,
marked, by a later job of the same impl, op, dtype, mode and dims other than B and T; never across another H or
dtype. A reused failure still fails."""

from __future__ import annotations

import collections
from typing import Any

import torch

from deltabench.correctness.engine import verify_case
from deltabench.correctness.gate_memo import GateMemo, reused_from
from deltabench.harness.cases import Case
from deltabench.harness.registry import get_impl

DIMS = {"K": 8, "V": 16}


class _Counting:
    """torch_chunk, counting its calls by (B, T, H) of q; optionally wrong at T == `bad_t`."""

    name, backend, supports_backward = "counting_chunk", "torch", True

    def __init__(self, bad_t: int | None = None) -> None:
        self.calls: collections.Counter[tuple[int, int, int]] = collections.Counter()
        self.bad_t = bad_t
        self.fn = get_impl("gdn", "torch_chunk")

    def __call__(self, q: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.calls[tuple(q.shape[:3])] += 1
        o, state = self.fn(q, *args, **kwargs)
        if q.shape[1] == self.bad_t:
            o = o * 1.5
        return o, state


def _gate(impl: _Counting, memo: GateMemo | None, job: str, **case: Any) -> Any:
    if memo is not None:
        memo.enter(("run", "kernels"), made_by=job)
    return verify_case(
        impl,
        Case("gdn", **{**DIMS, **case}),
        seeds=1,
        drawn_seed=1234,
        reference="torch_chunk",
        regimes="typical",
        memo=memo,
    )


def _unmarked(record: Any) -> Any:
    """The record as the job that made it wrote it."""
    detail = record.detail.split("; ", 1)[1] if "; " in record.detail else ""
    return record.model_copy(update={"detail": detail})


def test_a_second_job_at_other_b_and_t_reuses_the_reduced_checks_marked():
    impl, memo = _Counting(), GateMemo()
    first = _gate(impl, memo, "job-1", B=3, T=300, H=3)
    assert first.passed and not any(reused_from(r) for r in first.records)
    # The oracle's reduced case and the length sweep run at the job's H (B = 1), not at fewer heads.
    assert {k for k in impl.calls if k[0] == 1} == {(1, 256, 3), (1, 128, 3), (1, 64, 3), (1, 32, 3), (1, 1, 3)}
    impl.calls.clear()
    second = _gate(impl, memo, "job-2", B=2, T=260, H=3)
    assert second.passed and second.seeds == [0, 1234]
    reused = [r for r in second.records if reused_from(r)]
    assert reused and {reused_from(r) for r in reused} == {"job-1"}
    assert all(r.detail.startswith("reused from job job-1 (an identical check earlier in this run)") for r in reused)
    # The reduced records as the first job made them; the job's own shape checked afresh.
    assert len(second.records) == len(first.records)
    assert all(_unmarked(r) in first.records for r in reused)
    assert not any("T=260" in r.reference or "torch_chunk" in r.reference for r in reused)
    assert any("oracle at B1-T256-H3" in r.reference for r in reused)
    assert {b for b, _, _ in impl.calls} == {2}  # no call at a reduced case (B = 1): all reused


def test_another_h_or_dtype_makes_its_own_reduced_checks():
    impl, memo = _Counting(), GateMemo()
    _gate(impl, memo, "job-1", B=1, T=300, H=3)
    other_h = _gate(impl, memo, "job-2", B=1, T=300, H=2)
    other_dtype = _gate(impl, memo, "job-3", B=1, T=300, H=3, dtype="bf16")
    for report in (other_h, other_dtype):
        assert report.passed and not any(reused_from(r) for r in report.records)
    assert impl.calls[(1, 256, 2)] > 0 and len(memo) == 6  # (oracle, sweep) x (H3 fp32, H2 fp32, H3 bf16)
    # A new scope (another run) starts empty.
    memo.enter(("another run", "kernels"), made_by="job-4")
    assert len(memo) == 0


def test_a_reused_failure_still_fails_the_job():
    impl, memo = _Counting(bad_t=1), GateMemo()  # wrong only at T = 1: the length sweep alone sees it
    first = _gate(impl, memo, "job-1", B=3, T=300, H=3)
    second = _gate(impl, memo, "job-2", B=2, T=260, H=3)
    assert not first.passed and not second.passed
    failing = second.failures
    assert failing and all(reused_from(r) == "job-1" and "B1-T1-H3" in r.reference for r in failing)
    alone = _gate(_Counting(bad_t=1), None, "job-3", B=2, T=260, H=3)  # no memo: the same verdict, made afresh
    assert not alone.passed and not any(reused_from(r) for r in alone.records)
