"""A run draws the gate's extra seed once (recorded in its document) and every job uses it; in a worker process
shared by an impl's jobs, the second job at other B and T but the same other dims reuses the first's reduced-case
records, marked with the first job's id; a job at another H or dtype makes its own; with one process per job
nothing is reused."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltabench.correctness.gate_memo import reused_from
from deltabench.harness.suites import load_suite
from deltabench.runners.session import plan_run, run_plan

SUITE = """
name = "gate-reuse-test"
description = "one impl at two (B, T) of one H, another H, another dtype"
device = "cpu"
shapes = {shapes}
dtypes = {dtypes}
modes = ["fwd"]
isolation = "{isolation}"
timeout_s = 300

[timing]
budget_s = 0.02
min_reps = 2
warmup_s = 0.0

[gate]
seeds = 1
reference = "torch_chunk"
regimes = ["typical"]

[ops.gdn]
impls = ["torch_chunk"]
baseline = "torch_chunk"
"""


@pytest.mark.parametrize("isolation", ["impl", "job"])
def test_reduced_checks_are_reused_within_a_worker_and_the_seed_is_drawn_once(tmp_path: Path, isolation: str):
    path = tmp_path / "suite.toml"
    shapes = ["B=1,T=300,H=3,K=8,V=16", "B=2,T=260,H=3,K=8,V=16", "B=1,T=300,H=2,K=8,V=16"]
    dtypes = ["fp32", "bf16"]
    if isolation == "job":  # the first two jobs show it
        shapes, dtypes = shapes[:2], dtypes[:1]
    text = SUITE.replace("{isolation}", isolation).replace("{shapes}", str(shapes)).replace("{dtypes}", str(dtypes))
    path.write_text(text.replace("'", '"'))
    plan = plan_run(load_suite(str(path)), device="cpu")
    doc = run_plan(plan)
    jobs = {(j.case.shape_id, j.case.dtype): j for j in doc.jobs}
    assert all(j.status == "ok" for j in doc.jobs), [(j.status, j.reason) for j in doc.jobs]
    drawn = doc.meta["gate_drawn_seed"]
    assert all({r.seed for r in j.verification if r.seed is not None} == {0, drawn} for j in doc.jobs)
    reused = {k: {reused_from(r) for r in j.verification} - {None} for k, j in jobs.items()}
    first, second = jobs[("B1-T300-H3-K8-V16", "fp32")], ("B2-T260-H3-K8-V16", "fp32")
    if isolation == "job":
        assert len(reused) == 2 and not any(reused.values())  # a fresh process per job has nothing to reuse
        return
    assert reused[second] == {first.job_id}
    again = [r for r in jobs[second].verification if reused_from(r)]
    # Only reduced-case records: none at the job's own shape (its comparisons with torch_chunk, its streaming).
    assert again and not any("T=260" in r.reference or "torch_chunk" in r.reference for r in again)
    assert any("oracle at B1-T256-H3" in r.reference for r in again)
    # The H2 and bf16 jobs made their own (the bf16 H3 jobs reuse each other's, as the fp32 ones do).
    assert not reused[("B1-T300-H2-K8-V16", "fp32")] and not reused[("B1-T300-H3-K8-V16", "bf16")]
    assert reused[("B2-T260-H3-K8-V16", "bf16")] == {jobs[("B1-T300-H3-K8-V16", "bf16")].job_id}
