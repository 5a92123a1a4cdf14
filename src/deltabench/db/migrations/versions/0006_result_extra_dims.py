"""Ops with dims of their own: ``results.extra_dims``, the dims besides B, T, H, K, V, in the series index.

An op's contract names its dims (references/contract.py). B, T, H, K, V keep their indexed columns; any other dim
is stored in ``extra_dims``, canonical JSON text (keys sorted, no spaces, ``""`` when there are none) so that two
results of one shape compare equal as plain strings in SQLite and PostgreSQL alike. An indexed dim the op lacks is
stored as 0 (a dim is at least 1). Existing rows are the delta family's: their ``extra_dims`` is ``""``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SERIES_BEFORE = ["op", "impl", "B", "T", "H", "K", "V", "dtype", "mode", "machine_kind", "software", "run_created_at"]
_SERIES_AFTER = [*_SERIES_BEFORE[:7], "extra_dims", *_SERIES_BEFORE[7:]]


def upgrade() -> None:
    """Add ``results.extra_dims`` (``""`` for every existing row) and put it in the series index after V."""
    op.add_column("results", sa.Column("extra_dims", sa.String(255), nullable=False, server_default=""))
    op.drop_index("ix_results_series", table_name="results")
    op.create_index("ix_results_series", "results", _SERIES_AFTER)


def downgrade() -> None:
    """Back to five dims: results of ops with other dims cannot be told apart without the column, so they go."""
    results = sa.table(
        "results", sa.column("id"), sa.column("extra_dims"), sa.column("H"), sa.column("K"), sa.column("V")
    )
    other_ops = sa.select(results.c.id).where(
        sa.or_(results.c.extra_dims != "", results.c.H == 0, results.c.K == 0, results.c.V == 0)
    )
    # children first: SQLite enforces ON DELETE CASCADE only with its foreign-keys pragma on
    for child in ("checks", "result_samples"):
        table = sa.table(child, sa.column("result_id"))
        op.execute(sa.delete(table).where(table.c.result_id.in_(other_ops)))
    op.execute(sa.delete(results).where(results.c.id.in_(other_ops.scalar_subquery())))
    op.drop_index("ix_results_series", table_name="results")
    op.create_index("ix_results_series", "results", _SERIES_BEFORE)
    with op.batch_alter_table("results") as batch:
        batch.drop_column("extra_dims")
