"""The series list (``queries.list_series``) read from the maintained tables: the same series as a distinct over
the results, whatever the refresh has caught up with (nothing refreshed, all refreshed, a run deleted since)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from deltabench.db import queries, series_state
from deltabench.db.deletion import delete_run
from deltabench.db.engine import session_scope
from deltabench.db.ingest import ingest_document
from deltabench.db.models import SERIES_COLUMNS, Result
from deltabench.web.services import refresh_series_states

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)


def _from_results(session, *, op=None, since=None) -> list[series_state.SeriesKey]:  # type: ignore[no-untyped-def]
    """The definition: every distinct series of an ok result, in the list's order."""
    query = select(*(getattr(Result, c) for c in SERIES_COLUMNS)).where(Result.status == "ok").distinct()
    if op is not None:
        query = query.where(Result.op == op)
    if since is not None:
        query = query.where(Result.run_created_at >= since)
    keys = {series_state.SeriesKey(**dict(zip(SERIES_COLUMNS, row, strict=True))) for row in session.execute(query)}
    return sorted(keys, key=lambda k: (k.op, k.impl, k.B, k.T, k.H, k.K, k.V, k.dtype, k.mode, k.machine_kind,
                                       k.software, k.extra_dims))  # fmt: skip


def _store(engine, factory) -> list:  # type: ignore[no-untyped-def]
    """Three runs a day apart; the last alone holds a kda series; a series with failed results only."""
    docs = []
    for i in range(3):
        jobs = [factory.job(impl="torch_chunk", median=1.0 + i), factory.job(impl="triton_chunk", T=512, median=0.5)]
        jobs.append(factory.job(impl="triton_chunk", T=4096, status="incorrect"))
        if i == 2:
            jobs.append(factory.job(op="kda", impl="torch_chunk", dtype="fp32", median=2.0))
        docs.append(factory.document(jobs=jobs, created_at=T0 + dt.timedelta(days=i), commit=f"c{i}" + "0" * 38))
    with session_scope(engine) as s:
        for doc in docs:
            ingest_document(s, doc)
    return docs


def _check(engine) -> list[series_state.SeriesKey]:  # type: ignore[no-untyped-def]
    with session_scope(engine) as s:
        listed = queries.list_series(s)
        assert listed == _from_results(s)
        assert queries.list_series(s, op="kda") == _from_results(s, op="kda")
        since = T0 + dt.timedelta(days=1, hours=12)
        assert queries.list_series(s, since=since) == _from_results(s, since=since)
        assert queries.list_series(s, limit=2) == listed[:2]
        return listed


def test_the_list_is_the_results_series_before_and_after_the_refresh(engine, factory) -> None:  # type: ignore[no-untyped-def]
    docs = _store(engine, factory)
    before = _check(engine)  # nothing refreshed: every series is marked
    assert [k.op for k in before] == ["gdn", "gdn", "kda"]  # the failed-only series is not listed
    with session_scope(engine) as s:
        assert refresh_series_states(s) == 3
    assert _check(engine) == before  # every series from its state, none marked
    with session_scope(engine) as s:
        delete_run(s, run_id=docs[2].run_id)  # kda's only run: its state stays until the refresh, marked
    after = _check(engine)
    assert [k.op for k in after] == ["gdn", "gdn"]
    with session_scope(engine) as s:
        refresh_series_states(s)
    assert _check(engine) == after
