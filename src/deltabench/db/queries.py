"""Every select deltabench runs against its store, as keyword-only functions.

The CLI, the web routes and the regression tools call these; none of them builds a query itself. Functions
return ORM rows (:class:`~deltabench.db.models.Result`, :class:`~deltabench.db.models.Run`) or small frozen
dataclasses defined here, never open cursors.

A *series* is harness/series.py's: one (op, impl, shape, dtype, mode) on one ``machine_kind`` with the same
major.minor software versions (``results.software``, set at ingest); its key string (:meth:`SeriesKey.key`, the
same string as ``harness.series.SeriesKey.key``) is what annotations refer to.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import Integer, Row, Select, and_, any_, bindparam, func, literal, or_, select, tuple_
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from deltabench.harness.document import (
    HARDWARE_CHECKS,
    CaseSpec,
    CheckRecord,
    JobResult,
    MemoryStats,
    ResultDocument,
    TimingStats,
    WorkFigures,
    known_ops,
    timing_problem,
    unknown_op_reason,
)
from deltabench.harness.document import Environment as EnvironmentDoc
from deltabench.harness.errors import BadInput, UnknownOp
from deltabench.references.contract import INDEXED_DIMS, order_dims, parse_dims

from . import series_state
from .dims import PACKED_DIM, case_dim_fields, dims_columns
from .ingest import unpack_repetitions, unpack_samples, utc
from .models import Annotation, ApiToken, Check, Environment, Machine, QueuedJob, Result, ResultSamples, Run
from .series_state import SeriesKey

__all__ = [
    "SKIPPED_META",
    "ComparedPair",
    "ComparisonInput",
    "RunSummary",
    "SeriesHistory",
    "SeriesKey",
    "SeriesPoint",
    "WorkerSummary",
    "compare_impls",
    "compare_runs",
    "count_queued_jobs",
    "count_runs",
    "find_results",
    "get_annotation",
    "get_api_token",
    "get_queued_job",
    "get_run",
    "latest_run_for_commit",
    "latest_run_id",
    "list_annotations",
    "list_api_tokens",
    "list_machines",
    "list_queued_jobs",
    "list_runs",
    "list_series",
    "list_workers",
    "load_comparison_input",
    "load_run_document",
    "parse_shape_filter",
    "resolve_run_id",
    "result_checks",
    "result_sample_sets",
    "result_samples",
    "rows_with_ids",
    "run_ids_by_pk",
    "run_results",
    "series_dims",
    "series_history",
    "series_key",
    "series_software_now",
]

# The columns that say "same problem" when two results are compared.
_CASE_COLUMNS = ("op", *INDEXED_DIMS, "extra_dims", "dtype", "mode")


# ---------------------------------------------------------------------------------------------------- types


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """One row of the runs list."""

    run_id: str
    created_at: _dt.datetime
    suite: str
    git_commit: str | None
    git_dirty: bool
    host: str
    machine_kind: str
    device_name: str
    n_results: int
    status_counts: dict[str, int]
    complete: bool = True  # False for a run cut short (its document's meta.complete is false)


@dataclasses.dataclass(frozen=True)
class SeriesPoint:
    """One result in a series' history, with the run and software it came from."""

    result_id: int
    run_id: str
    created_at: _dt.datetime
    git_commit: str | None
    status: str
    median_ms: float | None
    q1_ms: float | None
    q3_ms: float | None
    mean_ms: float | None
    sem_rel: float | None
    clock: str | None
    host: str
    torch: str | None
    triton: str | None
    jax: str | None
    cuda: str | None
    samples_ms: list[float] | None = None


# The run document's meta key that counts the stored timings load_run_document left out as unusable.
SKIPPED_META = "skipped_bad_points"


class SeriesHistory(list[SeriesPoint]):
    """A series' points (a list), and how many stored points were skipped as unusable (``skipped``): a timing that
    is not finite and positive, stored by a version that did not validate it (see ``document.timing_problem``)."""

    skipped: int = 0


@dataclasses.dataclass(frozen=True)
class ComparedPair:
    """A case found in base and/or head (a missing side is None)."""

    key: tuple[Any, ...]
    base: Result | None
    head: Result | None


# ------------------------------------------------------------------------------------------------- helpers


def parse_shape_filter(shape: str | Mapping[str, int] | None) -> dict[str, int]:
    """Dims to filter on from ``"B8-T4096-H6-K128-V128"``, ``"B=8,T=4096"`` or a dict (any subset of an op's dims)."""
    if shape is None:
        return {}
    if isinstance(shape, Mapping):
        dims = {str(k).upper(): int(v) for k, v in shape.items()}
    else:
        try:
            dims = parse_dims(shape)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    known = _known_dims()
    unknown = [d for d in dims if d not in known]
    if unknown:
        raise BadInput(
            f"unknown dimension(s) {', '.join(unknown)} in shape {shape!r}: dimensions are {', '.join(known)}"
        )
    return dims


def _known_dims() -> tuple[str, ...]:
    """Every dim of the ops registered in this process (B, T, H, K, V first) and the packed count ``N``."""
    from deltabench.harness.ops import OPS, load_entry_point_ops

    load_entry_point_ops()
    every = [*INDEXED_DIMS, *(d for c in OPS.values() for d in c.dims), PACKED_DIM]
    return tuple(order_dims(dict.fromkeys(every, 1)))


def _shape_clauses(shape: str | Mapping[str, int] | None) -> list[Any]:
    """Clauses matching results whose dims include `shape`'s (an extra dim is matched inside the stored JSON)."""
    clauses: list[Any] = []
    for d, v in parse_shape_filter(shape).items():
        if d in INDEXED_DIMS:
            clauses.append(getattr(Result, d) == v)
        else:
            entry = f'"{d}":{int(v)}'
            clauses.append(or_(Result.extra_dims.contains(entry + ","), Result.extra_dims.contains(entry + "}")))
    return clauses


def _one_or_many(column: Any, value: str | Sequence[str] | None) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [column == value]
    return [column.in_(list(value))]


# ------------------------------------------------------------------------------------------------------ runs


