"""A result's samples and checks without foreign keys to ``results``: the store keeps them consistent itself.

Every ingest inserts a result's ``result_samples`` row and ``checks`` rows in the transaction that stored the result,
for the ids that transaction's INSERT returned (db/ingest.py), and the one way results leave the store deletes their
children first (db/deletion.py). A foreign key added nothing to that but a check per child row: on PostgreSQL a
lookup of the parent's key and a lock on its row, 143 -> 88 us of the database's CPU per ingested result when
dropped (a result with its samples and two checks; 6,000 results into a 200k-result store, three runs each). The
parent's key stays indexed on both child tables (their primary key and ``ix_checks_result_position``), so a
result's children are still found, and removed, by index.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (child table, its foreign key's name under the metadata's naming convention)
_KEYS = (("result_samples", "fk_result_samples_result_id_results"), ("checks", "fk_checks_result_id_results"))


def upgrade() -> None:
    """Drop the two children's foreign keys (on SQLite by rebuilding each table: batch mode)."""
    for table, name in _KEYS:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(name, type_="foreignkey")


def downgrade() -> None:
    """Put the foreign keys back (``ON DELETE CASCADE``), after removing any child row whose result is gone."""
    for table, name in _KEYS:
        op.execute(f"DELETE FROM {table} WHERE result_id NOT IN (SELECT id FROM results)")
        with op.batch_alter_table(table) as batch:
            batch.create_foreign_key(name, "results", ["result_id"], ["id"], ondelete="CASCADE")
