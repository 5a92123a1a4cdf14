"""The embedded default: ``deltabench serve`` without a broker runs submitted jobs on its own local worker.

Real components throughout: the server is a ``deltabench serve`` subprocess on an SQLite file, jobs are
submitted through its API, and each job runs in its own process (and each case in another).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import free_port, pid_alive, wait_for
from sqlalchemy import func, select

from deltabench.db.engine import get_engine, session_scope
from deltabench.db.models import QueuedJob, Result, Run
from deltabench.fleet.dispatch import LocalWorker
from deltabench.web.security.tokens import create_token

SLOW_IMPLS = '''
"""A gdn impl that sleeps in its first call while the file `slow` (its content: seconds) exists."""
import os, pathlib, time
from deltabench.harness.registry import register_impl
from deltabench.kernels.gdn.torch.torch_chunk import gdn_torch_chunk

CONTROL = pathlib.Path({control!r})

@register_impl("gdn", "slow_once", backend="torch", devices=("cpu", "cuda"), dtypes=("fp32", "bf16", "fp16"))
def slow_once(q, k, v, g, beta, scale=None, initial_state=None):
    gate = CONTROL / "slow"
    if gate.exists():
        (CONTROL / f"started-{{os.getpid()}}").write_text(str(os.getpid()))
        time.sleep(float(gate.read_text()))
    return gdn_torch_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)
'''


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """``deltabench serve`` on a fresh SQLite file, no broker: (base URL, write token, db path)."""
    db = str(tmp_path / "serve.db")
    with session_scope(get_engine(db)) as session:
        token = create_token(session, name="local-test")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DELTABENCH_BROKER", "DELTABENCH_DB")}
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltabench.cli.app", "serve", "--db", db, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        try:
            return httpx.get(f"{base}/api/v1/jobs", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for("the server to answer", up, timeout=60)
        yield base, token, db
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_serve_runs_a_submitted_job_on_its_local_worker(served: tuple[str, str, str]) -> None:
    base, token, _db = served
    auth = {"Authorization": f"Bearer {token}"}
    spec = {"suite": "smoke", "ops": ["gdn"], "impls": ["torch_chunk"], "dtypes": ["fp32"], "modes": ["fwd"]}
    submitted = httpx.post(f"{base}/api/v1/jobs", json={**spec, "device_kind": "cpu"}, headers=auth, timeout=10)
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]

    def finished() -> dict | None:
        job = httpx.get(f"{base}/api/v1/jobs/{job_id}", timeout=5).json()
        return job if job["status"] in ("done", "failed", "cancelled") else None

    job = wait_for("the job to finish", finished, timeout=100, every=0.5)
    assert job["status"] == "done", job
    assert job["attempts"] == 1 and job["worker"].startswith("local@")
    run = httpx.get(f"{base}/api/v1/runs/{job['run_id']}", timeout=10).json()
    assert run["run_id"] == job["run_id"]
    assert run["meta"]["queue_job_id"] == job_id and run["meta"]["complete"] is True
    [result] = run["jobs"]
    assert (result["impl"], result["case"]["op"], result["case"]["dtype"]) == ("torch_chunk", "gdn", "fp32")
    assert result["status"] == "ok", result["reason"]
    assert result["timing"]["median_ms"] > 0 and result["verification"]
    listed = httpx.get(f"{base}/api/v1/runs", timeout=10).json()
    assert [r["run_id"] for r in listed["data"]] == [job["run_id"]]
    page = httpx.get(f"{base}/runs/{job['run_id']}", headers={"Accept": "text/html"}, timeout=10)
    assert page.status_code == 200 and "torch_chunk" in page.text

    # The stored run woke the server's refresh of the regressions table: well before its 30 s periodic look.
    def refreshed() -> dict | None:
        answer = httpx.get(f"{base}/api/v1/regressions", timeout=10).json()
        return answer if answer["pending_series"] == 0 else None

    regressions = wait_for("the regressions table to be refreshed", refreshed, timeout=10, every=0.2)
    assert regressions["series_scanned"] == 1


def test_local_worker_requeues_orphans_honours_cancel_and_refuses_kinds_it_lacks(tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.mkdir()
    (control / "slow").write_text("600")
    module = tmp_path / "slow_impls.py"
    module.write_text(SLOW_IMPLS.format(control=str(control)))
    url = f"sqlite:///{tmp_path / 'local.db'}"
    engine = get_engine(url)
    spec = {
        "suite": None,
        "ops": ["gdn"],
        "impls": ["slow_once"],
        "shapes": ["B=1,T=16,H=1,K=8,V=8"],
        "dtypes": ["fp32"],
        "modes": ["fwd"],
        "device_kind": "cpu",
    }
    worker = LocalWorker(url, imports=[str(module)], poll_s=0.3)
    with session_scope(engine) as session:
        # What a server that crashed mid-job leaves behind: a job `running` on this host's local worker.
        orphan = QueuedJob(spec=spec, device_kind="cpu", status="running", attempts=1, worker=worker.name)
        elsewhere = QueuedJob(spec={**spec, "device_kind": "h200"}, device_kind="h200", status="queued")
        session.add_all([orphan, elsewhere])
        session.flush()
        orphan_id, elsewhere_id = orphan.id, elsewhere.id

    def job(job_id: int) -> QueuedJob:
        with session_scope(engine) as session:
            return session.get(QueuedJob, job_id)  # type: ignore[return-value]

    worker.start()
    try:
        started = wait_for("the slow case to start", lambda: sorted(control.glob("started-*")), timeout=90)
        case_pid = int(started[0].read_text())
        running = job(orphan_id)
        assert (running.status, running.attempts) == ("running", 2), "re-queued, then claimed again"
        refused = job(elsewhere_id)
        assert refused.status == "failed" and "no broker is configured" in (refused.error or "")

        t0 = time.monotonic()
        with session_scope(engine) as session:  # what POST /jobs/{id}/cancel does
            session.get(QueuedJob, orphan_id).status = "cancelled"  # type: ignore[union-attr]
            session.get(QueuedJob, orphan_id).updated_at = dt.datetime.now(dt.timezone.utc)  # type: ignore[union-attr]
        wait_for("the cancelled case's process to be killed", lambda: not pid_alive(case_pid), timeout=20)
        assert time.monotonic() - t0 < 20
        wait_for("the worker's slot to free up", lambda: not worker.slots[0].busy, timeout=20)
    finally:
        worker.stop()
    ended = job(orphan_id)
    assert ended.status == "cancelled" and ended.run_id is None
    with session_scope(engine) as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 0, "a cancelled job stores nothing"
        assert session.scalar(select(func.count()).select_from(Result)) == 0
