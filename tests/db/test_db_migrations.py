"""Migrations: a fresh database goes to head and back down step by step, and the models match the head schema."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from deltabench.db.engine import current_revision, downgrade, get_engine, head_revision, upgrade
from deltabench.db.models import Base

SERVICE = {"api_tokens", "job_queue", "annotations", "series_state", "series_dirty"}
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
    assert current_revision(fresh_engine) == head_revision() == "0011"
    assert _tables(fresh_engine) == MEASUREMENT | SERVICE
    downgrade(fresh_engine, "0001")
    assert _tables(fresh_engine) == MEASUREMENT
    downgrade(fresh_engine, "base")
    assert current_revision(fresh_engine) is None and _tables(fresh_engine) == set()
    upgrade(fresh_engine)
    upgrade(fresh_engine)  # at head already: nothing to do
    assert current_revision(fresh_engine) == "0011"


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


def test_0003_backfills_the_series_software_and_downgrades(fresh_engine, factory) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    from deltabench.db.engine import session_scope
    from deltabench.db.ingest import ingest_document
    from deltabench.harness.series import series_software

    upgrade(fresh_engine)
    docs = [factory.document(commit=f"{i:040x}", torch=torch) for i, torch in enumerate(("2.11.0", "2.12.1"))]
    docs.append(factory.document(commit="f" * 40, torch=None, triton=None, cuda=None, python=""))
    with session_scope(fresh_engine) as s:
        for doc in docs:
            ingest_document(s, doc)
    query = text("SELECT runs.run_id, results.software FROM results JOIN runs ON runs.id = results.run_pk")
    with fresh_engine.connect() as conn:
        at_ingest = sorted(conn.execute(query).all())
    want = {doc.run_id: series_software(doc.environment) for doc in docs}
    assert at_ingest == sorted((run_id, want[run_id]) for run_id, _ in at_ingest)
    assert want[docs[2].run_id] == "" and "torch=2.12" in want[docs[1].run_id]

    downgrade(fresh_engine, "0002")
    columns = {c["name"] for c in inspect(fresh_engine).get_columns("results")}
    assert "software" not in columns
    indexes = {ix["name"]: ix["column_names"] for ix in inspect(fresh_engine).get_indexes("results")}
    assert "software" not in indexes["ix_results_series"]
    upgrade(fresh_engine)  # 0003 again: the column comes back, filled from the stored environments
    with fresh_engine.connect() as conn:
        assert sorted(conn.execute(query).all()) == at_ingest
    indexes = {ix["name"]: ix["column_names"] for ix in inspect(fresh_engine).get_indexes("results")}
    assert indexes["ix_results_series"][-2:] == ["software", "run_created_at"]


def test_0005_adds_the_job_heartbeat_and_downgrades(fresh_engine) -> None:  # type: ignore[no-untyped-def]
    upgrade(fresh_engine, "0004")
    assert "heartbeat_at" not in {c["name"] for c in inspect(fresh_engine).get_columns("job_queue")}
    upgrade(fresh_engine, "0005")
    column = {c["name"]: c for c in inspect(fresh_engine).get_columns("job_queue")}["heartbeat_at"]
    assert column["nullable"]
    downgrade(fresh_engine, "0004")
    assert "heartbeat_at" not in {c["name"] for c in inspect(fresh_engine).get_columns("job_queue")}


def test_0007_adds_sample_repetitions_and_downgrades(fresh_engine) -> None:  # type: ignore[no-untyped-def]
    upgrade(fresh_engine, "0006")
    assert "repetitions" not in {c["name"] for c in inspect(fresh_engine).get_columns("result_samples")}
    upgrade(fresh_engine, "0007")
    column = {c["name"]: c for c in inspect(fresh_engine).get_columns("result_samples")}["repetitions"]
    assert column["nullable"]
    downgrade(fresh_engine, "0006")
    assert "repetitions" not in {c["name"] for c in inspect(fresh_engine).get_columns("result_samples")}


def test_0008_adds_the_series_state_tables_and_downgrades(fresh_engine) -> None:  # type: ignore[no-untyped-def]
    upgrade(fresh_engine, "0007")
    assert not {"series_state", "series_dirty"} & _tables(fresh_engine)
    upgrade(fresh_engine, "0008")
    assert {"series_state", "series_dirty"} <= _tables(fresh_engine)
    indexes = {ix["name"]: ix["column_names"] for ix in inspect(fresh_engine).get_indexes("series_state")}
    assert indexes["ix_series_state_last_point"] == ["last_point_at"]
    downgrade(fresh_engine, "0007")
    assert not {"series_state", "series_dirty"} & _tables(fresh_engine)


def test_0009_marks_every_series_of_a_store_whose_table_was_never_built(fresh_engine, factory) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import func, select

    from deltabench.db import series_state
    from deltabench.db.engine import session_scope
    from deltabench.db.ingest import ingest_document
    from deltabench.db.models import SeriesDirty

    def marked() -> list[series_state.SeriesKey]:
        with session_scope(fresh_engine) as s:
            return series_state.take_dirty(s)

    upgrade(fresh_engine)
    docs = [factory.document(commit=f"{i:040x}") for i in range(3)]
    with session_scope(fresh_engine) as s:
        for doc in docs:
            ingest_document(s, doc)
    series = marked()
    assert series, "ingest marks the series it touched"
    # Results stored before 0008 carry no mark: 0009 marks each of their series once.
    downgrade(fresh_engine, "0008")
    upgrade(fresh_engine)
    with session_scope(fresh_engine) as s:
        assert s.scalar(select(func.count()).select_from(SeriesDirty)) == len(series)
    assert marked() == series
    # A store whose table was built keeps its marks as they are (none here).
    with session_scope(fresh_engine) as s:
        series_state.save_states(s, [(key, docs[0].created_at, None, 0) for key in series])
    downgrade(fresh_engine, "0008")
    upgrade(fresh_engine)
    with session_scope(fresh_engine) as s:
        assert s.scalar(select(func.count()).select_from(SeriesDirty)) == 0


def test_0010_drops_the_children_foreign_keys_and_downgrades(fresh_engine) -> None:  # type: ignore[no-untyped-def]
    from sqlalchemy import text

    def keys(table: str) -> list[str | None]:
        return [fk["name"] for fk in inspect(fresh_engine).get_foreign_keys(table)]

    upgrade(fresh_engine, "0009")
    assert keys("checks") == ["fk_checks_result_id_results"]
    assert keys("result_samples") == ["fk_result_samples_result_id_results"]
    upgrade(fresh_engine, "0010")
    assert keys("checks") == [] and keys("result_samples") == []
    assert keys("results") == ["fk_results_run_pk_runs"]  # a result still belongs to a run
    # a child row naming no result: nothing refuses it now, and the downgrade removes it before the key returns
    with fresh_engine.begin() as conn:
        conn.execute(
            text(
                'INSERT INTO checks (result_id, position, "check", metric, passed, gating, reference, detail) '
                "VALUES (424242, 0, 'output', 'rel_err', true, true, 'oracle', '')"
            )
        )
    downgrade(fresh_engine, "0009")
    assert keys("checks") == ["fk_checks_result_id_results"]
    with fresh_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM checks")).scalar_one() == 0
