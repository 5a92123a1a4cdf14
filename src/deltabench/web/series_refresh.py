"""Keeping the regressions page's table (``db.series_state``) up to date after ingest, off the request path.

A page view only reads the table and counts the series waiting (``pending_series``); the recomputation happens
here, where a user expects it to: right after the results arrive.

- **The server** (``deltabench serve``, or any process running the app) has one :class:`SeriesRefresher`, a
  background thread. ``POST /api/v1/runs`` wakes it after its commit: the fleet's Celery workers post their
  documents there (they have no database access), so their results are refreshed by the server that stores them;
  the local worker of ``deltabench serve`` and run deletion wake it too. It also looks when it starts and every
  :data:`PERIOD_S` seconds, for marks written by other processes (a CLI ingest into the same store, another
  server, results stored while no server ran).
- **The CLI** (``deltabench ingest``, ``deltabench run`` storing its run, ``deltabench runs delete``) refreshes
  the series it touched itself, after its commit, before it returns (:func:`refresh_pending`).

Bounded: a refresh takes at most :data:`CHUNK` series per transaction (so it never holds SQLite's write lock, or
PostgreSQL's row locks, for long), waits :data:`SETTLE_S` after a wake so that a burst of ingests is refreshed in
one pass, and rests after a pass for three times as long as it ran: at most a quarter of the server's time goes
to refreshing while writers keep posting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from deltabench.db.engine import session_scope

__all__ = ["CHUNK", "PERIOD_S", "SETTLE_S", "SeriesRefresher", "refresh_pending"]

log = logging.getLogger(__name__)

CHUNK = 100  # series per transaction: ~0.5 s of work on a loaded two-core machine
PERIOD_S = 30.0  # how often the server looks for marks no wake announced
SETTLE_S = 1.0  # after a wake, how long to let more ingests land before refreshing them together
_REST = 3.0  # after a pass of t seconds, rest 3t: refreshing takes at most a quarter of the time


def refresh_pending(engine: Engine, *, chunk: int = CHUNK, should_stop: Callable[[], bool] | None = None) -> int:
    """Refresh every series marked changed in the store of `engine`, `chunk` series per transaction, until none is
    left, `should_stop()` says so, or another process's refresh holds the lock (it refreshes them); how many."""
    from .services import refresh_series_states

    total = 0
    while should_stop is None or not should_stop():
        with session_scope(engine) as session:
            done = refresh_series_states(session, limit=chunk)
        total += done
        if done < chunk:
            break
    return total


class SeriesRefresher:
    """The server's background refresh of ``db.series_state`` (see the module docstring); started by the app's
    lifespan, or by the first :meth:`wake`."""

    def __init__(self, engine: Engine, *, settle_s: float = SETTLE_S, period_s: float = PERIOD_S) -> None:
        self.engine = engine
        self.settle_s = settle_s
        self.period_s = period_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> SeriesRefresher:
        """Start the thread (once; a stopped refresher stays stopped)."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._loop, name="deltabench-series-refresh", daemon=True)
                self._thread.start()
        return self

    def wake(self) -> None:
        """Refresh soon: results were stored or deleted (call after their commit)."""
        self.start()
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the chunk under way (its transaction commits; what is left stays marked)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        self._wake.set()  # marks left while no server ran are refreshed at once, not at the first period
        while not self._stop.is_set():
            if self._wake.wait(self.period_s):
                self._stop.wait(self.settle_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            started = time.monotonic()
            try:
                done = refresh_pending(self.engine, should_stop=self._stop.is_set)
            except Exception:  # a database hiccup must not end the refreshes: the marks stay, try again later
                log.exception("refreshing the regressions table failed")
                done = 0
            spent = time.monotonic() - started
            if done:
                log.info("refreshed the change points of %d series in %.1f s", done, spent)
            self._stop.wait(_REST * spent)
