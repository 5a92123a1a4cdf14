"""``deltabench run``: a suite's jobs, each gated on correctness then timed in a worker process, stored; a live
progress display (jobs done of all, the current job and its phase, ETA) while it runs."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import typer

__all__ = ["MAX_REPEAT", "register"]

# Repetitions of a job in one run: enough for any spread estimate; more is a long benchmark, not a CI run.
MAX_REPEAT = 50

# How a job's phases (runners/job.py) read in the progress display: the first call is where an impl compiles.
_PHASE_LABELS = {"first call": "compile (first call)", "gate": "correctness gate"}


def _job_label(case, impl: str) -> str:
    """A job as the progress display and the log lines name it: ``gdn triton_chunk B8-T4096-H6-K128-V128 bf16 fwd``
    (`case`: a harness Case or a document's CaseSpec)."""
    return f"{case.op} {impl} {case.shape_id} {case.dtype} {case.mode}"


def _resolve_imports(specs: list[str]) -> list[str]:
    """Absolute paths for file imports, so the job subprocesses find them whatever their directory."""
    return [str(Path(s).resolve()) if s.endswith(".py") or Path(s).is_file() else s for s in specs]


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """`timeout`, CI runners and job schedulers stop a run with SIGTERM: leave through Python's exit, so the
    runner's clean-up kills the worker processes (each in a session of its own) instead of orphaning them."""
    raise SystemExit(128 + signum)


def _store(doc, db_url: str | None) -> str:
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.ingest import ingest_document

    with session_scope(get_engine(db_url)) as session:
        return ingest_document(session, doc)


def _check_memory(jobs: list) -> None:
    """Exit 2 before any job starts when a job's inputs and oracle cannot fit in host memory (one line with the
    estimate, see correctness/memory_need.py)."""
    from deltabench.correctness.memory_need import check_fits
    from deltabench.harness.errors import BadInput
    from deltabench.harness.registry import get_impl

    for job in jobs:
        case = job.to_case()
        try:
            grads = case.mode != "fwd" and get_impl(case.op, job.impl).supports_backward
        except BadInput:  # an impl the planner reports as unknown: judged as if it had a backward
            grads = case.mode != "fwd"
        what = f"{case.op}/{job.impl} at {case.shape_id} {case.dtype} {case.mode} on {case.device}"
        check_fits(case, reference=job.gate.reference, grads=grads, what=what)


def _run_interleaved(plan, base_ref: str, out, base_out, console, on_start, on_done):
    """(head, base) documents of `plan` run on this code and on git ref `base_ref`'s, interleaved
    (``runners.interleave``); the progress callbacks name the side."""
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
        )


