"""`deltabench run`'s progress lines: a gate's outcome names its longest stages when it took a while."""

from __future__ import annotations

from deltabench.cli.progress_lines import ProgressLines
from deltabench.correctness.checks import note_record
from deltabench.harness.cases import Case
from deltabench.harness.document import GATE_ONLY, JobResult
from deltabench.runners.job import case_spec


def _gate_result(detail: str) -> JobResult:
    record = note_record("gate time", detail, passed=True, gating=False)
    data = {
        "case": case_spec(Case("gdn", B=1, T=64, H=2, K=8, V=8)).model_dump(),
        "impl": "torch_chunk",
        "status": "ok",
        "verification": [record.model_dump()],
    }
    return JobResult.model_validate(data, context={GATE_ONLY: True})


def test_a_long_gate_names_its_three_longest_stages() -> None:
    long = _gate_result("62.0 s: reference at full shape 30.0 s, fresh process 15.0 s, streaming 10.0 s, sweep 7.0 s")
    assert ProgressLines.outcome(long).endswith(
        " [gate: reference at full shape 30.0 s, fresh process 15.0 s, streaming 10.0 s]"
    )


def test_a_short_gate_or_none_adds_nothing() -> None:
    assert "[gate" not in ProgressLines.outcome(_gate_result("4.0 s: impl at full shape 3.0 s, determinism 1.0 s"))
    assert "[gate" not in ProgressLines.outcome(_gate_result("not a time"))


def test_a_repetitions_line_times_that_repetition_alone() -> None:
    """The result of repetition 3 of 3 spans the job's first start to now (80 s here); its line says how long the
    third repetition took, not 80 s."""
    import datetime as dt
    import io
    from types import SimpleNamespace

    from rich.console import Console
    from rich.progress import Progress

    from deltabench.cli.run import RunProgress
    from deltabench.runners.base import JobSpec

    out = io.StringIO()
    console = Console(file=out, width=200)
    job = JobSpec.for_case(Case("gdn", B=1, T=64, H=2, K=8, V=8), "torch_chunk")
    plan = SimpleNamespace(jobs=[job], repeat=3, gate_workers=1)
    progress = RunProgress(Progress(console=console), plan, "suite s on cpu", console, ProgressLines(console))
    now = dt.datetime.now(dt.timezone.utc)
    result = _gate_result("1.0 s: impl 1.0 s").model_copy(
        update={"started_at": now - dt.timedelta(seconds=80), "finished_at": now}
    )
    for rep in range(3):
        repetition = job.model_copy(update={"repetition": rep})
        progress.on_start(repetition)
        progress.on_done(repetition, result)
    first, second, third = out.getvalue().splitlines()
    assert first.endswith("(repetition 1 of 3): ok in 80.0 s")  # the first: the result's own span
    assert "(repetition 3 of 3): ok in 0.0 s" in third and "80.0" not in third + second
