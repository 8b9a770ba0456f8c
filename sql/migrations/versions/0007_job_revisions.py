"""job revisions: every definition a job has had, numbered; the revision each run uses

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-23

``job_revisions`` (and ``job_revision_py_files``) keep each definition of a job
(artifacts pinned, conf, args, master, max_restarts); ``jobs.revision`` names the
current one, of which the job row's own columns stay a copy; ``distribution.revision``
is the revision the current or last run was claimed with. Every existing job becomes
revision 1 of itself, and a job that has run was run from it. ``jobs.label`` names the
spec file (``sparkring apply``) that defines a job.

Expand only: servers of the previous release keep reading the job row (still the
current definition) and claim without setting ``distribution.revision``; a run claimed
so is started from the job row by new servers too. A job created by a previous
release's API during a rolling upgrade has no revision row until its first update,
which adds it.

The event kinds of 0005 plus ``revised``, as in 0005: the constraint replaced, added
NOT VALID, then validated.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# The kinds as of this revision: never import them from the code, which moves on.
PREVIOUS_KINDS = (
    "created",
    "start_requested",
    "stop_requested",
    "restart_requested",
    "deleted",
    "retargeted",
    "claimed",
    "adopted",
    "driver_started",
    "stopping",
    "released",
    "deferred",
    "finished",
    "crashed",
    "failed",
    "reaped",
)
KINDS = (*PREVIOUS_KINDS, "revised")


def _kinds_constraint(kinds: tuple[str, ...]) -> None:
    op.execute("ALTER TABLE job_events DROP CONSTRAINT IF EXISTS ck_job_events_kind_known")
    op.execute(
        "ALTER TABLE job_events ADD CONSTRAINT ck_job_events_kind_known "
        f"CHECK (kind IN ({', '.join(repr(kind) for kind in kinds)})) NOT VALID"
    )
    op.execute("ALTER TABLE job_events VALIDATE CONSTRAINT ck_job_events_kind_known")


def _jsonb(name: str, default: str) -> sa.Column:
    return sa.Column(
        name,
        postgresql.JSONB(astext_type=sa.Text()),
        server_default=sa.text(f"'{default}'::jsonb"),
        nullable=False,
    )


def upgrade() -> None:
    op.add_column("jobs", sa.Column("revision", sa.Integer(), server_default="1", nullable=False))
    op.create_check_constraint(op.f("ck_jobs_revision_positive"), "jobs", "revision > 0")
    op.add_column("jobs", sa.Column("label", sa.Text(), nullable=True))
    op.create_check_constraint(
        op.f("ck_jobs_label_charset"),
        "jobs",
        r"label IS NULL OR label ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'",
    )
    op.create_index("ix_jobs_label", "jobs", ["label"], unique=False)
    op.add_column("distribution", sa.Column("revision", sa.Integer(), nullable=True))
    op.create_table(
        "job_revisions",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("resource_id", sa.BigInteger(), nullable=False),
        _jsonb("conf", "{}"),
        _jsonb("args", "[]"),
        sa.Column("spark_master", sa.Text(), nullable=True),
        sa.Column("max_restarts", sa.Integer(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("created_by", sa.Text(), nullable=True),
        _jsonb("changed", "[]"),
        sa.Column("rollback_of", sa.Integer(), nullable=True),
        sa.CheckConstraint("revision > 0", name=op.f("ck_job_revisions_revision_positive")),
        sa.CheckConstraint(
            "max_restarts >= 0", name=op.f("ck_job_revisions_max_restarts_not_negative")
        ),
        sa.CheckConstraint(
            "jsonb_typeof(conf) = 'object'", name=op.f("ck_job_revisions_conf_is_object")
        ),
        sa.CheckConstraint(
            "jsonb_typeof(args) = 'array'", name=op.f("ck_job_revisions_args_is_array")
        ),
        sa.CheckConstraint(
            "jsonb_typeof(changed) = 'array'", name=op.f("ck_job_revisions_changed_is_array")
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_job_revisions_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["resource_id"],
            ["resources.id"],
            name=op.f("fk_job_revisions_resource_id_resources"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("job_id", "revision", name=op.f("pk_job_revisions")),
    )
    op.create_table(
        "job_revision_py_files",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("resource_id", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "position >= 0", name=op.f("ck_job_revision_py_files_position_not_negative")
        ),
        sa.ForeignKeyConstraint(
            ["job_id", "revision"],
            ["job_revisions.job_id", "job_revisions.revision"],
            name="fk_job_revision_py_files_job_id_job_revisions",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["resource_id"],
            ["resources.id"],
            name=op.f("fk_job_revision_py_files_resource_id_resources"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint(
            "job_id", "revision", "position", name=op.f("pk_job_revision_py_files")
        ),
    )
    # Every job as it stands is its own revision 1; a job that has been claimed ran it.
    op.execute(
        """
        INSERT INTO job_revisions
               (job_id, revision, resource_id, conf, args, spark_master, max_restarts,
                created_at)
        SELECT id, 1, resource_id, conf, args, spark_master, max_restarts, created_at
          FROM jobs
        """
    )
    op.execute(
        """
        INSERT INTO job_revision_py_files (job_id, revision, position, resource_id)
        SELECT job_id, 1, position, resource_id FROM job_py_files
        """
    )
    op.execute("UPDATE distribution SET revision = 1 WHERE epoch > 0")
    _kinds_constraint(KINDS)


def downgrade() -> None:
    # Back to the kinds of 0005: the events of revisions go with the revisions.
    op.execute("DELETE FROM job_events WHERE kind = 'revised'")
    _kinds_constraint(PREVIOUS_KINDS)
    op.drop_table("job_revision_py_files")
    op.drop_table("job_revisions")
    op.drop_column("distribution", "revision")
    op.drop_index("ix_jobs_label", table_name="jobs")
    op.drop_constraint(op.f("ck_jobs_label_charset"), "jobs", type_="check")
    op.drop_column("jobs", "label")
    op.drop_constraint(op.f("ck_jobs_revision_positive"), "jobs", type_="check")
    op.drop_column("jobs", "revision")
