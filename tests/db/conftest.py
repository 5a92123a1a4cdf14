"""Fixtures of the db tests: a real SQLite file and a real PostgreSQL database for every test, and documents.

The database fixtures (``db_url``, ``pg_url``, ``pg_server``) are tests/pg_fixtures.py's, shared with the web tests:
PostgreSQL on 127.0.0.1:5432 in schemas of its own, dropped at the end; tables emptied between tests.
"""

from __future__ import annotations

import datetime as dt
import uuid

import pg_fixtures
import pytest
from sqlalchemy import Engine

from deltabench.db.engine import get_engine
from deltabench.harness.document import (
    CaseSpec,
    CheckRecord,
    Environment,
    JobResult,
    MemoryStats,
    ResultDocument,
    TimingStats,
    WorkFigures,
)

# The shared database fixtures (tests/pg_fixtures.py), registered here by name.
db_url, pg_server, pg_url, sqlite_url = (
    pg_fixtures.db_url,
    pg_fixtures.pg_server,
    pg_fixtures.pg_url,
    pg_fixtures.sqlite_url,
)


@pytest.fixture
def engine(db_url: str) -> Engine:
    """The engine of :func:`db_url`, migrated to head."""
    return get_engine(db_url)


def make_environment(**overrides: object) -> Environment:
    """An H200-like environment; override any field."""
    fields: dict[str, object] = {
        "host": "gpu-node-1",
        "machine_kind": "h200",
        "device_name": "NVIDIA H200",
        "device_count": 1,
        "platform": "Linux-6.8-x86_64",
        "cpu": "x86_64",
        "python": "3.11.9",
        "driver": "570.86",
        "cuda": "13.0",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "jax": None,
        "deltabench": "0.1.0",
        "git_commit": "a" * 40,
        "git_dirty": False,
        "kernel_hash": "f00d",
        "extra": {"note": "fixture"},
    }
    fields.update(overrides)
    return Environment(**fields)  # type: ignore[arg-type]


def make_job(
    *,
    op: str = "gdn",
    impl: str = "torch_chunk",
    T: int = 1024,
    dtype: str = "bf16",
    mode: str = "fwd",
    status: str = "ok",
    median: float = 1.0,
    job_id: str | None = None,
    attempt: int = 1,
) -> JobResult:
    """A job result; ok jobs carry timing, memory, work and two checks, others a reason and no timing."""
    timed = status == "ok"
    samples = [median * (1 + 0.01 * ((i % 5) - 2)) for i in range(12)]
    return JobResult(
        job_id=job_id or uuid.uuid4().hex,
        attempt=attempt,
        case=CaseSpec(op=op, B=2, T=T, H=4, K=64, V=64, dtype=dtype, mode=mode, seed=7),  # type: ignore[arg-type]
        impl=impl,
        backend="torch",
        device="cuda",
        status=status,  # type: ignore[arg-type]
        reason="" if timed else f"{status}: rel_fro 0.3 > 0.01",
        gate_reference="float64 oracle",
        verification=[
            CheckRecord(check="output", metric="rel_fro", value=1.5e-3, threshold=1e-2, passed=True, seed=0),
            CheckRecord(
                check="grad:q",
                metric="max_abs",
                value=None if timed else 0.3,
                threshold=0.05,
                passed=timed,
                worst_index=[0, 12, 3, 5],
                seed=1,
                regime="long",
                initial_state=True,
                reference="torch_chunk fp32",
                detail="worst at b0 t12",
            ),
        ],
        timing=TimingStats(
            clock="cuda_events",
            samples_ms=samples,
            median_ms=median,
            q1_ms=median * 0.99,
            q3_ms=median * 1.01,
            mean_ms=median,
            stdev_ms=median * 0.01,
            sem_rel=0.003,
            warmup=25,
            l2_flush=True,
            compile_s=1.25,
            stop_reason="sem",
        )
        if timed
        else None,
        memory=MemoryStats(peak_bytes=123_456_789, inputs_bytes=1_000, method="torch.cuda") if timed else None,
        work=WorkFigures(flops=1e9, bytes=2e8, tflops=1.0, gbps=200.0, floor_ms=0.1, pct_of_floor=10.0)
        if timed
        else None,
        notes="fixture",
        started_at=dt.datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=dt.timezone.utc),
        finished_at=dt.datetime(2026, 1, 1, 12, 0, 5, tzinfo=dt.timezone.utc),
    )


def make_document(
    *,
    jobs: list[JobResult] | None = None,
    created_at: dt.datetime | None = None,
    commit: str = "a" * 40,
    run_id: str | None = None,
    **env: object,
) -> ResultDocument:
    """A run of `jobs` (default: two impls x two shapes, one of them incorrect) at `created_at` on `commit`."""
    if jobs is None:
        jobs = [
            make_job(impl="torch_chunk", T=1024, median=1.0),
            make_job(impl="torch_chunk", T=4096, median=3.0),
            make_job(impl="triton_chunk", T=1024, median=0.5),
            make_job(impl="triton_chunk", T=4096, status="incorrect"),
        ]
    return ResultDocument(
        run_id=run_id or uuid.uuid4().hex,
        created_at=created_at or dt.datetime(2026, 1, 1, 12, tzinfo=dt.timezone.utc),
        suite="train",
        baselines={"gdn": "torch_chunk"},
        environment=make_environment(git_commit=commit, **env),
        ceilings={"matmul_tflops": 692.0, "copy_gbps": 4220.0},
        jobs=jobs,
        meta={"argv": ["deltabench", "run"], "nested": {"k": [1, 2]}},
    )


@pytest.fixture
def factory() -> object:
    """The document builders, as a fixture so test modules need not import this conftest by name."""

    class Factory:
        environment = staticmethod(make_environment)
        job = staticmethod(make_job)
        document = staticmethod(make_document)

    return Factory
