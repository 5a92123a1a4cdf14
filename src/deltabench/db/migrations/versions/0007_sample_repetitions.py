"""The repetition of each raw sample: ``result_samples.repetitions``, packed like the samples.

``deltabench run --repeat N`` times each job in N worker processes, round by round; the regression gate estimates
the run-to-run spread of a job without history from how far those repetitions move. Results stored before this
migration, and results of one repetition, have none (NULL).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``result_samples.repetitions`` (nullable)."""
    with op.batch_alter_table("result_samples") as batch:
        batch.add_column(sa.Column("repetitions", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    """Drop ``result_samples.repetitions``."""
    with op.batch_alter_table("result_samples") as batch:
        batch.drop_column("repetitions")
