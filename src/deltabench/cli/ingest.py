"""``deltabench ingest``: store result files in the database, idempotently."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import typer

from deltabench.cli.options import db_option, import_option, load_imports, refresh_regressions

__all__ = ["ingest_files", "register"]


def ingest_files(
    files: Sequence[Path], *, db: str | None = None, as_json: bool = False, imports: Sequence[str] = ()
) -> int:
    """Store the result documents (or pytest-benchmark files) `files` in `db`; print the run ids stored, one a line
    or with `as_json` as ``{"runs": [...]}``. A file stored twice is stored once; a bad file stores nothing.
    `imports` register a user's ops first (a document of an op not registered is bad input). The regressions
    page's table is brought up to date for the series stored before it returns. Returns 0."""
    import json

    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.ingest import ingest_documents
    from deltabench.harness.documents_io import load_documents

    load_imports(list(imports))
    # Read and validate every file before touching the database, so a bad file stores nothing.
    docs = [doc for path in files for doc in load_documents(path)]
    engine = get_engine(db)
    with session_scope(engine) as session:
        run_ids = list(dict.fromkeys(ingest_documents(session, docs)))
    refresh_regressions(engine)
    if as_json:
        print(json.dumps({"runs": run_ids}))
    else:
        for run_id in run_ids:
            print(run_id)
    return 0


def ingest_command(
    files: list[Path] = typer.Argument(..., help="Result documents (JSON) or pytest-benchmark JSON files."),
    db: str = db_option(),
    json_: bool = typer.Option(False, "--json", help='Print {"runs": [...]} instead of one run id a line.'),
    import_: list[str] = import_option(),
) -> int:
    """Store result files; print the run ids stored. Storing a file twice stores it once."""
    return ingest_files(files, db=db, as_json=json_, imports=import_)


def register(app: typer.Typer) -> None:
    """Add the ``ingest`` command to `app`."""
    app.command("ingest")(ingest_command)
