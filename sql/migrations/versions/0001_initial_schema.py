"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "coordinator",
        sa.Column("id", sa.SmallInteger(), server_default="1", nullable=False),
        sa.Column("term", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("server", sa.Text(), nullable=True),
        sa.Column("ring_generation", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("id = 1", name=op.f("ck_coordinator_single_row")),
        sa.CheckConstraint(
            "term >= 0 AND ring_generation >= 0", name=op.f("ck_coordinator_counters_not_negative")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_coordinator")),
    )
    op.create_table(
        "drains",
        sa.Column("server", sa.Text(), nullable=False),
        sa.Column(
            "requested_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "server ~ '^[A-Za-z0-9._-]{1,64}$'", name=op.f("ck_drains_server_is_name")
        ),
        sa.PrimaryKeyConstraint("server", name=op.f("pk_drains")),
    )
    op.create_table(
        "job_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("job_name", sa.Text(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("server", sa.Text(), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=True),
        sa.Column(
            "detail",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    op.create_index("ix_job_events_job_id_id", "job_events", ["job_id", "id"], unique=False)
    op.create_table(
        "resources",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("object_key", sa.Text(), nullable=False),
        sa.Column("filename", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'", name=op.f("ck_resources_name_charset")
        ),
        sa.CheckConstraint("sha256 ~ '^[0-9a-f]{64}$'", name=op.f("ck_resources_sha256_hex")),
        sa.CheckConstraint("size >= 0", name=op.f("ck_resources_size_not_negative")),
        sa.CheckConstraint("version > 0", name=op.f("ck_resources_version_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_resources")),
        sa.UniqueConstraint("name", "version", name="uq_resources_name_version"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("resource_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "conf",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "args",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("spark_master", sa.Text(), nullable=True),
        sa.Column("desired", sa.Text(), server_default="stopped", nullable=False),
        sa.Column("max_restarts", sa.Integer(), nullable=False),
        sa.Column("generation", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("desired IN ('running', 'stopped')", name=op.f("ck_jobs_desired_known")),
        sa.CheckConstraint("jsonb_typeof(args) = 'array'", name=op.f("ck_jobs_args_is_array")),
        sa.CheckConstraint("jsonb_typeof(conf) = 'object'", name=op.f("ck_jobs_conf_is_object")),
        sa.CheckConstraint("kind IN ('streaming', 'batch')", name=op.f("ck_jobs_kind_known")),
        sa.CheckConstraint(
            "name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'", name=op.f("ck_jobs_name_charset")
        ),
        sa.CheckConstraint("generation >= 0", name=op.f("ck_jobs_generation_not_negative")),
        sa.CheckConstraint("max_restarts >= 0", name=op.f("ck_jobs_max_restarts_not_negative")),
        sa.ForeignKeyConstraint(
            ["resource_id"],
            ["resources.id"],
            name=op.f("fk_jobs_resource_id_resources"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("name", name=op.f("uq_jobs_name")),
    )
    op.create_table(
        "distribution",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("target", sa.Text(), nullable=True),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("epoch", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("state", sa.Text(), server_default="stopped", nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("restarts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("generation", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("ring_generation", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("pending_reason", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "owner IS NULL OR owner ~ '^[A-Za-z0-9._-]{1,64}$'",
            name=op.f("ck_distribution_owner_is_server"),
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'starting', 'running', 'backoff', 'stopping', 'stopped', 'finished', 'failed')",
            name=op.f("ck_distribution_state_known"),
        ),
        sa.CheckConstraint(
            "target IS NULL OR target ~ '^[A-Za-z0-9._-]{1,64}$'",
            name=op.f("ck_distribution_target_is_server"),
        ),
        sa.CheckConstraint(
            "(owner IS NULL) = (lease_until IS NULL)",
            name=op.f("ck_distribution_lease_needs_owner"),
        ),
        sa.CheckConstraint(
            "epoch >= 0 AND attempt >= 0 AND restarts >= 0",
            name=op.f("ck_distribution_counters_not_negative"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_distribution_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_distribution")),
    )
    # The coordinator's single row exists from the start; terms only ever grow.
    op.execute("INSERT INTO coordinator (id, term, ring_generation) VALUES (1, 0, 0)")
    op.create_index("ix_distribution_owner", "distribution", ["owner"], unique=False)
    op.create_index("ix_distribution_target", "distribution", ["target"], unique=False)
    op.create_table(
        "job_py_files",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("resource_id", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("position >= 0", name=op.f("ck_job_py_files_position_not_negative")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_py_files_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["resource_id"],
            ["resources.id"],
            name=op.f("fk_job_py_files_resource_id_resources"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("job_id", "position", name=op.f("pk_job_py_files")),
    )


def downgrade() -> None:
    op.drop_table("job_py_files")
    op.drop_index("ix_distribution_target", table_name="distribution")
    op.drop_index("ix_distribution_owner", table_name="distribution")
    op.drop_table("distribution")
    op.drop_table("jobs")
    op.drop_table("resources")
    op.drop_index("ix_job_events_job_id_id", table_name="job_events")
    op.drop_table("job_events")
    op.drop_table("drains")
    op.drop_table("coordinator")
