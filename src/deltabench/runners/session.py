"""A whole run: a suite's jobs, one after another, into one result document.

Each job is judged in the parent first (an impl that cannot run the case is ``unsupported`` with its
reason, and no process is started); the others go to a runner, by the suite's ``isolation``: the jobs of
one impl in one long-lived worker process (``"impl"``, the default; they run impl by impl, in the suite's
order within each impl) or each job in its own subprocess (``"job"``), always with the job's timeout. The
document lists the jobs in the suite's order whatever order they ran in. After every job the document so
far is written atomically to the output file, so a crash of the parent loses nothing that finished.

With ``repeat`` N > 1 (``deltabench run --repeat N``) the run makes N rounds: round r runs every job that is
still ok once more, in fresh worker processes (the runner's processes are closed between rounds), so that a
machine's drift over the run reaches every job's repetitions alike and each repetition sees a process of its
own. Only the first round runs the correctness gate; later rounds time the code it passed. A job's samples
are kept with their repetition's index (``TimingStats.repetitions``): the regression gate estimates from them
how far whole processes move when the job has no history. A later repetition that fails makes the job fail.

With ``gate_workers`` N > 1 (``deltabench run --gate-workers N``, a suite's ``[gate] workers``) the run first gates
every supported job, up to N at once, each in a fresh process of its own with the job's timeout
(``isolated.run_gates``): the gate (seconds per job against the float64 oracle, minutes for a kernel that compiles
each length it is fed) is most of a job's time, and the gates of different jobs may overlap where timings may not.
Then the jobs run one at a time as above with their gate's outcome given: a job whose gate passed skips it
(``JobSpec.stage = "after_gate"``; first call, memory and timing as usual) and keeps the gate's records; one whose
gate failed, crashed or timed out ends with that status and reason, untimed. Every gate uses the run's drawn seed.
On a GPU or TPU, the jobs of an impl that compiles each shape (``Impl.compiles_per_shape``) first have the shapes
their gates call the impl at (``correctness.plan.gate_shapes``: about eight a job) compiled side by side, a process
per shape (``JobSpec.stage = "compile"``), beside the other impls' gates, and their gates start once those end, so
that a gate finds its shapes in the impl's compile cache instead of compiling them one after another; a compile
that fails is not a verdict (the gate still makes that call).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from deltabench.harness.cases import Case, has_backward
from deltabench.harness.document import Environment, JobResult, ResultDocument, TimingStats
from deltabench.harness.errors import oom_figures
from deltabench.harness.registry import get_impl
from deltabench.harness.suites import GateSettings, Suite, TimingSettings

from .base import JobSpec, Runner
from .job import case_spec

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "GatedCallback",
    "RunPlan",
    "RunState",
    "compile_jobs",
    "execution_order",
    "partial_path",
    "plan_run",
    "run_plan",
    "write_document",
]

# (jobs gated, jobs to gate, the gate that just ended: None before the first)
GatedCallback = Callable[[int, int, JobResult | None], None]


def compile_jobs(jobs: list[JobSpec]) -> dict[int, JobSpec]:
    """The compile-stage jobs (``JobSpec.stage = "compile"``, numbered from 0) for the gates of `jobs`, jobs of
    impls that compile each shape: one per impl and shape their gates call (``correctness.plan.gate_shapes``), at
    that shape, back-propagating where any of those gates does there; for an impl whose kernels a dry run lists
    (``Impl.jit``) one for all its shapes (``JobSpec.compile_cases``), which builds its distinct kernels side by side
    (correctness/compile_ahead.py). None on the CPU, where there is no compile of a kernel to share (an interpreter or
    XLA's CPU backend)."""
    from deltabench.correctness.plan import gate_shapes

    shapes: dict[tuple[str, str, str, str], JobSpec] = {}
    for job in jobs:
        case = job.to_case()
        if case.device == "cpu":
            continue
        impl = get_impl(case.op, job.impl)
        listed = gate_shapes(impl, case, regimes=job.gate.regimes, reference=job.gate.reference)
        for shape in listed:
            key = (job.impl, shape.op, shape.shape_id, shape.dtype)
            if key not in shapes or has_backward(shape.mode):
                shapes[key] = job.model_copy(update={"case": shape.to_dict(), "stage": "compile"})
    listed_by_dry_run: dict[tuple[str, str], list[JobSpec]] = {}
    compiles: list[JobSpec] = []
    for spec in shapes.values():
        op = spec.case["op"]
        if get_impl(op, spec.impl).jit:
            listed_by_dry_run.setdefault((op, spec.impl), []).append(spec)
        else:
            compiles.append(spec)
    for first, *rest in listed_by_dry_run.values():
        compiles.append(first.model_copy(update={"compile_cases": [spec.case for spec in rest]}))
    return dict(enumerate(compiles))


DEFAULT_TIMEOUT_S = 900.0  # per job: a new shape of a JIT-compiled kernel can compile for a minute


@dataclasses.dataclass
class RunPlan:
    """A suite's jobs on one device, with the settings they run under."""

    suite: Suite
    device: str
    jobs: list[JobSpec]
    repeat: int = 1  # repetitions of every job, round by round (module docstring)
    gate_workers: int = 1  # > 1: every job gated first, this many at once (module docstring)


def plan_run(
    suite: Suite,
    *,
    device: str,
    impls: list[str] | None = None,
    ops: list[str] | None = None,
    timeout_s: float | None = None,
    imports: list[str] | None = None,
    repeat: int = 1,
    gate_workers: int | None = None,
    shapes: list[str] | None = None,
    modes: list[str] | None = None,
) -> RunPlan:
    """Expand `suite` into jobs on `device` (optionally filtered: ``Suite.jobs``), each with the suite's settings,
    each to be run `repeat` times, gated `gate_workers` at a time before any is timed (None: the suite's ``[gate]
    workers``; 1: each job gated just before its timing; module docstring)."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    workers = suite.gate_workers if gate_workers is None else gate_workers
    if workers < 1:
        raise ValueError(f"gate_workers must be at least 1, got {workers}")
    timing = TimingSettings(**suite.timing)
    gate = GateSettings(**suite.gate)
    timeout = timeout_s or suite.timeout_s or DEFAULT_TIMEOUT_S
    jobs = [
        JobSpec.for_case(case, impl, imports=list(imports or ()), timing=timing, gate=gate, timeout_s=timeout)
        for case, impl in suite.jobs(device=device, impls=impls, ops=ops, shapes=shapes, modes=modes)
    ]
    return RunPlan(suite=suite, device=device, jobs=jobs, repeat=repeat, gate_workers=workers)


def partial_path(run_id: str) -> Path:
    """Where a run without ``--out`` keeps its in-progress document."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deltabench" / "runs" / f"{run_id}.json"


def write_document(doc: ResultDocument, path: Path) -> None:
    """Write `doc` to `path` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(doc.to_json())
    os.replace(tmp, path)


def _unsupported(job: JobSpec, case: Case, backend: str, reason: str) -> JobResult:
    now = _dt.datetime.now(_dt.timezone.utc)
    return JobResult(
        job_id=job.job_id,
        attempt=job.attempt,
        case=case_spec(case),
        impl=job.impl,
        backend=backend,
        device=case.device,
        status="unsupported",
        reason=reason,
        started_at=now,
        finished_at=now,
    )


def execution_order(plan: RunPlan) -> list[int]:
    """The order in which `plan`'s jobs run (indices into ``plan.jobs``): with ``isolation = "impl"``, impl
    by impl (each (op, impl) from its first appearance, its jobs in the suite's order), so that one worker
    process serves an impl's jobs back to back; with ``"job"``, the suite's order."""
    if plan.suite.isolation == "job":
        return list(range(len(plan.jobs)))
    first: dict[tuple[str, str], int] = {}
    for i, job in enumerate(plan.jobs):
        first.setdefault((job.case["op"], job.impl), i)
    return sorted(range(len(plan.jobs)), key=lambda i: (first[(plan.jobs[i].case["op"], plan.jobs[i].impl)], i))


def run_plan(
    plan: RunPlan,
    *,
    runner: Runner | None = None,
    out: Path | None = None,
    on_start: Callable[[JobSpec], None] | None = None,
    on_done: Callable[[JobSpec, JobResult], None] | None = None,
    on_begin: Callable[[Path], None] | None = None,
    on_phase: Callable[[JobSpec, str], None] | None = None,
    on_gated: GatedCallback | None = None,
    on_compiled: GatedCallback | None = None,
) -> ResultDocument:
    """Run every job of `plan` and return the document; each finished job is saved to `out` at once.

    Without `out` the in-progress document goes to :func:`partial_path`. `on_start` / `on_done` let a
    caller drive a progress bar; `on_begin` is told where the document is saved, once, before the first job;
    `on_phase` (job, phase) follows a job through its phases (setup, first call, gate, memory, timing) when the
    default runner is used; `on_gated` (jobs gated, jobs to gate, the gate's result) follows the gate phase of a
    plan with ``gate_workers`` > 1, once before its first gate ends (no result) and after each; `on_compiled` the
    same for the compiles before those gates (module docstring).
    """
    from .isolated import make_runner

    if runner is not None:
        return _run_jobs(plan, runner, out, on_start, on_done, on_begin, on_gated, on_compiled)
    own = make_runner(plan.suite.isolation, on_phase=on_phase)
    try:
        return _run_jobs(plan, own, out, on_start, on_done, on_begin, on_gated, on_compiled)
    finally:
        close = getattr(own, "close", None)
        if close is not None:
            close()  # the last worker process ends with the run


def _run_jobs(
    plan: RunPlan,
    runner: Runner,
    out: Path | None,
    on_start: Callable[[JobSpec], None] | None,
    on_done: Callable[[JobSpec, JobResult], None] | None,
    on_begin: Callable[[Path], None] | None,
    on_gated: GatedCallback | None = None,
    on_compiled: GatedCallback | None = None,
) -> ResultDocument:
    from .environment import collect_environment

    run = RunState(plan, collect_environment(plan.device), out, on_begin)
    order = execution_order(plan)
    if plan.gate_workers > 1:
        # The runner's interpreter and environment, so that a gate runs the code its timing will.
        run.gate_all(
            order,
            plan.gate_workers,
            python=getattr(runner, "python", None),
            env=getattr(runner, "env", None),
            on_gated=on_gated,
            on_compiled=on_compiled,
        )
    for rep in range(plan.repeat):
        if rep > 0:
            close = getattr(runner, "close", None)
            if close is not None:
                close()  # each repetition in processes of its own: their differences are what it measures
        for index in order:
            run.step(index, plan.jobs[index], rep, runner, on_start, on_done)
    return run.finish()


class RunState:
    """One run's document as its jobs end: each job's first result (gate and timing), later repetitions merged into
    it, the document saved after every job (:func:`run_plan`; ``runners.interleave`` keeps one per side)."""

    def __init__(
        self,
        plan: RunPlan,
        env: Environment,
        out: Path | None,
        on_begin: Callable[[Path], None] | None,
        meta: dict | None = None,
        run_id: str | None = None,
        drawn_seed: int | None = None,
    ) -> None:
        from deltabench.correctness.calls import draw_seed

        from .ceilings import ceilings_for

        self.plan = plan
        self.doc = ResultDocument(
            **({"run_id": run_id} if run_id else {}),
            suite=plan.suite.name,
            baselines=plan.suite.baselines,
            environment=env,
            ceilings=ceilings_for(plan.device, env.device_name),
            meta={"suite_source": plan.suite.source, "device": plan.device, "complete": False, **(meta or {})},
        )
        self.target = out or partial_path(self.doc.run_id)
        write_document(self.doc, self.target)
        if on_begin:
            on_begin(self.target)
        if plan.repeat > 1:
            self.doc.meta["repeat"] = plan.repeat
        # One drawn seed for the whole run: every job's gate uses it, so that the reduced-case checks a worker
        # process makes for one job are those its later jobs of the same dims would make (correctness/gate_memo.py).
        if drawn_seed is None and any(j.gate.extra_seed for j in plan.jobs):
            drawn_seed = draw_seed()
        self.drawn_seed = drawn_seed
        if drawn_seed is not None:
            self.doc.meta["gate_drawn_seed"] = drawn_seed
        self.finished: dict[int, JobResult] = {}
        self.timings: dict[int, list[TimingStats]] = {}
        self.gated: dict[int, JobResult] = {}  # the gate phase's results (gate_all), by the plan's job index

    def _for_run(self, job: JobSpec) -> JobSpec:
        return job.model_copy(update={"run_id": self.doc.run_id, "drawn_seed": self.drawn_seed})

    def gate_all(
        self,
        order: list[int],
        workers: int,
        *,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        on_gated: GatedCallback | None = None,
        on_compiled: GatedCallback | None = None,
    ) -> None:
        """Gate the plan's supported jobs (indices in `order`), up to `workers` processes at once, an impl's gates in
        one process (``isolated.run_gates``; each job of an impl that compiles per shape in a process of its own,
        after its gates' shapes were compiled side by side beside the other impls' gates, :func:`compile_jobs`;
        `on_compiled` follows those compiles as `on_gated` the gates);
        :meth:`step` then gives each job its gate's outcome. A gate that did not pass is the job's result: it is
        saved as it ends. `on_gated` (gated, total, the gate's result) follows the phase, with no result once before
        the first gate ends."""
        from .isolated import run_gates

        todo: dict[int, JobSpec] = {}
        own_process: set[int] = set()  # jobs of impls that compile each shape: gated side by side, not in a chain
        autotuned: set[int] = set()  # jobs of impls that autotune: their chain split only between tuning groups
        for index in order:
            job = self._for_run(self.plan.jobs[index])
            case = job.to_case()
            impl = get_impl(case.op, job.impl)
            if not impl.check_case(case):  # an unsupported job is judged by step, untimed
                todo[index] = job
                if impl.compiles_per_shape:
                    own_process.add(index)
                if impl.autotunes:
                    autotuned.add(index)
        if on_gated:
            on_gated(0, len(todo), None)

        def gated(index: int, result: JobResult) -> None:
            self.gated[index] = result
            if result.status != "ok":  # final: kept in the document now, so a run cut in this phase keeps it
                self._save(index, result)
            if on_gated:
                on_gated(len(self.gated), len(todo), result)

        def put_back(index: int, result: JobResult) -> None:
            """A gate out of memory beside others, said as it is put back to run alone at the end (not yet final)."""
            why = "out of memory beside other gates: again alone once they end"
            figures = oom_figures(result.reason or "")
            why = f"{why}; {figures}" if figures else why
            if on_gated:
                on_gated(len(self.gated), len(todo), result.model_copy(update={"reason": f"{why} ({result.reason})"}))

        compiles = {-1 - k: job for k, job in compile_jobs([todo[i] for i in sorted(own_process)]).items()}
        compiled: list[int] = []

        def ended(key: int, result: JobResult) -> None:
            if key >= 0:
                gated(key, result)
                return
            compiled.append(key)
            if on_compiled:
                on_compiled(len(compiled), len(compiles), result)

        if compiles:
            # Compiles (a process per shape) beside the gates of the impls that do not compile per shape; the gates
            # of those that do once the compiles have ended, finding their shapes in the impl's compile cache.
            if on_compiled:
                on_compiled(0, len(compiles), None)
            workers = max(workers, (os.cpu_count() or 2) // 2)
        run_gates(
            {**todo, **compiles},
            workers,
            python=python,
            env=env,
            on_gated=ended,
            own_process={*own_process, *compiles},
            after_compiles=own_process if compiles else (),
            autotuned=autotuned,
            on_again=put_back,
        )

    def step(
        self,
        index: int,
        job: JobSpec,
        rep: int,
        runner: Runner,
        on_start: Callable[[JobSpec], None] | None = None,
        on_done: Callable[[JobSpec, JobResult], None] | None = None,
    ) -> None:
        """Run repetition `rep` of the plan's job `index` (`job`: its spec for this side) on `runner`, unless an
        earlier repetition ended badly; record it and save the document."""
        from . import integrity
        from .ceilings import work_figures
        from .integrity import plausibility_record

        job = self._for_run(job)
        if rep > 0:
            if self.finished[index].status != "ok":
                return  # unsupported, failed or incorrect: nothing to time again
            job = job.model_copy(update={"repetition": rep})
        if on_start:
            on_start(job)
        case = job.to_case()
        if rep == 0:
            impl = get_impl(case.op, job.impl)
            why = impl.check_case(case)
            if why:
                result = _unsupported(job, case, impl.backend, why)
            elif index in self.gated:
                result = self._after_gate(self.gated[index], job, runner)
            else:
                result = runner.run(job)
            if result.status != "ok":
                result.timing = None  # only a job that passed the gate has a valid timing
            elif result.timing is not None:
                self.timings[index] = [result.timing]
        else:
            latest = runner.run(job)
            result = _with_repetition(self.finished[index], latest, self.timings[index], rep, self.plan.repeat)
        median = result.timing.median_ms if result.timing else None
        result.work = work_figures(case.op, case.dims, case.dtype, case.mode, median, self.doc.ceilings)
        if result.status == "ok" and job.gate.integrity:
            w = result.work  # a later repetition's result carries the first one's record: judged anew
            result.verification = [r for r in result.verification if r.check != "integrity:plausibility"]
            found = plausibility_record(w.pct_of_floor, self.doc.ceilings, w.tflops, w.gbps)
            integrity.flag(result, [found] if found else [])
        self._save(index, result)
        if on_done:
            on_done(job, result)

    def _save(self, index: int, result: JobResult) -> None:
        """Record `result` as the plan's job `index` and write the document."""
        self.finished[index] = result
        self.doc.jobs = [self.finished[i] for i in sorted(self.finished)]
        write_document(self.doc, self.target)

    @staticmethod
    def _after_gate(gate: JobResult, job: JobSpec, runner: Runner) -> JobResult:
        """The job's result given its gate-phase result `gate`: that one when the gate did not pass (incorrect,
        failed, crashed, timed out: nothing to time), else the job run without its gate, with the gate's records
        (its own started and finished times: those of its timing)."""
        if gate.status != "ok":
            return gate
        result = runner.run(job.model_copy(update={"stage": "after_gate"}))
        # the gate's, then every record of the timing's own (integrity, the GPU's state, a step's mixer share)
        records = [*gate.verification, *result.verification]
        return result.model_copy(update={"verification": records, "gate_reference": gate.gate_reference})

    def finish(self) -> ResultDocument:
        """Mark the run complete, save and return its document."""
        self.doc.meta["complete"] = True
        write_document(self.doc, self.target)
        return self.doc


def _with_repetition(
    first: JobResult, latest: JobResult, timings: list[TimingStats], rep: int, repeat: int
) -> JobResult:
    """The job's result after its repetition `rep` (0-based) of `repeat`: the first repetition's result with every
    repetition's samples so far (``timing.merge_repetitions``), or, when this repetition did not end ok, its status
    and reason (naming the repetition) with the first one's gate records, its own integrity records and no timing
    (each repetition's timed calls pass the integrity defences on their own)."""
    from .timing import merge_repetitions

    if latest.status == "ok" and latest.timing is not None:
        timings.append(latest.timing)
        return first.model_copy(update={"timing": merge_repetitions(timings), "finished_at": latest.finished_at})
    return latest.model_copy(
        update={
            "reason": f"repetition {rep + 1} of {repeat}: {latest.reason}",
            "verification": [*(r for r in first.verification if r not in first.integrity), *latest.integrity],
            "gate_reference": first.gate_reference,
            "started_at": first.started_at,
            "timing": None,
        }
    )
