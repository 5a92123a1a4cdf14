"""Alembic environment for deltabench's store.

``db.engine`` runs the migrations programmatically and hands over its open connection in
``config.attributes["connection"]``; the ``alembic`` command line (``alembic -c db/alembic.ini ...``) works too,
with the URL from ``-x db=URL``, else ``$DELTABENCH_DB``, else the per-user SQLite default.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from deltabench.db.engine import get_engine
from deltabench.db.models import Base

target_metadata = Base.metadata


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate over the caller's connection, or over a fresh engine for the command line."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("db") or context.config.get_main_option("sqlalchemy.url")
    engine = get_engine(url or None, migrate=False)
    with engine.connect() as conn:
        _migrate(conn)
        conn.commit()


if context.is_offline_mode():
    raise SystemExit("deltabench's migrations run online only (they need a connection)")
run_migrations_online()
