"""The fleet on PostgreSQL + Redis end to end: a real server on a PostgreSQL store, a real ``deltabench worker``.

A CPU (torch) job and a JAX job run through Celery and are stored: before the store's columns followed the
document, PostgreSQL refused both results (their memory methods are longer than 64 characters), the worker's
post got a 422 and the job stayed ``running`` forever. A document the server refuses (here: over the body limit)
now marks the job ``failed`` with the server's reason. A killed worker's job is queued again by the server's
heartbeat sweep and run by another worker, whose heartbeats keep it alive through a case longer than the timeout.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pg_fixtures
import pytest
import test_celery_fleet
from processes import wait_for
from test_celery_fleet import Fleet

from deltabench.db.engine import get_engine, session_scope
from deltabench.web.security.tokens import create_token

pytestmark = pytest.mark.redis
# The shared fixtures, registered here by name.
pg_server, redis_db = pg_fixtures.pg_server, test_celery_fleet.redis_db

SPEC = {
    "ops": ["gdn"],
    "impls": ["torch_chunk", "jax_chunk"],
    "shapes": ["B=1,T=24,H=1,K=8,V=8"],
    "dtypes": ["fp32"],
    "modes": ["fwd"],
    "device_kind": "cpu",
}


class PostgresFleet(Fleet):
    """Fleet's server and workers, the server on a fresh PostgreSQL schema."""

    def __init__(self, tmp: Path, db_url: str) -> None:
        super().__init__(tmp)
        self.db = db_url
        with session_scope(get_engine(db_url)) as session:
            self.token = create_token(session, name="fleet-pg")


@pytest.fixture
def pg_fleet(tmp_path: Path, redis_db: None, pg_server) -> Iterator[PostgresFleet]:  # type: ignore[no-untyped-def]
    """A fleet whose server stores in PostgreSQL (Redis db 13 as the broker)."""
    f = PostgresFleet(tmp_path, pg_server())
    try:
        yield f
    finally:
        f.stop()


def _submit_and_wait(fleet: PostgresFleet) -> dict:
    auth = {"Authorization": f"Bearer {fleet.token}"}
    submitted = httpx.post(f"{fleet.base}/api/v1/jobs", json=SPEC, headers=auth, timeout=10)
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]

    def finished() -> dict | None:
        job = fleet.job(job_id)
        return job if job["status"] in ("done", "failed", "cancelled") else None

    return wait_for("the job to finish", finished, timeout=240, every=0.5)  # type: ignore[return-value]


def test_cpu_and_jax_jobs_are_stored_on_postgresql(pg_fleet: PostgresFleet) -> None:
    pg_fleet.start_server()
    worker = pg_fleet.start_worker("wpg")
    pg_fleet.wait_server()
    pg_fleet.wait_ready("wpg", worker)
    job = _submit_and_wait(pg_fleet)
    assert job["status"] == "done", (job, pg_fleet.log("wpg")[-3000:], pg_fleet.log("server")[-2000:])
    run = httpx.get(f"{pg_fleet.base}/api/v1/runs/{job['run_id']}", timeout=10).json()
    by_impl = {j["impl"]: j for j in run["jobs"]}
    assert sorted(by_impl) == ["jax_chunk", "torch_chunk"]
    for impl, result in by_impl.items():
        assert result["status"] == "ok", (impl, result["reason"])
        assert len(result["memory"]["method"]) > 64, "what VARCHAR(64) refused"
    assert run["meta"]["complete"] is True


def test_a_refused_result_post_fails_the_job_with_the_server_s_reason(pg_fleet: PostgresFleet) -> None:
    pg_fleet.env["DELTABENCH_MAX_BODY_MB"] = "0.004"  # 4 KiB: jobs and status reports fit, the document does not
    pg_fleet.start_server()
    worker = pg_fleet.start_worker("wref")
    pg_fleet.wait_server()
    pg_fleet.wait_ready("wref", worker)
    job = _submit_and_wait(pg_fleet)
    assert job["status"] == "failed", (job, pg_fleet.log("wref")[-3000:])
    assert job["error"].startswith("the server refused the result document: 413 request body too large"), job
    assert worker.poll() is None, "the worker acknowledged the task and goes on"
    assert httpx.get(f"{pg_fleet.base}/api/v1/runs", timeout=10).json()["count"] == 0


def test_a_killed_worker_s_job_is_queued_again_and_a_long_live_one_is_left_alone(pg_fleet: PostgresFleet) -> None:
    pg_fleet.env.update(
        DELTABENCH_JOB_HEARTBEAT_TIMEOUT_S="3",
        DELTABENCH_JOB_HEARTBEAT_S="0.5",
        # The broker would deliver the killed worker's job again only after an hour: the server's sweep does it.
        DELTABENCH_BROKER_VISIBILITY_S="3600",
    )
    (pg_fleet.control / "slow").write_text("600")
    pg_fleet.start_server()
    first = pg_fleet.start_worker("wa")
    pg_fleet.wait_server()
    pg_fleet.wait_ready("wa", first)
    spec = {**SPEC, "impls": ["fleet_slow_once"]}
    auth = {"Authorization": f"Bearer {pg_fleet.token}"}
    submitted = httpx.post(f"{pg_fleet.base}/api/v1/jobs", json=spec, headers=auth, timeout=10)
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]

    started = wait_for("the slow case to start", lambda: sorted(pg_fleet.control.glob("started-*")), timeout=120)
    assert pg_fleet.job(job_id)["heartbeat_at"] is not None
    first.send_signal(signal.SIGKILL)
    first.wait()
    (pg_fleet.control / "slow").write_text(str(7))  # the next attempt sleeps 7 s, over two timeouts, once

    def requeued() -> dict | None:
        job = pg_fleet.job(job_id)
        return job if job["status"] != "running" else None

    job = wait_for("the sweep to queue the job again", requeued, timeout=30, every=0.2)
    assert job["status"] == "queued", job
    assert job["error"].startswith("no heartbeat from worker wa@") and job["error"].endswith("queued again"), job
    page = httpx.get(f"{pg_fleet.base}/jobs", headers={"Accept": "text/html"}, timeout=10).text
    assert "no heartbeat from worker wa@" in page

    second = pg_fleet.start_worker("wb")  # the server sent the job to the queue again: this worker takes it
    again = wait_for(
        "the second attempt's slow case",
        lambda: sorted(set(pg_fleet.control.glob("started-*")) - set(started)),
        timeout=120,
    )
    (pg_fleet.control / "slow").unlink()  # the sleeping call goes on; the later ones are fast
    assert again
    taken = pg_fleet.job(job_id)
    assert (taken["status"], taken["attempts"], taken["worker"][:3]) == ("running", 2, "wb@"), taken

    def finished() -> dict | None:
        assert second.poll() is None, pg_fleet.log("wb")
        job = pg_fleet.job(job_id)
        return job if job["status"] in ("done", "failed", "cancelled") else None

    job = wait_for("the second attempt to finish", finished, timeout=180, every=0.5)
    assert job["status"] == "done" and job["attempts"] == 2, (job, pg_fleet.log("wb")[-3000:])
    run = httpx.get(f"{pg_fleet.base}/api/v1/runs/{job['run_id']}", timeout=10).json()
    [result] = run["jobs"]
    assert result["status"] == "ok" and run["meta"]["worker"].startswith("wb@"), result["reason"]