def latest_run_id(session: Session) -> str | None:
    """The run id of the most recently created run, or None for an empty store."""
    return session.scalar(select(Run.run_id).order_by(Run.created_at.desc(), Run.id.desc()).limit(1))


def resolve_run_id(session: Session, *, ref: str | None) -> str:
    """A full run id from `ref`: None or ``latest`` -> the newest run; else an exact id or a unique prefix.

    Raises:
        BadInput: no run matches, or a prefix matches several.
    """
    if ref is None or ref == "latest":
        found = latest_run_id(session)
        if found is None:
            raise BadInput("no runs are stored in this database")
        return found
    if session.scalar(select(Run.run_id).where(Run.run_id == ref)) is not None:
        return ref
    escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    matches = session.scalars(select(Run.run_id).where(Run.run_id.like(f"{escaped}%", escape="\\")).limit(3)).all()
    if not matches:
        raise BadInput(f"no run {ref!r} in this database")
    if len(matches) > 1:
        raise BadInput(f"run id prefix {ref!r} is ambiguous ({', '.join(matches[:2])}, ...)")
    return matches[0]


def get_run(session: Session, *, run_id: str) -> Run | None:
    """The run row (with its environment and machine loaded), or None."""
    return session.scalar(select(Run).where(Run.run_id == run_id))


def _runs_query(
    *columns: Any,
    suite: str | None,
    machine_kind: str | None,
    commit: str | None,
    since: _dt.datetime | None,
    until: _dt.datetime | None,
) -> Select[Any]:
    """Runs (or `columns` of runs and their machines, when given) matching the filters."""
    query = select(*(columns or (Run,))).join(Machine, Run.machine_id == Machine.id)
    if suite is not None:
        query = query.where(Run.suite == suite)
    if machine_kind is not None:
        query = query.where(Machine.machine_kind == machine_kind)
    if commit is not None:
        query = query.where(Run.git_commit.startswith(commit, autoescape=True))
    if since is not None:
        query = query.where(Run.created_at >= utc(since))
    if until is not None:
        query = query.where(Run.created_at <= utc(until))
    return query


def list_runs(
    session: Session,
    *,
    limit: int = 50,
    offset: int = 0,
    suite: str | None = None,
    machine_kind: str | None = None,
    commit: str | None = None,
    since: _dt.datetime | None = None,
    until: _dt.datetime | None = None,
    before: str | None = None,
) -> list[RunSummary]:
    """Runs, newest first, with their machine and a count of results per status.

    `commit` is a prefix of the git commit; `since`/`until` bound the creation time. `before` (a run id, the last of
    the previous page) starts the page after that run: keyset pagination, as fast on the last page as on the first
    (an `offset` reads and skips every row before the page). An unknown `before` gives an empty page.
    """
    # The columns shown, as tuples: Run entities would also load each run's environment (a joined eager load, with
    # JSON columns to decode) that the list never shows; the runs and comparison pages pay for it on every view.
    columns = (Run.id, Run.run_id, Run.created_at, Run.suite, Run.git_commit, Run.git_dirty, Run.meta)
    query = _runs_query(
        *columns,
        Machine.host,
        Machine.machine_kind,
        Machine.device_name,
        suite=suite,
        machine_kind=machine_kind,
        commit=commit,
        since=since,
        until=until,
    )
    if before is not None:
        query = _after(session, query, Run.created_at, Run.id, Run.run_id, before)
        if query is None:
            return []
    runs = session.execute(query.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit).offset(offset)).all()
    counts: dict[int, dict[str, int]] = {run.id: {} for run in runs}
    if runs:
        rows = session.execute(
            select(Result.run_pk, Result.status, func.count())
            .where(Result.run_pk.in_(list(counts)))
            .group_by(Result.run_pk, Result.status)
        )
        for run_pk, status, n in rows:
            counts[run_pk][status] = n
    return [
        RunSummary(
            run_id=run.run_id,
            created_at=utc(run.created_at),  # type: ignore[arg-type]
            suite=run.suite,
            git_commit=run.git_commit,
            git_dirty=run.git_dirty,
            host=run.host,
            machine_kind=run.machine_kind,
            device_name=run.device_name,
            n_results=sum(counts[run.id].values()),
            status_counts=counts[run.id],
            complete=(run.meta or {}).get("complete", True) is not False,
        )
        for run in runs
    ]


def count_runs(
    session: Session,
    *,
    suite: str | None = None,
    machine_kind: str | None = None,
    commit: str | None = None,
    since: _dt.datetime | None = None,
    until: _dt.datetime | None = None,
) -> int:
    """How many runs :func:`list_runs` would page through with the same filters."""
    query = _runs_query(suite=suite, machine_kind=machine_kind, commit=commit, since=since, until=until)
    return session.scalar(select(func.count()).select_from(query.subquery())) or 0


def latest_run_for_commit(
    session: Session, *, commit_prefix: str, machine_kind: str | None = None, suite: str | None = None
) -> str | None:
    """The newest run stored for a commit (given by a prefix of its hash), optionally on one machine class."""
    if not commit_prefix:
        raise BadInput("an empty commit prefix matches every run")
    query = _runs_query(suite=suite, machine_kind=machine_kind, commit=commit_prefix, since=None, until=None)
    run = session.scalars(query.order_by(Run.created_at.desc(), Run.id.desc()).limit(1)).first()
    return run.run_id if run else None


def list_machines(session: Session) -> list[Machine]:
    """Every machine, grouped by machine kind."""
    return list(session.scalars(select(Machine).order_by(Machine.machine_kind, Machine.host)))


# --------------------------------------------------------------------------------------------------- results


def run_results(session: Session, *, run_id: str, op: str | None = None) -> list[Result]:
    """The results of one run in document order (optionally of one op)."""
    query = select(Result).join(Run, Result.run_pk == Run.id).where(Run.run_id == run_id)
    if op is not None:
        query = query.where(Result.op == op)
    return list(session.scalars(query.order_by(Result.position, Result.id)))


