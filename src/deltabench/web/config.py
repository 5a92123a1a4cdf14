"""The service's settings: one :class:`Settings`, read from the environment unless given explicitly.

Environment variables (all optional)::

    DELTABENCH_DB                    database URL or SQLite path (default: the per-user SQLite file)
    DELTABENCH_READ_TOKEN_REQUIRED   1 -> reads need a bearer token too (default: reads are open)
    DELTABENCH_MAX_BODY_MB           request body limit in MiB (default 32); larger bodies get 413
    DELTABENCH_BROKER                a Celery broker URL (redis://...): jobs go to the fleet, not the local worker
    DELTABENCH_JOB_HEARTBEAT_TIMEOUT_S  seconds without a heartbeat after which a running job is queued again
                                     (first attempt) or failed (default 300; see deltabench.db.jobs)
"""

from __future__ import annotations

import dataclasses
import os

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Settings"]

DEFAULT_MAX_BODY_BYTES = 32 * 2**20


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _heartbeat_timeout() -> float:
    from deltabench.db.jobs import heartbeat_timeout_s
    from deltabench.harness.errors import BadInput

    try:
        return heartbeat_timeout_s()
    except ValueError as exc:
        raise BadInput(str(exc)) from None


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one instance of the app serves and how it guards it."""

    db_url: str | None = None
    read_token_required: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    broker_url: str | None = None
    # False: submitted jobs are only stored (queued) for workers to pick up, never handed to the dispatcher.
    dispatch_jobs: bool = True
    # A running job silent for this long is queued again or failed; None: the environment's or the default.
    job_heartbeat_timeout_s: float | None = None
    # After an ingest, how long the regressions table's refresh waits for more ingests to refresh them together.
    series_refresh_settle_s: float = 1.0

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from the environment variables of the module docstring; keyword arguments win."""
        max_mb = os.environ.get("DELTABENCH_MAX_BODY_MB")
        values: dict[str, object] = {
            "db_url": os.environ.get("DELTABENCH_DB") or None,
            "read_token_required": _flag(os.environ.get("DELTABENCH_READ_TOKEN_REQUIRED")),
            "max_body_bytes": int(float(max_mb) * 2**20) if max_mb else DEFAULT_MAX_BODY_BYTES,
            "broker_url": os.environ.get("DELTABENCH_BROKER") or None,
            "job_heartbeat_timeout_s": _heartbeat_timeout(),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
