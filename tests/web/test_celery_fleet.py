"""The fleet path against real components: the Redis at 127.0.0.1:6379 (its db 13, flushed), a real server
(uvicorn subprocess on an SQLite file, broker configured) and real ``deltabench worker`` processes.

One worker is SIGKILLed while its job sleeps in a deliberately slow impl: the job must be delivered again, to a
new worker, run there, and its results stored exactly once (and a failing case is a result, not a lost job).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from processes import free_port, pid_alive, stop_processes, wait_for
from sqlalchemy import func, select

from deltabench.db.engine import get_engine, session_scope
from deltabench.db.models import QueuedJob, Result, Run
from deltabench.web.security.tokens import create_token

pytestmark = pytest.mark.redis

BROKER = "redis://127.0.0.1:6379/13"

IMPLS = '''
"""gdn impls for the fleet test: one sleeps in its first call while `slow` exists, one is 10% off."""
import os, pathlib, time
from deltabench.harness.registry import register_impl
from deltabench.kernels.gdn.torch.torch_chunk import gdn_torch_chunk

CONTROL = pathlib.Path({control!r})
ANY = dict(backend="torch", devices=("cpu", "cuda"), dtypes=("fp32", "bf16", "fp16"))

@register_impl("gdn", "fleet_slow_once", **ANY)
def fleet_slow_once(q, k, v, g, beta, scale=None, initial_state=None):
    gate = CONTROL / "slow"
    if gate.exists():
        (CONTROL / f"started-{{os.getpid()}}").write_text(str(os.getpid()))
        time.sleep(float(gate.read_text()))
    return gdn_torch_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)

@register_impl("gdn", "fleet_off_by_ten", **ANY)
def fleet_off_by_ten(q, k, v, g, beta, scale=None, initial_state=None):
    o, state = gdn_torch_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)
    return o * 1.1, state
'''

# The server must know the test's impls too (it checks a job's impl names when it is submitted).
SERVER = """
import sys, uvicorn
from deltabench.harness.registry import load_module
load_module(sys.argv[1])
from deltabench.web.app import create_app
from deltabench.web.config import Settings
app = create_app(Settings.from_env(db_url=sys.argv[2]))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
"""


@pytest.fixture
def redis_db() -> Iterator[None]:
    """Redis db 13, empty before and after the test (skips when the Redis is not there)."""
    import redis

    client = redis.Redis.from_url(BROKER, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis at 127.0.0.1:6379 not reachable: {exc}")
    client.flushdb()
    yield
    client.flushdb()
    client.close()


class Fleet:
    """The processes of one test: a server and workers, all stopped at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.control = tmp / "control"
        self.control.mkdir()
        self.impls = tmp / "fleet_impls.py"
        self.impls.write_text(IMPLS.format(control=str(self.control)))
        self.db = str(tmp / "fleet.db")
        with session_scope(get_engine(self.db)) as session:
            self.token = create_token(session, name="fleet-test")
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "DELTABENCH_DB"},
            "DELTABENCH_BROKER": BROKER,
            # Redeliver an unacknowledged job 3 s after it was taken, looking every second (production: hours).
            "DELTABENCH_BROKER_VISIBILITY_S": "3",
            "DELTABENCH_BROKER_RESTORE_S": "1",
        }
        self.procs: list[subprocess.Popen] = []
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.tmp / f"{name}.log", "w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.tmp)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def start_server(self) -> None:
        self._spawn("server", [sys.executable, "-c", SERVER, str(self.impls), self.db, str(self.port)])

    def wait_server(self) -> None:
        def up() -> bool:
            try:
                return httpx.get(f"{self.base}/api/v1/jobs", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for("the server", up, timeout=60)

    def start_worker(self, name: str) -> subprocess.Popen:
        argv = [sys.executable, "-m", "deltabench.cli.app", "worker", "--queue", "cpu", "--server", self.base]
        argv += ["--token", self.token, "--import", str(self.impls), "--name", name]
        return self._spawn(name, argv)

    def wait_ready(self, name: str, proc: subprocess.Popen) -> None:
        def ready() -> bool:
            assert proc.poll() is None, self.log(name)
            return " ready." in self.log(name)

        wait_for(f"worker {name} to be ready", ready, timeout=60)

    def job(self, job_id: int) -> dict:
        return httpx.get(f"{self.base}/api/v1/jobs/{job_id}", timeout=5).json()

    def stop(self) -> None:
        stop_processes(self.procs, signal.SIGTERM)


@pytest.fixture
def fleet(tmp_path: Path, redis_db: None) -> Iterator[Fleet]:
    """A fleet on a fresh SQLite file and Redis db 13."""
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        f.stop()


def test_a_killed_worker_s_job_is_redelivered_and_stored_once(fleet: Fleet) -> None:
    (fleet.control / "slow").write_text("600")
    fleet.start_server()
    first = fleet.start_worker("wa")
    fleet.wait_server()
    fleet.wait_ready("wa", first)

    spec = {
        "ops": ["gdn"],
        "impls": ["fleet_slow_once", "fleet_off_by_ten"],
        "shapes": ["B=1,T=24,H=1,K=8,V=8"],
        "dtypes": ["fp32"],
        "modes": ["fwd"],
        "device_kind": "cpu",
    }
    auth = {"Authorization": f"Bearer {fleet.token}"}
    refused = httpx.post(f"{fleet.base}/api/v1/jobs", json=spec, timeout=10)
    assert refused.status_code == 401, "submitting needs a token"
    submitted = httpx.post(f"{fleet.base}/api/v1/jobs", json=spec, headers=auth, timeout=10)
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]

    # The first worker takes the job and sleeps in the slow impl's first call: kill it there.
    started = wait_for("the slow case to start", lambda: sorted(fleet.control.glob("started-*")), timeout=90)
    case_pid = int(started[0].read_text())
    taken = fleet.job(job_id)
    assert taken["status"] == "running" and taken["worker"].startswith("wa@"), taken
    first.send_signal(signal.SIGKILL)
    first.wait()
    (fleet.control / "slow").unlink()  # the next delivery runs at full speed
    wait_for("the killed worker's case process to end", lambda: not pid_alive(case_pid), timeout=20)

    # A new worker gets the job again (late acknowledgement) and finishes it.
    second = fleet.start_worker("wb")

    def finished() -> dict | None:
        assert second.poll() is None, fleet.log("wb")
        job = fleet.job(job_id)
        return job if job["status"] in ("done", "failed", "cancelled") else None

    job = wait_for("the job to be redelivered and finish", finished, timeout=120, every=0.5)
    assert job["status"] == "done", (job, fleet.log("wb")[-3000:])
    assert job["worker"].startswith("wb@")

    run = httpx.get(f"{fleet.base}/api/v1/runs/{job['run_id']}", timeout=10).json()
    assert run["meta"]["queue_job_id"] == job_id
    assert run["meta"]["worker"].startswith("wb@") and run["meta"]["delivery"] == 2
    by_impl = {r["impl"]: r for r in run["jobs"]}
    assert sorted(by_impl) == ["fleet_off_by_ten", "fleet_slow_once"]
    assert by_impl["fleet_slow_once"]["status"] == "ok", by_impl["fleet_slow_once"]["reason"]
    wrong = by_impl["fleet_off_by_ten"]
    assert wrong["status"] == "incorrect" and wrong["reason"].startswith("failed the gate"), "a failure is a result"
    assert wrong["timing"] is None

    # Posting the document again (a worker retrying its upload) stores nothing new.
    again = httpx.post(f"{fleet.base}/api/v1/runs", json={"documents": [run]}, headers=auth, timeout=10)
    assert again.status_code == 201, again.text
    engine = get_engine(fleet.db)
    with session_scope(engine) as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 1
        job_ids = session.scalars(select(Result.job_id)).all()
        assert len(job_ids) == 2 and len(set(job_ids)) == 2, "each case stored exactly once"
        assert all(j.startswith(job["run_id"]) for j in job_ids)
        assert session.get(QueuedJob, job_id).status == "done"  # type: ignore[union-attr]


