"""Helpers of the tests that drive real processes (the local dispatcher, the Celery fleet): polling and liveness.

Imported as ``from processes import ...`` (tests/ is on sys.path because tests/conftest.py sits there without an
``__init__.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

__all__ = ["pid_alive", "wait_for"]


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