def find_results(
    session: Session,
    *,
    run_id: str | None = None,
    op: str | None = None,
    impl: str | Sequence[str] | None = None,
    shape: str | Mapping[str, int] | None = None,
    dtype: str | None = None,
    mode: str | None = None,
    machine_kind: str | None = None,
    status: str | Sequence[str] | None = None,
    commits: Sequence[str] | None = None,
    commit_range: tuple[str, str] | None = None,
    since: _dt.datetime | None = None,
    until: _dt.datetime | None = None,
    limit: int = 1000,
    offset: int = 0,
    before: int | None = None,
) -> list[Result]:
    """Results matching every filter given, newest first.

    `before` (a result id, the last of the previous page) starts the page after that result: keyset pagination
    (see :func:`list_runs`). An unknown `before` gives an empty page.

    Args:
        shape: any subset of the dims (see :func:`parse_shape_filter`).
        commits: exact commit hashes, e.g. the output of ``git rev-list BASE..HEAD``.
        commit_range: ``(from_prefix, to_prefix)``: results stored from the first run of the first commit to
            the last run of the second one (the store's own notion of order: time). Raises BadInput when either
            commit has no run.
    """
    clauses: list[Any] = [*_shape_clauses(shape)]
    if run_id is not None:
        run_pk = session.scalar(select(Run.id).where(Run.run_id == run_id))
        if run_pk is None:
            return []
        clauses.append(Result.run_pk == run_pk)
    clauses += _one_or_many(Result.impl, impl) + _one_or_many(Result.status, status)
    for column, value in ((Result.op, op), (Result.dtype, dtype), (Result.mode, mode)):
        if value is not None:
            clauses.append(column == value)
    if machine_kind is not None:
        clauses.append(Result.machine_kind == machine_kind)
    if commits is not None:
        clauses.append(Result.git_commit.in_(list(commits)))
    if commit_range is not None:
        start, end = _commit_time_bounds(session, commit_range)
        clauses += [Result.run_created_at >= start, Result.run_created_at <= end]
    if since is not None:
        clauses.append(Result.run_created_at >= utc(since))
    if until is not None:
        clauses.append(Result.run_created_at <= utc(until))
    query = select(Result).where(*clauses)
    if before is not None:
        query = _after(session, query, Result.run_created_at, Result.id, Result.id, before)
        if query is None:
            return []
    query = query.order_by(Result.run_created_at.desc(), Result.id.desc()).limit(limit).offset(offset)
    return list(session.scalars(query))


def _commit_time_bounds(session: Session, commit_range: tuple[str, str]) -> tuple[_dt.datetime, _dt.datetime]:
    first, last = commit_range
    start = session.scalar(select(func.min(Run.created_at)).where(Run.git_commit.startswith(first, autoescape=True)))
    end = session.scalar(select(func.max(Run.created_at)).where(Run.git_commit.startswith(last, autoescape=True)))
    if start is None or end is None:
        missing = first if start is None else last
        raise BadInput(f"no run is stored for commit {missing!r}")
    return start, end


def rows_with_ids(session: Session, query: Select[Any], column: Any, ids: Sequence[int]) -> Iterator[Row[Any]]:
    """The rows of `query` whose integer `column` is one of `ids`: on PostgreSQL one statement with the ids as one
    array parameter (a list of ~900 bound values a statement was a tenth of a long frame's time, parsed by the
    driver), elsewhere batches within SQLite's bound-parameter limit (an ordered `query` is ordered per batch)."""
    ids = list(ids)
    if session.get_bind().dialect.name == "postgresql":
        yield from session.execute(query.where(column == any_(bindparam("ids", ids, type_=ARRAY(Integer)))))
        return
    for start in range(0, len(ids), 900):
        yield from session.execute(query.where(column.in_(ids[start : start + 900])))


def _after(
    session: Session, query: Select[Any], time: Any, key: Any, cursor_column: Any, cursor: Any
) -> Select[Any] | None:
    """Keyset paging of a list ordered newest first by (`time`, `key`): `query` narrowed to the rows after the one
    whose `cursor_column` is `cursor` (the previous page's last), or None when no row is (an empty page)."""
    found = session.execute(select(time, key).where(cursor_column == cursor)).first()
    return None if found is None else query.where(tuple_(time, key) < tuple_(*found))


def result_samples(session: Session, *, result_ids: Sequence[int]) -> dict[int, list[float]]:
    """Raw timing samples (ms) per result id; results without timing are absent."""
    samples = ResultSamples.__table__.c
    query = select(samples.result_id, samples.samples)
    rows = rows_with_ids(session, query, samples.result_id, result_ids)
    return {result_id: unpack_samples(blob) for result_id, blob in rows}


class SampleSet(NamedTuple):
    """A result's raw samples (ms) and each sample's repetition (``[]``: one repetition)."""

    samples_ms: list[float]
    repetitions: list[int]


def result_sample_sets(session: Session, *, result_ids: Sequence[int]) -> dict[int, SampleSet]:
    """Raw timing samples with their repetitions per result id; results without timing are absent."""
    samples = ResultSamples.__table__.c
    query = select(samples.result_id, samples.samples, samples.repetitions)
    return {
        result_id: SampleSet(unpack_samples(blob), unpack_repetitions(reps))
        for result_id, blob, reps in rows_with_ids(session, query, samples.result_id, result_ids)
    }


def result_checks(session: Session, *, result_ids: Sequence[int]) -> dict[int, list[CheckRecord]]:
    """Verification records per result id, in their document order (results without any are absent)."""
    out: dict[int, list[CheckRecord]] = {}
    query = select(Check).order_by(Check.result_id, Check.position)
    for (row,) in rows_with_ids(session, query, Check.result_id, result_ids):
        out.setdefault(row.result_id, []).append(_check_record(row))
    return out


def _check_record(row: Any) -> CheckRecord:
    # model_construct: what is stored was validated when it was ingested; validating again costs the run page
    # most of its time.
    return CheckRecord.model_construct(
        check=row.check,
        metric=row.metric,
        value=row.value,
        threshold=row.threshold,
        passed=row.passed,
        gating=row.gating,
        worst_index=row.worst_index,
        seed=row.seed,
        regime=row.regime,
        initial_state=row.initial_state,
        reference=row.reference,
        detail=row.detail,
    )


