"""SQLAlchemy 2 tables of deltabench's store.

Measurement side (what result documents hold)::

    machines      one row per (host, machine_kind)
    environments  one row per distinct environment fingerprint (sha256 of its fields)
    runs          one row per result document (run_id unique)
    results       one row per (job_id, attempt): the case as indexed columns, status, timing summary, memory, work
    result_samples  the raw timing samples of a result, packed float64 (kept apart so result rows stay narrow),
                    and each sample's repetition when the run repeated its jobs
    checks        the verification records of a result, in document order

A result's samples and checks name it by ``result_id`` without a foreign key (migration 0010): ingest writes them in
the transaction that stored the result, and deletion removes them before it (db/deletion.py).

Service side (written by the web layer and workers)::

    api_tokens    bearer tokens, stored as sha256 hashes
    job_queue     submitted jobs: spec, target device kind, status, attempts, the run they produced, the last
                  heartbeat of the worker running one
    annotations   a human's verdict on a change point of a series (acknowledged / expected)

Results carry copies of their run's ``created_at``, ``git_commit`` and ``machine_kind`` on purpose: the series
history and commit-range queries then use one index over one table, which keeps them fast at millions of rows.
Every schema change is an Alembic revision in ``db/migrations/versions``.

The lengths of the columns that hold a document's text are the document model's own ``max_length``
(:func:`_sized`), and text the document leaves unbounded (reasons, notes, the memory method) is ``TEXT``: a
document that validates always fits (tests/db/test_db_ingest.py ingests each runner's documents on PostgreSQL,
which enforces the lengths SQLite ignores).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from annotated_types import MaxLen
from pydantic import BaseModel
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from deltabench.harness import document as doc

__all__ = [
    "Annotation",
    "ApiToken",
    "Base",
    "Check",
    "Environment",
    "Machine",
    "QueuedJob",
    "Result",
    "ResultSamples",
    "Run",
    "SeriesDirty",
    "SeriesState",
]

# Deterministic constraint names: Alembic needs them to alter or drop constraints (and SQLite batch mode).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _sized(model: type[BaseModel], field: str) -> String:
    """``VARCHAR(n)`` where n is the ``max_length`` the document model gives `field` of `model`."""
    for item in model.model_fields[field].metadata:
        if isinstance(item, MaxLen):
            return String(item.max_length)
    raise AssertionError(f"{model.__name__}.{field} has no max_length: store it as Text")


# Run and job ids: harness.document.ID_PATTERN allows at most 128 characters.
_ID = String(128)


def _utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


class Base(DeclarativeBase):
    """Declarative base; its metadata is what the migrations build."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Machine(Base):
    """A host of one device class (a series is compared within one ``machine_kind``)."""

    __tablename__ = "machines"
    __table_args__ = (UniqueConstraint("host", "machine_kind", name="uq_machines_host_kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(_sized(doc.Environment, "host"))
    machine_kind: Mapped[str] = mapped_column(_sized(doc.Environment, "machine_kind"), index=True)
    device_name: Mapped[str] = mapped_column(_sized(doc.Environment, "device_name"), default="")
    device_count: Mapped[int] = mapped_column(Integer, default=1)
    first_seen: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


class Environment(Base):
    """One distinct environment fingerprint; the fields are those of the document's ``Environment``."""

    __tablename__ = "environments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    host: Mapped[str] = mapped_column(_sized(doc.Environment, "host"))
    machine_kind: Mapped[str] = mapped_column(_sized(doc.Environment, "machine_kind"))
    device_name: Mapped[str] = mapped_column(_sized(doc.Environment, "device_name"))
    device_count: Mapped[int] = mapped_column(Integer, default=1)
    platform: Mapped[str] = mapped_column(_sized(doc.Environment, "platform"), default="")
    cpu: Mapped[str] = mapped_column(_sized(doc.Environment, "cpu"), default="")
    python: Mapped[str] = mapped_column(_sized(doc.Environment, "python"), default="")
    driver: Mapped[str | None] = mapped_column(_sized(doc.Environment, "driver"))
    cuda: Mapped[str | None] = mapped_column(_sized(doc.Environment, "cuda"))
    torch: Mapped[str | None] = mapped_column(_sized(doc.Environment, "torch"))
    triton: Mapped[str | None] = mapped_column(_sized(doc.Environment, "triton"))
    jax: Mapped[str | None] = mapped_column(_sized(doc.Environment, "jax"))
    deltabench: Mapped[str] = mapped_column(_sized(doc.Environment, "deltabench"), default="")
    git_commit: Mapped[str | None] = mapped_column(_sized(doc.Environment, "git_commit"))
    git_dirty: Mapped[bool] = mapped_column(Boolean, default=False)
    kernel_hash: Mapped[str | None] = mapped_column(_sized(doc.Environment, "kernel_hash"))
    extra: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Run(Base):
    """One result document: its environment, suite, baselines, ceilings and metadata."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_commit_created", "git_commit", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(_ID, unique=True)
    schema_version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), index=True)
    ingested_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)
    suite: Mapped[str] = mapped_column(_sized(doc.ResultDocument, "suite"), default="", index=True)
    git_commit: Mapped[str | None] = mapped_column(_sized(doc.Environment, "git_commit"))
    git_dirty: Mapped[bool] = mapped_column(Boolean, default=False)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"), index=True)
    machine_id: Mapped[int] = mapped_column(ForeignKey("machines.id"), index=True)
    baselines: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    ceilings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    environment: Mapped[Environment] = relationship(lazy="joined")
    machine: Mapped[Machine] = relationship(lazy="joined")


class Result(Base):
    """One job's outcome: the case as indexed columns, its status and its timing, memory and work summaries.

    ``median_ms`` is NULL when the job stored no timing (incorrect, unsupported, failed ...), ``peak_bytes``
    when it stored no memory figure and ``flops`` when it stored no work figures.
    """

    __tablename__ = "results"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", name="uq_results_job_attempt"),
        Index("ix_results_run_status", "run_pk", "status"),
        # A series' history (harness/series.py: one (op, impl, shape, dtype, mode) on one machine class with the
        # same major.minor software), in time order.
        Index(
            "ix_results_series",
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
            "machine_kind",
            "software",
            "run_created_at",
        ),
        Index("ix_results_commit_created", "git_commit", "run_created_at"),
        Index("ix_results_created", "run_created_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(_ID)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    position: Mapped[int] = mapped_column(Integer, default=0, doc="index of the job in its document")
    # the case
    op: Mapped[str] = mapped_column(_sized(doc.CaseSpec, "op"))
    impl: Mapped[str] = mapped_column(
        _sized(doc.JobResult, "impl"), doc="impl name (a pytest-benchmark fullname for imports)"
    )
    B: Mapped[int] = mapped_column(Integer)
    T: Mapped[int] = mapped_column(Integer)
    H: Mapped[int] = mapped_column(Integer)
    K: Mapped[int] = mapped_column(Integer)
    V: Mapped[int] = mapped_column(Integer)
    # An op's dims besides B, T, H, K, V: canonical JSON text (db.ingest.extra_dims_text), "" for none; an indexed
    # dim the op lacks is stored as 0 (migration 0006).
    extra_dims: Mapped[str] = mapped_column(String(255), default="", server_default="")
    dtype: Mapped[str] = mapped_column(String(8))
    mode: Mapped[str] = mapped_column(String(8))
    regime: Mapped[str] = mapped_column(String(16), default="typical")
    seed: Mapped[int] = mapped_column(BigInteger, default=0)
    initial_state: Mapped[bool] = mapped_column(Boolean, default=False)
    # denormalised from the run (see the module docstring)
    run_created_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True))
    git_commit: Mapped[str | None] = mapped_column(_sized(doc.Environment, "git_commit"))
    machine_kind: Mapped[str] = mapped_column(_sized(doc.Environment, "machine_kind"))
    software: Mapped[str] = mapped_column(
        Text, default="", server_default="", doc="the series' software part: harness.series.series_software"
    )
    # outcome
    backend: Mapped[str] = mapped_column(_sized(doc.JobResult, "backend"), default="")
    device: Mapped[str] = mapped_column(_sized(doc.JobResult, "device"), default="cpu")
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    gate_reference: Mapped[str] = mapped_column(Text, default="oracle")
    notes: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[_dt.datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[_dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # timing summary (NULL without timing)
    clock: Mapped[str | None] = mapped_column(String(16))
    median_ms: Mapped[float | None] = mapped_column(Float)
    q1_ms: Mapped[float | None] = mapped_column(Float)
    q3_ms: Mapped[float | None] = mapped_column(Float)
    mean_ms: Mapped[float | None] = mapped_column(Float)
    stdev_ms: Mapped[float | None] = mapped_column(Float)
    sem_rel: Mapped[float | None] = mapped_column(Float)
    n_samples: Mapped[int | None] = mapped_column(Integer)
    warmup: Mapped[int | None] = mapped_column(Integer)
    l2_flush: Mapped[bool | None] = mapped_column(Boolean)
    compile_s: Mapped[float | None] = mapped_column(Float)
    stop_reason: Mapped[str | None] = mapped_column(Text)
    # The run level the regression model reads (regression.noise.run_level of the raw samples), made at ingest so
    # that a history is read without the samples (migration 0011; NULL for results stored before it)
    level_ms: Mapped[float | None] = mapped_column(Float)
    # memory (NULL without)
    peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    inputs_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_method: Mapped[str | None] = mapped_column(Text)
    # work figures (NULL without)
    flops: Mapped[float | None] = mapped_column(Float)
    bytes_moved: Mapped[float | None] = mapped_column(Float)
    tflops: Mapped[float | None] = mapped_column(Float)
    gbps: Mapped[float | None] = mapped_column(Float)
    floor_ms: Mapped[float | None] = mapped_column(Float)
    pct_of_floor: Mapped[float | None] = mapped_column(Float)

    run: Mapped[Run] = relationship()


class ResultSamples(Base):
    """Raw timing samples of one result, as little-endian float64 bytes (see ``db.ingest.pack_samples``)."""

    __tablename__ = "result_samples"

    result_id: Mapped[int] = mapped_column(Integer, primary_key=True, doc="results.id (no foreign key: migration 0010)")
    samples: Mapped[bytes] = mapped_column(LargeBinary)
    # The repetition of each sample (``TimingStats.repetitions``, ``db.ingest.pack_repetitions``); NULL: one.
    repetitions: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


class Check(Base):
    """One verification record of a result (document order kept in ``position``)."""

    __tablename__ = "checks"
    __table_args__ = (Index("ix_checks_result_position", "result_id", "position", unique=True),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    result_id: Mapped[int] = mapped_column(Integer, doc="results.id (no foreign key: migration 0010)")
    position: Mapped[int] = mapped_column(Integer)
    check: Mapped[str] = mapped_column(_sized(doc.CheckRecord, "check"))
    metric: Mapped[str] = mapped_column(_sized(doc.CheckRecord, "metric"))
    value: Mapped[float | None] = mapped_column(Float)
    threshold: Mapped[float | None] = mapped_column(Float)
    passed: Mapped[bool] = mapped_column(Boolean)
    gating: Mapped[bool] = mapped_column(Boolean, default=True)
    worst_index: Mapped[list[Any] | None] = mapped_column(JSON)
    seed: Mapped[int | None] = mapped_column(BigInteger)
    regime: Mapped[str | None] = mapped_column(_sized(doc.CheckRecord, "regime"))
    initial_state: Mapped[bool | None] = mapped_column(Boolean)
    reference: Mapped[str] = mapped_column(Text, default="oracle")
    detail: Mapped[str] = mapped_column(Text, default="")


class ApiToken(Base):
    """A bearer token for writes; only its sha256 hash is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)
    last_used_at: Mapped[_dt.datetime | None] = mapped_column(DateTime(timezone=True))
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class QueuedJob(Base):
    """A submitted job (cases x impls x a device kind) and where it stands."""

    __tablename__ = "job_queue"
    __table_args__ = (Index("ix_job_queue_status_kind", "status", "device_kind", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    device_kind: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="queued", doc="queued|running|done|failed|cancelled")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    run_id: Mapped[str | None] = mapped_column(String(128), index=True)
    worker: Mapped[str | None] = mapped_column(String(255))
    submitted_by: Mapped[str | None] = mapped_column(String(255))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)
    updated_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow, onupdate=_utcnow)
    # The last sign of life of the worker running it (see deltabench.db.jobs); None unless running.
    heartbeat_at: Mapped[_dt.datetime | None] = mapped_column(DateTime(timezone=True))


