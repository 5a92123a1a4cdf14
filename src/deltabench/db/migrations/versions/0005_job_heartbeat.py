"""A running job's heartbeat: ``job_queue.heartbeat_at``, the last sign of life of the worker running it.

The server fails (or queues again) a running job whose worker has been silent for longer than
``DELTABENCH_JOB_HEARTBEAT_TIMEOUT_S`` (see ``deltabench.db.jobs``). Jobs running when this migration runs have
none yet; the sweep counts their silence from ``updated_at``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``job_queue.heartbeat_at`` (nullable)."""
    with op.batch_alter_table("job_queue") as batch:
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Drop ``job_queue.heartbeat_at``."""
    with op.batch_alter_table("job_queue") as batch:
        batch.drop_column("heartbeat_at")
