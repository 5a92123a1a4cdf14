"""What the API routes and the pages both compute: run tables, comparisons, histories and regressions.

Each function takes a session and plain arguments, reads through ``deltabench.db.queries`` and grades with
``deltabench.regression`` / ``deltabench.regression.changepoints``; none builds a query itself.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as _dt
import threading
from typing import Any

from sqlalchemy.orm import Session

from deltabench.db import queries
from deltabench.harness.document import HARDWARE_CHECKS, JobResult, ResultDocument
from deltabench.harness.errors import BadInput

from . import schemas

__all__ = [
    "NotFound",
    "OpTable",
    "compare_impls_in_run",
    "compare_two_runs",
    "forget_runs",
    "latest_change_points",
    "load_run",
    "refresh_series_states",
    "run_tables",
    "series_history",
    "series_key_of",
]

# Points a history loads for change-point detection and plotting: enough to see months of nightly runs.
HISTORY_POINTS = 500
# Points of each series the regressions page finds its latest change point in.
REGRESSION_POINTS = 200


class NotFound(BadInput):
    """A run, job or series that is not stored (the API answers 404)."""


def load_run(session: Session, ref: str, *, checks: str = "all") -> ResultDocument:
    """The stored run `ref` (a run id, a unique prefix or ``latest``) as a document.

    `checks` is passed to ``queries.load_run_document``: pages load only what they show.

    Raises:
        NotFound: no such run.
    """
    try:
        run_id = queries.resolve_run_id(session, ref=ref)
    except BadInput as exc:
        raise NotFound(str(exc)) from None
    return queries.load_run_document(session, run_id, checks=checks)


# ------------------------------------------------------------------------------------------------ run tables


@dataclasses.dataclass
class OpTable:
    """One op's pivot: a row per case (shape, dtype, mode), a column per impl, a cell per job."""

    op: str
    title: str
    baseline: str | None
    impls: list[str]
    rows: list[tuple[str, list[dict[str, Any] | None]]]
    clock: str


def _failing_checks(job: JobResult) -> list[dict[str, Any]]:
    return [
        {
            "check": r.check,
            "metric": r.metric,
            "value": r.value,
            "threshold": r.threshold,
            "seed": r.seed,
            "where": r.where,
            "reference": r.reference,
            "detail": r.detail,
            "worst_index": r.worst_index,
        }
        for r in job.verification
        if not r.passed
    ]


def _hardware(job: JobResult) -> dict[str, Any] | None:
    """The GPU's state while the job was timed, from its ``hardware:*`` records: the median SM clock, the windows
    left out of the level, and the records' details for a tooltip; None when it has none (a CPU job)."""
    found = {r.check: r for r in job.verification if r.check in HARDWARE_CHECKS}
    if not found:
        return None
    clocks, throttle = (found.get(name) for name in HARDWARE_CHECKS)
    return {
        "sm_mhz": clocks.value if clocks else None,
        "excluded_windows": int(throttle.value or 0) if throttle else 0,
        "detail": "; ".join(r.detail for r in found.values() if r.detail),
    }


def run_tables(doc: ResultDocument) -> list[OpTable]:
    """Per op the impl x case pivot of a run, each cell with the figures ``harness.report`` computes."""
    from deltabench.harness.document import unknown_op_reason
    from deltabench.harness.errors import UnknownOp
    from deltabench.harness.ops import get_op
    from deltabench.harness.report import result_rows

    rows = result_rows(doc)
    tables: dict[str, OpTable] = {}
    cells: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for job, row in zip(doc.jobs, rows, strict=True):
        op = job.case.op
        if op not in tables:
            try:
                title = get_op(op).title
            except UnknownOp:  # the op's contract is not loaded here: say how to load it
                title = unknown_op_reason(op)
            tables[op] = OpTable(op, title, doc.baselines.get(op), [], [], "")
            cells[op] = {}
        table = tables[op]
        if job.impl not in table.impls:
            table.impls.append(job.impl)
        case = f"{job.case.shape_id} {job.case.dtype} {job.case.mode}"
        cell = dict(
            row,
            failing_checks=_failing_checks(job),
            n_checks=len(job.verification),
            job_id=job.job_id,
            hardware=_hardware(job),
        )
        # A retried job appears twice: the later attempt replaces the earlier one.
        cells[op].setdefault(case, {})[job.impl] = cell
    for op, table in tables.items():
        clocks = {c["clock"] for by_impl in cells[op].values() for c in by_impl.values() if c["clock"]}
        table.clock = ", ".join(sorted(clocks))
        table.rows = [(case, [by_impl.get(impl) for impl in table.impls]) for case, by_impl in cells[op].items()]
    return list(tables.values())


# ----------------------------------------------------------------------------------------------- comparisons