def register(app: typer.Typer) -> None:
    """Add the ``run`` command to `app`."""

    @app.command("run")
    def run_command(
        suite: str = typer.Option(..., "--suite", help="A shipped suite's name (smoke, train, ...) or a .toml path."),
        impl: list[str] = typer.Option([], "--impl", help="Only these impls (repeatable), run in the order given."),
        op: list[str] = typer.Option([], "--op", help="Only these ops (repeatable)."),
        shape: list[str] = typer.Option(
            [], "--shape", help="Only these shapes of the suite, e.g. B=1,T=8192,H=2,K=128 (repeatable)."
        ),
        mode: list[str] = typer.Option([], "--mode", help="Only these modes: fwd, bwd, fwd+bwd (repeatable)."),
        device: str = typer.Option(
            None, "--device", help="cpu, cuda or tpu (default: the suite's, else cuda if present)."
        ),
        db: str = typer.Option(None, "--db", help="Database URL or SQLite path (default: $DELTABENCH_DB or per-user)."),
        no_db: bool = typer.Option(False, "--no-db", help="Do not store the run in a database."),
        out: Path = typer.Option(None, "--out", help="Write the result document (JSON) here, job by job."),
        timeout: float = typer.Option(None, "--timeout", help="Seconds per job before it is killed (timeout)."),
        import_: list[str] = typer.Option([], "--import", help="A module or .py file that registers impls."),
        fmt: str = typer.Option("table", "--format", help="How to print the results: table, csv, json, markdown."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No live progress display."),
        repeat: int = typer.Option(
            1,
            "--repeat",
            help="Time every job N times, round by round in fresh worker processes (the gate runs once); "
            "`deltabench gate` then judges a job without history on its repetitions (N >= 5 on both runs).",
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
            "`deltabench gate --base BASE_OUT --head OUT` (use --repeat N, N >= 5).",
        ),
        base_out: Path = typer.Option(
            None, "--base-out", help="With --base-ref: the base run's document (default: OUT's name + .base.json)."
        ),
    ) -> int:
        """Run a suite: gate each job on correctness, time it, measure its memory, print and store the results.

        Exit code 1 when any job was incorrect, failed, timed out or ran out of memory (unsupported is fine).
        """
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        from deltabench.cli.progress_lines import ProgressLines
        from deltabench.harness.errors import BadInput
        from deltabench.harness.registry import load_module
        from deltabench.harness.report import FORMATS, print_results, render_results
        from deltabench.harness.suites import load_suite

        if fmt not in FORMATS:
            raise BadInput(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
        if timeout is not None and timeout <= 0:
            raise BadInput("--timeout must be a positive number of seconds")
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
        imports = _resolve_imports(import_)
        for spec in imports:
            load_module(spec)
        loaded = load_suite(suite)
        from deltabench.harness.devices import absent_reason, default_device, parse_platform

        dev = parse_platform(device or loaded.device or default_device().platform)
        if dev == "cuda" and absent_reason(dev):
            # Every job would need the GPU; an absent TPU is instead each job's `unsupported` reason, since
            # JAX-free impls there are unsupported anyway and the run says why for each.
            raise BadInput(f"--device cuda: {absent_reason(dev)}")

        from deltabench.runners.session import partial_path, plan_run, run_plan

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _exit_on_sigterm)

        plan = plan_run(
            loaded,
            device=dev,
            impls=impl or None,
            ops=op or None,
            shapes=shape or None,
            modes=mode or None,
            timeout_s=timeout,
            imports=imports,
            repeat=repeat,
            gate_workers=1 if base_ref is not None else gate_workers,  # interleaved runs gate job by job
        )
        if not plan.jobs:
            raise BadInput(f"suite {loaded.name!r} has no jobs for the filters given")
        _check_memory(plan.jobs)
        console = Console(stderr=True)
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
            # Each repetition of a job is a step; jobs that end badly in the first round are not repeated.
            task = progress.add_task(f"suite {loaded.name} on {dev}", total=len(plan.jobs) * plan.repeat)
            current: dict[str, str] = {}

            def on_start(job) -> None:
                c = job.to_case()
                rep = f" (repetition {job.repetition + 1} of {plan.repeat})" if plan.repeat > 1 else ""
                current["job"] = f"{_job_label(c, job.impl)}{rep}"
                progress.update(task, description=f"{current['job']}: starting")

            def on_phase(job, phase: str) -> None:
                progress.update(task, description=f"{current.get('job', job.impl)}: {_PHASE_LABELS.get(phase, phase)}")

            def on_done(job, result) -> None:
                # A job that ended badly skips its later rounds: advance past them too.
                skipped = plan.repeat - 1 - job.repetition if result.status != "ok" else 0
                progress.advance(task, 1 + skipped)
                if lines:
                    done = int(progress.tasks[task].completed)
                    lines.line(
                        f"[{done}/{int(progress.tasks[task].total or 0)}] {current.get('job', job.impl)}: "
                        f"{lines.outcome(result)}"
                    )

            gate_task: list = []  # the gate phase's own bar, made when the phase starts (gate_workers > 1)

            def on_gated(done: int, total: int, result) -> None:
                if not gate_task:
                    gate_task.append(progress.add_task(f"gates, {plan.gate_workers} at once", total=total, start=True))
                    progress.update(task, description=f"suite {loaded.name} on {dev}: gating first")
                    if lines:
                        lines.line(f"gating {total} jobs first, up to {plan.gate_workers} gate processes at once")
                progress.update(gate_task[0], completed=done)
                if lines and result is not None:
                    lines.line(f"gate {done}/{total} {_job_label(result.case, result.impl)}: {lines.outcome(result)}")

            compile_task: list = []  # the compiles' own bar, made when they start (runners/session.py)

            def on_compiled(done: int, total: int, result) -> None:
                if not compile_task:
                    compile_task.append(progress.add_task("compiles of the gates' shapes", total=total, start=True))
                    progress.update(task, description=f"suite {loaded.name} on {dev}: compiling first")
                    if lines:
                        lines.line(f"compiling first for the gates of impls that compile each shape: {total} jobs")
                progress.update(compile_task[0], completed=done)
                if lines and result is not None:
                    built = f" ({result.notes})" if result.status == "ok" and result.notes else ""
                    lines.line(
                        f"compile {done}/{total} {_job_label(result.case, result.impl)}: {lines.outcome(result)}{built}"
                    )

            def on_begin(path) -> None:
                # Named up front: a run cut short (Ctrl-C, a lost machine) leaves its jobs so far in this file.
                console.print(f"partial document (each job saved as it ends): {path}")

            if base_ref is None:
                doc = run_plan(
                    plan,
                    out=out,
                    on_start=on_start,
                    on_done=on_done,
                    on_begin=on_begin,
                    on_phase=on_phase,
                    on_gated=on_gated,
                    on_compiled=on_compiled,
                )
                docs = [doc]
            else:
                progress.update(task, total=2 * len(plan.jobs) * plan.repeat)
                doc, base_doc = _run_interleaved(plan, base_ref, out, base_out, console, on_start, on_done)
                docs = [doc, base_doc]
            progress.update(task, description=f"suite {loaded.name} on {dev}: done")

        if fmt == "table":
            # A pipe or a file gets the full table rather than rich's 80-column default.
            print_results(doc, Console(width=None if sys.stdout.isatty() else 200))
        else:
            print(render_results(doc, fmt), end="")
        outs = [out, base_out]
        for d, path in zip(docs, outs, strict=False):
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
        if base_ref is not None:
            console.print(f"gate it: deltabench gate --base {base_out or base_doc.run_id} --head {out or doc.run_id}")
        bad = [j for j in doc.jobs if j.status in ("incorrect", "failed", "timeout", "oom")]
        counts = {s: sum(j.status == s for j in doc.jobs) for s in dict.fromkeys(j.status for j in doc.jobs)}
        console.print("jobs: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        return 1 if bad else 0
