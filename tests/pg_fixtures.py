"""PostgreSQL and database-URL fixtures shared by the db and web tests.

tests/db/conftest.py and tests/web/conftest.py import these fixtures by name (``from pg_fixtures import ...``;
tests/ is on sys.path because tests/conftest.py sits there without an ``__init__.py``). They are not loaded with
``pytest_plugins``: pytest refuses that outside the top-level conftest, and there it would load them for every test.

PostgreSQL is the one on 127.0.0.1:5432 (trust auth), database ``test``. The session works in its own schemas
``deltabench_test_<pid>_<n>`` (the connection's search_path) and drops them at the end, so parallel sessions and
other users of ``test`` never see these tables. Between tests the tables are emptied.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import text

from deltabench.db.engine import dispose_engines, get_engine
from deltabench.db.models import Base

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
# Numbers schemas across every pg_server of the session (the db and web conftests each get their own), so no two
# share a name: the engine cache keys on the URL, and a schema dropped and remade under it would look migrated.
_schema_numbers = itertools.count()


def _pg_admin():  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Callable[[], str]]:
    """A factory of fresh, empty PostgreSQL schemas in the ``test`` database, as URLs whose search_path is that
    schema; every schema it made is dropped at session end (schemas are much cheaper than databases to drop)."""
    try:
        _pg_admin().close()
    except Exception as exc:  # the server is part of the dev setup; say so instead of failing every test
        pytest.skip(f"PostgreSQL at 127.0.0.1:5432 not reachable: {exc}")
    made: list[str] = []

    def make() -> str:
        name = f"deltabench_test_{os.getpid()}_{next(_schema_numbers)}"
        with _pg_admin() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{name}"')
        made.append(name)
        return f"postgresql+psycopg://postgres@127.0.0.1:5432/test?options=-csearch_path%3D{name}"

    yield make
    dispose_engines()
    with _pg_admin() as conn:
        for name in made:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture(scope="session")
def pg_url(pg_server: Callable[[], str]) -> str:
    """The session's PostgreSQL database for the ordinary tests (migrated on first use)."""
    return pg_server()


def empty_tables(url: str) -> None:
    """Empty every deltabench table of the database at `url` (identities restarted)."""
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    with get_engine(url).begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


@pytest.fixture
def sqlite_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    """A fresh SQLite file (a conftest may override it to name the file differently)."""
    return str(tmp_path / "deltabench.db")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, sqlite_url: str) -> Iterator[str]:
    """A migrated, empty database: a fresh SQLite file, or the session's PostgreSQL database emptied after use."""
    if request.param == "sqlite":
        yield sqlite_url
        return
    url = request.getfixturevalue("pg_url")
    yield url
    empty_tables(url)
