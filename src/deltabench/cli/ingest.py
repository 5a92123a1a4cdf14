"""``deltabench ingest``: store result files in the database, idempotently."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``ingest`` command to `app`."""

    @app.command("ingest")
    def ingest_command(
        files: list[Path] = typer.Argument(..., help="Result documents (JSON) or pytest-benchmark JSON files."),
        db: str = typer.Option(
            None,
            "--db",
            help="Database URL or SQLite path (default: $DELTABENCH_DB, else "
            "${XDG_DATA_HOME:-~/.local/share}/deltabench/deltabench.db).",
        ),
        json_: bool = typer.Option(False, "--json", help='Print {"runs": [...]} instead of one run id a line.'),
    ) -> int:
        """Store result files; print the run ids stored. Storing a file twice stores it once."""
        import json

        from deltabench.db.engine import get_engine, session_scope
        from deltabench.db.ingest import ingest_documents
        from deltabench.harness.documents_io import load_documents

        # Read and validate every file before touching the database, so a bad file stores nothing.
        docs = [doc for path in files for doc in load_documents(path)]
        with session_scope(get_engine(db)) as session:
            run_ids = list(dict.fromkeys(ingest_documents(session, docs)))
        if json_:
            print(json.dumps({"runs": run_ids}))
        else:
            for run_id in run_ids:
                print(run_id)
        return 0
