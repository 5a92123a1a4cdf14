"""Sequential repetitions (``run --repeat auto``): the looks, alpha spent over them, and the gate grading the two
documents at the level the run stopped on."""

from __future__ import annotations

import numpy as np
import pytest
from test_gate import run_document

from deltabench.regression import GradingRule, compare_documents
from deltabench.regression.sequential import look_schedule, looks_of, sequential_rule, still_unknown
from deltabench.runners.timing import merge_repetitions, summarize


def test_the_first_look_can_reject_and_later_ones_double_up_to_the_maximum() -> None:
    assert look_schedule(20) == [6, 12, 20]  # C(12, 6) = 924 >= 2 x 3 looks / 0.01; C(10, 5) = 252 is not
    assert look_schedule(12) == [6, 12]
    assert look_schedule(20, jobs=24) == [9, 18, 20]  # C(18, 9) = 48,620 >= 2 x 3 x 24 / 0.01
    assert look_schedule(10) == [6, 10]
    assert look_schedule(5) == [5]
    with pytest.raises(ValueError):
        look_schedule(4)


def test_alpha_is_spent_over_the_looks() -> None:
    rule = GradingRule(alpha=0.01)
    assert sequential_rule(rule, 1) is rule
    assert sequential_rule(rule, 3).alpha == pytest.approx(0.01 / 3)
    assert looks_of({"sequential": {"looks": 3, "schedule": [5, 10, 20]}}) == 3
    assert looks_of({}) == looks_of(None) == looks_of({"sequential": "x"}) == 1


def _repeated(seed: int, levels: list[float], *, sequential: dict | None, other: str, run_id: str):
    """A run of one job per impl: each repetition a process whose samples sit 1% above its level, bimodal levels
    (fast and slow processes) as on a shared machine."""
    doc = run_document(seed=seed, machine_kind="cpu")
    rng = np.random.default_rng(seed)
    jobs = []
    for job in doc.jobs[:1]:
        reps = [summarize((lv * np.exp(rng.normal(0.01, 0.005, 30))).tolist(), clock="cpu_monotonic") for lv in levels]
        jobs.append(job.model_copy(update={"timing": merge_repetitions(reps)}))
    meta = {"interleaved_with": other, **({"sequential": sequential} if sequential else {})}
    return doc.model_copy(update={"jobs": jobs, "meta": meta, "run_id": run_id})


def test_the_gate_grades_a_sequential_run_at_the_alpha_its_looks_spent() -> None:
    """Same code, processes fast (1.0) or slow (1.4) at random: the pooled medians swing with how many processes were
    slow, the repetitions' faster halves agree. The interleaved gate judges on the repetitions alone (SAME, its
    minimum detectable change well under 5%), at alpha / looks when the run was sequential."""
    rng = np.random.default_rng(3)
    base_levels = np.where(np.arange(10) % 5 == 1, 1.4, 1.0) * np.exp(rng.normal(0, 0.004, 10))  # 2 slow of 10
    head_levels = np.where(np.arange(10) % 2 == 0, 1.4, 1.0) * np.exp(rng.normal(0, 0.004, 10))  # 5 slow of 10
    seq = {"looks": 3, "schedule": [5, 10, 20]}
    base = _repeated(1, base_levels.tolist(), sequential=seq, other="h", run_id="b")
    head = _repeated(2, head_levels.tolist(), sequential=seq, other="b", run_id="h")
    cmp = compare_documents(base, head)
    assert cmp.interleaved and cmp.looks == 3 and cmp.alpha == pytest.approx(0.01 / 3)
    (row,) = cmp.rows
    assert row.verdict == "same", row.reason
    assert row.stats.min_detectable_change < 0.05 and row.stats.ratio > 1.05  # pooled medians moved, levels did not
    assert still_unknown(cmp) == set()
    # A 25% slowdown of every process: different.
    slow = _repeated(2, (1.25 * head_levels).tolist(), sequential=seq, other="b", run_id="h")
    (row,) = compare_documents(base, slow).rows
    assert row.outcome == "regression" and row.verdict == "different", row.reason
    # Without the sequential record the same documents are graded at the full alpha.
    plain = compare_documents(
        *(d.model_copy(update={"meta": {"interleaved_with": d.meta["interleaved_with"]}}) for d in (base, head))
    )
    assert plain.looks == 1 and plain.alpha == pytest.approx(0.01)
