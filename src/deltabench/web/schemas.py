"""Pydantic schemas of the JSON API (request bodies and responses), one family per resource.

Result documents themselves are :class:`deltabench.harness.document.ResultDocument`; the ingest body is a batch
of them (:class:`RunsIngest`).
"""

from __future__ import annotations

import datetime as _dt
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from deltabench.harness.document import ResultDocument
from deltabench.regression import Comparison, JobComparison, TimingEvidence

__all__ = [
    "AnnotationCreate",
    "AnnotationPublic",
    "AnnotationsPublic",
    "ChangePointPublic",
    "ComparisonPublic",
    "ComparisonRowPublic",
    "HistoryPointPublic",
    "HistoryPublic",
    "IngestResponse",
    "JobPublic",
    "JobStatusUpdate",
    "JobSubmit",
    "JobsPublic",
    "MachinePublic",
    "MachinesPublic",
    "Message",
    "RegressionPublic",
    "RegressionsPublic",
    "ResultPublic",
    "ResultsPublic",
    "RunPublic",
    "RunsIngest",
    "RunsPublic",
    "SampleStatsPublic",
    "WorkerPublic",
    "WorkersPublic",
]


def _as_utc(value: _dt.datetime) -> _dt.datetime:
    # SQLite hands back naive datetimes; every time the store keeps is UTC, so say so in the JSON.
    return value.replace(tzinfo=_dt.timezone.utc) if value.tzinfo is None else value.astimezone(_dt.timezone.utc)


UtcDatetime = Annotated[_dt.datetime, AfterValidator(_as_utc)]

# Short, printable identifiers: what a queue, impl, op or suite name may be.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+@:/-]{0,127}$"
DEVICE_KIND_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Message(BaseModel):
    """An error or a plain acknowledgement: ``{"detail": "..."}``."""

    detail: str


# ------------------------------------------------------------------------------------------------------ runs


class RunsIngest(_Body):
    """A batch of result documents to store (idempotent: a stored run or job is not stored again)."""

    documents: list[ResultDocument] = Field(min_length=1, max_length=10_000)


class IngestResponse(BaseModel):
    """What an ingest stored: the run ids in the order given, how many jobs the batch carried, and of those how
    many were new and how many were stored already (an ingest is idempotent: posting a run again stores nothing)."""

    runs: list[str]
    jobs: int
    new_jobs: int
    already_stored_jobs: int


class RunPublic(BaseModel):
    """One run in a list: its machine, commit and a count of results per status."""

    run_id: str
    created_at: UtcDatetime
    suite: str
    git_commit: str | None
    git_dirty: bool
    host: str
    machine_kind: str
    device_name: str
    n_results: int
    status_counts: dict[str, int]
    complete: bool = Field(True, description="false for a run cut short (not every planned job ran)")


class RunsPublic(BaseModel):
    """A page of runs and how many match in all."""

    data: list[RunPublic]
    count: int
    next_before: str | None = Field(None, description="`before` for the next page (None on the last page)")


# --------------------------------------------------------------------------------------------------- results


class ResultPublic(BaseModel):
    """One stored result (a job's outcome), flat."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    run_id: str
    job_id: str
    attempt: int
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
    git_commit: str | None
    run_created_at: UtcDatetime
    status: str
    reason: str
    median_ms: float | None
    q1_ms: float | None
    q3_ms: float | None
    tflops: float | None
    pct_of_floor: float | None
    peak_bytes: int | None


class ResultsPublic(BaseModel):
    """Results matching a filter, newest first."""

    data: list[ResultPublic]
    count: int
    next_before: int | None = Field(None, description="`before` for the next page (None on the last page)")


# --------------------------------------------------------------------------------------------------- history


class HistoryPointPublic(BaseModel):
    """One result of a series: when, on which commit, its median and IQR."""

    run_id: str
    created_at: UtcDatetime
    git_commit: str | None
    status: str
    median_ms: float | None
    q1_ms: float | None
    q3_ms: float | None
    host: str


class ChangePointPublic(BaseModel):
    """A step in a series: where, the medians either side, and its significance."""

    index: int
    run_id: str
    git_commit: str | None
    created_at: UtcDatetime
    before_ms: float
    after_ms: float
    ratio: float
    pvalue: float
    direction: str
    n_before: int = Field(0, description="points of the segment before the step")
    n_after: int = Field(0, description="points of the segment from the step on, the step's own run included")
    confirmed: bool = Field(False, description="a later run shows the new level too (n_after >= 2)")
    before_run_id: str | None = Field(None, description="the last run before the step (it lies between it and run_id)")
    before_commit: str | None = None


class AnnotationCreate(_Body):
    """A verdict on a change point of a series."""

    series_key: str = Field(min_length=1, max_length=512)
    kind: Literal["acknowledged", "expected"]
    note: str = Field(default="", max_length=4000)
    run_id: str | None = Field(default=None, max_length=128)
    git_commit: str | None = Field(default=None, max_length=64)


class AnnotationPublic(BaseModel):
    """A stored annotation."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    series_key: str
    kind: str
    note: str
    author: str | None
    run_id: str | None
    git_commit: str | None
    created_at: UtcDatetime


