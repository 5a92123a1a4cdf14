"""The fleet guide's commands, run as written: a PostgreSQL store, a Redis broker, ``deltabench token create``,
``deltabench serve`` and ``deltabench worker``, then a job submitted through the API is done, its results stored.

The commands are read from docs/guide/fleet.md's code block that starts the fleet (the first with ``deltabench
worker``), so the guide cannot drift from what works. Only the block's placeholders are replaced, each of which
must still be in the guide: the database and broker URLs, the server's port and address (a free port on this machine),
the token (the one ``token create`` printed) and the worker's queue (``cpu``: this machine has no H200).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pg_fixtures
import pytest
import test_celery_fleet
from processes import free_port, stop_processes, wait_for
from sqlalchemy import select

from deltabench.db.engine import get_engine, session_scope
from deltabench.db.models import Result, Run

pytestmark = pytest.mark.redis
pg_server, redis_db = pg_fixtures.pg_server, test_celery_fleet.redis_db

FLEET_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "fleet.md"
DB_PLACEHOLDER = "postgresql+psycopg://bench@db-host/deltabench"
BROKER_PLACEHOLDER = "redis://redis-host:6379/0"
PORT_PLACEHOLDER = "8000"
SERVER_PLACEHOLDER = "http://bench-host:8000"
TOKEN_PLACEHOLDER = "dbt_..."
QUEUE_PLACEHOLDER = "h200"
SPEC = {
    "ops": ["gdn"],
    "impls": ["torch_chunk"],
    "shapes": ["B=1,T=24,H=1,K=8,V=8"],
    "dtypes": ["fp32"],
    "modes": ["fwd"],
    "device_kind": "cpu",
}


def fleet_block(readme: str) -> list[str]:
    """The lines of the guide's first shell block that runs ``deltabench worker`` (comments left in)."""
    for block in re.findall(r"```bash\n(.*?)```", readme, flags=re.DOTALL):
        if "deltabench worker" in block:
            return [line for line in block.splitlines() if line.strip()]
    raise AssertionError("docs/guide/fleet.md has no ```bash block with `deltabench worker`")


def parse(line: str) -> tuple[dict[str, str], list[str]]:
    """A shell line of the block as (environment assignments, argv): ``export K=V`` or ``K=V ... cmd args``."""
    words = shlex.split(line, comments=True)
    if words and words[0] == "export":
        return dict(w.split("=", 1) for w in words[1:]), []
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    return env, words


