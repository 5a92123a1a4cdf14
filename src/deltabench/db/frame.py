"""Stored results as a pandas DataFrame, for notebooks and exports (``deltabench results --format csv|parquet``).

::

    from deltabench.db import results_frame

    df = results_frame()                                   # every result in $DELTABENCH_DB (or the default file)
    df = results_frame("postgresql+psycopg://...", op="gdn", machine_kind="h200", since="2026-01-01")
    df[df.status == "ok"].pivot_table(index="shape", columns="impl", values="median_ms")

One row per job (a retried job's latest attempt; ``all_attempts=True`` keeps every attempt), in run order then
document order. :data:`COLUMNS` lists the columns: the case, the outcome, the timing summary and raw samples, memory,
work figures, the run's ceilings and the environment it ran in. Times are UTC; a figure a job did not record is
missing (NaN or None), never zero.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, Table, select
from sqlalchemy.orm import Session

from deltabench.harness.errors import BadInput
from deltabench.references.contract import shape_id

from . import queries
from .dims import dims_of
from .engine import get_engine, session_scope
from .ingest import utc
from .models import Environment, Result, Run

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["COLUMNS", "results_frame"]

# (frame column, source column) in frame order; the case first, so a CSV reads like the result tables.
_RESULT_COLUMNS = (
    ("op", Result.op),
    ("impl", Result.impl),
    ("B", Result.B),
    ("T", Result.T),
    ("H", Result.H),
    ("K", Result.K),
    ("V", Result.V),
    ("extra_dims", Result.extra_dims),
    ("dtype", Result.dtype),
    ("mode", Result.mode),
    ("regime", Result.regime),
    ("seed", Result.seed),
    ("initial_state", Result.initial_state),
    ("status", Result.status),
    ("reason", Result.reason),
    ("backend", Result.backend),
    ("device", Result.device),
    ("gate_reference", Result.gate_reference),
    ("clock", Result.clock),
    ("median_ms", Result.median_ms),
    ("q1_ms", Result.q1_ms),
    ("q3_ms", Result.q3_ms),
    ("mean_ms", Result.mean_ms),
    ("stdev_ms", Result.stdev_ms),
    ("sem_rel", Result.sem_rel),
    ("n_samples", Result.n_samples),
    ("warmup", Result.warmup),
    ("l2_flush", Result.l2_flush),
    ("compile_s", Result.compile_s),
    ("stop_reason", Result.stop_reason),
    ("peak_bytes", Result.peak_bytes),
    ("inputs_bytes", Result.inputs_bytes),
    ("memory_method", Result.memory_method),
    ("flops", Result.flops),
    ("bytes", Result.bytes_moved),
    ("tflops", Result.tflops),
    ("gbps", Result.gbps),
    ("floor_ms", Result.floor_ms),
    ("pct_of_floor", Result.pct_of_floor),
    ("run_id", Run.run_id),
    ("job_id", Result.job_id),
    ("attempt", Result.attempt),
    ("run_created_at", Result.run_created_at),
    ("suite", Run.suite),
    ("started_at", Result.started_at),
    ("finished_at", Result.finished_at),
    ("machine_kind", Result.machine_kind),
    ("software", Result.software),
    ("host", Environment.host),
    ("device_name", Environment.device_name),
    ("device_count", Environment.device_count),
    ("platform", Environment.platform),
    ("cpu", Environment.cpu),
    ("python", Environment.python),
    ("driver", Environment.driver),
    ("cuda", Environment.cuda),
    ("torch", Environment.torch),
    ("triton", Environment.triton),
    ("jax", Environment.jax),
    ("deltabench", Environment.deltabench),
    ("git_commit", Result.git_commit),
    ("git_dirty", Environment.git_dirty),
    ("kernel_hash", Environment.kernel_hash),
)
# Columns worked out from the stored ones, and where they go in the frame.
_DERIVED = {
    "shape": "B",  # before B: "B8-T4096-H6-K128-V128", the id the pages and tables use
    "iqr_ms": "mean_ms",
    "samples_ms": "warmup",
    "peak_mib": "inputs_bytes",
    "ceiling_matmul_tflops": "run_id",
    "ceiling_copy_gbps": "run_id",
}
_TIMES = ("run_created_at", "started_at", "finished_at")
_FLOATS = (
    "median_ms",
    "q1_ms",
    "q3_ms",
    "iqr_ms",
    "mean_ms",
    "stdev_ms",
    "sem_rel",
    "compile_s",
    "peak_mib",
    "flops",
    "bytes",
    "tflops",
    "gbps",
    "floor_ms",
    "pct_of_floor",
    "ceiling_matmul_tflops",
    "ceiling_copy_gbps",
)
_INTS = ("n_samples", "warmup", "peak_bytes", "inputs_bytes", "device_count", "seed", "attempt")
_FLAGS = {"l2_flush": "boolean", "initial_state": "bool", "git_dirty": "bool"}


# The frame columns that come from a result's run and its environment, and the two ceilings the run recorded.
_RUN_COLUMNS = tuple((name, column) for name, column in _RESULT_COLUMNS if column.class_ is not Result)
_RUN_COLUMN_NAMES = (*(name for name, _ in _RUN_COLUMNS), "ceiling_matmul_tflops", "ceiling_copy_gbps")


def _run_columns(session: Session, run_pks: list[int]) -> dict[int, tuple[Any, ...]]:
    """Each run's values of :data:`_RUN_COLUMN_NAMES`, by run key."""
    out: dict[int, tuple[Any, ...]] = {}
    query = select(Run.id, Run.ceilings, *(column for _, column in _RUN_COLUMNS)).join(
        Environment, Run.environment_id == Environment.id
    )
    for pk, ceilings, *values in queries.rows_with_ids(session, query, Run.id, run_pks):
        ceilings = ceilings or {}
        out[pk] = (*values, ceilings.get("matmul_tflops"), ceilings.get("copy_gbps"))
    return out


