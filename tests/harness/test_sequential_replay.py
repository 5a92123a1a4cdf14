"""``runners.replay``: the ``run --repeat auto`` stopping rule replayed on stored repetitions takes its decisions from
the gate (same code ends SAME or UNKNOWN, a planted step a regression; a bug in the gate's decision shows)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_gate import run_document

from deltabench.harness.document import ResultDocument
from deltabench.regression import compare_documents, rule
from deltabench.regression.result import DIFFERENT, REGRESSION, SAME, UNKNOWN, WITHIN_NOISE
from deltabench.runners.replay import first_repetitions, recorded_repetitions, replay_sequential, split_repetitions
from deltabench.runners.timing import merge_repetitions, summarize


def _recorded(seed: int, reps: int, *, step: float = 1.0, process_spread: float = 0.003) -> ResultDocument:
    """A ``run --repeat reps`` run of one job: each repetition a process whose level moves by `process_spread`
    (log sd) around 1 ms times `step`, its 30 samples 1% above its level."""
    doc = run_document(seed=seed, machine_kind="cpu")
    rng = np.random.default_rng(seed)
    levels = step * np.exp(rng.normal(0.0, process_spread, reps))
    per = [summarize((lv * np.exp(rng.normal(0.01, 0.004, 30))).tolist(), clock="cpu_monotonic") for lv in levels]
    job = doc.jobs[0].model_copy(update={"timing": merge_repetitions(per)})
    return doc.model_copy(update={"jobs": [job], "run_id": f"{seed:032x}", "meta": {}})


def test_same_code_pairs_end_same_or_unknown_and_a_planted_step_is_a_regression() -> None:
    same = [_recorded(seed, 20) for seed in range(5)]
    for base, head in itertools.permutations(same, 2):
        (job,) = replay_sequential(base, head)[0].values()
        assert job.row.verdict in (SAME, UNKNOWN) and job.row.outcome != REGRESSION, job.row.reason
        assert job.repetitions == 6 and job.looks == 1 and not job.truncated  # a 0.3% spread is seen at the first look
    planted = _recorded(99, 20, step=1.20)
    for base in same:
        jobs, cmp = replay_sequential(base, planted)
        (job,) = jobs.values()
        assert job.row.outcome == REGRESSION and job.row.verdict == DIFFERENT, job.row.reason
        assert job.repetitions == 6 and cmp.interleaved and cmp.looks == 3  # graded as the live run's, alpha / 3
        assert cmp.alpha == pytest.approx(0.01 / 3)


def test_the_replay_ends_on_the_gates_own_comparison_of_the_cut_documents() -> None:
    base, head = _recorded(1, 20), _recorded(2, 20, step=1.3)
    jobs, cmp = replay_sequential(base, head)
    (job,) = jobs.values()
    assert cmp.rows == [job.row]
    cut = [first_repetitions(d, job.repetitions) for d in (base, head)]
    assert recorded_repetitions(cut[0]) == {job.row.key: job.repetitions}
    seq = {"schedule": [6, 12, 20], "looks": 3}
    marked = [
        cut[0].model_copy(update={"meta": {"interleaved_with": head.run_id, "sequential": seq}}),
        cut[1].model_copy(update={"meta": {"interleaved_with": base.run_id, "sequential": seq}}),
    ]
    (live,) = compare_documents(*marked).rows
    assert (live.outcome, live.verdict, live.stats.change) == (job.row.outcome, job.row.verdict, job.row.stats.change)


def test_an_undecided_job_takes_the_next_looks_and_a_short_record_says_so() -> None:
    """Processes spread 8% apart: 6 + 6 cannot see a 5% change (UNKNOWN), so the rule asks for 12, then 20; a record
    of 8 repetitions cannot show the second look, and the job ends truncated at the first."""
    noisy = {"process_spread": 0.08}
    base, head = _recorded(3, 20, **noisy), _recorded(4, 20, **noisy)
    (job,) = replay_sequential(base, head)[0].values()
    assert job.repetitions > 6 and job.looks > 1 and not job.truncated
    short = [first_repetitions(d, 8) for d in (base, head)]
    (cut,) = replay_sequential(*short)[0].values()
    assert cut.row.verdict == UNKNOWN and cut.truncated and cut.repetitions == 6 and cut.looks == 1
    with pytest.raises(ValueError, match="first look"):
        replay_sequential(*(first_repetitions(d, 5) for d in (base, head)))
    with pytest.raises(ValueError, match="two runs"):
        replay_sequential(base, base)


def test_a_bug_in_the_gates_decision_shows_in_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay does not decide on its own: a gate that never calls a change a regression lets the planted step
    through the replay too."""
    base, planted = _recorded(5, 20), _recorded(6, 20, step=1.2)
    (job,) = replay_sequential(base, planted)[0].values()
    assert job.row.outcome == REGRESSION
    monkeypatch.setattr(rule.GradingRule, "decide", lambda self, **kw: (WITHIN_NOISE, "planted bug"))
    (job,) = replay_sequential(base, planted)[0].values()
    assert job.row.outcome == WITHIN_NOISE and "planted bug" in job.row.reason


def test_one_long_run_cut_into_runs_of_its_repetitions_in_order() -> None:
    doc = _recorded(7, 20)
    parts = split_repetitions(doc, 6)
    assert len(parts) == 3 and len({p.run_id for p in [doc, *parts]}) == 4  # the 2 left over make no run
    samples, reps = doc.jobs[0].timing.samples_ms, doc.jobs[0].timing.repetitions
    for c, part in enumerate(parts):
        t = part.jobs[0].timing
        assert sorted(set(t.repetitions)) == list(range(6)) and part.meta["split_from"]["part"] == c
        assert t.samples_ms == [x for x, r in zip(samples, reps, strict=True) if 6 * c <= r < 6 * (c + 1)]
    (job,) = replay_sequential(parts[0], parts[2])[0].values()
    assert job.row.verdict == SAME and job.repetitions == 6
    with pytest.raises(ValueError):
        split_repetitions(doc, 0)
