"""Helpers of the tests that drive real processes (the local dispatcher, the Celery fleet, the dashboard in a
browser): polling, liveness, free ports and a served dashboard.

Imported as ``from processes import ...`` (tests/ is on sys.path because tests/conftest.py sits there without an
``__init__.py``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest

__all__ = ["free_port", "pid_alive", "serve_dashboard", "stop_processes", "wait_for"]


def wait_for(what: str, predicate: Callable[[], object], timeout: float, every: float = 0.3) -> object:
    """Poll `predicate` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still exists (and is not a zombie)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def stop_processes(procs: list[subprocess.Popen], sig: int) -> None:  # type: ignore[type-arg]
    """Send `sig` to every process still running, then wait for each (15 s) and kill what is left."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_dashboard(db: Path, token_name: str, args: Sequence[str] = ()) -> Iterator[tuple[str, str]]:
    """``deltabench serve`` on the SQLite file `db` (no broker) and a free port, with a write token made by
    ``deltabench token create --name token_name`` and `args` (more options of serve, e.g. ``--import FILE``):
    yields (base URL, token); the server is stopped on exit."""
    env = {k: v for k, v in os.environ.items() if k not in ("DELTABENCH_BROKER", "DELTABENCH_DB")}
    cli = [sys.executable, "-c", "from deltabench.cli.app import main; main()"]
    token = subprocess.run(
        [*cli, "token", "create", "--name", token_name, "--db", str(db)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    port = free_port()
    with open(db.with_suffix(".log"), "w") as log:
        proc = subprocess.Popen(
            [*cli, "serve", "--db", str(db), "--port", str(port), "--log-level", "warning", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/api/v1/runs", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"deltabench serve did not come up: {db.with_suffix('.log').read_text()[-2000:]}")
            time.sleep(0.2)
        try:
            yield base, token
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
