"""Engines and sessions: where the store lives, and bringing its schema to the newest migration.

The URL comes from, in order: the ``url`` argument (the CLI's ``--db``), the ``DELTABENCH_DB`` environment
variable, else the per-user SQLite file ``${XDG_DATA_HOME:-~/.local/share}/deltabench/deltabench.db``. A value
without ``://`` is taken as a path to an SQLite file. SQLite connections run in WAL mode with foreign keys on
and ``synchronous=NORMAL`` (durable at each checkpoint, much faster commits); PostgreSQL URLs
(``postgresql+psycopg://user@host/db``) work as they are.

The first :func:`get_engine` for a URL in a process runs ``alembic upgrade head`` on it, so a fresh file or an
empty database is usable at once and an older one is migrated forward.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import threading
from collections.abc import Iterator

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

__all__ = [
    "MIGRATIONS_DIR",
    "alembic_config",
    "current_revision",
    "default_sqlite_path",
    "dispose_engines",
    "downgrade",
    "get_engine",
    "head_revision",
    "resolve_url",
    "session_scope",
    "upgrade",
]

MIGRATIONS_DIR = pathlib.Path(__file__).resolve().parent / "migrations"
ENV_VAR = "DELTABENCH_DB"
# An arbitrary constant key for pg_advisory_lock, so concurrent first uses migrate one at a time.
_PG_MIGRATION_LOCK = 0x0DE17AB
_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def default_sqlite_path() -> pathlib.Path:
    """The per-user SQLite file: ``${XDG_DATA_HOME:-~/.local/share}/deltabench/deltabench.db``."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return pathlib.Path(base) / "deltabench" / "deltabench.db"


def resolve_url(url: str | None = None) -> str:
    """The database URL to use: `url`, else ``$DELTABENCH_DB``, else the per-user SQLite file.

    A plain path (no ``://``) means an SQLite file at that path; its folder is created.
    """
    chosen = url or os.environ.get(ENV_VAR) or str(default_sqlite_path())
    if "://" not in chosen:
        path = pathlib.Path(chosen).expanduser().resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    parsed = make_url(chosen)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        pathlib.Path(parsed.database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    return chosen


def _sqlite_pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    # WAL lets the dashboard read while a run writes; busy_timeout waits out a concurrent writer.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _create(url: str) -> Engine:
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def get_engine(url: str | None = None, *, migrate: bool = True) -> Engine:
    """The engine for `url` (see :func:`resolve_url`), cached per URL; the first call migrates it to head.

    Args:
        url: an SQLAlchemy URL or an SQLite file path; None -> ``$DELTABENCH_DB`` or the per-user default.
        migrate: run ``alembic upgrade head`` on first use (False for tests that drive migrations themselves).
    """
    resolved = resolve_url(url)
    with _lock:
        engine = _engines.get(resolved)
        if engine is None:
            engine = _create(resolved)
            if migrate:
                upgrade(engine)
            _engines[resolved] = engine
    return engine


def dispose_engines() -> None:
    """Close and forget every cached engine (tests, and before a fork)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


@contextlib.contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits when the block ends and rolls back if it raises."""
    session = sessionmaker(bind=engine, expire_on_commit=False)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config():  # type: ignore[no-untyped-def]
    """An Alembic ``Config`` for the shipped migrations (no ini file needed).

    The URL is not put in the config (configparser would choke on a ``%`` in it): the migrations run over the
    connection handed to them in ``config.attributes["connection"]``.
    """
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    """The newest migration's revision id."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, f"no migrations found in {MIGRATIONS_DIR}"
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database at `engine` is at (None for an empty database)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _run_alembic(engine: Engine, action: str, revision: str) -> None:
    from alembic import command

    config = alembic_config()
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        config.attributes["connection"] = conn
        getattr(command, action)(config, revision)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database at `engine` forward to `revision` (default: the newest)."""
    if revision == "head" and current_revision(engine) == head_revision():
        return
    try:
        _run_alembic(engine, "upgrade", revision)
    except Exception:
        # Two processes opening a fresh SQLite file at once: the loser finds the winner's tables. That is fine
        # as long as the database did end up at head; anything else is a real error.
        if revision == "head" and current_revision(engine) == head_revision():
            return
        raise


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the database at `engine` back to `revision` (``base`` removes every table)."""
    _run_alembic(engine, "downgrade", revision)
