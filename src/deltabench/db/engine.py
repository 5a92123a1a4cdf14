"""Engines and sessions: where the store lives, and bringing its schema to the newest migration.

The URL comes from, in order: the ``url`` argument (the CLI's ``--db``), the ``DELTABENCH_DB`` environment
variable, else the per-user SQLite file ``${XDG_DATA_HOME:-~/.local/share}/deltabench/deltabench.db``. A value
without ``://`` is taken as a path to an SQLite file. SQLite connections run in WAL mode with foreign keys on
and ``synchronous=NORMAL`` (durable at each checkpoint, much faster commits); PostgreSQL URLs
(``postgresql+psycopg://user@host/db``) work as they are.

The first :func:`get_engine` for a URL in a process runs ``alembic upgrade head`` on it, so a fresh file or an
empty database is usable at once and an older one is migrated forward. Commands that only read pass
``create=False``: a path or an empty database that holds no store is then an error, never a new store.

A URL that cannot be opened (a missing driver, an unreachable server, another database than SQLite or
PostgreSQL) is a :class:`DatabaseError` (a ``BadInput``: the CLI prints it on one line and exits 2) naming the
URL, its password hidden, and what went wrong.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import threading
from collections.abc import Iterator

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from deltabench.harness.errors import BadInput

__all__ = [
    "MIGRATIONS_DIR",
    "DatabaseError",
    "alembic_config",
    "current_revision",
    "default_sqlite_path",
    "describe_error",
    "dispose_engines",
    "downgrade",
    "get_engine",
    "head_revision",
    "resolve_url",
    "safe_url",
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


_BACKENDS = ("sqlite", "postgresql")


class DatabaseError(BadInput):
    """The database at a URL cannot be used: the message names the URL and what went wrong, on one line."""


def safe_url(url: str) -> str:
    """`url` with its password hidden (for messages)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1] if "@" in url else url


def describe_error(exc: BaseException) -> str:
    """The first line of what a database error says (SQLAlchemy's own text when it wraps a driver's error)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip() or type(exc).__name__
    first = text.splitlines()[0].strip()
    return first[:300]


def _sqlite_file(url: str) -> pathlib.Path | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return pathlib.Path(parsed.database).expanduser().resolve()


def resolve_url(url: str | None = None, *, create: bool = True) -> str:
    """The database URL to use: `url`, else ``$DELTABENCH_DB``, else the per-user SQLite file.

    A plain path (no ``://``) means an SQLite file at that path; with `create` its folder is created.

    Raises:
        DatabaseError: a URL SQLAlchemy cannot parse, or a database other than SQLite or PostgreSQL.
    """
    chosen = url or os.environ.get(ENV_VAR) or str(default_sqlite_path())
    if "://" not in chosen:
        chosen = f"sqlite:///{pathlib.Path(chosen).expanduser().resolve()}"
    try:
        backend = make_url(chosen).get_backend_name()
    except ArgumentError as exc:
        raise DatabaseError(f"database {safe_url(chosen)}: not a database URL ({describe_error(exc)})") from None
    if backend not in _BACKENDS:
        raise DatabaseError(
            f"database {safe_url(chosen)}: deltabench stores in SQLite (a file path) or PostgreSQL "
            f"(postgresql+psycopg://user@host/db), not {backend}"
        )
    path = _sqlite_file(chosen)
    if path is not None and create:
        path.parent.mkdir(parents=True, exist_ok=True)
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
    engine = create_engine(url, pool_pre_ping=True)
    event.listen(engine, "connect", _postgresql_settings)
    return engine


def _postgresql_settings(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    # Plan every statement for its values. psycopg prepares a statement on its sixth run and PostgreSQL then
    # switches to a generic plan when its estimated cost looks no worse: for a series' history (~12 equality
    # conditions) it estimates one row, so it reads and sorts every point of the series instead of the newest 500
    # by the index (48 ms against 2 ms at 1M results, ~10x that at 10M). Planning takes under 1 ms.
    # No parallel workers: the store's reads are index-driven slices of a few thousand rows, where starting workers
    # costs more than it saves (a comparison's history query 16-30 ms with two workers, 8-10 ms without, on two
    # cores; a 16,000-row results_frame no slower), and concurrent requests already use the cores.
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_custom_plan")
        cursor.execute("SET max_parallel_workers_per_gather = 0")
    dbapi_connection.commit()


def get_engine(url: str | None = None, *, migrate: bool = True, create: bool = True) -> Engine:
    """The engine for `url` (see :func:`resolve_url`), cached per URL; the first call migrates it to head.

    Args:
        url: an SQLAlchemy URL or an SQLite file path; None -> ``$DELTABENCH_DB`` or the per-user default.
        migrate: run ``alembic upgrade head`` on first use (False for tests that drive migrations themselves).
        create: make the store when there is none (False for commands that only read: a missing SQLite file or
            a database without deltabench's tables is then a :class:`DatabaseError`).

    Raises:
        DatabaseError: the database cannot be opened or migrated, or (without `create`) holds no store.
    """
    resolved = resolve_url(url, create=create)
    with _lock:
        engine = _engines.get(resolved)
        if engine is not None:
            return engine
        path = _sqlite_file(resolved)
        if not create and path is not None and not path.is_file():
            raise DatabaseError(f"database {path}: no such file (nothing is stored there)")
        try:
            engine = _create(resolved)
            if not create and current_revision(engine) is None:
                engine.dispose()
                raise DatabaseError(f"database {safe_url(resolved)}: holds no deltabench store (nothing stored yet)")
            if migrate:
                upgrade(engine)
        except (SQLAlchemyError, ImportError, OSError) as exc:
            raise DatabaseError(f"database {safe_url(resolved)}: {describe_error(exc)}") from exc
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