# ------------------------------------------------------------------------------------------------- documents


def _environment_doc(env: Any) -> EnvironmentDoc:
    # `env`: an Environment row, ORM or Core (the same attribute names).
    return EnvironmentDoc(
        host=env.host,
        machine_kind=env.machine_kind,
        device_name=env.device_name,
        device_count=env.device_count,
        platform=env.platform,
        cpu=env.cpu,
        python=env.python,
        driver=env.driver,
        cuda=env.cuda,
        torch=env.torch,
        triton=env.triton,
        jax=env.jax,
        deltabench=env.deltabench,
        git_commit=env.git_commit,
        git_dirty=env.git_dirty,
        kernel_hash=env.kernel_hash,
        extra=dict(env.extra or {}),
    )


def _job_result(row: Any, samples: SampleSet | None, checks: list[CheckRecord], run: Run) -> JobResult:
    timing = None
    if row.median_ms is not None:
        timing = TimingStats.model_construct(
            clock=row.clock,  # type: ignore[arg-type]
            samples_ms=samples.samples_ms if samples else [],
            repetitions=samples.repetitions if samples else [],
            median_ms=row.median_ms,
            q1_ms=row.q1_ms,  # type: ignore[arg-type]
            q3_ms=row.q3_ms,  # type: ignore[arg-type]
            mean_ms=row.mean_ms,  # type: ignore[arg-type]
            stdev_ms=row.stdev_ms,  # type: ignore[arg-type]
            sem_rel=row.sem_rel,  # type: ignore[arg-type]
            warmup=row.warmup or 0,
            l2_flush=bool(row.l2_flush),
            compile_s=row.compile_s,
            stop_reason=row.stop_reason or "",
        )
    memory = None
    if row.peak_bytes is not None:
        memory = MemoryStats.model_construct(
            peak_bytes=row.peak_bytes, inputs_bytes=row.inputs_bytes or 0, method=row.memory_method or ""
        )
    work = None
    if row.flops is not None:
        work = WorkFigures.model_construct(
            flops=row.flops,
            bytes=row.bytes_moved or 0.0,
            tflops=row.tflops,
            gbps=row.gbps,
            floor_ms=row.floor_ms,
            pct_of_floor=row.pct_of_floor,
        )
    return JobResult.model_construct(
        job_id=row.job_id,
        attempt=row.attempt,
        case=CaseSpec.model_construct(
            op=row.op,
            **case_dim_fields(row.B, row.T, row.H, row.K, row.V, row.extra_dims),
            dtype=row.dtype,  # type: ignore[arg-type]
            mode=row.mode,  # type: ignore[arg-type]
            regime=row.regime,  # type: ignore[arg-type]
            seed=row.seed,
            initial_state=row.initial_state,
        ),
        impl=row.impl,
        backend=row.backend,
        device=row.device,
        status=row.status,  # type: ignore[arg-type]
        reason=row.reason,
        gate_reference=row.gate_reference,
        verification=checks,
        timing=timing,
        memory=memory,
        work=work,
        notes=row.notes,
        started_at=utc(row.started_at) or utc(run.created_at),  # type: ignore[arg-type]
        finished_at=utc(row.finished_at),
    )


CHECK_SCOPES = ("all", "failed_jobs", "none")


def _run_children(
    session: Session, run_pk: int, checks_scope: str = "all"
) -> tuple[list[Any], dict[int, SampleSet], dict[int, list[CheckRecord]]]:
    """A run's result rows (Core rows: several times cheaper than ORM objects), samples and checks.

    `checks_scope` bounds the verification records loaded: ``all``; ``failed_jobs`` (only those of jobs whose
    status is not ``ok``, and the GPU state of jobs on an accelerator, ``HARDWARE_CHECKS``: what a run page shows,
    without reading the ~100 passing records of every good job); ``none``.
    """
    results_table, checks_table = Result.__table__, Check.__table__
    rows = session.execute(
        select(results_table).where(results_table.c.run_pk == run_pk).order_by(Result.position, Result.id)
    ).all()
    samples = {
        result_id: SampleSet(unpack_samples(blob), unpack_repetitions(reps))
        for result_id, blob, reps in session.execute(
            select(ResultSamples.result_id, ResultSamples.samples, ResultSamples.repetitions)
            .join(Result, Result.id == ResultSamples.result_id)
            .where(Result.run_pk == run_pk)
        )
    }
    checks: dict[int, list[CheckRecord]] = {}
    if checks_scope not in CHECK_SCOPES:
        raise ValueError(f"checks_scope must be one of {', '.join(CHECK_SCOPES)}, not {checks_scope!r}")
    if checks_scope == "none":
        return rows, samples, checks
    query = (
        select(checks_table)
        .join(results_table, results_table.c.id == checks_table.c.result_id)
        .where(results_table.c.run_pk == run_pk)
        .order_by(checks_table.c.result_id, checks_table.c.position)
    )
    if checks_scope == "failed_jobs":
        gpu_state = and_(results_table.c.device != "cpu", checks_table.c.check.in_(HARDWARE_CHECKS))
        query = query.where(or_(results_table.c.status != "ok", gpu_state))
    for row in session.execute(query):
        checks.setdefault(row.result_id, []).append(_check_record(row))
    return rows, samples, checks


