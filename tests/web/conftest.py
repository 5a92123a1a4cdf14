"""Fixtures of the web tests: the real app on a real SQLite file or PostgreSQL database, tokens, documents.

The database fixtures (``db_url``, ``pg_url``, ``pg_server``) are tests/pg_fixtures.py's, shared with the db tests:
PostgreSQL on 127.0.0.1:5432 in schemas of its own, dropped at the end; tables emptied between tests. ``sqlite_url``
is overridden here so the SQLite file is ``web.db``, for ``db_url`` too.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator

import pg_fixtures
import pytest
from fastapi.testclient import TestClient

from deltabench.db.engine import get_engine, session_scope
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
from deltabench.web.app import create_app
from deltabench.web.config import Settings
from deltabench.web.security.tokens import create_token

UTC = dt.timezone.utc

# The shared database fixtures (tests/pg_fixtures.py), registered here by name.
db_url, pg_server, pg_url = pg_fixtures.db_url, pg_fixtures.pg_server, pg_fixtures.pg_url


@pytest.fixture
def sqlite_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    """A fresh SQLite file (for tests that need one backend only; also db_url's SQLite case, as before)."""
    return str(tmp_path / "web.db")


def make_token(db_url: str, name: str | None = None) -> str:
    """A live write token in the database at `db_url`."""
    with session_scope(get_engine(db_url)) as session:
        return create_token(session, name=name or f"t-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def app_client(db_url: str) -> Iterator[Callable[..., TestClient]]:
    """A factory of test clients on the real app over `db_url` (keyword arguments go to Settings). Each app's
    background refresh of the regressions table (started by its first ingest) is stopped after the test, so that
    it never takes the marks of a later test's data."""
    made: list[TestClient] = []

    def make(**settings: object) -> TestClient:
        made.append(TestClient(create_app(Settings(db_url=db_url, **settings))))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for client in made:
        client.app.state.series_refresher.stop()  # type: ignore[attr-defined]


def make_job(
    *,
    op: str = "gdn",
    impl: str = "torch_chunk",
    T: int = 1024,
    dtype: str = "bf16",
    mode: str = "fwd",
    status: str = "ok",
    median: float = 1.0,
    n: int = 20,
    spread: float = 0.01,
    reason: str = "",
) -> JobResult:
    """A job result; ok jobs carry `n` samples around `median`, others a failing check and a reason."""
    timed = status == "ok"
    samples = [median * (1 + spread * (((i * 7) % n) / n - 0.5)) for i in range(n)]
    checks = [CheckRecord(check="output", metric="rel_fro", value=1e-3, threshold=1e-2, passed=True, seed=0)]
    if not timed:
        checks.append(
            CheckRecord(
                check="grad:q", metric="rel_fro", value=0.3, threshold=0.01, passed=False, seed=1, detail="worst at t12"
            )
        )
    return JobResult(
        case=CaseSpec(op=op, B=2, T=T, H=4, K=64, V=64, dtype=dtype, mode=mode),  # type: ignore[arg-type]
        impl=impl,
        backend="torch",
        device="cpu",
        status=status,  # type: ignore[arg-type]
        reason=reason or ("" if timed else "grad:q rel_fro 0.3 > 0.01"),
        verification=checks,
        timing=TimingStats(
            samples_ms=samples,
            median_ms=median,
            q1_ms=median * 0.995,
            q3_ms=median * 1.005,
            mean_ms=median,
            stdev_ms=median * spread / 3,
            sem_rel=0.002,
        )
        if timed
        else None,
        memory=MemoryStats(peak_bytes=64 * 2**20, method="torch.cuda") if timed else None,
        work=WorkFigures(flops=1e9, bytes=1e8, tflops=1.0, pct_of_floor=12.5) if timed else None,
    )


def make_document(
    *,
    jobs: list[JobResult] | None = None,
    created_at: dt.datetime | None = None,
    commit: str = "a" * 40,
    machine_kind: str = "cpu",
    meta: dict | None = None,
) -> ResultDocument:
    """A run of `jobs` (default: torch_chunk and triton_chunk at one shape, and an incorrect triton job)."""
    if jobs is None:
        jobs = [
            make_job(impl="torch_chunk", median=1.0),
            make_job(impl="triton_chunk", median=0.5),
            make_job(impl="triton_chunk", T=4096, status="incorrect"),
        ]
    return ResultDocument(
        created_at=created_at or dt.datetime.now(UTC),
        suite="smoke",
        baselines={"gdn": "torch_chunk"},
        environment=Environment(
            host="node-1",
            machine_kind=machine_kind,
            device_name="test CPU",
            python="3.11.9",
            torch="2.13.0",
            git_commit=commit,
        ),
        jobs=jobs,
        meta=meta or {},
    )


def as_body(*docs: ResultDocument) -> dict:
    """The ingest body for `docs`."""
    return {"documents": [d.model_dump(mode="json") for d in docs]}


def refreshed(client: TestClient, timeout_s: float = 60.0) -> dict:
    """The regressions API's answer once the app's background refresh has no series left waiting (it is woken
    first, as an ingest wakes it: some tests store results straight into the database)."""
    import time

    client.app.state.series_refresher.wake()  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while True:
        answer = client.get("/api/v1/regressions").json()
        if answer["pending_series"] == 0:
            return answer
        assert time.monotonic() < deadline, f"{answer['pending_series']} series still waiting after {timeout_s} s"
        time.sleep(0.05)


class Factory:
    """The builders above, handed to tests as the ``build`` fixture (test modules never import conftest)."""

    job = staticmethod(make_job)
    document = staticmethod(make_document)
    body = staticmethod(as_body)
    token = staticmethod(make_token)
    refreshed = staticmethod(refreshed)


@pytest.fixture(scope="session")
def build() -> type[Factory]:
    """Document, job, ingest-body and token builders."""
    return Factory
