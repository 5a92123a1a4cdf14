"""``deltabench run``: a suite's jobs, each gated on correctness then timed in a worker process, stored; a live
progress display (jobs done of all, the current job and its phase, ETA) while it runs.

``run_command`` is the typer signature; :func:`run_suite` does the work in named steps: check the options, load the
imports and the suite, plan, check host memory, run the plan under the progress display (:class:`RunProgress`),
print, save and store the documents, summarize.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from deltabench.cli.options import (
    db_option,
    device_option,
    import_option,
    load_imports,
    refresh_regressions,
    resolve_imports,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from deltabench.cli.progress_lines import ProgressLines
    from deltabench.harness.document import ResultDocument

__all__ = ["MAX_REPEAT", "RunProgress", "register", "run_suite"]

# Repetitions of a job in one run: enough for any spread estimate; more is a long benchmark, not a CI run.
MAX_REPEAT = 50
# Repetitions a job may reach under `--repeat auto` unless `--max-repeat` says otherwise: looks at 6, 12 and 20 for
# one job (regression.sequential).
DEFAULT_MAX_REPEAT = 20

# How a job's phases (runners/job.py) read in the progress display: the first call is where an impl compiles.
_PHASE_LABELS = {"first call": "compile (first call)", "gate": "correctness gate"}


def _job_label(case, impl: str) -> str:
    """A job as the progress display and the log lines name it: ``gdn triton_chunk B8-T4096-H6-K128-V128 bf16 fwd``
    (`case`: a harness Case or a document's CaseSpec)."""
    return f"{case.op} {impl} {case.shape_id} {case.dtype} {case.mode}"


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """`timeout`, CI runners and job schedulers stop a run with SIGTERM: leave through Python's exit, so the
    runner's clean-up kills the worker processes (each in a session of its own) instead of orphaning them."""
    raise SystemExit(128 + signum)


def _check_store(db_url: str | None) -> None:
    """Reach the store before the first job (BadInput naming the database's error): a run into a store that cannot
    be reached would otherwise end, after all its jobs, without storing them."""
    try:
        from sqlalchemy import text

        from deltabench.db.engine import describe_error, get_engine, session_scope
    except ModuleNotFoundError:  # no db layer installed: _save says so at the end
        return
    from deltabench.harness.errors import BadInput

    try:
        with session_scope(get_engine(db_url)) as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:
        if not type(exc).__module__.startswith("sqlalchemy."):
            raise
        raise BadInput(f"database: {describe_error(exc)} (use --no-db to run without storing)") from None


def _store(doc, db_url: str | None) -> str:
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.ingest import ingest_document

    engine = get_engine(db_url)
    with session_scope(engine) as session:
        run_id = ingest_document(session, doc)
    refresh_regressions(engine)
    return run_id


def _sequential(auto: bool, plan: Any, console: Console, steps: Callable[[int], None]) -> dict[str, Any]:
    """The keyword arguments of ``run_interleaved`` for ``--repeat auto`` (``regression.sequential``): its looks up
    to the plan's repetitions (``--max-repeat``), and the question asked after each look, which jobs the gate (at its
    default threshold and alpha, spent over the looks) still calls unknown; `steps` is told how many job runs each
    stage adds (the progress display's total). Empty for a fixed ``--repeat N``."""
    if not auto:
        steps(2 * len(plan.jobs) * plan.repeat)
        return {}
    from deltabench.regression import DEFAULT_ALPHA, DEFAULT_THRESHOLD, GradingRule, compare_documents
    from deltabench.regression.sequential import look_schedule, still_unknown

    rule = GradingRule(threshold=DEFAULT_THRESHOLD, alpha=DEFAULT_ALPHA)
    looks = look_schedule(plan.repeat, jobs=len(plan.jobs), alpha=rule.alpha)
    steps(2 * len(plan.jobs) * looks[0])
    stage = itertools.pairwise(looks)

    def undecided(head: ResultDocument, base: ResultDocument) -> set:
        keys = still_unknown(compare_documents(base, head, rule=rule))
        done, following = next(stage)
        console.print(f"--repeat auto: {len(keys)} job(s) still unknown after {done} repetitions")
        steps(2 * len(keys) * (following - done))
        return keys

    meta = {"threshold": rule.threshold, "alpha": rule.alpha, "max_repeat": plan.repeat}
    return {"looks": looks, "undecided": undecided, "sequential_meta": meta}


def _run_interleaved(plan, base_ref: str, out, base_out, console, on_start, on_done, auto: bool, steps):
    """(head, base) documents of `plan` run on this code and on git ref `base_ref`'s, interleaved
    (``runners.interleave``), sequentially when `auto` (``--repeat auto``); the progress callbacks name the side,
    `steps` is told the job runs each stage adds."""
    from deltabench.runners.interleave import base_tree, run_interleaved

    with base_tree(base_ref) as tree:
        console.print(f"base: {base_ref} = commit {tree.commit[:12]}, run interleaved with the head job by job")
        return run_interleaved(
            plan,
            tree,
            out=out,
            base_out=base_out,
            on_start=lambda job, side: on_start(job.model_copy(update={"impl": f"{job.impl} [{side}]"})),
            on_done=lambda job, result, side: on_done(job, result),
            on_begin=lambda path, side: console.print(f"partial document ({side}, each job saved as it ends): {path}"),
            **_sequential(auto, plan, console, steps),
        )


def _check_options(
    *,
    fmt: str,
    timeout: float | None,
    repeat: int,
    gate_workers: int | None,
    base_ref: str | None,
    out: Path | None,
    base_out: Path | None,
    auto: bool = False,
) -> Path | None:
    """Refuse options that are malformed or do not go together (bad input, exit 2); return the base document's
    path (given, or named after `out` for an interleaved run; None when there is none)."""
    from deltabench.harness.errors import BadInput
    from deltabench.harness.report import FORMATS

    if fmt not in FORMATS:
        raise BadInput(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    if timeout is not None and timeout <= 0:
        raise BadInput("--timeout must be a positive number of seconds")
    from deltabench.regression.noise import MIN_REPETITIONS

    if auto and base_ref is None:
        raise BadInput("--repeat auto needs --base-ref: it adds interleaved repetitions until the gate can tell")
    if auto and not MIN_REPETITIONS <= repeat <= MAX_REPEAT:
        raise BadInput(f"--max-repeat {repeat}: use {MIN_REPETITIONS} to {MAX_REPEAT} repetitions of each job")
    if not 1 <= repeat <= MAX_REPEAT:
        raise BadInput(f"--repeat {repeat}: use 1 to {MAX_REPEAT} repetitions of each job")
    if gate_workers is not None and gate_workers < 1:
        raise BadInput(f"--gate-workers {gate_workers}: use at least 1")
    if gate_workers is not None and gate_workers > 1 and base_ref is not None:
        raise BadInput("--gate-workers with --base-ref: an interleaved run gates each job just before its timing")
    if base_out is not None and base_ref is None:
        raise BadInput("--base-out needs --base-ref (the base run it names)")
    if base_ref is not None and base_out is None and out is not None:
        base_out = out.with_name(f"{out.name.removesuffix('.json')}.base.json")
    if base_ref is not None and out is not None and base_out.resolve() == out.resolve():
        raise BadInput(f"--base-out {base_out} is --out: name two files")
    return base_out


def _parse_repeat(repeat: int | str, max_repeat: int | None) -> tuple[bool, int]:
    """(sequential, repetitions) from ``--repeat`` (a count, or ``auto``) and ``--max-repeat`` (the most
    repetitions of ``auto``; refused with a count)."""
    from deltabench.harness.errors import BadInput

    text = str(repeat).strip().lower()
    if text == "auto":
        return True, DEFAULT_MAX_REPEAT if max_repeat is None else max_repeat
    if max_repeat is not None:
        raise BadInput("--max-repeat needs --repeat auto")
    try:
        return False, int(text)
    except ValueError:
        raise BadInput(f"--repeat {repeat!r}: use a number of repetitions or auto") from None


def _pick_device(device: str | None, suite_device: str | None) -> str:
    """The platform the run's jobs use: `device`, else the suite's, else cuda when present; an absent GPU is bad
    input (every job would need it)."""
    from deltabench.harness.devices import absent_reason, default_device, parse_platform
    from deltabench.harness.errors import BadInput

    dev = parse_platform(device or suite_device or default_device().platform)
    if dev == "cuda" and absent_reason(dev):
        # Every job would need the GPU; an absent TPU is instead each job's `unsupported` reason, since
        # JAX-free impls there are unsupported anyway and the run says why for each.
        raise BadInput(f"--device cuda: {absent_reason(dev)}")
    return dev


class RunProgress:
    """A run's progress as ``run_plan`` reports it: the live bar of jobs (and of the gates and compiles made first),
    and in a log (`lines`) one plain line per gate, compile and job instead."""

    def __init__(self, progress: Progress, plan: Any, title: str, console: Console, lines: ProgressLines | None):
        self.progress = progress
        self.plan = plan
        self.title = title  # "suite NAME on DEVICE"
        self.console = console
        self.lines = lines
        # Each repetition of a job is a step; jobs that end badly in the first round are not repeated.
        self.task = progress.add_task(title, total=len(plan.jobs) * plan.repeat)
        self.job: str | None = None  # the current job's label
        self.job_started = 0.0  # when the current job (this repetition of it) started, time.monotonic()
        self.gate_task: Any = None  # the gate phase's own bar, made when the phase starts (gate_workers > 1)
        self.compile_task: Any = None  # the compiles' own bar, made when they start (runners/session.py)

    def describe(self, text: str) -> None:
        """Show `text` as the run's state on its bar."""
        self.progress.update(self.task, description=text)

    def on_start(self, job) -> None:
        c = job.to_case()
        rep = f" (repetition {job.repetition + 1} of {self.plan.repeat})" if self.plan.repeat > 1 else ""
        self.job = f"{_job_label(c, job.impl)}{rep}"
        self.job_started = time.monotonic()
        self.describe(f"{self.job}: starting")

    def on_phase(self, job, phase: str) -> None:
        self.describe(f"{self.job or job.impl}: {_PHASE_LABELS.get(phase, phase)}")

    def on_done(self, job, result) -> None:
        # A job that ended badly skips its later rounds: advance past them too.
        skipped = self.plan.repeat - 1 - job.repetition if result.status != "ok" else 0
        self.progress.advance(self.task, 1 + skipped)
        if self.lines:
            task = self.progress.tasks[self.task]
            # A repetition's result spans every repetition so far: its line times this repetition alone.
            took = time.monotonic() - self.job_started if job.repetition else None
            outcome = self.lines.outcome(result, took)
            self.lines.line(f"[{int(task.completed)}/{int(task.total or 0)}] {self.job or job.impl}: {outcome}")

    def on_gated(self, done: int, total: int, result) -> None:
        lines = self.lines
        if self.gate_task is None:
            self.gate_task = self.progress.add_task(f"gates, {self.plan.gate_workers} at once", total=total, start=True)
            self.describe(f"{self.title}: gating first")
            if lines:
                lines.line(f"gating {total} jobs first, up to {self.plan.gate_workers} gate processes at once")
        self.progress.update(self.gate_task, completed=done)
        if lines and result is not None:
            lines.line(f"gate {done}/{total} {_job_label(result.case, result.impl)}: {lines.outcome(result)}")

    def on_compiled(self, done: int, total: int, result) -> None:
        lines = self.lines
        if self.compile_task is None:
            self.compile_task = self.progress.add_task("compiles of the gates' shapes", total=total, start=True)
            self.describe(f"{self.title}: compiling first")
            if lines:
                lines.line(f"compiling first for the gates of impls that compile each shape: {total} jobs")
        self.progress.update(self.compile_task, completed=done)
        if lines and result is not None:
            built = f" ({result.notes})" if result.status == "ok" and result.notes else ""
            lines.line(f"compile {done}/{total} {_job_label(result.case, result.impl)}: {lines.outcome(result)}{built}")

    def on_begin(self, path) -> None:
        # Named up front: a run cut short (Ctrl-C, a lost machine) leaves its jobs so far in this file.
        self.path = path
        self.console.print(f"partial document (each job saved as it ends): {path}", soft_wrap=True, highlight=False)

    def saved_line(self) -> str | None:
        """``N of M jobs saved in FILE (incomplete); ...``: what a run that ends early leaves, and how to store it;
        None before the document was begun."""
        from deltabench.harness.document import ResultDocument

        path = getattr(self, "path", None)
        if path is None:
            return None
        try:
            done = len(ResultDocument.from_json(Path(path).read_text()).jobs)
        except (OSError, ValueError):
            done = 0
        total = len(self.plan.jobs) * self.plan.repeat
        return f"{done} of {total} jobs saved in {path} (incomplete); `deltabench ingest {path}` stores it"


def _execute(
    plan: Any,
    title: str,
    console: Console,
    *,
    quiet: bool,
    out: Path | None,
    base_ref: str | None,
    base_out: Path | None,
    auto: bool = False,
) -> list[ResultDocument]:
    """Run `plan` under its progress display: [the document], or [head, base] interleaved with `base_ref`'s code
    (sequentially when `auto`)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from deltabench.cli.progress_lines import ProgressLines

    # Live only where someone watches: a pipe, a file or CI gets the tables and the summary alone.
    live = not quiet and sys.stdout.isatty() and console.is_terminal
    # A log (a pipe, a file, CI) gets one plain line per gate and job on stderr instead, unless --quiet.
    lines = None if live or quiet else ProgressLines(console)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not live,
    ) as progress:
        hooks = RunProgress(progress, plan, title, console, lines)
        try:
            return _run_under(
                hooks, plan, progress, console, title, out=out, base_ref=base_ref, base_out=base_out, auto=auto
            )
        except KeyboardInterrupt:
            saved = hooks.saved_line()
            if saved:
                console.print(f"interrupted: {saved}", soft_wrap=True, highlight=False)
            raise


def _run_under(
    hooks: RunProgress,
    plan: Any,
    progress: Any,
    console: Console,
    title: str,
    *,
    out: Path | None,
    base_ref: str | None,
    base_out: Path | None,
    auto: bool = False,
) -> list[ResultDocument]:
    """The run itself, reporting to `hooks`."""
    from deltabench.runners.session import run_plan

    if base_ref is None:
        docs = [
            run_plan(
                plan,
                out=out,
                on_start=hooks.on_start,
                on_done=hooks.on_done,
                on_begin=hooks.on_begin,
                on_phase=hooks.on_phase,
                on_gated=hooks.on_gated,
                on_compiled=hooks.on_compiled,
            )
        ]
    else:
        progress.update(hooks.task, total=0)

        def steps(n: int) -> None:
            task = next(t for t in progress.tasks if t.id == hooks.task)
            progress.update(hooks.task, total=(task.total or 0) + n)

        docs = list(
            _run_interleaved(plan, base_ref, out, base_out, console, hooks.on_start, hooks.on_done, auto, steps)
        )
    hooks.describe(f"{title}: done")
    return docs


def _print_results(doc: ResultDocument, fmt: str) -> None:
    """The run's results on stdout: rich tables (`fmt` table), else csv, json or markdown text."""
    from rich.console import Console

    from deltabench.harness.report import print_results, render_results

    if fmt == "table":
        # A pipe or a file gets the full table rather than rich's 80-column default.
        print_results(doc, Console(width=None if sys.stdout.isatty() else 200))
    else:
        print(render_results(doc, fmt), end="")


def _save(
    docs: list[ResultDocument], paths: list[Path | None], console: Console, *, db: str | None, no_db: bool
) -> None:
    """Name each document's file and store it in the database (unless `no_db`); a document stored and written
    nowhere else loses its partial file, one neither stored nor written keeps it and names it."""
    from deltabench.runners.session import partial_path

    for d, path in zip(docs, paths, strict=False):
        side = "" if len(docs) == 1 else f" ({d.meta['side']})"
        if path:
            console.print(f"result document{side}: {path}")
        if not no_db:
            try:
                run_id = _store(d, db)
            except ModuleNotFoundError as exc:
                console.print(f"[yellow]not stored: the db layer is not installed ({exc.name})[/]")
            else:
                console.print(f"stored run {run_id}{side}")
                if not path:
                    partial_path(d.run_id).unlink(missing_ok=True)
        elif not path:
            console.print(f"result document{side}: {partial_path(d.run_id)}")


def _summarize(doc: ResultDocument, console: Console) -> int:
    """Print the count of jobs per status; 1 when any job was incorrect, failed, timed out or ran out of memory."""
    bad = [j for j in doc.jobs if j.status in ("incorrect", "failed", "timeout", "oom")]
    counts = {s: sum(j.status == s for j in doc.jobs) for s in dict.fromkeys(j.status for j in doc.jobs)}
    console.print("jobs: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 1 if bad else 0


def run_suite(
    suite: str,
    *,
    impls: Sequence[str] = (),
    ops: Sequence[str] = (),
    shapes: Sequence[str] = (),
    modes: Sequence[str] = (),
    device: str | None = None,
    db: str | None = None,
    no_db: bool = False,
    out: Path | None = None,
    timeout: float | None = None,
    imports: Sequence[str] = (),
    fmt: str = "table",
    quiet: bool = False,
    repeat: int | str = 1,
    gate_workers: int | None = None,
    base_ref: str | None = None,
    base_out: Path | None = None,
    max_repeat: int | None = None,
    seqlens: str | None = None,
    lock_clocks: int | None = None,
) -> int:
    """Run `suite` (a shipped suite's name or a .toml path), narrowed to `impls`, `ops`, `shapes` and `modes` when
    given (with `seqlens`, ``17,64,1,218``, its shapes of B = 1 and T = their sum packing those sequences, the
    others left out): gate each job on correctness, time it, print the results in `fmt`, write them to `out` and
    store them (in `db`, unless `no_db`). With `base_ref`, also run every job on that git ref's code, interleaved;
    `repeat` ``"auto"`` (with `base_ref`) adds repetitions, up to `max_repeat`, only to the jobs the gate cannot yet
    tell (``regression.sequential``). `lock_clocks` (MHz, CUDA only) locks the GPUs' SM clock for the run where the
    driver allows it; the environment records whether it did (``runners.hwstate.locked_clocks``).

    Returns:
        1 when any job was incorrect, failed, timed out or ran out of memory (unsupported is fine), else 0.

    Raises:
        BadInput: malformed or clashing options, an unknown suite, no jobs, a job that cannot fit in host memory.
    """
    from rich.console import Console

    from deltabench.correctness.memory_need import check_jobs_fit
    from deltabench.harness.errors import BadInput
    from deltabench.harness.suites import load_suite
    from deltabench.runners.session import plan_run

    auto, repeat = _parse_repeat(repeat, max_repeat)
    base_out = _check_options(
        fmt=fmt,
        timeout=timeout,
        repeat=repeat,
        gate_workers=gate_workers,
        base_ref=base_ref,
        out=out,
        base_out=base_out,
        auto=auto,
    )
    specs = resolve_imports(list(imports))
    load_imports(specs)
    loaded = load_suite(suite)
    if seqlens is not None:
        from deltabench.harness.seqlens import parse_seqlens

        loaded = loaded.packed(parse_seqlens(seqlens))
    dev = _pick_device(device, loaded.device)
    if lock_clocks is not None and (not dev.startswith("cuda") or not 100 <= lock_clocks <= 5000):
        raise BadInput(f"--lock-clocks {lock_clocks}: give an SM clock in MHz (100 to 5000) for a run on cuda")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    plan = plan_run(
        loaded,
        device=dev,
        impls=list(impls) or None,
        ops=list(ops) or None,
        shapes=list(shapes) or None,
        modes=list(modes) or None,
        timeout_s=timeout,
        imports=specs,
        repeat=repeat,
        gate_workers=1 if base_ref is not None else gate_workers,  # interleaved runs gate job by job
    )
    if not plan.jobs:
        raise BadInput(f"suite {loaded.name!r} has no jobs for the filters given")
    check_jobs_fit((job.to_case(), job.impl, job.gate.reference) for job in plan.jobs)  # exit 2 before any job
    if not no_db:
        _check_store(db)
    console = Console(stderr=True)
    with contextlib.ExitStack() as stack:
        if lock_clocks is not None:
            from deltabench.runners.hwstate import locked_clocks

            console.print(f"clocks: {stack.enter_context(locked_clocks(lock_clocks))}")
        docs = _execute(
            plan,
            f"suite {loaded.name} on {dev}",
            console,
            quiet=quiet,
            out=out,
            base_ref=base_ref,
            base_out=base_out,
            auto=auto,
        )
    _print_results(docs[0], fmt)
    _save(docs, [out, base_out], console, db=db, no_db=no_db)
    if base_ref is not None:
        doc, base_doc = docs
        console.print(f"gate it: deltabench gate --base {base_out or base_doc.run_id} --head {out or doc.run_id}")
    return _summarize(docs[0], console)


def run_command(
    suite: str = typer.Option(..., "--suite", help="A shipped suite's name (smoke, train, ...) or a .toml path."),
    impl: list[str] = typer.Option([], "--impl", help="Only these impls (repeatable), run in the order given."),
    op: list[str] = typer.Option([], "--op", help="Only these ops (repeatable)."),
    shape: list[str] = typer.Option(
        [], "--shape", help="Only these shapes of the suite, e.g. B=1,T=8192,H=2,K=128 (repeatable)."
    ),
    mode: list[str] = typer.Option([], "--mode", help="Only these modes: fwd, bwd, fwd+bwd, decode (repeatable)."),
    device: str = device_option("the suite's, else cuda if present"),
    db: str = db_option(),
    no_db: bool = typer.Option(False, "--no-db", help="Do not store the run in a database."),
    out: Path = typer.Option(None, "--out", help="Write the result document (JSON) here, job by job."),
    timeout: float = typer.Option(None, "--timeout", help="Seconds per job before it is killed (timeout)."),
    import_: list[str] = import_option(),
    fmt: str = typer.Option("table", "--format", help="How to print the results: table, csv, json, markdown."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live progress display."),
    repeat: str = typer.Option(
        "1",
        "--repeat",
        help="Time every job N times, round by round in fresh worker processes (the gate runs once); "
        "`deltabench gate` then judges a job without history on its repetitions (N >= 5 on both runs). "
        "`auto` (with --base-ref): a few interleaved repetitions, then more (doubling, up to --max-repeat) only for "
        "the jobs the gate cannot yet tell from noise, alpha spent over the looks.",
    ),
    max_repeat: int = typer.Option(
        None,
        "--max-repeat",
        help=f"With --repeat auto: the most repetitions a job gets (default {DEFAULT_MAX_REPEAT}).",
    ),
    gate_workers: int = typer.Option(
        None,
        "--gate-workers",
        help="Gate every job first, up to N processes at once (each impl's gates in a process of its own; each job "
        "of an impl that compiles per shape, e.g. FlashQLA, in one of its own, once its kernels were built side "
        "by side), then time the jobs one at a time "
        "with their gate's outcome (default: the suite's [gate] workers, else 1: each job gated just before its "
        "timing). Not with --base-ref.",
    ),
    base_ref: str = typer.Option(
        None,
        "--base-ref",
        help="Also run every job on the code of this git ref (e.g. main), interleaved with the head job by job "
        "in one invocation, so both see the same machine states; gate the two documents with "
        "`deltabench gate --base BASE_OUT --head OUT` (use --repeat auto, or --repeat N with N >= 5).",
    ),
    base_out: Path = typer.Option(
        None, "--base-out", help="With --base-ref: the base run's document (default: OUT's name + .base.json)."
    ),
    seqlens: str = typer.Option(
        None,
        "--seqlens",
        help="Pack sequences of these lengths (cu_seqlens), e.g. 17,64,1,218: only the suite's shapes of B=1 "
        "and T = their sum run, packed.",
    ),
    lock_clocks: int = typer.Option(
        None,
        "--lock-clocks",
        help="Lock the GPUs' SM clock at this many MHz for the run (needs root or the driver's leave; the "
        "environment records whether it was locked). Only on a machine no one else uses.",
    ),
) -> int:
    """Run a suite: gate each job on correctness, time it, measure its memory, print and store the results.

    Exit code 1 when any job was incorrect, failed, timed out or ran out of memory (unsupported is fine).
    """
    return run_suite(
        suite,
        impls=impl,
        ops=op,
        shapes=shape,
        modes=mode,
        device=device,
        db=db,
        no_db=no_db,
        out=out,
        timeout=timeout,
        imports=import_,
        fmt=fmt,
        quiet=quiet,
        repeat=repeat,
        gate_workers=gate_workers,
        base_ref=base_ref,
        base_out=base_out,
        max_repeat=max_repeat,
        seqlens=seqlens,
        lock_clocks=lock_clocks,
    )


def register(app: typer.Typer) -> None:
    """Add the ``run`` command to `app`."""
    app.command("run")(run_command)