def load_run_document(session: Session, run_id: str, *, checks: str = "all") -> ResultDocument:
    """Rebuild the stored run as a :class:`ResultDocument` (what was ingested, jobs in document order).

    Args:
        checks: which verification records to load: ``all`` (the exact document), ``failed_jobs`` (those of jobs
            that did not end ``ok``) or ``none`` (a comparison needs only samples and statuses).

    A stored timing that is not finite and positive (stored by an older version) is left out of its job, with a
    note in the job's ``notes``; ``meta["skipped_bad_points"]`` counts them.

    Raises:
        BadInput: no such run.
    """
    run = get_run(session, run_id=run_id)
    if run is None:
        raise BadInput(f"no run {run_id!r} in this database")
    rows, samples, checks_by_result = _run_children(session, run.id, checks)
    jobs = [_job_result(row, samples.get(row.id), checks_by_result.get(row.id, []), run) for row in rows]
    meta = dict(run.meta or {})
    skipped = 0
    for job in jobs:
        t = job.timing
        problem = t and timing_problem(
            median_ms=t.median_ms,
            samples_ms=t.samples_ms,
            q1_ms=t.q1_ms,
            q3_ms=t.q3_ms,
            mean_ms=t.mean_ms,
            stdev_ms=t.stdev_ms,
            sem_rel=t.sem_rel,
        )
        if problem:  # stored by a version that did not validate timings: shown without it, and counted
            job.timing = None
            job.notes = "; ".join(x for x in (job.notes, f"stored timing skipped: {problem}") if x)
            skipped += 1
    if skipped:
        meta[SKIPPED_META] = skipped
    # model_construct: a run stored by an older version may break today's rules (a run id, a time); it is shown
    # as stored rather than refused.
    return ResultDocument.model_construct(
        schema_version=run.schema_version,
        run_id=run.run_id,
        created_at=utc(run.created_at),  # type: ignore[arg-type]
        suite=run.suite,
        baselines=dict(run.baselines or {}),
        environment=_environment_doc(run.environment),
        ceilings=dict(run.ceilings or {}),
        jobs=jobs,
        meta=meta,
    )


@dataclasses.dataclass(frozen=True)
class ComparisonInput:
    """What a comparison of runs reads of one stored run (``harness.regression.compare_documents`` takes it as it takes
    a :class:`ResultDocument`): its id, its environment and its jobs in document order.

    Each job carries its case, impl, backend, device, status, reason, times and its timing (summary and every raw
    sample), exactly as stored; its verification records, memory and work figures are not loaded (empty / None):
    a comparison grades statuses and timings only.
    """

    run_id: str
    environment: EnvironmentDoc
    jobs: list[JobResult]
    skipped: int = 0  # stored jobs left out: they fail the document's validation (stored by an older version)
    # The run's ``interleaved_with`` (``run --base-ref``: the run it was interleaved with) and ``sequential`` (the
    # looks of ``run --repeat auto``), for the comparison's rule.
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


def _valid_jobs(fields: list[dict[str, Any]]) -> tuple[list[JobResult], int]:
    """The jobs of `fields` that validate, and how many did not (one batch; job by job only when one fails)."""
    try:
        return _JOBS.validate_python(fields), 0
    except ValidationError:
        pass
    jobs: list[JobResult] = []
    for item in fields:
        try:
            jobs.append(JobResult.model_validate(item))
        except ValidationError:
            continue
    return jobs, len(fields) - len(jobs)


def _interleaving(meta: dict[str, Any] | None) -> dict[str, Any]:
    """The part of a stored run's meta a comparison reads: which run it was interleaved with, if any, and the looks
    of a sequential run (``run --repeat auto``: ``regression.sequential``)."""
    meta = meta or {}
    return {k: meta[k] for k in ("interleaved_with", "sequential") if meta.get(k)}


def load_comparison_input(session: Session, *, run_id: str) -> ComparisonInput:
    """The jobs of run `run_id` as a comparison needs them (see :class:`ComparisonInput`), in two lean selects.

    The same jobs, statuses, timings and environment as ``load_run_document(..., checks="none")`` gives, at a
    fraction of its cost: one Core select of the columns a comparison reads with the samples joined in, and the
    jobs validated in one batch instead of built model by model.

    Raises:
        BadInput: no such run.
        UnknownOp: the run holds jobs of an op not registered in this process (a user's op: ``--import``).
    """
    runs, envs = Run.__table__, Environment.__table__
    env_columns = [envs.c[name] for name in EnvironmentDoc.model_fields]
    head = session.execute(
        select(runs.c.id, runs.c.created_at.label("run_created_at"), runs.c.meta.label("run_meta"), *env_columns)
        .join(envs, envs.c.id == runs.c.environment_id)
        .where(runs.c.run_id == run_id)
    ).one_or_none()
    if head is None:
        raise BadInput(f"no run {run_id!r} in this database")
    results, samples = Result.__table__, ResultSamples.__table__
    rows = session.execute(
        select(*(results.c[name] for name in _COMPARISON_RESULT_COLUMNS), samples.c.samples, samples.c.repetitions)
        .outerjoin(samples, samples.c.result_id == results.c.id)
        .where(results.c.run_pk == head.id)
        .order_by(results.c.position, results.c.id)
    ).all()
    unknown = sorted({row.op for row in rows} - known_ops())
    if unknown:  # this process lacks the op's contract: say how to load it, not that the jobs are bad
        raise UnknownOp(unknown_op_reason(unknown[0]))
    run_created_at = utc(head.run_created_at)
    jobs, skipped = _valid_jobs([_comparison_job(row, run_created_at) for row in rows])
    return ComparisonInput(
        run_id=run_id, environment=_environment_doc(head), jobs=jobs, skipped=skipped, meta=_interleaving(head.run_meta)
    )


# Validates a run's jobs in one pydantic-core call: ~8 us a job, where model_construct, a Python loop over every
# field of every model, takes ~25 us (JobResult, CaseSpec and TimingStats a job); and the jobs come out validated.
_JOBS = TypeAdapter(list[JobResult])

# What a comparison reads of each result, in _comparison_job's order (the case, status and timing summary).
_COMPARISON_RESULT_COLUMNS = (
    "job_id",
    "attempt",
    "op",
    "impl",
    "B",
    "T",
    "H",
    "K",
    "V",
    "extra_dims",
    "dtype",
    "mode",
    "regime",
    "seed",
    "initial_state",
    "backend",
    "device",
    "status",
    "reason",
    "gate_reference",
    "notes",
    "started_at",
    "finished_at",
    "clock",
    "median_ms",
    "q1_ms",
    "q3_ms",
    "mean_ms",
    "stdev_ms",
    "sem_rel",
    "warmup",
    "l2_flush",
    "compile_s",
    "stop_reason",
)


