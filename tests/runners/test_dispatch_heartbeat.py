"""The local worker's heartbeats, on SQLite and PostgreSQL, against the server's sweep (``web.job_sweeper``).

Real processes: a local worker in its own process, killed with SIGKILL mid-job (its job process and case die
with it); the sweep then fails the job, naming the silent worker, once the timeout has passed and not before.
A job that runs for several timeouts on a live worker is never touched.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pg_fixtures
import pytest
from processes import pid_alive, wait_for

from deltabench.db.engine import get_engine, session_scope
from deltabench.db.models import QueuedJob
from deltabench.fleet.dispatch import LocalWorker, Slot
from deltabench.web.job_sweeper import JobSweeper

# The shared database fixtures (tests/pg_fixtures.py), registered here by name.
db_url, pg_server, pg_url = pg_fixtures.db_url, pg_fixtures.pg_server, pg_fixtures.pg_url
sqlite_url = pg_fixtures.sqlite_url


TIMEOUT_S = 3.0
SLOW_IMPLS = '''
"""A gdn impl whose first call sleeps (control/slow: seconds), once per process group's job: later calls are fast."""
import os, pathlib, time
from deltabench.harness.registry import register_impl
from deltabench.kernels.gdn.torch.torch_chunk import gdn_torch_chunk

CONTROL = pathlib.Path({control!r})

@register_impl("gdn", "slow_once", backend="torch", devices=("cpu",), dtypes=("fp32",))
def slow_once(q, k, v, g, beta, scale=None, initial_state=None):
    gate, started = CONTROL / "slow", CONTROL / f"started-{{os.getpid()}}"
    if gate.exists() and not started.exists():
        started.write_text(str(os.getpid()))
        time.sleep(float(gate.read_text()))
    return gdn_torch_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)
'''
SPEC = {
    "ops": ["gdn"],
    "impls": ["slow_once"],
    "shapes": ["B=1,T=16,H=1,K=8,V=8"],
    "dtypes": ["fp32"],
    "modes": ["fwd"],
    "device_kind": "cpu",
}
WORKER = """
import sys, time
from deltabench.fleet.dispatch import LocalWorker, Slot
LocalWorker(sys.argv[1], imports=[sys.argv[2]], slots=[Slot("cpu", "cpu", frozenset({"cpu"}))], poll_s=0.3,
            heartbeat_s=0.3).start()
time.sleep(3600)
"""


@pytest.fixture
def slow_impls(tmp_path: Path) -> tuple[Path, Path]:
    """(the control folder, the impls module): `slow_once` sleeps while control/slow names seconds."""
    control = tmp_path / "control"
    control.mkdir()
    module = tmp_path / "slow_impls.py"
    module.write_text(SLOW_IMPLS.format(control=str(control)))
    return control, module


@pytest.fixture
def sweeper(db_url: str) -> Iterator[JobSweeper]:
    """The server's sweep on `db_url` with a 3 s timeout (a job queued again waits for a local worker)."""
    sweeper = JobSweeper(get_engine(db_url), timeout_s=TIMEOUT_S, redispatch=lambda _job_id: None).start()
    yield sweeper
    sweeper.stop()


def _add_job(url: str, **fields: object) -> int:
    with session_scope(get_engine(url)) as session:
        job = QueuedJob(spec=SPEC, device_kind="cpu", **fields)
        session.add(job)
        session.flush()
        return job.id


def _job(url: str, job_id: int) -> QueuedJob:
    with session_scope(get_engine(url)) as session:
        return session.get(QueuedJob, job_id)  # type: ignore[return-value]


def test_a_killed_local_worker_s_job_fails_after_the_timeout(
    db_url: str, slow_impls: tuple[Path, Path], sweeper: JobSweeper, tmp_path: Path
) -> None:
    control, module = slow_impls
    (control / "slow").write_text("600")
    # Its second attempt (the first one's worker went silent too): this time the sweep fails it.
    job_id = _add_job(db_url, status="queued", attempts=1)
    with open(tmp_path / "worker.log", "w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-c", WORKER, db_url, str(module)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        started = wait_for("the slow case to start", lambda: sorted(control.glob("started-*")), timeout=90)
        case_pid = int(started[0].read_text())
        time.sleep(2 * TIMEOUT_S)  # a live worker's job outlives the timeout
        running = _job(db_url, job_id)
        assert (running.status, running.attempts, running.error) == ("running", 2, None), running.error
        assert running.worker.startswith("local@") and running.heartbeat_at is not None  # type: ignore[union-attr]

        worker.send_signal(signal.SIGKILL)
        worker.wait()
        killed = time.monotonic()
        wait_for("the killed worker's case to end", lambda: not pid_alive(case_pid), timeout=20)

        def swept() -> QueuedJob | None:
            job = _job(db_url, job_id)
            return job if job.status != "running" else None

        job: QueuedJob = wait_for("the sweep to fail the job", swept, timeout=TIMEOUT_S + 10, every=0.1)  # type: ignore[assignment]
        silent_s = time.monotonic() - killed
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert job.status == "failed", job.error
    assert job.error.startswith(f"no heartbeat from worker {running.worker} for ")  # type: ignore[union-attr]
    assert job.error.endswith(f"(timeout {TIMEOUT_S:g} s) on attempt 2: failed"), job.error  # type: ignore[union-attr]
    # Its last beat came at most 0.3 s (plus a poll) before the kill: failed no sooner than the timeout allows.
    assert silent_s > TIMEOUT_S - 1.5, silent_s


def test_a_long_job_of_a_live_local_worker_is_never_swept(
    db_url: str, slow_impls: tuple[Path, Path], sweeper: JobSweeper
) -> None:
    control, module = slow_impls
    (control / "slow").write_text(str(2.5 * TIMEOUT_S))
    job_id = _add_job(db_url, status="queued", attempts=0)
    cpu = Slot(name="cpu", device="cpu", kinds=frozenset({"cpu"}))
    worker = LocalWorker(db_url, imports=[str(module)], slots=[cpu], poll_s=0.3, heartbeat_s=0.3).start()
    try:

        def finished() -> QueuedJob | None:
            job = _job(db_url, job_id)
            return job if job.status not in ("queued", "running") else None

        job: QueuedJob = wait_for("the job to finish", finished, timeout=120, every=0.2)  # type: ignore[assignment]
    finally:
        worker.stop()
    assert sorted(control.glob("started-*")), "the case slept through more than two timeouts"
    assert (job.status, job.attempts, job.error) == ("done", 1, None), job.error
    assert job.heartbeat_at is None and job.run_id
