"""Storing result documents: idempotent, and in bulk.

A run is identified by its ``run_id`` and a result by ``(job_id, attempt)``. Ingesting the same document twice
stores nothing the second time; a job that arrives again in another document (a worker's retry that posts a
new run) is stored once, with the run that brought it first. A document whose run is already stored but that
carries new jobs (a worker posting a run piece by piece) adds those jobs to that run.

Results go in with a bulk ``INSERT ... ON CONFLICT DO NOTHING`` per batch, so concurrent uploads of the same
job cannot both store it, then their samples and checks likewise (checks are unique by result and position). On
PostgreSQL every table is written with ``COPY`` (results through a scratch table, see :func:`_copy_jobs`).
"""

from __future__ import annotations

import collections
import datetime as _dt
import hashlib
import json
import operator
import struct
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from deltabench.harness.document import CaseSpec, CheckRecord, JobResult, ResultDocument
from deltabench.harness.document import Environment as EnvironmentDoc
from deltabench.harness.series import series_software
from deltabench.regression.noise import run_level

from .dims import dims_columns, stored_dims
from .models import Check, Environment, Machine, Result, ResultSamples, Run
from .series_state import mark_dirty

__all__ = [
    "environment_fingerprint",
    "ingest_document",
    "ingest_documents",
    "pack_repetitions",
    "pack_samples",
    "store_document",
    "store_documents",
    "unpack_repetitions",
    "unpack_samples",
    "utc",
]

# Rows per INSERT statement: large enough to amortise round trips, small enough for SQLite's variable limit
# (50-odd columns x 500 rows stays under 32766).
_BATCH = 500


def utc(value: _dt.datetime | None) -> _dt.datetime | None:
    """`value` as an aware UTC datetime (naive values are taken as UTC, as SQLite returns them)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=_dt.timezone.utc)
    return value.astimezone(_dt.timezone.utc)


def pack_samples(samples_ms: Sequence[float]) -> bytes:
    """Raw samples as little-endian float64 bytes: exact, 8 bytes each, and fast both ways."""
    return struct.pack(f"<{len(samples_ms)}d", *samples_ms)


def unpack_samples(blob: bytes) -> list[float]:
    """Inverse of :func:`pack_samples`."""
    return list(struct.unpack(f"<{len(blob) // 8}d", blob))


def pack_repetitions(repetitions: Sequence[int]) -> bytes | None:
    """Each sample's repetition index as little-endian int32 bytes; None for a timing of one repetition."""
    return struct.pack(f"<{len(repetitions)}i", *repetitions) if repetitions else None


def unpack_repetitions(blob: bytes | None) -> list[int]:
    """Inverse of :func:`pack_repetitions` (``[]`` for NULL)."""
    return list(struct.unpack(f"<{len(blob) // 4}i", blob)) if blob else []