def _comparison_job(row: Sequence[Any], run_created_at: _dt.datetime | None) -> dict[str, Any]:
    """A JobResult's fields from a row of the comparison select (as _job_result reads them, less memory and work)."""
    # Unpacked by position: a Row's attribute access costs ~0.4 us a column, a third of the load at 34 columns.
    (
        job_id,
        attempt,
        op,
        impl,
        B,
        T,
        H,
        K,
        V,
        extra_dims,
        dtype,
        mode,
        regime,
        seed,
        initial_state,
        backend,
        device,
        status,
        reason,
        gate_reference,
        notes,
        started_at,
        finished_at,
        clock,
        median_ms,
        q1_ms,
        q3_ms,
        mean_ms,
        stdev_ms,
        sem_rel,
        warmup,
        l2_flush,
        compile_s,
        stop_reason,
        samples,
        repetitions,
    ) = row
    timing = None
    if median_ms is not None:
        timing = {
            "clock": clock,
            "samples_ms": unpack_samples(samples) if samples else [],
            "repetitions": unpack_repetitions(repetitions),
            "median_ms": median_ms,
            "q1_ms": q1_ms,
            "q3_ms": q3_ms,
            "mean_ms": mean_ms,
            "stdev_ms": stdev_ms,
            "sem_rel": sem_rel,
            "warmup": warmup or 0,
            "l2_flush": bool(l2_flush),
            "compile_s": compile_s,
            "stop_reason": stop_reason or "",
        }
    case = {
        "op": op,
        **case_dim_fields(B, T, H, K, V, extra_dims),
        "dtype": dtype,
        "mode": mode,
        "regime": regime,
        "seed": seed,
        "initial_state": initial_state,
    }
    return {
        "job_id": job_id,
        "attempt": attempt,
        "case": case,
        "impl": impl,
        "backend": backend,
        "device": device,
        "status": status,
        "reason": reason,
        "gate_reference": gate_reference,
        "timing": timing,
        "notes": notes,
        "started_at": utc(started_at) or run_created_at,
        "finished_at": utc(finished_at),
    }


# ---------------------------------------------------------------------------------------------------- series


def series_history(
    session: Session,
    *,
    op: str,
    impl: str,
    shape: str | Mapping[str, int],
    dtype: str,
    mode: str,
    machine_kind: str,
    software: str | None = None,
    statuses: Sequence[str] | None = ("ok",),
    since: _dt.datetime | None = None,
    until: _dt.datetime | None = None,
    limit: int | None = None,
    with_samples: bool = False,
) -> list[SeriesPoint]:
    """One series' results in time order (oldest first); with `limit`, the newest `limit` of them.

    An ``ok`` point whose stored timing is unusable (not finite and positive: stored by an older version) is left
    out and counted in the returned list's ``skipped``.

    Args:
        shape: all five dims (``"B8-T4096-H6-K128-V128"`` or a dict).
        software: the series' software part (``SeriesKey.software``); None: the software of the newest result of
            this case on this machine class (the series it is in now). Results on other major software versions
            belong to other series and are never mixed in.
        statuses: which statuses to include (default: only timed, correct results); None for all.
        with_samples: also load each point's raw samples (for rank tests and bootstraps).
    """
    dims = series_dims(op, shape)
    same_case = _same_case(op, impl, dims, dtype, mode, machine_kind)
    if software is None:
        software = _software_now(session, same_case, statuses)
        if software is None:
            return []
    query = (
        select(
            Result.id,
            Run.run_id,
            Result.run_created_at,
            Result.git_commit,
            Result.status,
            Result.median_ms,
            Result.q1_ms,
            Result.q3_ms,
            Result.mean_ms,
            Result.sem_rel,
            Result.clock,
            Machine.host,
            Environment.torch,
            Environment.triton,
            Environment.jax,
            Environment.cuda,
        )
        .join(Run, Result.run_pk == Run.id)
        .join(Machine, Run.machine_id == Machine.id)
        .join(Environment, Run.environment_id == Environment.id)
    )
    conditions = [*same_case, Result.software == software]
    if statuses is not None:
        conditions.append(Result.status.in_(list(statuses)))
    if since is not None:
        conditions.append(Result.run_created_at >= utc(since))
    if until is not None:
        conditions.append(Result.run_created_at <= utc(until))
    query = query.where(*conditions).order_by(Result.run_created_at.desc(), Result.id.desc())
    if limit is not None:
        query = query.where(*_newest_bound(conditions, limit)).limit(limit)
    rows = list(session.execute(query))[::-1]
    samples = result_samples(session, result_ids=[r[0] for r in rows]) if with_samples else {}
    history = SeriesHistory()
    usable = []
    for r in rows:
        if r[4] == "ok" and timing_problem(
            median_ms=r[5], q1_ms=r[6], q3_ms=r[7], mean_ms=r[8], sem_rel=r[9], samples_ms=samples.get(r[0])
        ):
            history.skipped += 1
        else:
            usable.append(r)
    history.extend(
        SeriesPoint(
            result_id=r[0],
            run_id=r[1],
            created_at=utc(r[2]),  # type: ignore[arg-type]
            git_commit=r[3],
            status=r[4],
            median_ms=r[5],
            q1_ms=r[6],
            q3_ms=r[7],
            mean_ms=r[8],
            sem_rel=r[9],
            clock=r[10],
            host=r[11],
            torch=r[12],
            triton=r[13],
            jax=r[14],
            cuda=r[15],
            samples_ms=samples.get(r[0]) if with_samples else None,
        )
        for r in usable
    )
    return history


def series_software_now(session: Session, *, key: SeriesKey, statuses: Sequence[str] | None = ("ok",)) -> str | None:
    """The software part of the newest result of `key`'s case on its machine class (``key.software`` is ignored):
    the series that case is in now. None when no such result is stored."""
    return _software_now(
        session, _same_case(key.op, key.impl, key.shape, key.dtype, key.mode, key.machine_kind), statuses
    )


