"""``deltabench runs list``: the stored runs, newest first; ``deltabench runs delete RUN``: remove a run stored by
mistake."""

from __future__ import annotations

import typer

from deltabench.cli.options import db_option, refresh_regressions

__all__ = ["delete_stored_run", "list_stored_runs", "register"]

RUNS_FORMATS = ("table", "json")
RUNS_COLUMNS = ("id", "suite", "commit", "machine", "jobs", "complete", "created")


def list_stored_runs(*, db: str | None = None, fmt: str = "table", limit: int = 50) -> int:
    """Print the `limit` newest runs of `db`: id, suite, commit, machine, jobs, complete, created; as a table
    (one run a line, columns aligned) or ``fmt="json"`` (a list of objects with those keys). Returns 0.

    Raises:
        BadInput: an unknown format, a limit below 1.
    """
    import json

    from deltabench.db import queries
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.harness.errors import BadInput

    if fmt not in RUNS_FORMATS:
        raise BadInput(f"unknown format {fmt!r}: use one of {', '.join(RUNS_FORMATS)}")
    if limit < 1:
        raise BadInput(f"--limit {limit}: give 1 or more")
    with session_scope(get_engine(db, create=False)) as session:
        runs = queries.list_runs(session, limit=limit)
    rows = [
        {
            "id": run.run_id,
            "suite": run.suite,
            "commit": (run.git_commit or "") + ("+dirty" if run.git_dirty else ""),
            "machine": run.machine_kind,
            "jobs": run.n_results,
            "complete": run.complete,
            "created": run.created_at.isoformat(timespec="seconds"),
        }
        for run in runs
    ]
    if fmt == "json":
        print(json.dumps(rows, indent=1))
        return 0
    cells = [list(RUNS_COLUMNS)] + [
        [
            str(r["id"]),
            str(r["suite"]),
            str(r["commit"])[:12] or "-",
            str(r["machine"]),
            str(r["jobs"]),
            "yes" if r["complete"] else "no",
            str(r["created"]),
        ]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(RUNS_COLUMNS))]
    for row in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def list_command(
    db: str = db_option(),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    limit: int = typer.Option(50, "--limit", help="The newest N runs."),
) -> int:
    """List the stored runs, newest first: id, suite, commit, machine, jobs, complete, created."""
    return list_stored_runs(db=db, fmt=fmt, limit=limit)


def delete_stored_run(run: str, *, db: str | None = None) -> int:
    """Delete run `run` (its exact id) from `db` with its results, samples and checks; print how many results went.
    Returns 0.

    Raises:
        BadInput: no run has that id.
    """
    from deltabench.db.deletion import delete_run
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.harness.errors import BadInput

    engine = get_engine(db, create=False)
    with session_scope(engine) as session:
        n_results = delete_run(session, run_id=run)
    if n_results is None:
        raise BadInput(f"no run {run!r} in this database (give its exact id)")
    refresh_regressions(engine)  # its series lost points
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
    group.command("list")(list_command)
    group.command("delete")(delete_command)