class Shell:
    """Runs the block's lines one after another like a shell: exports persist, commands see them."""

    def __init__(self, tmp: Path, replace: dict[str, str], words: dict[str, str]) -> None:
        self.tmp = tmp
        self.replace = replace  # placeholders inside words (URLs)
        self.words = words  # placeholders that are whole words (a port, a queue, the token)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DELTABENCH_")}
        self.procs: list[subprocess.Popen] = []
        # `deltabench` is this environment's console script, as a user's shell would find it.
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"

    def _sub(self, word: str) -> str:
        if word in self.words:
            return self.words[word]
        for placeholder, value in self.replace.items():
            word = word.replace(placeholder, value)
        return word

    def command(self, line: str) -> tuple[dict[str, str], list[str]]:
        """Apply `line`'s exports; the environment and argv its command runs with (argv empty for an export)."""
        assignments, argv = parse(line)
        assignments = {k: self._sub(v) for k, v in assignments.items()}
        if not argv:
            self.env.update(assignments)
            return self.env, []
        if argv and argv[0] == "deltabench":
            argv[0] = str(Path(sys.executable).parent / "deltabench")
        return {**self.env, **assignments}, [self._sub(w) for w in argv]

    def run(self, line: str) -> str:
        env, argv = self.command(line)
        done = subprocess.run(argv, env=env, cwd=self.tmp, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        return done.stdout

    def start(self, name: str, line: str) -> subprocess.Popen:
        env, argv = self.command(line)
        with open(self.tmp / f"{name}.log", "w") as log:
            proc = subprocess.Popen(argv, env=env, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        stop_processes(self.procs, signal.SIGINT)


@pytest.fixture
def shell(tmp_path: Path, redis_db: None, pg_server) -> Iterator[Shell]:  # type: ignore[no-untyped-def]
    """A shell whose placeholders point at a fresh PostgreSQL schema, Redis db 13 and a free port."""
    port = str(free_port())
    replace = {
        DB_PLACEHOLDER: pg_server(),
        BROKER_PLACEHOLDER: test_celery_fleet.BROKER,
        SERVER_PLACEHOLDER: f"http://127.0.0.1:{port}",
    }
    sh = Shell(tmp_path, replace, {PORT_PLACEHOLDER: port, QUEUE_PLACEHOLDER: "cpu"})
    try:
        yield sh
    finally:
        sh.stop()


def test_the_readme_fleet_runs_word_for_word(shell: Shell) -> None:
    lines = fleet_block(FLEET_GUIDE.read_text())
    text = "\n".join(lines)
    for placeholder in (DB_PLACEHOLDER, BROKER_PLACEHOLDER, SERVER_PLACEHOLDER, TOKEN_PLACEHOLDER):
        assert placeholder in text, f"the guide's fleet block no longer has {placeholder!r}: update this test"
    commands = [line for line in lines if parse(line)[1]]
    kinds = [parse(line)[1][:2] for line in commands]
    assert kinds == [["deltabench", "token"], ["deltabench", "serve"], ["deltabench", "worker"]], kinds
    token_line, serve_line, worker_line = commands
    assert PORT_PLACEHOLDER in parse(serve_line)[1] and QUEUE_PLACEHOLDER in parse(worker_line)[1]

    for line in lines:
        if not parse(line)[1]:
            shell.command(line)  # the exports
    assert shell.env["DELTABENCH_DB"].startswith("postgresql+psycopg://postgres@127.0.0.1")
    [token] = re.findall(r"dbt_\S+", shell.run(token_line))
    shell.words[TOKEN_PLACEHOLDER] = token
    for line in lines:
        if not parse(line)[1]:
            shell.command(line)  # again: an export of the token takes the one just made
    assert shell.env.get("DELTABENCH_TOKEN") == token, "the worker's token goes through the environment"
    assert "--token" not in parse(worker_line)[1], "a token on the command line is visible in ps"
    server = shell.start("serve", serve_line)
    base = shell.replace[SERVER_PLACEHOLDER]

    def up() -> bool:
        assert server.poll() is None, shell.log("serve")
        try:
            return httpx.get(f"{base}/api/v1/jobs", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for("the server", up, timeout=90)
    worker = shell.start("worker", worker_line)

    def ready() -> bool:
        assert worker.poll() is None, shell.log("worker")
        return " ready." in shell.log("worker")

    wait_for("the worker", ready, timeout=90)

    auth = {"Authorization": f"Bearer {token}"}
    submitted = httpx.post(f"{base}/api/v1/jobs", json=SPEC, headers=auth, timeout=10)
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]

    def finished() -> dict | None:
        job = httpx.get(f"{base}/api/v1/jobs/{job_id}", timeout=5).json()
        return job if job["status"] in ("done", "failed", "cancelled") else None

    job = wait_for("the job to finish", finished, timeout=240, every=0.5)
    assert job["status"] == "done", (job, shell.log("worker")[-3000:], shell.log("serve")[-2000:])  # type: ignore[index]
    assert job["worker"].startswith("worker")  # type: ignore[index]
    run = httpx.get(f"{base}/api/v1/runs/{job['run_id']}", timeout=10).json()  # type: ignore[index]
    [result] = run["jobs"]
    assert (result["impl"], result["status"]) == ("torch_chunk", "ok"), result["reason"]
    assert result["timing"]["median_ms"] > 0 and result["verification"]
    with session_scope(get_engine(shell.env["DELTABENCH_DB"])) as session:  # stored in the guide's PostgreSQL
        stored = session.scalars(select(Result.status).join(Run).where(Run.run_id == job["run_id"])).all()  # type: ignore[index]
    assert stored == ["ok"]