class AnnotationsPublic(BaseModel):
    """Annotations, newest first."""

    data: list[AnnotationPublic]
    count: int
    next_before: int | None = Field(None, description="`before` for the next page (None on the last page)")


class HistoryPublic(BaseModel):
    """A series' history (oldest first), its change points and their annotations."""

    series_key: str
    op: str
    impl: str
    shape: str
    dtype: str
    mode: str
    machine_kind: str
    software: str = Field("", description="major.minor software versions of the series, e.g. python=3.11,torch=2.13")
    points: list[HistoryPointPublic]
    change_points: list[ChangePointPublic]
    annotations: list[AnnotationPublic]
    skipped_points: int = Field(0, description="stored points left out as unusable (a timing not finite and positive)")


class RegressionPublic(BaseModel):
    """The latest change point of a series, with the annotation on it if any."""

    series_key: str
    op: str
    impl: str
    shape: str
    dtype: str
    mode: str
    machine_kind: str
    software: str = Field("", description="major.minor software versions of the series, e.g. python=3.11,torch=2.13")
    change_point: ChangePointPublic
    annotation: AnnotationPublic | None
    measure: str = Field("median_ms", description="what stepped: the series' median time per call")
    effect: float = Field(0.0, description="after / before - 1 of the segments' medians: +0.1 is 10% slower")
    alert: str = Field("", description="one line naming benchmark, shape, measure, effect and the runs it lies between")


class RegressionsPublic(BaseModel):
    """Latest change points across series, biggest slowdowns first."""

    data: list[RegressionPublic]
    count: int
    series_scanned: int
    skipped_points: int = Field(0, description="stored points left out as unusable (a timing not finite and positive)")
    pending_series: int = Field(
        0,
        description="series that gained or lost points since their change point was last computed: listed as they "
        "were, refreshed in the background after ingest",
    )


# ----------------------------------------------------------------------------------------------- comparisons


# One definition of a comparison result, shared with the CLI: these names are the harness models themselves.
SampleStatsPublic = TimingEvidence
ComparisonRowPublic = JobComparison
ComparisonPublic = Comparison


# ------------------------------------------------------------------------------------------------------ jobs


class JobSubmit(_Body):
    """A job: a shipped suite, or cases (ops x shapes x dtypes x modes), run by some impls on one device kind.

    With ``suite`` the other lists filter it (empty: the whole suite); without, ``ops`` and ``shapes`` are needed.
    Shapes read ``B=1,T=100,H=2,K=16,V=32``.
    """

    suite: str | None = Field(default=None, pattern=NAME_PATTERN)
    ops: list[str] = Field(default_factory=list, max_length=16)
    impls: list[str] = Field(default_factory=list, max_length=64)
    shapes: list[str] = Field(default_factory=list, max_length=64)
    dtypes: list[str] = Field(default_factory=list, max_length=3)
    modes: list[str] = Field(default_factory=list, max_length=3)
    device_kind: str = Field(default="cpu", pattern=DEVICE_KIND_PATTERN)


class JobStatusUpdate(_Body):
    """A worker's report on a job it took."""

    status: Literal["running", "done", "failed"]
    worker: str | None = Field(default=None, max_length=255)
    run_id: str | None = Field(default=None, max_length=128)
    error: str | None = Field(default=None, max_length=20_000)


class JobPublic(BaseModel):
    """A submitted job and where it stands."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    spec: dict[str, Any]
    device_kind: str
    status: str
    attempts: int
    run_id: str | None
    worker: str | None
    submitted_by: str | None
    error: str | None
    created_at: UtcDatetime
    updated_at: UtcDatetime
    heartbeat_at: UtcDatetime | None = Field(
        default=None, description="the last heartbeat of the worker running it (running jobs only)"
    )


class JobsPublic(BaseModel):
    """A page of jobs, newest first, and how many match."""

    data: list[JobPublic]
    count: int
    next_before: int | None = Field(None, description="`before` for the next page (None on the last page)")


# ----------------------------------------------------------------------------------------- workers, machines


class WorkerPublic(BaseModel):
    """A worker the queue has heard of."""

    name: str
    device_kinds: list[str]
    last_seen: UtcDatetime
    jobs_total: int
    jobs_running: int
    jobs_done: int
    jobs_failed: int


class WorkersPublic(BaseModel):
    """Every worker, most recently seen first."""

    data: list[WorkerPublic]
    count: int


class MachinePublic(BaseModel):
    """A host of one device class that stored runs."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    host: str
    machine_kind: str
    device_name: str
    device_count: int
    first_seen: UtcDatetime


class MachinesPublic(BaseModel):
    """Every machine, by kind."""

    data: list[MachinePublic]
    count: int
