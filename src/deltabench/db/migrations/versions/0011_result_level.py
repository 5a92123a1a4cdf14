"""``results.level_ms``: a result's run level (``regression.noise.run_level`` of its raw samples), made at ingest.

The regression gate's history (db/history.py) reads the level of every result of a series' newest runs: from the
packed samples, that was a join to ``result_samples`` and most of a comparison's first view on PostgreSQL. Rows
stored before this revision keep NULL and are read from their samples as before; the history's window is the
newest runs of a machine class, so a store's reads move to the column as new runs arrive, with no rewrite of old
rows here.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``results.level_ms`` (nullable; NULL for the rows stored so far)."""
    op.add_column("results", sa.Column("level_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    """Drop ``results.level_ms`` (the samples it was made from stay)."""
    with op.batch_alter_table("results") as batch:
        batch.drop_column("level_ms")
