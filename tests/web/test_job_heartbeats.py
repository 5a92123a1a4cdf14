"""Heartbeats of running jobs, on SQLite and PostgreSQL: the state machine's sweep (deltabench.db.jobs), the
API a fleet worker beats through, and the server's periodic sweep shown on the API and the queue page.

A job whose worker went silent for longer than the timeout is queued again on its first attempt and failed
after that; a job whose worker keeps beating is left alone however long it runs.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from processes import wait_for

from deltabench.db import jobs
from deltabench.db.engine import get_engine, session_scope
from deltabench.db.models import QueuedJob
from deltabench.web.app import create_app
from deltabench.web.config import Settings

SPEC = {"ops": ["gdn"], "impls": ["torch_chunk"], "shapes": ["B=1,T=16,H=1,K=8,V=8"], "device_kind": "cpu"}
NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)


def _add(url: str, **fields: object) -> int:
    with session_scope(get_engine(url)) as session:
        job = QueuedJob(spec=SPEC, device_kind="cpu", **fields)
        session.add(job)
        session.flush()
        return job.id


def _get(url: str, job_id: int) -> QueuedJob:
    with session_scope(get_engine(url)) as session:
        return session.get(QueuedJob, job_id)  # type: ignore[return-value]


def test_the_sweep_requeues_a_silent_first_attempt_fails_a_later_one_and_spares_the_living(db_url: str) -> None:
    ago = lambda s: NOW - dt.timedelta(seconds=s)
    first = _add(db_url, status="running", attempts=1, worker="wa@h1", heartbeat_at=ago(600), updated_at=ago(900))
    second = _add(db_url, status="running", attempts=2, worker="wb@h2", heartbeat_at=ago(61), updated_at=ago(900))
    alive = _add(db_url, status="running", attempts=1, worker="wc@h3", heartbeat_at=ago(59), updated_at=ago(900))
    # A job reported running by a worker that predates heartbeats: silent since its last update.
    legacy = _add(db_url, status="running", attempts=1, worker="old@h4", heartbeat_at=None, updated_at=ago(120))
    waiting = _add(db_url, status="queued", attempts=0, updated_at=ago(9999))
    finished = _add(db_url, status="done", attempts=1, worker="wd@h5", heartbeat_at=ago(9999), updated_at=ago(9999))

    with session_scope(get_engine(db_url)) as session:
        swept = jobs.sweep_stalled_jobs(session, timeout_s=60, now=NOW)
    assert [(s.job_id, s.status) for s in swept] == [(first, "queued"), (second, "failed"), (legacy, "queued")]

    requeued = _get(db_url, first)
    assert (requeued.status, requeued.heartbeat_at, requeued.worker) == ("queued", None, "wa@h1")
    assert requeued.error == "no heartbeat from worker wa@h1 for 600 s (timeout 60 s) on attempt 1: queued again"
    failed = _get(db_url, second)
    assert failed.status == "failed"
    assert failed.error == "no heartbeat from worker wb@h2 for 61 s (timeout 60 s) on attempt 2: failed"
    assert _get(db_url, legacy).error.startswith("no heartbeat from worker old@h4 for 120 s")  # type: ignore[union-attr]
    for job_id, status in ((alive, "running"), (waiting, "queued"), (finished, "done")):
        row = _get(db_url, job_id)
        assert (row.status, row.error) == (status, None), job_id

    # A heartbeat moves the deadline: a minute later the living job is still alive only if it beat meanwhile.
    with session_scope(get_engine(db_url)) as session:
        assert jobs.record_heartbeat(session, job_id=alive)
        assert not jobs.record_heartbeat(session, job_id=waiting), "only a running job beats"
    with session_scope(get_engine(db_url)) as session:
        assert jobs.sweep_stalled_jobs(session, timeout_s=60, now=dt.datetime.now(dt.timezone.utc)) == []
        later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=61)
        assert [s.job_id for s in jobs.sweep_stalled_jobs(session, timeout_s=60, now=later)] == [alive]


def test_a_worker_beats_through_the_api_and_learns_of_a_cancel(
    db_url: str, app_client: Callable[..., TestClient], build
) -> None:  # type: ignore[no-untyped-def]
    client = app_client(dispatch_jobs=False)
    auth = {"Authorization": f"Bearer {build.token(db_url)}"}
    job_id = _add(db_url, status="queued", attempts=0)
    assert client.post(f"/api/v1/jobs/{job_id}/heartbeat").status_code == 401
    assert client.post("/api/v1/jobs/999999/heartbeat", headers=auth).status_code == 404
    queued = client.post(f"/api/v1/jobs/{job_id}/heartbeat", headers=auth)
    assert queued.status_code == 200 and queued.json()["heartbeat_at"] is None, "a queued job does not beat"

    running = client.post(f"/api/v1/jobs/{job_id}/status", json={"status": "running", "worker": "w1"}, headers=auth)
    first = dt.datetime.fromisoformat(running.json()["heartbeat_at"])
    time.sleep(0.05)
    beat = client.post(f"/api/v1/jobs/{job_id}/heartbeat", headers=auth).json()
    assert beat["status"] == "running" and dt.datetime.fromisoformat(beat["heartbeat_at"]) > first

    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth).json()["status"] == "cancelled"
    after = client.post(f"/api/v1/jobs/{job_id}/heartbeat", headers=auth).json()
    assert (after["status"], after["heartbeat_at"]) == ("cancelled", None)


def test_the_server_sweeps_while_it_serves_and_shows_why(db_url: str, build) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(db_url=db_url, dispatch_jobs=False, job_heartbeat_timeout_s=1.0)
    auth = {"Authorization": f"Bearer {build.token(db_url)}"}
    with TestClient(create_app(settings)) as client:  # `with`: the app's lifespan, where the sweeper runs
        beating = _add(db_url, status="queued", attempts=0)
        silent = _add(db_url, status="queued", attempts=0)
        for job_id in (beating, silent):
            client.post(f"/api/v1/jobs/{job_id}/status", json={"status": "running", "worker": "w1"}, headers=auth)
        deadline = time.monotonic() + 3.0  # three timeouts: the silent job is swept, the beating one is not
        while time.monotonic() < deadline:
            assert client.post(f"/api/v1/jobs/{beating}/heartbeat", headers=auth).json()["status"] == "running"
            time.sleep(0.2)
        job = client.get(f"/api/v1/jobs/{silent}").json()
        assert job["status"] == "queued", job
        assert job["error"].startswith("no heartbeat from worker w1 for ") and job["error"].endswith("queued again")
        page = client.get("/jobs", headers={"Accept": "text/html"}).text
        assert "no heartbeat from worker w1" in page

        # Its second attempt fails the same way.
        client.post(f"/api/v1/jobs/{silent}/status", json={"status": "running", "worker": "w2"}, headers=auth)

        def failed() -> dict | None:
            assert client.post(f"/api/v1/jobs/{beating}/heartbeat", headers=auth).json()["status"] == "running"
            job = client.get(f"/api/v1/jobs/{silent}").json()
            return job if job["status"] != "running" else None

        job = wait_for("the second silent attempt to be swept", failed, timeout=10, every=0.2)  # type: ignore[assignment]
        assert job["status"] == "failed" and job["attempts"] == 2, job
        assert job["error"].startswith("no heartbeat from worker w2 for ") and job["error"].endswith("failed")
        assert client.get(f"/api/v1/jobs/{beating}").json()["status"] == "running"


def test_a_bad_heartbeat_timeout_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from deltabench.harness.errors import BadInput

    for bad in ("0", "-5", "soon", "inf", "nan"):
        monkeypatch.setenv(jobs.HEARTBEAT_TIMEOUT_ENV, bad)
        with pytest.raises(BadInput, match=f"DELTABENCH_JOB_HEARTBEAT_TIMEOUT_S={bad!r}: give a positive"):
            Settings.from_env()
    monkeypatch.setenv(jobs.HEARTBEAT_TIMEOUT_ENV, "42")
    assert Settings.from_env().job_heartbeat_timeout_s == 42.0
    monkeypatch.delenv(jobs.HEARTBEAT_TIMEOUT_ENV)
    assert Settings.from_env().job_heartbeat_timeout_s == jobs.DEFAULT_HEARTBEAT_TIMEOUT_S == 300.0