class Annotation(Base):
    """A human's note on a change point of a series: ``acknowledged`` (a real change, known) or ``expected``."""

    __tablename__ = "annotations"
    __table_args__ = (Index("ix_annotations_series", "series_key", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    series_key: Mapped[str] = mapped_column(String(512))
    run_id: Mapped[str | None] = mapped_column(String(128))
    git_commit: Mapped[str | None] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16), doc="acknowledged|expected")
    note: Mapped[str] = mapped_column(Text, default="")
    author: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


# The columns that name a series (db.queries.SeriesKey's fields), shared by the two tables below.
SERIES_COLUMNS = ("op", "impl", "B", "T", "H", "K", "V", "extra_dims", "dtype", "mode", "machine_kind", "software")


class SeriesState(Base):
    """The newest point and latest change point of one series: what the regressions page lists, kept up to date
    from :class:`SeriesDirty` (``db.series_state``) instead of re-reading every series' history on every view."""

    __tablename__ = "series_state"
    __table_args__ = (Index("ix_series_state_last_point", "last_point_at"),)

    series_key: Mapped[str] = mapped_column(String(512), primary_key=True, doc="db.queries.SeriesKey.key")
    op: Mapped[str] = mapped_column(_sized(doc.CaseSpec, "op"))
    impl: Mapped[str] = mapped_column(_sized(doc.JobResult, "impl"))
    B: Mapped[int] = mapped_column(Integer)
    T: Mapped[int] = mapped_column(Integer)
    H: Mapped[int] = mapped_column(Integer)
    K: Mapped[int] = mapped_column(Integer)
    V: Mapped[int] = mapped_column(Integer)
    extra_dims: Mapped[str] = mapped_column(String(255), default="")
    dtype: Mapped[str] = mapped_column(String(8))
    mode: Mapped[str] = mapped_column(String(8))
    machine_kind: Mapped[str] = mapped_column(_sized(doc.Environment, "machine_kind"))
    software: Mapped[str] = mapped_column(Text, default="")
    last_point_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True))
    # The latest change point of the newest points as the web layer describes it (JSON), None without one.
    change_point: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    skipped: Mapped[int] = mapped_column(Integer, default=0, doc="points left out as unusable")
    updated_at: Mapped[_dt.datetime] = mapped_column(DateTime(timezone=True), default=_utcnow)


class SeriesDirty(Base):
    """A series that gained or lost points since its :class:`SeriesState` was computed: written by ingest and run
    deletion in their own transaction (insert only, so concurrent writers never wait on each other), consumed by
    ``db.series_state``."""

    __tablename__ = "series_dirty"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    op: Mapped[str] = mapped_column(_sized(doc.CaseSpec, "op"))
    impl: Mapped[str] = mapped_column(_sized(doc.JobResult, "impl"))
    B: Mapped[int] = mapped_column(Integer)
    T: Mapped[int] = mapped_column(Integer)
    H: Mapped[int] = mapped_column(Integer)
    K: Mapped[int] = mapped_column(Integer)
    V: Mapped[int] = mapped_column(Integer)
    extra_dims: Mapped[str] = mapped_column(String(255), default="")
    dtype: Mapped[str] = mapped_column(String(8))
    mode: Mapped[str] = mapped_column(String(8))
    machine_kind: Mapped[str] = mapped_column(_sized(doc.Environment, "machine_kind"))
    software: Mapped[str] = mapped_column(Text, default="")
