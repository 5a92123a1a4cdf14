"""The regressions page's maintained tables (migration 0008): each series' newest point and latest change point
(``series_state``), and the series whose points changed since (``series_dirty``).

Ingest and run deletion append the series they touch to ``series_dirty`` in their own transaction: insert only, so
concurrent writers never wait on each other's rows. Every series whose state is out of date has a mark (migration
0009 marks every series of a store whose table was never built). A refresh takes a bounded number of marked series
(their marks deleted in its transaction), recomputes the change points of just those series and saves them in the
same transaction; a mark committed after its ``DELETE`` is taken by the next refresh. One refresh runs at a time:
SQLite's write lock, taken by the ``DELETE``, serialises them, and on PostgreSQL :func:`lock_refresh` (a
transaction-level advisory lock), so an older computation never overwrites a newer one. What the change point is,
and how it is found, is the web layer's (``web.services``): this module stores it as JSON. What identifies a series
in the store (:class:`SeriesKey`) is defined here, below the queries that read series and the ingest that marks
them.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Table, and_, delete, exists, func, insert, select, text, tuple_
from sqlalchemy.orm import Session

from deltabench.harness.series import SeriesKey as HarnessSeriesKey
from deltabench.harness.series import parse_software
from deltabench.references.contract import shape_id

from .dims import dims_of
from .models import SERIES_COLUMNS, Result, SeriesDirty, SeriesState

__all__ = [
    "SeriesKey",
    "drop_states",
    "listed",
    "lock_refresh",
    "mark_all_dirty",
    "mark_dirty",
    "mark_run_dirty",
    "pending_count",
    "save_states",
    "states",
    "take_dirty",
]


@dataclasses.dataclass(frozen=True)
class SeriesKey:
    """What identifies a series: one (op, impl, shape, dtype, mode) on one machine class and major software.

    `software` is ``harness.series.series_software`` of the runs' environment (``"python=3.11,torch=2.13"``).
    """

    op: str
    impl: str
    B: int
    T: int
    H: int
    K: int
    V: int
    dtype: str
    mode: str
    machine_kind: str
    software: str = ""
    extra_dims: str = ""  # the op's other dims as stored (db/dims.py); B..V of a dim it lacks are 0

    @property
    def shape(self) -> dict[str, int]:
        """The dims as a dict (every dim of the op, any names)."""
        return dims_of(self.B, self.T, self.H, self.K, self.V, self.extra_dims)

    @property
    def shape_id(self) -> str:
        """``B2-T256-H4-K64-V64`` (references/contract.shape_id)."""
        return shape_id(self.shape)

    def to_harness(self) -> HarnessSeriesKey:
        """The same series as ``harness.series.SeriesKey`` (the definition's source of truth)."""
        software = parse_software(self.software)
        return HarnessSeriesKey(self.op, self.impl, self.shape_id, self.dtype, self.mode, self.machine_kind, software)

    @property
    def key(self) -> str:
        """``gdn/torch_chunk/B2-T256-H4-K64-V64/fp32/fwd@cpu[python=3.11,torch=2.13]``: what annotations refer to
        (``harness.series.SeriesKey.key``)."""
        return self.to_harness().key

    @property
    def legacy_key(self) -> str:
        """The key annotations were stored under before series carried their software
        (``gdn/torch_chunk/B2-T256-H4-K64-V64/fp32/fwd/cpu``)."""
        return f"{self.op}/{self.impl}/{self.shape_id}/{self.dtype}/{self.mode}/{self.machine_kind}"


def _key(row: Mapping[str, Any] | Any) -> SeriesKey:
    get = row.get if isinstance(row, Mapping) else lambda c: getattr(row, c)
    return SeriesKey(
        get("op"),
        get("impl"),
        get("B"),
        get("T"),
        get("H"),
        get("K"),
        get("V"),
        get("dtype"),
        get("mode"),
        get("machine_kind"),
        get("software"),
        get("extra_dims"),
    )


def mark_dirty(session: Session, result_rows: Iterable[Mapping[str, Any]]) -> None:
    """Mark the series of these result rows (``results`` columns; only ``ok`` ones are in a series) as changed."""
    key = operator.itemgetter(*SERIES_COLUMNS)
    seen = sorted({key(row) for row in result_rows if row.get("status") == "ok"})
    if not seen:
        return
    if session.get_bind().dialect.name == "postgresql":  # one COPY: an executemany is a statement per row there
        cursor = session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
        columns = ", ".join(f'"{c}"' for c in SERIES_COLUMNS)
        with cursor.copy(f"COPY series_dirty ({columns}) FROM STDIN") as copy:
            for key in seen:
                copy.write_row(key)
        return
    session.execute(insert(SeriesDirty), [dict(zip(SERIES_COLUMNS, key, strict=True)) for key in seen])


def mark_run_dirty(session: Session, run_pk: int) -> None:
    """Mark the series of the stored run `run_pk`'s ok results as changed (before the run is deleted)."""
    columns = [getattr(Result, c) for c in SERIES_COLUMNS]
    rows = select(*columns).where(Result.run_pk == run_pk, Result.status == "ok").distinct()
    session.execute(insert(SeriesDirty).from_select(list(SERIES_COLUMNS), rows))


def mark_all_dirty(session: Session) -> None:
    """Mark every series of the store (each with an ``ok`` result) as changed: the next refreshes rebuild them all."""
    columns = [getattr(Result, c) for c in SERIES_COLUMNS]
    rows = select(*columns).where(Result.status == "ok").distinct()
    session.execute(insert(SeriesDirty).from_select(list(SERIES_COLUMNS), rows))


# How a series list is sorted: its fields, the dims before dtype and mode, the machine class and software last.
_LIST_ORDER = ("op", "impl", "B", "T", "H", "K", "V", "dtype", "mode", "machine_kind", "software", "extra_dims")


# An arbitrary constant key for pg_try_advisory_xact_lock: one refresh of series_state at a time on PostgreSQL.
_PG_REFRESH_LOCK = 0x5E1E57A7


def lock_refresh(session: Session) -> bool:
    """Take the store's refresh lock for this transaction; False when another refresh holds it (PostgreSQL only:
    on SQLite the refresh's first write takes the database's write lock, which serialises refreshes already)."""
    if session.get_bind().dialect.name != "postgresql":
        return True
    return bool(session.scalar(text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": _PG_REFRESH_LOCK}))


def take_dirty(session: Session, *, limit: int | None = None) -> list[SeriesKey]:
    """Up to `limit` series (all when None) marked changed since their last refresh, each once; every mark of
    those series is removed (in this transaction)."""
    table: Table = SeriesDirty.__table__  # type: ignore[assignment]
    columns = [table.c[c] for c in SERIES_COLUMNS]
    taking = delete(table)
    if limit is not None:  # one statement: on SQLite it takes the write lock before reading which series
        taking = taking.where(tuple_(*columns).in_(select(*columns).distinct().limit(limit)))
    rows = session.execute(taking.returning(*columns)).all()
    return sorted({_key(row) for row in rows}, key=lambda k: (k.key, k.extra_dims))


def pending_count(session: Session) -> int:
    """How many series are marked changed and wait for a refresh."""
    table: Table = SeriesDirty.__table__  # type: ignore[assignment]
    marked = select(*(table.c[c] for c in SERIES_COLUMNS)).distinct().subquery()
    return int(session.scalar(select(func.count()).select_from(marked)) or 0)


def _upsert(session: Session, table: Table):  # type: ignore[no-untyped-def]
    name = session.get_bind().dialect.name
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    stmt = dialect_insert(table)
    keep = ("series_key",)
    return stmt.on_conflict_do_update(
        index_elements=list(keep), set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keep}
    )


def save_states(session: Session, found: Sequence[tuple[SeriesKey, _dt.datetime, dict[str, Any] | None, int]]) -> None:
    """Store each series' (key, newest point's time, latest change point as JSON or None, skipped points)."""
    if not found:
        return
    now = _dt.datetime.now(_dt.timezone.utc)
    rows = [
        {
            "series_key": key.key,
            **{c: getattr(key, c) for c in SERIES_COLUMNS},
            "last_point_at": last,
            "change_point": change_point,
            "skipped": skipped,
            "updated_at": now,
        }
        for key, last, change_point, skipped in sorted(found, key=lambda f: f[0].key)  # one lock order
    ]
    session.execute(_upsert(session, SeriesState.__table__), rows)  # type: ignore[arg-type]


def drop_states(session: Session, keys: Sequence[SeriesKey]) -> None:
    """Forget series that no longer have a point."""
    if keys:
        session.execute(delete(SeriesState).where(SeriesState.series_key.in_([k.key for k in keys])))


def states(
    session: Session,
    *,
    since: _dt.datetime | None = None,
    op: str | None = None,
    machine_kind: str | None = None,
    limit: int = 10_000,
) -> list[tuple[SeriesKey, SeriesState]]:
    """The stored series with a point since `since` (optionally of one op or machine class), sorted by
    :data:`_LIST_ORDER` as :func:`listed` sorts them, at most `limit`."""
    query = select(SeriesState)
    if since is not None:
        query = query.where(SeriesState.last_point_at >= since)
    if op is not None:
        query = query.where(SeriesState.op == op)
    if machine_kind is not None:
        query = query.where(SeriesState.machine_kind == machine_kind)
    order = [getattr(SeriesState, c) for c in _LIST_ORDER]
    return [(_key(row), row) for row in session.scalars(query.order_by(*order).limit(limit))]


def listed(
    session: Session,
    *,
    op: str | None = None,
    impl: str | None = None,
    machine_kind: str | None = None,
    since: _dt.datetime | None = None,
    limit: int | None = 10_000,
) -> list[SeriesKey]:
    """The series with at least one ok result (with one since `since`, when given), optionally of one op, impl and
    machine class, sorted by :data:`_LIST_ORDER`, at most `limit` (None: all).

    Read from the maintained tables, not from the results: a distinct over every ok result took 5-8 s at 10M results
    on PostgreSQL. Exact whatever the refresh has caught up with: a series without a mark is as its state says, and
    a marked one (new, grown or emptied since its state) is looked up in the results (one probe of the series index
    each).
    """
    state: Table = SeriesState.__table__  # type: ignore[assignment]
    dirty: Table = SeriesDirty.__table__  # type: ignore[assignment]
    marked_columns = [dirty.c[c] for c in SERIES_COLUMNS]
    filters = {"op": op, "impl": impl, "machine_kind": machine_kind}
    marked_query = select(*marked_columns).distinct()
    stated_query = select(*(state.c[c] for c in SERIES_COLUMNS))
    for name, value in filters.items():
        if value is not None:
            marked_query = marked_query.where(dirty.c[name] == value)
            stated_query = stated_query.where(state.c[name] == value)
    if since is not None:
        stated_query = stated_query.where(state.c.last_point_at >= since)
    marked = {_key(row) for row in session.execute(marked_query)}
    keys = {_key(row) for row in session.execute(stated_query)} - marked
    if marked:
        results: Table = Result.__table__  # type: ignore[assignment]
        same_series = [results.c[c] == dirty.c[c] for c in SERIES_COLUMNS]
        point = and_(*same_series, results.c.status == "ok")
        if since is not None:
            point = and_(point, results.c.run_created_at >= since)
        keys |= {_key(row) for row in session.execute(marked_query.where(exists().where(point)))}
    order = operator.attrgetter(*_LIST_ORDER)
    return sorted(keys, key=order)[:limit]  # [:None] is all