def _columns() -> tuple[str, ...]:
    out: list[str] = []
    for name, _ in _RESULT_COLUMNS:
        out += [derived for derived, before in _DERIVED.items() if before == name]
        out.append(name)
    return tuple(out)


COLUMNS: tuple[str, ...] = _columns()


def _as_list(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _as_time(value: _dt.datetime | _dt.date | str | None, name: str) -> _dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = _dt.datetime.fromisoformat(value)
        except ValueError:
            raise BadInput(f"{name}: not an ISO date or time: {value!r}") from None
    if not isinstance(value, _dt.datetime):
        value = _dt.datetime(value.year, value.month, value.day)
    return utc(value)


def results_frame(
    db: str | Engine | Session | None = None,
    *,
    run: str | Sequence[str] | None = None,
    op: str | Sequence[str] | None = None,
    impl: str | Sequence[str] | None = None,
    machine_kind: str | Sequence[str] | None = None,
    status: str | Sequence[str] | None = None,
    since: _dt.datetime | _dt.date | str | None = None,
    until: _dt.datetime | _dt.date | str | None = None,
    all_attempts: bool = False,
    samples: bool = True,
) -> pd.DataFrame:
    """Stored results as a DataFrame, one row per job, with the columns :data:`COLUMNS` lists.

    Args:
        db: a database URL or SQLite path, an Engine or an open Session; None -> ``$DELTABENCH_DB`` or the default.
        run: run ids, unique prefixes or ``latest``; op, impl, machine_kind, status: one value or several.
        since, until: bounds on the run's creation time (datetimes, dates or ISO strings; naive means UTC).
        all_attempts: keep every attempt of a retried job, not only the latest.
        samples: include ``samples_ms``, each job's raw timing samples (a list; None without timing).

    Raises:
        BadInput: an unknown run, an ambiguous prefix or a malformed time.
    """
    if isinstance(db, Session):
        return _frame(db, run, op, impl, machine_kind, status, since, until, all_attempts, samples)
    engine = db if isinstance(db, Engine) else get_engine(db, create=False)
    with session_scope(engine) as session:
        return _frame(session, run, op, impl, machine_kind, status, since, until, all_attempts, samples)


def _frame(
    session: Session,
    run: str | Sequence[str] | None,
    op: str | Sequence[str] | None,
    impl: str | Sequence[str] | None,
    machine_kind: str | Sequence[str] | None,
    status: str | Sequence[str] | None,
    since: Any,
    until: Any,
    all_attempts: bool,
    samples: bool,
) -> pd.DataFrame:
    import pandas as pd

    # The results' own columns by Core (the ORM's row processing cost a tenth of the call); the columns of each
    # result's run and environment read once a run (a join repeated them, the run's ceilings' JSON decoded, on every
    # row), then spread over the rows.
    results: Table = Result.__table__  # type: ignore[assignment]
    own = [(name, column.property.columns[0]) for name, column in _RESULT_COLUMNS if column.class_ is Result]
    query = select(results.c.id, results.c.run_pk, *(table_column for _, table_column in own))
    runs = _as_list(run)
    if runs is not None:
        run_ids = [queries.resolve_run_id(session, ref=ref) for ref in runs]
        query = query.where(results.c.run_pk.in_(select(Run.id).where(Run.run_id.in_(run_ids))))
    for name, value in (("op", op), ("impl", impl), ("machine_kind", machine_kind), ("status", status)):
        values = _as_list(value)
        if values is not None:
            query = query.where(results.c[name].in_(values))
    if (start := _as_time(since, "since")) is not None:
        query = query.where(results.c.run_created_at >= start)
    if (end := _as_time(until, "until")) is not None:
        query = query.where(results.c.run_created_at <= end)
    query = query.order_by(results.c.run_created_at, results.c.run_pk, results.c.position, results.c.attempt)
    rows = session.execute(query).all()
    frame = pd.DataFrame([row[2:] for row in rows], columns=[name for name, _ in own])
    ids = [row[0] for row in rows]
    run_pks = [row[1] for row in rows]
    of_run = _run_columns(session, sorted(set(run_pks)))
    for i, name in enumerate(_RUN_COLUMN_NAMES):
        frame[name] = [of_run[pk][i] for pk in run_pks]
    shapes: dict[tuple[Any, ...], str] = {}  # a few hundred distinct shapes among the rows: each id built once
    shape_ids = []
    for dims in zip(*(frame[d] for d in (*"BTHKV", "extra_dims")), strict=True):
        shape = shapes.get(dims)
        if shape is None:
            shape = shapes[dims] = shape_id(dims_of(*dims))
        shape_ids.append(shape)
    frame["shape"] = shape_ids
    frame["iqr_ms"] = frame["q3_ms"] - frame["q1_ms"]
    frame["peak_mib"] = frame["peak_bytes"] / 2**20
    if samples:
        found = queries.result_samples(session, result_ids=ids)
        frame["samples_ms"] = [found.get(i) for i in ids]
    else:
        frame["samples_ms"] = None
    for name in _TIMES:
        frame[name] = pd.to_datetime(frame[name], utc=True)
    # Missing figures stay missing whatever the mix of rows: floats as NaN, counts and flags as pandas' nullable types.
    frame = frame.astype({name: "float64" for name in _FLOATS} | {name: "Int64" for name in _INTS} | _FLAGS)
    if not all_attempts:
        # The latest attempt of each job, where its first attempt stood.
        first_row = frame.index.to_series().groupby(frame["job_id"]).min()
        latest = frame.sort_values("attempt", kind="stable").drop_duplicates(subset=["job_id"], keep="last")
        frame = latest.iloc[latest["job_id"].map(first_row).argsort(kind="stable")]
    return frame[list(COLUMNS)].reset_index(drop=True)
