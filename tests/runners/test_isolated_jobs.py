"""Jobs in their own processes: a hang ends `timeout`, an exit without a result ends `failed`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from deltabench.harness.cases import Case
from deltabench.runners.base import GateSettings, JobSpec, TimingSettings
from deltabench.runners.isolated import _phase_times, run_isolated
from deltabench.runners.job import PHASE_MARK

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


def test_a_timeout_says_how_long_each_phase_took():
    log = "\n".join([
        f"{PHASE_MARK}setup @1000.0", "some output", f"{PHASE_MARK}first call @1003.2",
        f"{PHASE_MARK}gate @1004.0", f"{PHASE_MARK}memory @1354.4", f"{PHASE_MARK}timing @1384.0",
    ])  # fmt: skip
    assert _phase_times(log, now=1400.0) == "timing for 16 s, after setup 3 s, first call 1 s, gate 350 s, memory 30 s"
    assert _phase_times(f"{PHASE_MARK}setup @1000.0", now=1008.0) == "setup for 8 s"
    # an older worker's marks carry no times: the phase's name alone
    assert _phase_times(f"{PHASE_MARK}setup\n{PHASE_MARK}gate", now=0.0) == "gate"
    assert _phase_times("no marks at all", now=0.0) == "startup"
