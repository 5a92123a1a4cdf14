"""Measurement tables: machines, environments, runs, results, their raw samples and verification records.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create the tables a result document is stored in."""
    op.create_table(
        "machines",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("machine_kind", sa.String(64), nullable=False),
        sa.Column("device_name", sa.String(255), nullable=False),
        sa.Column("device_count", sa.Integer(), nullable=False),
        sa.Column("first_seen", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_machines")),
        sa.UniqueConstraint("host", "machine_kind", name="uq_machines_host_kind"),
    )
    op.create_index(op.f("ix_machines_machine_kind"), "machines", ["machine_kind"])

    op.create_table(
        "environments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("machine_kind", sa.String(64), nullable=False),
        sa.Column("device_name", sa.String(255), nullable=False),
        sa.Column("device_count", sa.Integer(), nullable=False),
        sa.Column("platform", sa.String(255), nullable=False),
        sa.Column("cpu", sa.String(255), nullable=False),
        sa.Column("python", sa.String(64), nullable=False),
        sa.Column("driver", sa.String(64), nullable=True),
        sa.Column("cuda", sa.String(64), nullable=True),
        sa.Column("torch", sa.String(64), nullable=True),
        sa.Column("triton", sa.String(64), nullable=True),
        sa.Column("jax", sa.String(64), nullable=True),
        sa.Column("deltabench", sa.String(64), nullable=False),
        sa.Column("git_commit", sa.String(64), nullable=True),
        sa.Column("git_dirty", sa.Boolean(), nullable=False),
        sa.Column("kernel_hash", sa.String(128), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environments")),
        sa.UniqueConstraint("fingerprint", name=op.f("uq_environments_fingerprint")),
    )

    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("ingested_at", _TS, nullable=False),
        sa.Column("suite", sa.String(255), nullable=False),
        sa.Column("git_commit", sa.String(64), nullable=True),
        sa.Column("git_dirty", sa.Boolean(), nullable=False),
        sa.Column("environment_id", sa.Integer(), nullable=False),
        sa.Column("machine_id", sa.Integer(), nullable=False),
        sa.Column("baselines", sa.JSON(), nullable=False),
        sa.Column("ceilings", sa.JSON(), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["environment_id"], ["environments.id"], name=op.f("fk_runs_environment_id_environments")
        ),
        sa.ForeignKeyConstraint(["machine_id"], ["machines.id"], name=op.f("fk_runs_machine_id_machines")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("run_id", name=op.f("uq_runs_run_id")),
    )
    op.create_index("ix_runs_commit_created", "runs", ["git_commit", "created_at"])
    op.create_index(op.f("ix_runs_created_at"), "runs", ["created_at"])
    op.create_index(op.f("ix_runs_environment_id"), "runs", ["environment_id"])
    op.create_index(op.f("ix_runs_machine_id"), "runs", ["machine_id"])
    op.create_index(op.f("ix_runs_suite"), "runs", ["suite"])

    op.create_table(
        "results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("op", sa.String(64), nullable=False),
        sa.Column("impl", sa.String(512), nullable=False),
        sa.Column("B", sa.Integer(), nullable=False),
        sa.Column("T", sa.Integer(), nullable=False),
        sa.Column("H", sa.Integer(), nullable=False),
        sa.Column("K", sa.Integer(), nullable=False),
        sa.Column("V", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(8), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("regime", sa.String(16), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("initial_state", sa.Boolean(), nullable=False),
        sa.Column("run_created_at", _TS, nullable=False),
        sa.Column("git_commit", sa.String(64), nullable=True),
        sa.Column("machine_kind", sa.String(64), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("device", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("gate_reference", sa.Text(), nullable=False),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("started_at", _TS, nullable=True),
        sa.Column("finished_at", _TS, nullable=True),
        sa.Column("clock", sa.String(16), nullable=True),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("q1_ms", sa.Float(), nullable=True),
        sa.Column("q3_ms", sa.Float(), nullable=True),
        sa.Column("mean_ms", sa.Float(), nullable=True),
        sa.Column("stdev_ms", sa.Float(), nullable=True),
        sa.Column("sem_rel", sa.Float(), nullable=True),
        sa.Column("n_samples", sa.Integer(), nullable=True),
        sa.Column("warmup", sa.Integer(), nullable=True),
        sa.Column("l2_flush", sa.Boolean(), nullable=True),
        sa.Column("compile_s", sa.Float(), nullable=True),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("inputs_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_method", sa.String(64), nullable=True),
        sa.Column("flops", sa.Float(), nullable=True),
        sa.Column("bytes_moved", sa.Float(), nullable=True),
        sa.Column("tflops", sa.Float(), nullable=True),
        sa.Column("gbps", sa.Float(), nullable=True),
        sa.Column("floor_ms", sa.Float(), nullable=True),
        sa.Column("pct_of_floor", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name=op.f("fk_results_run_pk_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_results")),
        sa.UniqueConstraint("job_id", "attempt", name="uq_results_job_attempt"),
    )
    op.create_index("ix_results_commit_created", "results", ["git_commit", "run_created_at"])
    op.create_index("ix_results_created", "results", ["run_created_at"])
    op.create_index("ix_results_run_status", "results", ["run_pk", "status"])
    op.create_index(
        "ix_results_series",
        "results",
        ["op", "impl", "B", "T", "H", "K", "V", "dtype", "mode", "machine_kind", "run_created_at"],
    )

    op.create_table(
        "result_samples",
        sa.Column("result_id", sa.Integer(), nullable=False),
        sa.Column("samples", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["result_id"], ["results.id"], name=op.f("fk_result_samples_result_id_results"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("result_id", name=op.f("pk_result_samples")),
    )

    op.create_table(
        "checks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("result_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("check", sa.String(64), nullable=False),
        sa.Column("metric", sa.String(32), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("threshold", sa.Float(), nullable=True),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("gating", sa.Boolean(), nullable=False),
        sa.Column("worst_index", sa.JSON(), nullable=True),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("regime", sa.String(16), nullable=True),
        sa.Column("initial_state", sa.Boolean(), nullable=True),
        sa.Column("reference", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["result_id"], ["results.id"], name=op.f("fk_checks_result_id_results"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checks")),
    )
    op.create_index("ix_checks_result_position", "checks", ["result_id", "position"], unique=True)


def downgrade() -> None:
    """Drop the measurement tables (children first)."""
    op.drop_index("ix_checks_result_position", table_name="checks")
    op.drop_table("checks")
    op.drop_table("result_samples")
    for name in ("ix_results_series", "ix_results_run_status", "ix_results_created", "ix_results_commit_created"):
        op.drop_index(name, table_name="results")
    op.drop_table("results")
    for name in ("ix_runs_suite", "ix_runs_machine_id", "ix_runs_environment_id", "ix_runs_created_at"):
        op.drop_index(op.f(name), table_name="runs")
    op.drop_index("ix_runs_commit_created", table_name="runs")
    op.drop_table("runs")
    op.drop_table("environments")
    op.drop_index(op.f("ix_machines_machine_kind"), table_name="machines")
    op.drop_table("machines")