def _comparison_public(
    comparison: Any, *, base_label: str, head_label: str, skipped: int = 0
) -> schemas.ComparisonPublic:
    return comparison.model_copy(update={"base_label": base_label, "head_label": head_label, "skipped_points": skipped})


# Comparisons are deterministic (seeded bootstrap) and cost ~0.1 ms a job (vectorised), so each is kept until a run
# it reads gets new jobs (see forget_runs, called on ingest). Bounded: the oldest entries go first.
_COMPARISONS: collections.OrderedDict[tuple[Any, ...], schemas.ComparisonPublic] = collections.OrderedDict()
_COMPARISONS_MAX = 256
_COMPARISONS_LOCK = threading.Lock()


def forget_runs(run_ids: list[str]) -> None:
    """Drop cached comparisons that read any of `run_ids` (their jobs changed)."""
    changed = set(run_ids)
    with _COMPARISONS_LOCK:
        for key in [k for k in _COMPARISONS if changed & set(k[:2])]:
            del _COMPARISONS[key]


def _cached(key: tuple[Any, ...], compute: Any) -> schemas.ComparisonPublic:
    with _COMPARISONS_LOCK:
        if key in _COMPARISONS:
            _COMPARISONS.move_to_end(key)
            return _COMPARISONS[key]
    value = compute()
    with _COMPARISONS_LOCK:
        _COMPARISONS[key] = value
        while len(_COMPARISONS) > _COMPARISONS_MAX:
            _COMPARISONS.popitem(last=False)
    return value


def _resolve(session: Session, ref: str) -> str:
    try:
        return queries.resolve_run_id(session, ref=ref)
    except BadInput as exc:
        raise NotFound(str(exc)) from None


def compare_two_runs(
    session: Session, *, base: str, head: str, threshold: float, alpha: float
) -> schemas.ComparisonPublic:
    """Head run vs base run, job by job (see ``harness.regression.compare_documents``)."""
    from deltabench.db.history import history_spreads
    from deltabench.regression import GradingRule, compare_documents

    base_id, head_id = _resolve(session, base), _resolve(session, head)
    if base_id == head_id:  # as `deltabench gate` refuses it: a run compared with itself says nothing
        raise BadInput(f"base {base!r} and head {head!r} are the same run ({head_id}): name another base")

    def compute() -> schemas.ComparisonPublic:
        # The lean load (jobs, timings and raw samples; no checks, memory or work figures): a comparison reads
        # nothing else, and building two whole documents was the largest part of a first view's time.
        base_side = queries.load_comparison_input(session, run_id=base_id)
        head_side = queries.load_comparison_input(session, run_id=head_id)
        # The same noise model as the CLI gate: each job's run-to-run spread from its series' stored history.
        spreads = history_spreads(session, base_run_id=base_id, exclude_run_id=head_id)
        rule = GradingRule(threshold=threshold, alpha=alpha)
        comparison = compare_documents(base_side, head_side, rule=rule, spreads=spreads)
        return _comparison_public(
            comparison,
            base_label=base_id[:12],
            head_label=head_id[:12],
            skipped=base_side.skipped + (head_side.skipped if head_id != base_id else 0),
        )

    return _cached((base_id, head_id, "runs", threshold, alpha), compute)


def compare_impls_in_run(
    session: Session, *, run: str, base_impl: str, head_impl: str, threshold: float, alpha: float
) -> schemas.ComparisonPublic:
    """Two impls of one run, case by case: head impl vs base impl (same machine, same software)."""
    run_id = _resolve(session, run)
    return _cached(
        (run_id, run_id, base_impl, head_impl, threshold, alpha),
        lambda: _compare_impls(session, run_id, base_impl, head_impl, threshold, alpha),
    )


def _compare_impls(
    session: Session, run: str, base_impl: str, head_impl: str, threshold: float, alpha: float
) -> schemas.ComparisonPublic:
    from deltabench.regression import Comparison, GradingRule, compare_job_pairs

    doc = queries.load_comparison_input(session, run_id=run)  # jobs and timings only, as for two runs
    by_case: dict[tuple[str, str, str, str], dict[str, JobResult]] = {}
    for job in doc.jobs:
        if job.impl in (base_impl, head_impl):
            key = (job.case.op, job.case.shape_id, job.case.dtype, job.case.mode)
            side = by_case.setdefault(key, {})
            if job.impl not in side or job.attempt >= side[job.impl].attempt:
                side[job.impl] = job
    if not by_case:
        raise NotFound(f"run {doc.run_id} has no results of {base_impl!r} or {head_impl!r}")
    rows = compare_job_pairs(
        [(side.get(base_impl), side.get(head_impl)) for side in by_case.values()],
        rule=GradingRule(threshold=threshold, alpha=alpha),
        machine_kind=doc.environment.machine_kind,
        same_run=True,  # one machine and software state: the run's own samples, no cross-run spread
    )
    # A job missing on the head side has the base impl's name in its key; show the head impl's name instead.
    label = f"{head_impl} vs {base_impl}"
    return Comparison(
        base_run_id=doc.run_id,
        head_run_id=doc.run_id,
        base_label=base_impl,
        head_label=head_impl,
        threshold=threshold,
        alpha=alpha,
        rows=[row.model_copy(update={"impl": label}) for row in rows],
        base_commit=doc.environment.git_commit,
        head_commit=doc.environment.git_commit,
        allow_missing=True,  # two impls of one run: a case one of them lacks is not a failure of the other
        skipped_points=doc.skipped,
    )


