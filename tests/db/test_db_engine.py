"""Engine: where the store lives by default, SQLite's pragmas, migration on first use."""

from __future__ import annotations

import pathlib

from sqlalchemy import text

from deltabench.db.engine import current_revision, default_sqlite_path, get_engine, head_revision, resolve_url


def test_default_path_follows_xdg(monkeypatch, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("DELTABENCH_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_sqlite_path() == tmp_path / "xdg" / "deltabench" / "deltabench.db"
    assert resolve_url() == f"sqlite:///{tmp_path / 'xdg' / 'deltabench' / 'deltabench.db'}"
    assert (tmp_path / "xdg" / "deltabench").is_dir()
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_sqlite_path() == tmp_path / "home" / ".local" / "share" / "deltabench" / "deltabench.db"


def test_env_var_and_argument(monkeypatch, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DELTABENCH_DB", str(tmp_path / "env.db"))
    assert resolve_url() == f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv("DELTABENCH_DB", "postgresql+psycopg://u@h/db")
    assert resolve_url() == "postgresql+psycopg://u@h/db"
    assert resolve_url(f"sqlite:///{tmp_path}/a/b.db") == f"sqlite:///{tmp_path}/a/b.db"
    assert (tmp_path / "a").is_dir()


def test_sqlite_pragmas_and_first_use_migrates(tmp_path: pathlib.Path) -> None:
    engine = get_engine(str(tmp_path / "x.db"))
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
    assert get_engine(f"sqlite:///{tmp_path / 'x.db'}") is engine  # cached per URL


def test_postgresql_plans_every_statement_for_its_values(pg_url: str) -> None:
    """A generic plan of a series' history estimated one row and sorted every point of the series; the engine's
    connections plan each statement for its values, also after a rollback and a statement's sixth run (when psycopg
    prepares it), and start no parallel workers."""
    engine = get_engine(pg_url)
    with engine.connect() as conn:
        conn.rollback()
        for _ in range(7):
            assert conn.execute(text("SHOW plan_cache_mode"), {}).scalar() == "force_custom_plan"
        # No parallel workers for the pages' small index-driven reads.
        assert conn.execute(text("SHOW max_parallel_workers_per_gather")).scalar() == "0"
        # The URL's own options (the test schema's search_path) still apply.
        assert conn.execute(text("SHOW search_path")).scalar().startswith("deltabench_test_")