def environment_fingerprint(env: EnvironmentDoc) -> str:
    """sha256 over every field of the environment, in a canonical JSON form."""
    canonical = json.dumps(env.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _insert_ignore(session: Session, table: Table):  # type: ignore[no-untyped-def]
    """``INSERT ... ON CONFLICT DO NOTHING`` for the session's dialect (SQLite and PostgreSQL both have it)."""
    name = session.get_bind().dialect.name
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:  # pragma: no cover - other databases are not supported
        raise NotImplementedError(f"deltabench's store supports SQLite and PostgreSQL, not {name}")
    return insert(table).on_conflict_do_nothing()


def _get_or_create(session: Session, model: type, where: dict[str, Any], values: dict[str, Any]) -> int:
    """The id of the row of `model` matching `where`, inserting it (race-safe) when absent."""
    query = select(model.id).filter_by(**where)  # type: ignore[attr-defined]
    found = session.scalar(query)
    if found is not None:
        return found
    session.execute(_insert_ignore(session, model.__table__), [{**where, **values}])  # type: ignore[attr-defined]
    return session.scalar(query)  # type: ignore[return-value]


def _environment_id(session: Session, env: EnvironmentDoc) -> int:
    fields = env.model_dump()
    return _get_or_create(session, Environment, {"fingerprint": environment_fingerprint(env)}, fields)


def _machine_id(session: Session, env: EnvironmentDoc, first_seen: _dt.datetime) -> int:
    return _get_or_create(
        session,
        Machine,
        {"host": env.host, "machine_kind": env.machine_kind},
        {"device_name": env.device_name, "device_count": env.device_count, "first_seen": first_seen},
    )


def _run_pk(session: Session, doc: ResultDocument) -> int:
    existing = session.scalar(select(Run.id).where(Run.run_id == doc.run_id))
    if existing is not None:
        return existing
    created_at = utc(doc.created_at)
    values = {
        "schema_version": doc.schema_version,
        "created_at": created_at,
        "ingested_at": _dt.datetime.now(_dt.timezone.utc),
        "suite": doc.suite,
        "git_commit": doc.environment.git_commit,
        "git_dirty": doc.environment.git_dirty,
        "environment_id": _environment_id(session, doc.environment),
        "machine_id": _machine_id(session, doc.environment, created_at),  # type: ignore[arg-type]
        "baselines": dict(doc.baselines),
        "ceilings": dict(doc.ceilings),
        "meta": dict(doc.meta),
    }
    return _get_or_create(session, Run, {"run_id": doc.run_id}, values)


def _run_columns(doc: ResultDocument) -> dict[str, Any]:
    """The results columns copied from the document's run and environment, the same for each of its jobs (once a
    document: the software string alone was a tenth of an ingest's Python time when built per job)."""
    return {
        "run_created_at": utc(doc.created_at),
        "git_commit": doc.environment.git_commit,
        "machine_kind": doc.environment.machine_kind,
        "software": series_software(doc.environment),
    }


def _result_row(job: JobResult, position: int, run_pk: int, run_columns: dict[str, Any]) -> dict[str, Any]:
    """The results row of `job`, its `position` in its document of run `run_pk` (whose :func:`_run_columns` are
    `run_columns`)."""
    case, timing, memory, work = job.case, job.timing, job.memory, job.work
    return {
        "run_pk": run_pk,
        "job_id": job.job_id,
        "attempt": job.attempt,
        "position": position,
        "op": case.op,
        "impl": job.impl,
        **_case_dims_columns(case),
        "dtype": case.dtype,
        "mode": case.mode,
        "regime": case.regime,
        "seed": case.seed,
        "initial_state": case.initial_state,
        **run_columns,
        "backend": job.backend,
        "device": job.device,
        "status": job.status,
        "reason": job.reason,
        "gate_reference": job.gate_reference,
        "notes": job.notes,
        "started_at": utc(job.started_at),
        "finished_at": utc(job.finished_at),
        "clock": timing.clock if timing else None,
        "median_ms": timing.median_ms if timing else None,
        "q1_ms": timing.q1_ms if timing else None,
        "q3_ms": timing.q3_ms if timing else None,
        "mean_ms": timing.mean_ms if timing else None,
        "stdev_ms": timing.stdev_ms if timing else None,
        "sem_rel": timing.sem_rel if timing else None,
        "n_samples": len(timing.samples_ms) if timing else None,
        "warmup": timing.warmup if timing else None,
        "l2_flush": timing.l2_flush if timing else None,
        "compile_s": timing.compile_s if timing else None,
        "stop_reason": timing.stop_reason if timing else None,
        "level_ms": run_level(timing.samples_ms, timing.median_ms, timing.repetitions) if timing else None,
        "peak_bytes": memory.peak_bytes if memory else None,
        "inputs_bytes": memory.inputs_bytes if memory else None,
        "memory_method": memory.method if memory else None,
        "flops": work.flops if work else None,
        "bytes_moved": work.bytes if work else None,
        "tflops": work.tflops if work else None,
        "gbps": work.gbps if work else None,
        "floor_ms": work.floor_ms if work else None,
        "pct_of_floor": work.pct_of_floor if work else None,
    }


# dims_columns(stored_dims(case)) by the case's dims: a suite's few hundred shapes recur in every document, and built
# per job the columns were a tenth of an ingest's Python time. Read-only (rows copy them); emptied when full.
_DIMS_COLUMNS: dict[tuple[Any, ...], dict[str, Any]] = {}
_DIMS_COLUMNS_MAX = 4096


def _case_dims_columns(case: CaseSpec) -> dict[str, Any]:
    """``dims_columns(stored_dims(case))``, built once for each distinct set of dims."""
    extra = tuple(sorted(case.extra_dims.items())) if case.extra_dims else ()
    key = (case.B, case.T, case.H, case.K, case.V, extra, None if case.seqlens is None else len(case.seqlens))
    columns = _DIMS_COLUMNS.get(key)
    if columns is None:
        if len(_DIMS_COLUMNS) >= _DIMS_COLUMNS_MAX:
            _DIMS_COLUMNS.clear()
        columns = _DIMS_COLUMNS[key] = dims_columns(stored_dims(case))
    return columns


def _check_rows(job: JobResult, result_id: int) -> list[dict[str, Any]]:
    return [{"result_id": result_id, "position": i, **record.model_dump()} for i, record in enumerate(job.verification)]


def _store_jobs(session: Session, doc: ResultDocument, run_pk: int) -> int:
    """Insert the document's jobs not stored yet; returns how many were stored."""
    if session.get_bind().dialect.name == "postgresql":  # its INSERT ... RETURNING tells which jobs were new
        return _copy_jobs(session, [(doc, run_pk)])[run_pk]
    by_key = {(job.job_id, job.attempt): job for job in doc.jobs}
    # Skip the ones already stored up front (the common re-upload case) so the database does no wasted work.
    already = _stored_keys(session, by_key)
    pending = [(i, job) for i, job in enumerate(doc.jobs) if (job.job_id, job.attempt) not in already]
    results_table: Table = Result.__table__  # type: ignore[assignment]
    run_columns = _run_columns(doc)
    stored = 0
    for start in range(0, len(pending), _BATCH):
        chunk = pending[start : start + _BATCH]
        rows = [_result_row(job, i, run_pk, run_columns) for i, job in chunk]
        session.execute(_insert_ignore(session, results_table), rows)
        # Only rows of this run are ours: a job that another run stored first is that run's.
        inserted = session.execute(
            select(Result.id, Result.job_id, Result.attempt).where(
                Result.run_pk == run_pk, Result.job_id.in_([job.job_id for _, job in chunk])
            )
        ).all()
        chunk_keys = {(job.job_id, job.attempt) for _, job in chunk}
        ours = {(j, a): result_id for result_id, j, a in inserted if (j, a) in chunk_keys}
        samples, checks = _children(by_key, ours)
        # ON CONFLICT DO NOTHING: two uploads of one document racing each other both reach this point.
        if samples:
            session.execute(_insert_ignore(session, ResultSamples.__table__), samples)  # type: ignore[arg-type]
        for cstart in range(0, len(checks), _BATCH * 4):
            session.execute(_insert_ignore(session, Check.__table__), checks[cstart : cstart + _BATCH * 4])  # type: ignore[arg-type]
        # The regressions page's refresh recomputes the series these results joined (db.series_state).
        mark_dirty(session, [row for row in rows if (row["job_id"], row["attempt"]) in ours])
        stored += len(ours)
    return stored


def _children(by_key: dict[Any, JobResult], ours: dict[Any, int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The raw-samples rows and check rows of the results `ours` (a job's key in `by_key` -> result id) just
    stored."""
    samples: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    for key, result_id in ours.items():
        job = by_key[key]
        if job.timing is not None:
            samples.append(
                {
                    "result_id": result_id,
                    "samples": pack_samples(job.timing.samples_ms),
                    "repetitions": pack_repetitions(job.timing.repetitions),
                }
            )
        checks.extend(_check_rows(job, result_id))
    return samples, checks


# The session's scratch table on PostgreSQL: a document's result rows are copied in, then inserted from it.
_SCRATCH = "deltabench_ingest_results"


def _copy_rows(cursor: Any, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """``COPY table (columns) FROM STDIN`` of `rows` (each a sequence of values, in the order of `columns`)."""
    quoted = ", ".join(f'"{c}"' for c in columns)
    with cursor.copy(f"COPY {table} ({quoted}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


# A check's columns after (result_id, position): the record's fields, in their declared order. The rows are built as
# tuples straight from the records (a dict per record through model_dump cost a twentieth of an ingest's Python).
_CHECK_FIELDS = tuple(CheckRecord.model_fields)
_check_values = operator.attrgetter(*_CHECK_FIELDS)
_WORST = _CHECK_FIELDS.index("worst_index")


def _copy_children(cursor: Any, by_key: dict[Any, JobResult], ours: dict[Any, int]) -> None:
    """PostgreSQL's :func:`_children`: the raw samples and checks of the results `ours` copied in, one ``COPY``
    a table."""
    samples: list[tuple[Any, ...]] = []
    checks: list[tuple[Any, ...]] = []
    for key, result_id in ours.items():
        job = by_key[key]
        if job.timing is not None:
            timing = job.timing
            samples.append((result_id, pack_samples(timing.samples_ms), pack_repetitions(timing.repetitions)))
        for i, record in enumerate(job.verification):
            values = _check_values(record)
            worst = values[_WORST]  # a JSON column: its text, as SQLAlchemy writes it (None is JSON null)
            checks.append(
                (result_id, i, *values[:_WORST], "null" if worst is None else json.dumps(worst), *values[_WORST + 1 :])
            )
    if samples:
        _copy_rows(cursor, "result_samples", ("result_id", "samples", "repetitions"), samples)
    if checks:
        _copy_rows(cursor, "checks", ("result_id", "position", *_CHECK_FIELDS), checks)


def _copy_jobs(session: Session, docs: list[tuple[ResultDocument, int]]) -> collections.Counter[int]:
    """PostgreSQL's path of :func:`_store_jobs`, for the jobs of several documents at once (each with its run's
    key): the rows go in with ``COPY`` (a statement per table, not one per row: per-row statements were most of an
    ingest's time), results through a scratch table so that ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` names
    exactly the rows this transaction stored. Every job is copied: the INSERT skips the ones stored already (a
    re-upload) for less than a query asking first costs, and of a job in two of the documents it keeps the first
    (rows are inserted in the order they were copied). A job that a concurrent upload stored first is not returned,
    so its samples and checks are that upload's to write. Returns how many jobs were stored per run key."""
    stored: collections.Counter[int] = collections.Counter()
    rows = [
        _result_row(job, i, run_pk, run_columns)
        for doc, run_pk, run_columns in ((doc, run_pk, _run_columns(doc)) for doc, run_pk in docs)
        for i, job in enumerate(doc.jobs)
    ]
    if not rows:
        return stored
    columns = ", ".join(f'"{c}"' for c in rows[0])
    cursor = session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
    cursor.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS {_SCRATCH} ON COMMIT DELETE ROWS AS SELECT {columns} FROM results "
        "WITH NO DATA"
    )
    cursor.execute(f"TRUNCATE {_SCRATCH}")  # an earlier ingest of this transaction may have used it
    _copy_rows(cursor, _SCRATCH, list(rows[0]), map(tuple, map(dict.values, rows)))
    cursor.execute(
        f"INSERT INTO results ({columns}) SELECT {columns} FROM {_SCRATCH} ORDER BY ctid ON CONFLICT DO NOTHING "
        "RETURNING id, job_id, attempt, run_pk"
    )
    ours = {(job_id, attempt, run_pk): result_id for result_id, job_id, attempt, run_pk in cursor.fetchall()}
    by_key = {(job.job_id, job.attempt, run_pk): job for doc, run_pk in docs for job in doc.jobs}
    _copy_children(cursor, by_key, ours)
    # The regressions page's refresh recomputes the series these results joined (db.series_state).
    mark_dirty(session, [row for row in rows if (row["job_id"], row["attempt"], row["run_pk"]) in ours])
    stored.update(run_pk for _, _, run_pk in ours)
    return stored


def _stored_keys(session: Session, keys: Iterable[tuple[str, int]]) -> set[tuple[str, int]]:
    job_ids = sorted({job_id for job_id, _ in keys})
    found: set[tuple[str, int]] = set()
    for start in range(0, len(job_ids), _BATCH):
        chunk = job_ids[start : start + _BATCH]
        rows = session.execute(select(Result.job_id, Result.attempt).where(Result.job_id.in_(chunk)))
        found.update((job_id, attempt) for job_id, attempt in rows)
    return found


def ingest_document(session: Session, doc: ResultDocument) -> str:
    """Store `doc` (idempotently, see the module docstring) and return its run id.

    The caller owns the transaction: use it inside ``db.engine.session_scope(engine)``.

    Example::

        with session_scope(get_engine()) as session:
            run_id = ingest_document(session, ResultDocument.from_json(path.read_text()))
    """
    return store_document(session, doc)[0]


def store_document(session: Session, doc: ResultDocument) -> tuple[str, int]:
    """Store `doc` as :func:`ingest_document` does; return its run id and how many of its jobs were new (the
    others were stored already, by an earlier ingest of the same run)."""
    run_pk = _run_pk(session, doc)
    return doc.run_id, _store_jobs(session, doc, run_pk)


def store_documents(session: Session, docs: Sequence[ResultDocument]) -> list[tuple[str, int]]:
    """Store several documents as :func:`store_document` does, in the order given; each one's run id and how many
    of its jobs were new. On PostgreSQL the jobs of all of them go in together (one ``COPY`` per table: per
    document, the statements' own cost was a third of a batch's time)."""
    if session.get_bind().dialect.name != "postgresql":
        return [store_document(session, doc) for doc in docs]
    keyed = [(doc, _run_pk(session, doc)) for doc in docs]
    stored = _copy_jobs(session, keyed)
    out = []
    for doc, run_pk in keyed:  # a run named by two documents counts its new jobs once, at the first
        out.append((doc.run_id, stored.pop(run_pk, 0)))
    return out


def ingest_documents(session: Session, docs: Iterable[ResultDocument]) -> list[str]:
    """Store several documents; the run ids in the order given."""
    return [run_id for run_id, _ in store_documents(session, list(docs))]
