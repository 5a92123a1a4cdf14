"""Service tables: API tokens, the submitted-job queue and annotations on change points.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create the tables the web service and the workers write."""
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("last_used_at", _TS, nullable=True),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("name", name=op.f("uq_api_tokens_name")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_api_tokens_token_sha256")),
    )

    op.create_table(
        "job_queue",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("device_kind", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=True),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("submitted_by", sa.String(255), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_queue")),
    )
    op.create_index(op.f("ix_job_queue_run_id"), "job_queue", ["run_id"])
    op.create_index("ix_job_queue_status_kind", "job_queue", ["status", "device_kind", "created_at"])

    op.create_table(
        "annotations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("series_key", sa.String(512), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=True),
        sa.Column("git_commit", sa.String(64), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("author", sa.String(255), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_annotations")),
    )
    op.create_index("ix_annotations_series", "annotations", ["series_key", "created_at"])


def downgrade() -> None:
    """Drop the service tables."""
    op.drop_index("ix_annotations_series", table_name="annotations")
    op.drop_table("annotations")
    op.drop_index("ix_job_queue_status_kind", table_name="job_queue")
    op.drop_index(op.f("ix_job_queue_run_id"), table_name="job_queue")
    op.drop_table("job_queue")
    op.drop_table("api_tokens")
