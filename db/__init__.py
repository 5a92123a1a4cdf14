"""deltabench.db: the store of result documents (SQLAlchemy models, Alembic migrations, ingest and queries).

Start here::

    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.ingest import ingest_document
    from deltabench.db import queries

    engine = get_engine()  # $DELTABENCH_DB or ~/.local/share/deltabench/deltabench.db, migrated to head
    with session_scope(engine) as session:
        run_id = ingest_document(session, doc)
        same = queries.load_run_document(session, run_id)
"""

__all__ = ["engine", "ingest", "jobs", "models", "queries"]
