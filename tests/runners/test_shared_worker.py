"""Jobs of one impl share one worker process; a job that segfaults, hangs or runs out of memory in the middle
of it costs only its own job (failed / timeout / oom), and the impl's following jobs run in a fresh process
and pass."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from planted_impls import FRAGILE_HANG_T, FRAGILE_OOM_T, FRAGILE_SEGFAULT_T  # beside this file (rootdir import)

from deltabench.harness.cases import Case
from deltabench.runners.base import GateSettings, JobSpec, TimingSettings
from deltabench.runners.isolated import IsolatedRunner, SharedProcessRunner, make_runner

PLANTED = str(Path(__file__).with_name("planted_impls.py"))


def _job(T: int, *, impl: str = "planted_fragile", timeout_s: float = 120) -> JobSpec:
    return JobSpec.for_case(
        Case("gdn", B=1, T=T, H=1, K=8, V=8, dtype="fp32", mode="fwd"),
        impl,
        imports=[PLANTED],
        timing=TimingSettings(budget_s=0.05, min_reps=3, warmup_s=0.02),
        gate=GateSettings(seeds=1, extra_seed=False),
        timeout_s=timeout_s,
    )


def test_a_segfault_a_hang_and_an_oom_cost_only_their_own_jobs():
    jobs = [
        _job(20),
        _job(24),
        _job(FRAGILE_SEGFAULT_T),
        _job(30),
        _job(FRAGILE_HANG_T, timeout_s=8),
        _job(32),
        _job(FRAGILE_OOM_T),
        _job(36),
        _job(38),
    ]
    with SharedProcessRunner() as runner:
        results = [runner.run(job) for job in jobs]
        started = runner.processes_started
    statuses = [r.status for r in results]
    assert statuses == ["ok", "ok", "failed", "ok", "timeout", "ok", "oom", "ok", "ok"], [
        (r.status, r.reason) for r in results
    ]
    segfault, hang, oom = results[2], results[4], results[6]
    assert "killed by signal SIGSEGV" in segfault.reason and "first call" in segfault.reason
    assert "[log: " in segfault.reason  # the tail of the log faulthandler wrote
    # where it hung and for how long, and how long each phase before took
    assert re.search(r"no result after 8 s \(in first call for [78] s, after setup \d+ s\)", hang.reason), hang.reason
    assert "OutOfMemoryError" in oom.reason
    assert all(r.timing is not None and r.timing.median_ms > 0 for r in results if r.status == "ok")
    # One process for the first two jobs, then a fresh one after each fault.
    assert started == 4


def test_exec_worker_under_another_interpreter_survives_a_segfault():
    with SharedProcessRunner(python=sys.executable) as runner:
        results = [runner.run(_job(T)) for T in (20, FRAGILE_SEGFAULT_T, 24)]
        started = runner.processes_started
    assert [r.status for r in results] == ["ok", "failed", "ok"], [(r.status, r.reason) for r in results]
    assert "killed by signal SIGSEGV" in results[1].reason
    assert started == 2


def test_a_new_impl_gets_its_own_process_and_phases_are_reported():
    phases: list[tuple[str, str]] = []
    with SharedProcessRunner(on_phase=lambda job, phase: phases.append((job.impl, phase))) as runner:
        results = [runner.run(_job(20)), runner.run(_job(20, impl="torch_chunk"))]
        started = runner.processes_started
    assert [r.status for r in results] == ["ok", "ok"]
    assert started == 2
    for impl in ("planted_fragile", "torch_chunk"):
        seen = [p for i, p in phases if i == impl]
        assert seen[-1] == "timing" and "gate" in seen and "first call" in seen, phases


def test_isolation_picks_the_runner():
    assert isinstance(make_runner("job"), IsolatedRunner)
    assert isinstance(make_runner("impl"), SharedProcessRunner)
    with pytest.raises(ValueError, match="unknown isolation"):
        make_runner("thread")