def series_dims(op: str, shape: str | Mapping[str, int]) -> dict[str, int]:
    """The complete dims of a series of `op` from `shape`: every dim of its contract (B, T, H, K, V for the delta
    family), with ``N`` for packed sequences; of an op not registered in this process, at least B and T. BadInput
    says what is missing."""
    dims = parse_shape_filter(shape)
    needed = _series_dims(op)
    if (needed is not None and set(dims) - {PACKED_DIM} != set(needed)) or not {"B", "T"} <= set(dims):
        raise BadInput(f"a series needs all of {', '.join(needed or ('B', 'T', '...'))}; got {shape!r}")
    return dims


def series_key(
    op: str, impl: str, dims: Mapping[str, int], dtype: str, mode: str, machine_kind: str, software: str = ""
) -> SeriesKey:
    """The SeriesKey of one case at complete `dims` (any names; db/dims.py's columns)."""
    cols = dims_columns(dims)
    B, T, H, K, V = (cols[d] for d in INDEXED_DIMS)
    return SeriesKey(op, impl, B, T, H, K, V, dtype, mode, machine_kind, software, cols["extra_dims"])


def _series_dims(op: str) -> tuple[str, ...] | None:
    """The dims of `op`'s contract, or None for an op not registered in this process (stored by a user's file)."""
    from deltabench.harness.ops import get_op

    try:
        return get_op(op).dims
    except UnknownOp:
        return None


def _same_case(
    op: str, impl: str, dims: Mapping[str, int], dtype: str, mode: str, machine_kind: str
) -> tuple[Any, ...]:
    """Clauses of one case: every dim column (0 where the op lacks the dim) and the extra dims, exactly."""
    return (
        Result.op == op,
        Result.impl == impl,
        *(getattr(Result, c) == v for c, v in dims_columns(dims).items()),
        Result.dtype == dtype,
        Result.mode == mode,
        Result.machine_kind == machine_kind,
    )


def _software_now(session: Session, same_case: Sequence[Any], statuses: Sequence[str] | None) -> str | None:
    conditions = list(same_case)
    if statuses is not None:
        conditions.append(Result.status.in_(list(statuses)))
    query = select(Result.software).where(*conditions, *_newest_bound(conditions, 1))
    return session.execute(query.order_by(Result.run_created_at.desc(), Result.id.desc()).limit(1)).scalar()


def _newest_bound(conditions: Sequence[Any], limit: int) -> list[Any]:
    """A condition keeping the results matching `conditions` no older than the `limit`-th newest of them (ties
    kept): the newest `limit` by (time, id) are among them. None of them when `limit` is under 1.

    Why: a series' rows are ordered by time in ``ix_results_series``, not by (time, id). Where PostgreSQL estimates
    one row for a series' ~12 equality conditions, it sorts every result of the series (24,000 at 10M results, 160
    ms) rather than read the newest by the index; bounded by the time of the `limit`-th newest (read by the index
    alone), the sort holds `limit` rows whatever the estimate.
    """
    if limit < 1:
        return []
    nth = (
        select(Result.run_created_at)
        .where(*conditions)
        .order_by(Result.run_created_at.desc())
        .offset(limit - 1)
        .limit(1)
        .scalar_subquery()
    )
    # COALESCE, not "IS NULL OR": the bound stays an index condition (a series with fewer results keeps them all).
    oldest = literal(_dt.datetime(1, 1, 1, tzinfo=_dt.timezone.utc), Result.run_created_at.type)
    return [Result.run_created_at >= func.coalesce(nth, oldest)]


def list_series(
    session: Session,
    *,
    op: str | None = None,
    impl: str | None = None,
    machine_kind: str | None = None,
    since: _dt.datetime | None = None,
    limit: int = 10_000,
    after: str | None = None,
) -> list[SeriesKey]:
    """The distinct series with at least one ok result (optionally since a time), sorted by their fields
    (``db.series_state.listed``: read from the maintained tables, exact before the refresh catches up). `after` (a
    series' :attr:`SeriesKey.key`, the last of the previous page) starts the page after that series; an unknown one
    gives an empty page."""
    since = None if since is None else utc(since)
    if after is None:
        return series_state.listed(session, op=op, impl=impl, machine_kind=machine_kind, since=since, limit=limit)
    every = series_state.listed(session, op=op, impl=impl, machine_kind=machine_kind, since=since, limit=None)
    start = next((i + 1 for i, key in enumerate(every) if key.key == after), len(every))
    return every[start : start + limit]


def list_annotations(
    session: Session, *, series_key: str | Sequence[str] | None = None, limit: int = 1000, before: int | None = None
) -> list[Annotation]:
    """Annotations on change points, newest first (of one series when `series_key` is given; several keys of one
    series, e.g. its key and :attr:`SeriesKey.legacy_key`, may be given as a list). `before` (an annotation id, the
    last of the previous page) starts the page after it; an unknown one gives an empty page."""
    query = select(Annotation)
    if before is not None:
        query = _after(session, query, Annotation.created_at, Annotation.id, Annotation.id, before)
        if query is None:
            return []
    if isinstance(series_key, str):
        query = query.where(Annotation.series_key == series_key)
    elif series_key is not None:
        query = query.where(Annotation.series_key.in_(list(series_key)))
    return list(session.scalars(query.order_by(Annotation.created_at.desc(), Annotation.id.desc()).limit(limit)))


# ----------------------------------------------------------------------------------------------- comparisons


def _latest_by_key(rows: Sequence[Result], columns: Sequence[str]) -> dict[tuple[Any, ...], Result]:
    # A run may hold several attempts of one case (a retried job): the highest attempt is the one that counts.
    out: dict[tuple[Any, ...], Result] = {}
    for row in rows:
        key = tuple(getattr(row, c) for c in columns)
        if key not in out or row.attempt > out[key].attempt:
            out[key] = row
    return out


def _pairs(
    base: dict[tuple[Any, ...], Result], head: dict[tuple[Any, ...], Result], order: Sequence[tuple[Any, ...]]
) -> list[ComparedPair]:
    return [ComparedPair(key=key, base=base.get(key), head=head.get(key)) for key in order]


