"""Migrations: a fresh database goes to head and back down step by step, and the models match the head schema."""

from __future__ import annotations

import pytest
from deltabench.db.engine import current_revision, downgrade, get_engine, head_revision, upgrade
from deltabench.db.models import Base
from sqlalchemy import inspect

SERVICE = {"api_tokens", "job_queue", "annotations"}
MEASUREMENT = {"machines", "environments", "runs", "results", "result_samples", "checks"}


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_engine(request: pytest.FixtureRequest, tmp_path):  # type: ignore[no-untyped-def]
    """An engine on a brand-new, empty database (nothing migrated)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'fresh.db'}"
    else:
        url = request.getfixturevalue("pg_server")()
    return get_engine(url, migrate=False)


def _tables(engine) -> set[str]:  # type: ignore[no-untyped-def]
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_round_trip(fresh_engine) -> None:  # type: ignore[no-untyped-def]
    assert current_revision(fresh_engine) is None and _tables(fresh_engine) == set()
    upgrade(fresh_engine, "0001")
    assert current_revision(fresh_engine) == "0001"
    assert _tables(fresh_engine) == MEASUREMENT
    upgrade(fresh_engine)
    assert current_revision(fresh_engine) == head_revision() == "0002"
    assert _tables(fresh_engine) == MEASUREMENT | SERVICE
    downgrade(fresh_engine, "0001")
    assert _tables(fresh_engine) == MEASUREMENT
    downgrade(fresh_engine, "base")
    assert current_revision(fresh_engine) is None and _tables(fresh_engine) == set()
    upgrade(fresh_engine)
    upgrade(fresh_engine)  # at head already: nothing to do
    assert current_revision(fresh_engine) == "0002"


def test_head_schema_matches_models(fresh_engine) -> None:  # type: ignore[no-untyped-def]
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    upgrade(fresh_engine)
    with fresh_engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []
    inspector = inspect(fresh_engine)
    indexes = {ix["name"]: ix["column_names"] for ix in inspector.get_indexes("results")}
    assert indexes["ix_results_series"][-1] == "run_created_at"
    assert indexes["ix_results_run_status"] == ["run_pk", "status"]
