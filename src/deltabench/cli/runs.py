"""``deltabench runs delete RUN``: remove a run stored by mistake."""

from __future__ import annotations

import typer

from deltabench.cli.options import db_option

__all__ = ["delete_stored_run", "register"]


def delete_stored_run(run: str, *, db: str | None = None) -> int:
    """Delete run `run` (its exact id) from `db` with its results, samples and checks; print how many results went.
    Returns 0.

    Raises:
        BadInput: no run has that id.
    """
    from deltabench.db.deletion import delete_run
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.harness.errors import BadInput

    with session_scope(get_engine(db, create=False)) as session:
        n_results = delete_run(session, run_id=run)
    if n_results is None:
        raise BadInput(f"no run {run!r} in this database (give its exact id)")
    print(f"deleted run {run} ({n_results} results)")
    return 0


def delete_command(
    run: str = typer.Argument(..., help="The run's exact id (not a prefix, not `latest`)."),
    db: str = db_option(),
) -> int:
    """Delete a run with its results, samples and checks (machines and environments stay)."""
    return delete_stored_run(run, db=db)


def register(app: typer.Typer) -> None:
    """Add the ``runs`` command group to `app`."""
    group = typer.Typer(help="Manage stored runs.")
    app.add_typer(group, name="runs")
    group.command("delete")(delete_command)
