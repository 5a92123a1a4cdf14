"""The regressions page reads a maintained table (db.series_state): ingest and run deletion mark the series they
touch, a refresh after ingest recomputes only those (never a page view), and what it lists is what a full
recomputation lists. SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import delete, func, select

from deltabench.db import series_state
from deltabench.db.deletion import delete_run
from deltabench.db.engine import get_engine, session_scope
from deltabench.db.ingest import ingest_document
from deltabench.db.models import SeriesDirty, SeriesState
from deltabench.web import services

UTC = dt.timezone.utc


def _history(build, impl: str, step_at: int | None, n: int = 30, start_day: int = 0):  # type: ignore[no-untyped-def]
    start = dt.datetime.now(UTC) - dt.timedelta(days=60)
    docs = []
    for i in range(start_day, start_day + n):
        level = 1.2 if step_at is not None and i >= step_at else 1.0
        median = level * (1 + 0.004 * ((i * 5) % 3 - 1))
        docs.append(
            build.document(
                created_at=start + dt.timedelta(days=i),
                commit=f"{impl[:4]}{i:036x}",
                jobs=[build.job(impl=impl, median=median), build.job(impl=impl, T=4096, median=2.0)],
            )
        )
    return docs


def _summary(found) -> list[tuple[str, int, str]]:  # type: ignore[no-untyped-def]
    return sorted((r.series_key, r.change_point.index, r.change_point.run_id) for r in found.data)


def _full_recompute(session) -> list[tuple[str, int, str]]:  # type: ignore[no-untyped-def]
    """What the page lists when every series is recomputed from scratch (the table emptied first)."""
    session.execute(delete(SeriesState))
    series_state.mark_all_dirty(session)
    services.refresh_series_states(session)
    return _summary(services.latest_change_points(session))


def test_a_view_recomputes_only_the_series_that_changed_and_matches_a_full_recomputation(db_url, build) -> None:
    engine = get_engine(db_url)
    with session_scope(engine) as session:
        for doc in _history(build, "torch_chunk", step_at=18) + _history(build, "fla_chunk", step_at=None):
            ingest_document(session, doc)
        # Four series marked, in 60 documents: a view lists nothing yet and says four series wait.
        assert session.scalar(select(func.count()).select_from(SeriesDirty)) == 60 * 2
        stale = services.latest_change_points(session)
        assert (stale.data, stale.series_scanned, stale.pending_series) == ([], 0, 4)
        assert session.scalar(select(func.count()).select_from(SeriesDirty)) == 60 * 2, "a view recomputes nothing"
        assert services.refresh_series_states(session) == 4
        first = services.latest_change_points(session)
        assert session.scalar(select(func.count()).select_from(SeriesDirty)) == 0
        assert (first.series_scanned, first.pending_series) == (4, 0)
        assert [(r.impl, r.change_point.index) for r in first.data] == [("torch_chunk", 18)]
        assert services.refresh_series_states(session) == 0, "nothing changed: nothing recomputed"
    # A step arrives in one series of fla_chunk (days 30-41): only fla_chunk's two series are read again.
    with session_scope(engine) as session:
        for doc in _history(build, "fla_chunk", step_at=30, n=12, start_day=30):
            ingest_document(session, doc)
    with session_scope(engine) as session:
        assert services.latest_change_points(session).pending_series == 2
        # Bounded: one series per call here, the other stays marked for the next.
        assert services.refresh_series_states(session, limit=1) == 1
        assert services.latest_change_points(session).pending_series == 1
        assert services.refresh_series_states(session) == 1
        found = _summary(services.latest_change_points(session))
        assert [key.split("/")[1] for key, *_ in found] == ["fla_chunk", "torch_chunk"]
        assert found == _full_recompute(session)


def test_deleting_runs_marks_their_series_and_a_series_without_points_leaves_the_table(db_url, build) -> None:
    engine = get_engine(db_url)
    docs = _history(build, "torch_chunk", step_at=18)
    lone = build.document(commit="c" * 40, jobs=[build.job(impl="triton_chunk", T=8192, median=3.0)])
    with session_scope(engine) as session:
        for doc in [*docs, lone]:
            ingest_document(session, doc)
        services.refresh_series_states(session)
        assert len(series_state.states(session)) == 3
        assert [r.change_point.index for r in services.latest_change_points(session).data] == [18]
    with session_scope(engine) as session:
        # The step's runs go: torch_chunk's history is flat again; the lone run's series has no point left.
        for doc in [*docs[18:], lone]:
            delete_run(session, run_id=doc.run_id)
    with session_scope(engine) as session:
        assert services.refresh_series_states(session) == 3
        assert len(series_state.states(session)) == 2
        assert services.latest_change_points(session).data == []
        assert _full_recompute(session) == []


def test_the_ingest_api_refreshes_in_the_background_and_a_view_never_waits(app_client, db_url, build) -> None:  # type: ignore[no-untyped-def]
    import time

    # A settle long enough that the views below come before the refresh starts, and short enough for the test.
    client = app_client(series_refresh_settle_s=3.0)
    token = build.token(db_url)
    docs = _history(build, "torch_chunk", step_at=18)
    posted = client.post("/api/v1/runs", json=build.body(*docs), headers={"Authorization": f"Bearer {token}"})
    assert posted.status_code == 201, posted.text
    stale = client.get("/api/v1/regressions").json()
    assert (stale["data"], stale["pending_series"]) == ([], 2), "a view lists the table as it stands, and says so"
    assert "2 series gained or lost points" in client.get("/regressions").text
    # No one refreshes by hand: the ingest woke the app's refresher, which runs well before its periodic look.
    deadline = time.monotonic() + 20
    while (found := client.get("/api/v1/regressions").json())["pending_series"]:
        assert time.monotonic() < deadline, "the ingest did not start a refresh"
        time.sleep(0.1)
    assert [(r["impl"], r["change_point"]["index"]) for r in found["data"]] == [("torch_chunk", 18)]
    assert found["series_scanned"] == 2
    assert 'id="pending-series"' not in client.get("/regressions").text
