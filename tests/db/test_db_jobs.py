"""The job queue's state machine (deltabench.db.jobs) on SQLite and PostgreSQL: claims, ends, cancels, orphans,
unserved kinds. (The heartbeat sweep is tested with the server in tests/web/test_job_heartbeats.py.)"""

from __future__ import annotations

from deltabench.db import jobs
from deltabench.db.engine import get_engine, session_scope
from deltabench.db.models import QueuedJob

SPEC = {"ops": ["gdn"], "shapes": ["B=1,T=16,H=1,K=8,V=8"]}


def _add(url: str, kind: str = "cpu", status: str = "queued") -> int:
    with session_scope(get_engine(url)) as session:
        return jobs.create_job(session, spec={**SPEC, "device_kind": kind}, device_kind=kind, submitted_by="t").id


def _get(url: str, job_id: int) -> QueuedJob:
    with session_scope(get_engine(url)) as session:
        return session.get(QueuedJob, job_id)  # type: ignore[return-value]


def test_claims_take_the_oldest_job_of_a_served_kind_once(db_url: str) -> None:
    older, gpu, newer = _add(db_url), _add(db_url, "h200"), _add(db_url)
    engine = get_engine(db_url)
    with session_scope(engine) as session:
        first = jobs.claim_job(session, device_kinds=["cpu"], worker="w1")
    with session_scope(engine) as session:
        second = jobs.claim_job(session, device_kinds=["cpu"], worker="w2")
    with session_scope(engine) as session:
        assert jobs.claim_job(session, device_kinds=["cpu"], worker="w3") is None
    assert (first.id, first.status, first.attempts, first.worker) == (older, "running", 1, "w1")  # type: ignore[union-attr]
    assert first.heartbeat_at is not None  # type: ignore[union-attr]
    assert (second.id, second.worker) == (newer, "w2")  # type: ignore[union-attr]
    assert _get(db_url, gpu).status == "queued"


def test_an_end_never_overrides_a_cancel_and_orphans_go_back_to_the_queue(db_url: str) -> None:
    done, cancelled, orphan = _add(db_url), _add(db_url), _add(db_url)
    engine = get_engine(db_url)
    for _ in range(3):
        with session_scope(engine) as session:
            jobs.claim_job(session, device_kinds=["cpu"], worker="local@h")
    with session_scope(engine) as session:
        assert jobs.cancel_job(session, job=session.get(QueuedJob, cancelled))  # type: ignore[arg-type]
    with session_scope(engine) as session:
        assert jobs.finish_job(session, job_id=done, status="done", run_id="r1")
        assert not jobs.finish_job(session, job_id=cancelled, status="done", run_id="r2"), "a cancel wins"
        assert jobs.requeue_jobs_of(session, worker="elsewhere") == 0
        assert jobs.requeue_jobs_of(session, worker="local@h") == 1
    assert (_get(db_url, done).status, _get(db_url, done).run_id, _get(db_url, done).heartbeat_at) == (
        "done",
        "r1",
        None,
    )
    assert (_get(db_url, cancelled).status, _get(db_url, cancelled).run_id) == ("cancelled", None)
    assert (_get(db_url, orphan).status, _get(db_url, orphan).attempts) == ("queued", 1)


def test_jobs_of_kinds_nobody_serves_fail_with_the_reason(db_url: str) -> None:
    cpu, tpu = _add(db_url), _add(db_url, "tpu-v5e")
    with session_scope(get_engine(db_url)) as session:
        assert jobs.fail_unserved_jobs(session, served_kinds=["cpu"], reason="no tpu here") == 1
        assert jobs.fail_unserved_jobs(session, served_kinds=["cpu"], reason="no tpu here") == 0
    assert (_get(db_url, tpu).status, _get(db_url, tpu).error) == ("failed", "no tpu here")
    assert _get(db_url, cpu).status == "queued"
