"""`deltabench run --repeat N` end to end on the CPU: each job timed in N rounds of fresh worker processes, the
correctness gate once, every sample stored with its repetition, and `deltabench gate` judging two such runs by
the spread between their repetitions when there is no history.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from deltabench.cli.app import main
from deltabench.harness.document import ResultDocument
from deltabench.harness.suites import load_suite
from deltabench.runners.isolated import SharedProcessRunner
from deltabench.runners.session import plan_run, run_plan

PLANTED = str(Path(__file__).with_name("planted_impls.py"))
REPEAT = 5


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return int(exc.value.code)


def _alternate_repetitions(doc: ResultDocument, parity: int) -> ResultDocument:
    """`doc`'s repetitions of one parity (0: the 1st, 3rd, ...; 1: the 2nd, 4th, ...) as a run of their own."""
    from deltabench.runners.timing import merge_repetitions, summarize

    jobs = []
    for job in doc.jobs:
        t = job.timing
        per = [
            summarize([x for x, i in zip(t.samples_ms, t.repetitions, strict=True) if i == r], clock=t.clock)
            for r in range(parity, t.n_repetitions, 2)
        ]
        jobs.append(job.model_copy(update={"timing": merge_repetitions(per), "job_id": uuid.uuid4().hex}))
    meta = {**doc.meta, "repeat": len(per)}
    return ResultDocument(environment=doc.environment, suite=doc.suite, jobs=jobs, meta=meta)


@pytest.fixture(scope="module")
def stored_runs(
    tmp_path_factory: pytest.TempPathFactory, tiny_suite: Callable[..., Path]
) -> tuple[Path, str, ResultDocument, ResultDocument, ResultDocument]:
    """A real run of the same code with --repeat 10, its alternate repetitions as two runs of 5 (base: the odd
    rounds, head: the even ones), all three stored in one SQLite file.

    Two runs of the same code made at different minutes, even side by side, differed by 37-45% in all of their
    repetitions on the loaded CI machine (a drift between the runs, not a spread within them), which the gate
    without history rightly calls a regression (a user on such a machine interleaves base and head: `run
    --base-ref`). Alternate rounds of one run saw the same minutes, as interleaved runs do."""
    tmp = tmp_path_factory.mktemp("repeat")
    suite = tiny_suite(tmp / "repeat.toml")
    db = str(tmp / "store.db")
    out = tmp / "run.json"
    assert _cli("run", "--suite", str(suite), "--repeat", str(2 * REPEAT), "--out", str(out), "--no-db", "-q") == 0
    assert _cli("ingest", "--db", db, str(out)) == 0
    run = ResultDocument.from_json(out.read_text())
    base, head = (_alternate_repetitions(run, parity) for parity in (0, 1))
    from deltabench.db.engine import dispose_engines, get_engine, session_scope
    from deltabench.db.ingest import ingest_document

    try:
        with session_scope(get_engine(db)) as session:
            for doc in (base, head):
                ingest_document(session, doc)
    finally:
        dispose_engines()
    return tmp, db, run, base, head


def test_a_repeated_run_stores_every_repetition_and_gates_once(stored_runs) -> None:
    _, db, run, _, _ = stored_runs
    (job,) = run.jobs
    t = job.timing
    assert job.status == "ok" and run.meta["repeat"] == 2 * REPEAT
    assert len(t.repetitions) == len(t.samples_ms) and sorted(set(t.repetitions)) == list(range(2 * REPEAT))
    assert all(t.repetitions.count(r) >= 10 for r in range(2 * REPEAT))  # each repetition took its own min_reps
    assert job.verification and all(r.passed for r in job.verification if r.gating)
    from deltabench.db.engine import dispose_engines, get_engine, session_scope
    from deltabench.db.queries import load_comparison_input, load_run_document

    try:
        with session_scope(get_engine(db)) as session:
            stored = load_run_document(session, run.run_id).jobs[0].timing
            lean = load_comparison_input(session, run_id=run.run_id).jobs[0].timing
    finally:
        dispose_engines()
    assert stored.repetitions == t.repetitions and stored.samples_ms == t.samples_ms
    assert lean.repetitions == t.repetitions


def test_later_repetitions_run_in_fresh_processes_without_the_gate(
    tmp_path: Path, tiny_suite: Callable[..., Path]
) -> None:
    suite = tiny_suite(tmp_path / "repeat.toml")
    plan = plan_run(load_suite(str(suite)), device="cpu", repeat=REPEAT)
    phases: list[tuple[int, str]] = []
    with SharedProcessRunner(on_phase=lambda job, phase: phases.append((job.repetition, phase))) as runner:
        doc = run_plan(plan, runner=runner, out=tmp_path / "out.json")
        assert runner.processes_started == REPEAT  # one impl: a worker per round, none shared between rounds
    assert doc.jobs[0].timing.n_repetitions == REPEAT
    assert [p for r, p in phases if r == 0] == ["setup", "first call", "gate", "timing"]
    for rep in range(1, REPEAT):
        assert [p for r, p in phases if r == rep] == ["setup", "first call", "timing"]


