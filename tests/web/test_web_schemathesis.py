"""schemathesis against the OpenAPI schema: generated requests (valid and malformed) never get a 500.

Writes carry a live token so the generated bodies reach the handlers instead of stopping at 401. Jobs are only
queued (``dispatch_jobs=False``), so no generated job starts a benchmark.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error

from deltabench.web.app import create_app
from deltabench.web.config import Settings

# Examples per operation: ~25 operations x 12 examples runs in well under a minute on 2 cores.
MAX_EXAMPLES = 12


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzz_target(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The app on a fresh SQLite file or PostgreSQL schema with one run stored, its schema, and a write token."""
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.ingest import ingest_document
    from deltabench.harness.document import CaseSpec, Environment, JobResult, ResultDocument, TimingStats
    from deltabench.web.security.tokens import create_token

    if request.param == "sqlite":
        url = str(tmp_path_factory.mktemp("fuzz") / "fuzz.db")
    else:
        url = request.getfixturevalue("pg_server")()
    app = create_app(Settings(db_url=url, dispatch_jobs=False))
    timing = TimingStats(
        samples_ms=[1.0, 1.1, 0.9], median_ms=1.0, q1_ms=0.95, q3_ms=1.05, mean_ms=1, stdev_ms=0.1, sem_rel=0.05
    )
    doc = ResultDocument(
        run_id="fuzzrun",
        environment=Environment(host="h", machine_kind="cpu", device_name="cpu", git_commit="ab" * 20),
        jobs=[
            JobResult(
                case=CaseSpec(op="gdn", B=1, T=8, H=1, K=4, V=4, dtype="fp32"),
                impl="torch_chunk",
                status="ok",
                timing=timing,
            )
        ],
    )
    with session_scope(get_engine(url)) as session:
        ingest_document(session, doc)
        token = create_token(session, name="fuzzer")
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)
    return schema, token


def _fuzz(operation, token: str, failures: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Send MAX_EXAMPLES generated requests to one operation; note every 5xx in `failures`."""

    @given(case=operation.as_strategy())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: report the failing example as found
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:  # type: ignore[no-untyped-def]
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
        response = case.call()
        if response.status_code >= 500:
            failures.append(f"{operation.label}: {response.status_code} {response.text[:200]}")
        case.validate_response(response, checks=[not_a_server_error])

    try:
        run()
    except Exception as exc:  # collect every operation's failure, then fail once with all of them
        failures.append(f"{operation.label}: {type(exc).__name__}: {str(exc)[:1500]}")


def test_no_operation_answers_500(fuzz_target) -> None:  # type: ignore[no-untyped-def]
    schema, token = fuzz_target
    operations = [op.ok() for op in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    failures: list[str] = []
    for operation in operations:
        _fuzz(operation, token, failures)
    assert not failures, "\n".join(failures)
