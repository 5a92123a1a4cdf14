"""Column sizes follow the result document: the memory method and the series software are unbounded text.

``results.memory_method`` was ``VARCHAR(64)`` while the runners describe their method in 87 (CPU, host RSS) and
93 (JAX, XLA buffer assignment) characters: PostgreSQL refused every CPU- or JAX-timed result (SQLite ignores
lengths). ``results.software`` joins up to five version strings, each up to the document's 64 characters, so a
bound there served nothing either. Every other text column already had the document model's ``max_length``.

On SQLite the table is rebuilt (batch mode); there the types only matter to the schema comparison.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """``results.memory_method`` and ``results.software`` become TEXT."""
    with op.batch_alter_table("results") as batch:
        batch.alter_column("memory_method", type_=sa.Text(), existing_type=sa.String(64), existing_nullable=True)
        batch.alter_column(
            "software",
            type_=sa.Text(),
            existing_type=sa.String(255),
            existing_nullable=False,
            existing_server_default="",
        )


def downgrade() -> None:
    """Back to the bounded columns; longer values are cut to fit (a method over 64 characters was never stored
    on PostgreSQL before this revision, and SQLite kept them whole)."""
    results = sa.table("results", sa.column("memory_method", sa.Text()), sa.column("software", sa.Text()))
    op.execute(
        results.update()
        .where(sa.func.length(results.c.memory_method) > 64)
        .values(memory_method=sa.func.substr(results.c.memory_method, 1, 64))
    )
    op.execute(
        results.update()
        .where(sa.func.length(results.c.software) > 255)
        .values(software=sa.func.substr(results.c.software, 1, 255))
    )
    with op.batch_alter_table("results") as batch:
        batch.alter_column("memory_method", type_=sa.String(64), existing_type=sa.Text(), existing_nullable=True)
        batch.alter_column(
            "software",
            type_=sa.String(255),
            existing_type=sa.Text(),
            existing_nullable=False,
            existing_server_default="",
        )
