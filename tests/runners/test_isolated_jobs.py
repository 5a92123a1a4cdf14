"""Jobs in their own processes: a hang ends `timeout`, an exit without a result ends `failed`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from deltabench.harness.cases import Case
from deltabench.runners.base import GateSettings, JobSpec, TimingSettings
from deltabench.runners.isolated import run_isolated

PLANTED = str(Path(__file__).with_name("planted_impls.py"))
CASE = Case("gdn", B=1, T=20, H=1, K=8, V=8, dtype="fp32", mode="fwd")


def _job(impl: str, timeout_s: float) -> JobSpec:
    return JobSpec.for_case(
        CASE,
        impl,
        imports=[PLANTED],
        timing=TimingSettings(budget_s=0.05, min_reps=3, warmup_s=0.02),
        gate=GateSettings(seeds=1, extra_seed=False),
        timeout_s=timeout_s,
    )


def test_hanging_impl_times_out_and_its_process_group_is_killed():
    t0 = time.monotonic()
    result = run_isolated(_job("planted_hang", timeout_s=5))
    elapsed = time.monotonic() - t0
    assert result.status == "timeout"
    assert "no result after 5 s" in result.reason
    assert result.timing is None
    assert elapsed < 15, f"the kill took {elapsed:.1f} s"


@pytest.mark.parametrize("python", [None, sys.executable], ids=["forked", "exec"])
def test_process_that_exits_without_a_result_fails_with_its_exit_code(python):
    result = run_isolated(_job("planted_exit", timeout_s=120), python=python)
    assert result.status == "failed"
    assert "exited with code 3 without a result" in result.reason
    assert "first call" in result.reason  # the phase it died in
    assert result.timing is None
