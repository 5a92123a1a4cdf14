"""deltabench.db: the store of result documents (SQLAlchemy models, Alembic migrations, ingest and queries).

Start here::

    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.ingest import ingest_document
    from deltabench.db import queries

    engine = get_engine()  # $DELTABENCH_DB or ~/.local/share/deltabench/deltabench.db, migrated to head
    with session_scope(engine) as session:
        run_id = ingest_document(session, doc)
        same = queries.load_run_document(session, run_id)

    from deltabench.db import results_frame  # stored results as a pandas DataFrame, for notebooks

    df = results_frame(op="gdn", machine_kind="h200")
"""

from typing import Any

__all__ = ["engine", "ingest", "jobs", "models", "queries", "results_frame"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the frame module needs SQLAlchemy (and pandas when called), which plain imports of
    # deltabench.db's submodules should not pay for.
    if name == "results_frame":
        from .frame import results_frame

        return results_frame
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