# ---------------------------------------------------------------------------------------------------- series


def series_key_of(
    session: Session,
    *,
    op: str,
    impl: str,
    shape: str,
    dtype: str,
    mode: str,
    machine_kind: str,
    software: str | None = None,
) -> queries.SeriesKey:
    """The series of these fields (`shape` must give all five dims), as ``harness.series`` defines it.

    `software` is the series' software part (``"python=3.11,torch=2.13"``, as ``harness.series`` writes it); None
    means the series the newest ok result of this case on this machine class is in.

    Raises:
        BadInput: a malformed shape or software part.
        NotFound: `software` is None and no ok result of this case is stored.
    """
    from deltabench.harness.series import parse_software

    dims = queries.series_dims(op, shape)
    case = queries.series_key(op, impl, dims, dtype, mode, machine_kind)
    if software is None:
        software = queries.series_software_now(session, key=case)
        if software is None:
            raise NotFound(f"no ok result stored for series {case.legacy_key}")
    else:
        try:
            software = ",".join(f"{k}={v}" for k, v in parse_software(software))  # canonical order
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    return dataclasses.replace(case, software=software)


def _change_point_public(cp: Any, points: list[queries.SeriesPoint]) -> schemas.ChangePointPublic:
    at = points[cp.index]
    before = points[cp.index - 1] if cp.index > 0 else None
    return schemas.ChangePointPublic(
        index=cp.index,
        run_id=at.run_id,
        git_commit=at.git_commit,
        created_at=at.created_at,
        before_ms=cp.before,
        after_ms=cp.after,
        ratio=cp.ratio,
        pvalue=cp.pvalue,
        direction=cp.direction,
        n_before=cp.n_before,
        n_after=cp.n_after,
        confirmed=cp.confirmed,
        before_run_id=before.run_id if before is not None else None,
        before_commit=before.git_commit if before is not None else None,
    )


def _change_points(points: list[queries.SeriesPoint]) -> list[schemas.ChangePointPublic]:
    from deltabench.regression.changepoints import dashboard_change_points

    timed = [p for p in points if p.median_ms is not None and p.median_ms > 0]
    found = dashboard_change_points([(i, p.median_ms) for i, p in enumerate(timed)])
    return [_change_point_public(cp, timed) for cp in found]


def _points(session: Session, key: queries.SeriesKey, limit: int) -> queries.SeriesHistory:
    """The newest `limit` ok results of exactly this series (its software included)."""
    return queries.series_history(
        session,
        op=key.op,
        impl=key.impl,
        shape=key.shape,
        dtype=key.dtype,
        mode=key.mode,
        machine_kind=key.machine_kind,
        software=key.software,
        limit=limit,
    )


def series_history(session: Session, key: queries.SeriesKey, *, limit: int = HISTORY_POINTS) -> schemas.HistoryPublic:
    """A series' newest `limit` ok results (oldest first), its change points and their annotations.

    Raises:
        NotFound: the series has no ok result.
    """
    points = _points(session, key, limit)
    if not points:
        raise NotFound(f"no ok result stored for series {key.key}")
    timed = [p for p in points if p.median_ms is not None and p.median_ms > 0]
    annotations = queries.list_annotations(session, series_key=[key.key, key.legacy_key], limit=200)
    return schemas.HistoryPublic(
        series_key=key.key,
        op=key.op,
        impl=key.impl,
        shape=key.shape_id,
        dtype=key.dtype,
        mode=key.mode,
        machine_kind=key.machine_kind,
        software=key.software,
        points=[
            schemas.HistoryPointPublic(
                run_id=p.run_id,
                created_at=p.created_at,
                git_commit=p.git_commit,
                status=p.status,
                median_ms=p.median_ms,
                q1_ms=p.q1_ms,
                q3_ms=p.q3_ms,
                host=p.host,
            )
            for p in timed
        ],
        change_points=_change_points(timed),
        annotations=[schemas.AnnotationPublic.model_validate(a) for a in annotations],
        skipped_points=points.skipped,
    )


