"""Series carry their software: ``results.software`` (major.minor of torch, triton, jax, CUDA, Python), in the index.

A series is one (op, impl, shape, dtype, mode) on one machine class with the same major software versions
(``deltabench.harness.series``); before this revision the store's series ignored the software. The column holds
``harness.series.series_software`` of the result's run environment, set at ingest; existing rows are backfilled
from their run's stored environment, one UPDATE per distinct software context.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SERIES_BEFORE = ["op", "impl", "B", "T", "H", "K", "V", "dtype", "mode", "machine_kind", "run_created_at"]
_SERIES_AFTER = [*_SERIES_BEFORE[:-1], "software", "run_created_at"]
_SOFTWARE_COLUMNS = ("torch", "triton", "jax", "cuda", "python")


def _backfill() -> None:
    # The definition lives in harness/series.py (the one source of truth for what a series is); imported here so
    # the backfilled strings are exactly what ingest writes.
    from deltabench.harness.series import software_context

    conn = op.get_bind()
    environments = sa.table("environments", sa.column("id"), *(sa.column(c) for c in _SOFTWARE_COLUMNS))
    runs = sa.table("runs", sa.column("id"), sa.column("environment_id"))
    results = sa.table("results", sa.column("run_pk"), sa.column("software"))
    by_context: dict[str, list[int]] = {}
    for row in conn.execute(sa.select(environments)).mappings():
        context = software_context({c: row[c] for c in _SOFTWARE_COLUMNS})
        by_context.setdefault(context, []).append(row["id"])
    for context, env_ids in by_context.items():
        if not context:
            continue  # already the column's default
        for start in range(0, len(env_ids), 500):
            run_pks = sa.select(runs.c.id).where(runs.c.environment_id.in_(env_ids[start : start + 500]))
            conn.execute(sa.update(results).where(results.c.run_pk.in_(run_pks)).values(software=context))


def upgrade() -> None:
    """Add ``results.software``, backfill it, and put it in the series index before the time column."""
    op.add_column("results", sa.Column("software", sa.String(255), nullable=False, server_default=""))
    _backfill()
    op.drop_index("ix_results_series", table_name="results")
    op.create_index("ix_results_series", "results", _SERIES_AFTER)


def downgrade() -> None:
    """Back to series without software: the old index, no column."""
    op.drop_index("ix_results_series", table_name="results")
    op.drop_column("results", "software")
    op.create_index("ix_results_series", "results", _SERIES_BEFORE)
