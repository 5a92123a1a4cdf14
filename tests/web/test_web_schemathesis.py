"""schemathesis against the OpenAPI schema, every check it has (``--checks all``): generated requests (valid and
malformed) never get a 500, and every answer conforms to the schema (status codes, content types, headers, bodies),
malformed data is refused, valid data accepted, authentication honoured; schemathesis warns of nothing.

Writes carry a live token so the generated bodies reach the handlers instead of stopping at 401. Jobs are only
queued (``dispatch_jobs=False``), so no generated job starts a benchmark.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import CHECKS, load_all_checks, positive_data_acceptance
from schemathesis.core.failures import FailureGroup

from deltabench.web.app import create_app
from deltabench.web.config import Settings

load_all_checks()
ALL_CHECKS = list(CHECKS.get_all())
# positive_data_acceptance (a schema-valid request must be accepted) where the API refuses schema-valid input by
# a rule JSON Schema cannot state; every other check runs on these operations too.
NOT_IN_SCHEMA = {
    # created_at between 2020 and ten minutes from now (a bound that moves with the clock), run ids unique in a
    # batch, ops registered in this server (user ops come and go with --import)
    "POST /api/v1/runs": "created_at bounds relative to now, ops registered at start",
    # commit_from and commit_to go together
    "GET /api/v1/results": "two parameters given together or not at all",
    # a shape has every dim of the op's own contract (a user op's dims are known only at run time)
    "GET /api/v1/history": "a shape read by the op's contract",
    # ops and shapes when there is no suite; shapes read by each op's contract; a job that fits host memory
    "POST /api/v1/jobs": "fields required together, shapes read by the op's contract, host memory",
}
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
        excluded = [positive_data_acceptance] if operation.label in NOT_IN_SCHEMA else []
        case.validate_response(response, checks=ALL_CHECKS, excluded_checks=excluded)

    try:
        run()
    except (Exception, FailureGroup) as exc:  # collect every operation's failure, then fail once with all of them
        failures.append(f"{operation.label}: {type(exc).__name__}: {str(exc)[:1500]}")


@pytest.mark.filterwarnings("error")  # zero warnings: one from schemathesis or the app fails the test
def test_every_check_passes_on_every_operation(fuzz_target) -> None:  # type: ignore[no-untyped-def]
    schema, token = fuzz_target
    operations = [op.ok() for op in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    failures: list[str] = []
    for operation in operations:
        _fuzz(operation, token, failures)
    assert not failures, "\n".join(failures)