def _alert_line(key: queries.SeriesKey, cp: schemas.ChangePointPublic) -> str:
    """One line naming the benchmark, shape, measure, effect and the runs the step lies between."""
    where = f"{key.op}/{key.impl} {key.shape_id} {key.dtype} {key.mode} on {key.machine_kind}"
    since = (cp.before_commit or cp.before_run_id or "?")[:10]
    until = (cp.git_commit or cp.run_id)[:10]
    state = "confirmed" if cp.confirmed else "unconfirmed: one run so far"
    return (
        f"{where}: median time {cp.ratio - 1.0:+.1%} ({cp.before_ms:.4g} -> {cp.after_ms:.4g} ms, p={cp.pvalue:.2g}) "
        f"between {since} and {until} ({state})"
    )


def refresh_series_states(
    session: Session, *, limit: int | None = None, points_per_series: int = REGRESSION_POINTS
) -> int:
    """Recompute the latest change point of up to `limit` series (all when None) marked changed since their last
    refresh, each from its newest `points_per_series` points, into ``db.series_state``; returns how many.

    The caller's transaction holds the marks it took until it commits: a refresh that fails leaves them marked.
    Returns 0 without reading anything when another refresh holds the store's refresh lock (PostgreSQL).
    """
    from deltabench.db import series_state

    if not series_state.lock_refresh(session):
        return 0
    keys = series_state.take_dirty(session, limit=limit)
    found, gone = [], []
    for key in keys:
        points = _points(session, key, points_per_series)
        if not points:
            gone.append(key)
            continue
        cps = _change_points([p for p in points if p.median_ms])
        latest = cps[-1].model_dump(mode="json") if cps else None
        found.append((key, points[-1].created_at, latest, points.skipped))
    series_state.save_states(session, found)
    series_state.drop_states(session, gone)
    return len(keys)


def latest_change_points(
    session: Session,
    *,
    since_days: int = 90,
    only_regressions: bool = False,
    machine_kind: str | None = None,
    op: str | None = None,
    max_series: int = 500,
) -> schemas.RegressionsPublic:
    """The latest change point of every series with results in the last `since_days` days, slowdowns first, one
    alert per (benchmark, shape, dtype, mode, machine class, run): a step found in two series of one job (its
    software versions) is listed once. `only_regressions`: confirmed slowdowns only (a later run shows the new
    level too; the newest run alone never makes a regression).

    Read from ``db.series_state`` as it stands: this never recomputes (a view after a large ingest would pay for
    it). The series that gained or lost points since their last refresh are counted in ``pending_series``; the
    refresh after ingest (``web.series_refresh``) brings them up to date. Each carries the newest annotation made
    on it (same series, same run).
    """
    from deltabench.db import series_state

    pending = series_state.pending_count(session)
    since = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(days=since_days)
    rows = series_state.states(session, since=since, op=op, machine_kind=machine_kind, limit=max_series)
    with_change = [(key, state) for key, state in rows if state.change_point is not None]
    notes: dict[str, list[Any]] = {}
    if with_change:
        wanted = [k for key, _ in with_change for k in (key.key, key.legacy_key)]
        for note in queries.list_annotations(session, series_key=wanted, limit=10**6):
            notes.setdefault(note.series_key, []).append(note)  # newest first, as listed
    found: list[schemas.RegressionPublic] = []
    alerted: set[tuple[str, ...]] = set()
    for key, state in with_change:
        latest = schemas.ChangePointPublic.model_validate(state.change_point)
        if only_regressions and (latest.ratio <= 1.0 or not latest.confirmed):
            continue
        alert_key = (key.op, key.impl, key.shape_id, key.dtype, key.mode, key.machine_kind, latest.run_id)
        if alert_key in alerted:
            continue
        alerted.add(alert_key)
        mine = sorted(
            notes.get(key.key, []) + notes.get(key.legacy_key, []), key=lambda a: (a.created_at, a.id), reverse=True
        )
        note = next((a for a in mine if a.run_id in (None, latest.run_id)), None)
        found.append(
            schemas.RegressionPublic(
                series_key=key.key,
                op=key.op,
                impl=key.impl,
                shape=key.shape_id,
                dtype=key.dtype,
                mode=key.mode,
                machine_kind=key.machine_kind,
                software=key.software,
                change_point=latest,
                annotation=schemas.AnnotationPublic.model_validate(note) if note else None,
                effect=latest.ratio - 1.0,
                alert=_alert_line(key, latest),
            )
        )
    found.sort(key=lambda r: -r.change_point.ratio)
    skipped = sum(state.skipped for _, state in rows)
    return schemas.RegressionsPublic(
        data=found, count=len(found), series_scanned=len(rows), skipped_points=skipped, pending_series=pending
    )