def test_a_later_repetition_that_crashes_fails_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_suite: Callable[..., Path]
) -> None:
    suite = tiny_suite(tmp_path / "repeat.toml", "planted_first_process_only")
    monkeypatch.setenv("PLANTED_FIRST_PID_FILE", str(tmp_path / "first.pid"))
    out = tmp_path / "out.json"
    assert _cli("run", "--suite", str(suite), "--import", PLANTED, "--repeat", "2", "--out", str(out), "--no-db") == 1
    (job,) = ResultDocument.from_json(out.read_text()).jobs
    assert job.status == "failed" and job.timing is None
    assert job.reason.startswith("repetition 2 of 2: crashed") and "SIGSEGV" in job.reason
    assert job.verification  # the first repetition's gate records are kept


def test_repeat_out_of_range_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli("run", "--suite", "smoke", "--repeat", "0", "--no-db") == 2
    assert "--repeat 0: use 1 to 50" in capsys.readouterr().err


def _slowed(doc: ResultDocument, factor: float) -> ResultDocument:
    """`doc`'s real samples, every one `factor` times longer, as another run."""
    from deltabench.runners.timing import merge_repetitions, summarize

    jobs = []
    for job in doc.jobs:
        t = job.timing
        per = [
            summarize([x * factor for x, i in zip(t.samples_ms, t.repetitions, strict=True) if i == r], clock=t.clock)
            for r in range(t.n_repetitions)
        ]
        # A job id of its own: the store keeps a job once, in the run that stored it first.
        jobs.append(job.model_copy(update={"timing": merge_repetitions(per), "job_id": uuid.uuid4().hex}))
    return ResultDocument(environment=doc.environment, suite=doc.suite, jobs=jobs, meta=dict(doc.meta))


def _first_repetition(doc: ResultDocument) -> ResultDocument:
    """`doc` as a run without --repeat would have held it: its first repetition's samples."""
    from deltabench.runners.timing import summarize

    jobs = []
    for job in doc.jobs:
        t = job.timing
        first = [x for x, i in zip(t.samples_ms, t.repetitions, strict=True) if i == 0]
        jobs.append(job.model_copy(update={"timing": summarize(first, clock=t.clock)}))
    return ResultDocument(environment=doc.environment, suite=doc.suite, jobs=jobs)


def test_the_gate_judges_repeated_runs_by_their_within_run_spread(stored_runs) -> None:
    """No history: the same code passes, judged on the repetitions; a 3x slowdown built from the base's real
    samples fails, its reason naming the within-run spread; the same runs cut to one repetition cannot tell. (Built
    from the base's, not the head's: two real runs of a microsecond op on a loaded CI machine differed by 32%, which
    a slowdown built on the head carries into the measured change.)"""
    tmp, db, _, base, head = stored_runs
    out = tmp / "cmp.json"
    code = _cli("gate", "--base", base.run_id, "--head", head.run_id, "--db", db, "--json", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    assert code in (0, 3) and row["verdict"] in ("same", "unknown"), row["reason"]
    assert row["stats"]["spread_source"] == "repetitions" and row["stats"]["history_runs"] == 0
    assert (row["stats"]["base_repetitions"], row["stats"]["head_repetitions"]) == (REPEAT, REPEAT)

    slow = _slowed(base, 3.0)
    from deltabench.db.engine import dispose_engines, get_engine, session_scope
    from deltabench.db.ingest import ingest_document

    try:
        with session_scope(get_engine(db)) as session:
            ingest_document(session, slow)
    finally:
        dispose_engines()
    code = _cli("gate", "--base", base.run_id, "--head", slow.run_id, "--db", db, "--json", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    assert code == 1 and row["outcome"] == "regression"
    assert f"between repetitions ({REPEAT} base, {REPEAT} head; no history;" in row["reason"]
    assert row["stats"]["change"] > 1.5

    files = []
    for name, doc in (("b1", _first_repetition(base)), ("h1", _first_repetition(slow))):
        (tmp / f"{name}.json").write_text(doc.to_json())
        files.append(str(tmp / f"{name}.json"))
    assert _cli("gate", "--base", files[0], "--head", files[1], "--json", str(out)) == 3  # a blind gate: unknown
    (row,) = json.loads(out.read_text())["rows"]
    assert row["stats"]["spread_source"] == "default" and row["verdict"] == "unknown"
    assert row["reason"].startswith("within noise: run-to-run spread unknown")