def test_a_cancelled_job_s_case_ends_within_a_heartbeat(fleet: Fleet) -> None:
    """The README's "a fleet worker notices a cancel within about 6 s": the worker learns of it from the reply to
    its next heartbeat (every DELTABENCH_JOB_HEARTBEAT_S, 5 s by default) and kills the case's process."""
    (fleet.control / "slow").write_text("600")
    fleet.env.pop("DELTABENCH_JOB_HEARTBEAT_S", None)  # the default interval, which the README's figure is for
    fleet.start_server()
    worker = fleet.start_worker("wc")
    fleet.wait_server()
    fleet.wait_ready("wc", worker)
    spec = {
        "ops": ["gdn"],
        "impls": ["fleet_slow_once"],
        "shapes": ["B=1,T=24,H=1,K=8,V=8"],
        "dtypes": ["fp32"],
        "modes": ["fwd"],
        "device_kind": "cpu",
    }
    auth = {"Authorization": f"Bearer {fleet.token}"}
    submitted = httpx.post(f"{fleet.base}/api/v1/jobs", json=spec, headers=auth, timeout=10)
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]
    started = wait_for("the slow case to start", lambda: sorted(fleet.control.glob("started-*")), timeout=90)
    case_pid = int(started[0].read_text())

    cancelled_at = time.monotonic()
    cancel = httpx.post(f"{fleet.base}/api/v1/jobs/{job_id}/cancel", headers=auth, timeout=10)
    assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled", cancel.text
    wait_for("the cancelled case's process to end", lambda: not pid_alive(case_pid), timeout=30, every=0.1)
    noticed_s = time.monotonic() - cancelled_at
    # one heartbeat interval, the worker's poll (at most 1 s), and the kill
    assert noticed_s < 7.0, f"the case ran on {noticed_s:.1f} s after the cancel"
    assert worker.poll() is None, fleet.log("wc")
    assert fleet.job(job_id)["status"] == "cancelled"
