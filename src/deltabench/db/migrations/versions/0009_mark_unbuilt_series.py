"""Mark every series of a store whose ``series_state`` was never built, so that every series whose state is out of
date has a mark in ``series_dirty`` (the background refresh builds them; no page view does).

A store whose table was built already (a regressions page viewed under 0008) keeps it: its marks are current.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SERIES = '"op", "impl", "B", "T", "H", "K", "V", "extra_dims", "dtype", "mode", "machine_kind", "software"'


def upgrade() -> None:
    """Insert one mark per series with an ``ok`` result, when ``series_state`` is empty."""
    op.execute(
        f"INSERT INTO series_dirty ({_SERIES}) SELECT DISTINCT {_SERIES} FROM results "
        "WHERE status = 'ok' AND NOT EXISTS (SELECT 1 FROM series_state)"
    )


def downgrade() -> None:
    """Nothing to undo: under 0008 the marks are taken by the next view (an empty table is built from scratch)."""
