"""``deltabench results``: show a stored run's tables (per op: impl x shape), or export stored results.

``table``, ``markdown`` and ``json`` render one run (``harness.report``); ``csv`` and ``parquet`` export the
rows of ``deltabench.db.results_frame`` (one per job, every field), for one run, or every run with ``--all``,
narrowed by ``--op``, ``--impl``, ``--machine``, ``--since`` and ``--until``.
"""

from __future__ import annotations

from collections.abc import Sequence

import typer

from deltabench.cli.options import db_option, import_option, load_imports

__all__ = ["register", "show_results"]

EXPORTS = ("csv", "parquet")


def show_results(
    run: str | None = None,
    *,
    db: str | None = None,
    fmt: str = "table",
    every_run: bool = False,
    op: Sequence[str] = (),
    impl: Sequence[str] = (),
    machine: Sequence[str] = (),
    since: str | None = None,
    until: str | None = None,
    out: str | None = None,
    imports: Sequence[str] = (),
) -> int:
    """Show stored run `run` (an id, a unique prefix, None for the latest) in `fmt` (table, markdown, json), or
    export the results of that run (of every run with `every_run`, narrowed by `op`, `impl`, `machine`, `since`,
    `until`) as csv or parquet; to `out` when given, else standard output. `imports` register a user's ops first
    (their titles and work models). Returns 0.

    Raises:
        BadInput: an unknown format, --all with --run, filters with a format that shows one run, no such run.
    """
    from deltabench.harness.errors import BadInput
    from deltabench.harness.report import FORMATS

    load_imports(list(imports))
    if fmt not in (*FORMATS, *EXPORTS):
        raise BadInput(f"unknown format {fmt!r}: use one of {', '.join(sorted({*FORMATS, *EXPORTS}))}")
    if every_run and run:
        raise BadInput("give --all and --run not both: --all exports every run")
    if fmt in EXPORTS:
        _export(
            db,
            fmt,
            out,
            run=None if every_run else (run or "latest"),
            op=op,
            impl=impl,
            machine=machine,
            since=since,
            until=until,
        )
        return 0
    if every_run or op or impl or machine or since or until:
        raise BadInput(
            f"--all and the filters (--op, --impl, --machine, --since, --until) export csv or "
            f"parquet; --format {fmt} shows one run"
        )
    _show_run(run, db=db, fmt=fmt, out=out)
    return 0


def _show_run(run: str | None, *, db: str | None, fmt: str, out: str | None) -> None:
    """Print stored run `run` (None: the latest) in `fmt`, or write it to `out` (a table as markdown); warn on
    stderr when the run was cut short."""
    import sys

    from deltabench.db import queries
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.harness.report import print_results, render_results

    with session_scope(get_engine(db, create=False)) as session:
        doc = queries.load_run_document(session, queries.resolve_run_id(session, ref=run))
    if not doc.complete:
        print(f"run {doc.run_id} is incomplete: it was cut short, not every planned job ran", file=sys.stderr)
    if out:
        with open(out, "w") as f:
            f.write(render_results(doc, "markdown" if fmt == "table" else fmt))
    elif fmt == "table" and sys.stdout.isatty():
        from rich.console import Console

        print_results(doc, Console())
    else:  # a pipe or a file: plain text, not squeezed to rich's 80 columns
        print(render_results(doc, fmt).rstrip("\n"))


def results_command(
    run: str = typer.Option(None, "--run", help="Run id or a unique prefix of it (default: the latest run)."),
    db: str = db_option(),
    fmt: str = typer.Option("table", "--format", help="table, csv, json, markdown or parquet."),
    every_run: bool = typer.Option(False, "--all", help="csv/parquet: every stored run, not one."),
    op: list[str] = typer.Option(None, "--op", help="csv/parquet: only this op (repeatable)."),
    impl: list[str] = typer.Option(None, "--impl", help="csv/parquet: only this impl (repeatable)."),
    machine: list[str] = typer.Option(None, "--machine", help="csv/parquet: only this machine kind (repeatable)."),
    since: str = typer.Option(None, "--since", help="csv/parquet: runs created at or after this ISO date/time."),
    until: str = typer.Option(None, "--until", help="csv/parquet: runs created at or before this ISO date/time."),
    out: str = typer.Option(None, "--out", help="Write to this file instead of standard output."),
    import_: list[str] = import_option(),
) -> int:
    """Print a stored run's results: per op, impl x shape with median, IQR, speedup, TFLOP/s, memory, status."""
    return show_results(
        run,
        db=db,
        fmt=fmt,
        every_run=every_run,
        op=op or (),
        impl=impl or (),
        machine=machine or (),
        since=since,
        until=until,
        out=out,
        imports=import_,
    )


def register(app: typer.Typer) -> None:
    """Add the ``results`` command to `app`."""
    app.command("results")(results_command)


def _export(
    db: str | None,
    fmt: str,
    out: str | None,
    *,
    run: str | None,
    op: Sequence[str],
    impl: Sequence[str],
    machine: Sequence[str],
    since: str | None,
    until: str | None,
) -> None:
    """Write ``results_frame`` as csv (to `out` or standard output) or parquet (to `out`)."""
    import sys

    from deltabench.harness.errors import BadInput

    if fmt == "parquet":
        if not out:
            raise BadInput("--format parquet needs --out FILE (parquet is binary)")
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise BadInput("--format parquet needs pyarrow: pip install pyarrow (or 'deltabench[db]')") from None
    from deltabench.db import results_frame

    frame = results_frame(
        db,
        run=run,
        op=list(op) or None,
        impl=list(impl) or None,
        machine_kind=list(machine) or None,
        since=since,
        until=until,
    )
    if fmt == "parquet":
        frame.to_parquet(out, index=False)
    elif out:
        frame.to_csv(out, index=False)
    else:
        frame.to_csv(sys.stdout, index=False)