def compare_runs(session: Session, *, base_run_id: str, head_run_id: str, op: str | None = None) -> list[ComparedPair]:
    """Pair the results of two runs by (op, impl, shape, dtype, mode): base order first, then head-only cases.

    Each pair's key is ``(op, impl, B, T, H, K, V, extra_dims, dtype, mode)`` (db/dims.py).
    """
    columns = ("op", "impl", *_CASE_COLUMNS[1:])
    base_rows = run_results(session, run_id=base_run_id, op=op)
    head_rows = run_results(session, run_id=head_run_id, op=op)
    base, head = _latest_by_key(base_rows, columns), _latest_by_key(head_rows, columns)
    order = list(dict.fromkeys([*base, *head]))
    return _pairs(base, head, order)


def compare_impls(
    session: Session, *, run_id: str, base_impl: str, head_impl: str, op: str | None = None
) -> list[ComparedPair]:
    """Pair two impls' results within one run by (op, shape, dtype, mode); the key is ``_CASE_COLUMNS``."""
    rows = [r for r in run_results(session, run_id=run_id, op=op) if r.impl in (base_impl, head_impl)]
    base = _latest_by_key([r for r in rows if r.impl == base_impl], _CASE_COLUMNS)
    head = _latest_by_key([r for r in rows if r.impl == head_impl], _CASE_COLUMNS)
    order = list(dict.fromkeys([*base, *head]))
    return _pairs(base, head, order)


# ------------------------------------------------------------------------------------- service (web, workers)


@dataclasses.dataclass(frozen=True)
class WorkerSummary:
    """A worker as the job queue knows it: the jobs it took, and when it was last heard of."""

    name: str
    device_kinds: list[str]
    last_seen: _dt.datetime
    jobs_total: int
    jobs_running: int
    jobs_done: int
    jobs_failed: int


def get_api_token(session: Session, *, name: str | None = None, token_sha256: str | None = None) -> ApiToken | None:
    """The token row with this name or this hash (exactly one of them), or None."""
    if (name is None) == (token_sha256 is None):
        raise ValueError("give exactly one of name, token_sha256")
    column, value = (ApiToken.name, name) if name is not None else (ApiToken.token_sha256, token_sha256)
    return session.scalar(select(ApiToken).where(column == value))


def list_api_tokens(session: Session) -> list[ApiToken]:
    """Every token row (hashes only), oldest first."""
    return list(session.scalars(select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)))


def _queued_jobs_query(*, status: str | Sequence[str] | None, device_kind: str | None) -> Select[Any]:
    query = select(QueuedJob)
    for clause in _one_or_many(QueuedJob.status, status):
        query = query.where(clause)
    if device_kind is not None:
        query = query.where(QueuedJob.device_kind == device_kind)
    return query


def list_queued_jobs(
    session: Session,
    *,
    status: str | Sequence[str] | None = None,
    device_kind: str | None = None,
    limit: int = 100,
    offset: int = 0,
    before: int | None = None,
) -> list[QueuedJob]:
    """Submitted jobs, newest first, optionally of some statuses and one device kind. `before` (a job id, the last
    of the previous page) starts the page after that job (keyset: every page costs what the first does); an unknown
    one gives an empty page."""
    query = _queued_jobs_query(status=status, device_kind=device_kind)
    if before is not None:
        query = _after(session, query, QueuedJob.created_at, QueuedJob.id, QueuedJob.id, before)
        if query is None:
            return []
    query = query.order_by(QueuedJob.created_at.desc(), QueuedJob.id.desc()).limit(limit).offset(offset)
    return list(session.scalars(query))


def count_queued_jobs(
    session: Session, *, status: str | Sequence[str] | None = None, device_kind: str | None = None
) -> int:
    """How many jobs :func:`list_queued_jobs` would page through with the same filters."""
    query = _queued_jobs_query(status=status, device_kind=device_kind)
    return session.scalar(select(func.count()).select_from(query.subquery())) or 0


def get_queued_job(session: Session, *, job_id: int) -> QueuedJob | None:
    """One submitted job by its id, or None."""
    return session.get(QueuedJob, job_id)


def list_workers(session: Session, *, limit: int = 500) -> list[WorkerSummary]:
    """Workers that took at least one job, most recently seen first, with their job counts by outcome."""
    rows = session.execute(
        select(
            QueuedJob.worker,
            QueuedJob.device_kind,
            QueuedJob.status,
            func.count(),
            func.max(QueuedJob.updated_at),
        )
        .where(QueuedJob.worker.is_not(None))
        .group_by(QueuedJob.worker, QueuedJob.device_kind, QueuedJob.status)
    ).all()
    acc: dict[str, dict[str, Any]] = {}
    for worker, kind, status, n, last in rows:
        w = acc.setdefault(worker, {"kinds": set(), "last": None, "counts": {}})
        w["kinds"].add(kind)
        last = utc(last)
        w["last"] = last if w["last"] is None or (last and last > w["last"]) else w["last"]
        w["counts"][status] = w["counts"].get(status, 0) + n
    out = [
        WorkerSummary(
            name=name,
            device_kinds=sorted(w["kinds"]),
            last_seen=w["last"],
            jobs_total=sum(w["counts"].values()),
            jobs_running=w["counts"].get("running", 0),
            jobs_done=w["counts"].get("done", 0),
            jobs_failed=w["counts"].get("failed", 0),
        )
        for name, w in acc.items()
    ]
    out.sort(key=lambda w: w.last_seen, reverse=True)
    return out[:limit]


def run_ids_by_pk(session: Session, *, run_pks: Sequence[int]) -> dict[int, str]:
    """The run id of each run primary key given (results carry ``run_pk``; the API shows run ids)."""
    return dict(rows_with_ids(session, select(Run.id, Run.run_id), Run.id, sorted(set(run_pks))))


def get_annotation(session: Session, *, annotation_id: int) -> Annotation | None:
    """One annotation by its id, or None."""
    return session.get(Annotation, annotation_id)
