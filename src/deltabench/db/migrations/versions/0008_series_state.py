"""The regressions page's maintained tables: ``series_state`` (each series' newest point and latest change point)
and ``series_dirty`` (series whose points changed since).

An existing store starts with both empty: the first refresh (``db.series_state``) finds ``series_state`` empty and
builds it from every series once.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _series_columns() -> list[sa.Column]:
    return [
        sa.Column("op", sa.String(64), nullable=False),
        sa.Column("impl", sa.String(512), nullable=False),
        *(sa.Column(d, sa.Integer(), nullable=False) for d in ("B", "T", "H", "K", "V")),
        sa.Column("extra_dims", sa.String(255), nullable=False),
        sa.Column("dtype", sa.String(8), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("machine_kind", sa.String(64), nullable=False),
        sa.Column("software", sa.Text(), nullable=False),
    ]


def upgrade() -> None:
    """Create ``series_state`` and ``series_dirty``."""
    op.create_table(
        "series_state",
        sa.Column("series_key", sa.String(512), nullable=False),
        *_series_columns(),
        sa.Column("last_point_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("change_point", sa.JSON(), nullable=True),
        sa.Column("skipped", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("series_key", name="pk_series_state"),
    )
    op.create_index("ix_series_state_last_point", "series_state", ["last_point_at"])
    op.create_table(
        "series_dirty",
        sa.Column("id", sa.Integer(), nullable=False),
        *_series_columns(),
        sa.PrimaryKeyConstraint("id", name="pk_series_dirty"),
    )


def downgrade() -> None:
    """Drop both tables."""
    op.drop_table("series_dirty")
    op.drop_index("ix_series_state_last_point", table_name="series_state")
    op.drop_table("series_state")
