"""``deltabench results``: show a stored run's tables (per op: impl x shape)."""

from __future__ import annotations

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``results`` command to `app`."""

    @app.command("results")
    def results_command(
        run: str = typer.Option(None, "--run", help="Run id or a unique prefix of it (default: the latest run)."),
        db: str = typer.Option(
            None,
            "--db",
            help="Database URL or SQLite path (default: $DELTABENCH_DB, else "
            "${XDG_DATA_HOME:-~/.local/share}/deltabench/deltabench.db).",
        ),
        fmt: str = typer.Option("table", "--format", help="table, csv, json or markdown."),
    ) -> int:
        """Print a stored run's results: per op, impl x shape with median, IQR, speedup, TFLOP/s, memory, status."""
        import sys

        from deltabench.db import queries
        from deltabench.db.engine import get_engine, session_scope
        from deltabench.harness.errors import BadInput
        from deltabench.harness.report import FORMATS, print_results, render_results

        if fmt not in FORMATS:
            raise BadInput(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
        with session_scope(get_engine(db, create=False)) as session:
            doc = queries.load_run_document(session, queries.resolve_run_id(session, ref=run))
        if not doc.complete:
            print(f"run {doc.run_id} is incomplete: it was cut short, not every planned job ran", file=sys.stderr)
        if fmt == "table" and sys.stdout.isatty():
            from rich.console import Console

            print_results(doc, Console())
        else:  # a pipe or a file: plain text, not squeezed to rich's 80 columns
            print(render_results(doc, fmt).rstrip("\n"))
        return 0
