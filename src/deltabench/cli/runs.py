"""``deltabench runs delete RUN``: remove a run stored by mistake."""

from __future__ import annotations

import typer

__all__ = ["register"]

_DB_HELP = "Database URL or SQLite path (default: $DELTABENCH_DB or per-user)."


def register(app: typer.Typer) -> None:
    """Add the ``runs`` command group to `app`."""
    group = typer.Typer(help="Manage stored runs.")
    app.add_typer(group, name="runs")

    @group.command("delete")
    def delete_command(
        run: str = typer.Argument(..., help="The run's exact id (not a prefix, not `latest`)."),
        db: str = typer.Option(None, "--db", help=_DB_HELP),
    ) -> int:
        """Delete a run with its results, samples and checks (machines and environments stay)."""
        from deltabench.db.deletion import delete_run
        from deltabench.db.engine import get_engine, session_scope
        from deltabench.harness.errors import BadInput

        with session_scope(get_engine(db, create=False)) as session:
            n_results = delete_run(session, run_id=run)
        if n_results is None:
            raise BadInput(f"no run {run!r} in this database (give its exact id)")
        print(f"deleted run {run} ({n_results} results)")
        return 0
