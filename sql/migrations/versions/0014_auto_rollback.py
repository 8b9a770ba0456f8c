"""auto-rollback: an update watched until its revision is healthy, else rolled back

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26

The job's setting (``job create/update --auto-rollback``, a spec's ``auto_rollback``):
``jobs.auto_rollback`` and ``jobs.healthy_within_s`` (default 300 s). Not part of a
revision: turning it on or off, or changing the deadline, makes no revision.

The watch of one update (``scheduler/auto_rollback.py``): ``watch_revision`` (the new
revision), ``watch_fallback`` (the revision it replaced: the one to go back to),
``watch_since`` and ``watch_until`` (its deadline), by PostgreSQL's clock; all four
NULL when no update is watched. In the job row, so any server may end a watch after
the one that started it died; a partial index finds the watched jobs.

The event kinds of 0009 plus ``rolled_back``, as in 0005 and 0009: the constraint
replaced, added NOT VALID, then validated.

Expand only: a server of the previous release neither reads nor writes the columns
(its updates start no watch; a watch it leaves in place is ended by a server of this
release once the job's revision moved on).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# The kinds as of 0009 (the last to change them): never import them from the code.
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
    "revised",
    "health_flagged",
    "health_cleared",
)
KINDS = (*PREVIOUS_KINDS, "rolled_back")
DEFAULT_HEALTHY_WITHIN_S = 300.0
WATCH = ("watch_revision", "watch_fallback", "watch_since", "watch_until")


def _kinds_constraint(kinds: tuple[str, ...]) -> None:
    op.execute("ALTER TABLE job_events DROP CONSTRAINT IF EXISTS ck_job_events_kind_known")
    op.execute(
        "ALTER TABLE job_events ADD CONSTRAINT ck_job_events_kind_known "
        f"CHECK (kind IN ({', '.join(repr(kind) for kind in kinds)})) NOT VALID"
    )
    op.execute("ALTER TABLE job_events VALIDATE CONSTRAINT ck_job_events_kind_known")


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("auto_rollback", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.add_column(
        "jobs",
        sa.Column(
            "healthy_within_s",
            sa.Float(),
            server_default=sa.text(str(DEFAULT_HEALTHY_WITHIN_S)),
            nullable=False,
        ),
    )
    op.add_column("jobs", sa.Column("watch_revision", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("watch_fallback", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("watch_since", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("watch_until", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        op.f("ck_jobs_healthy_within_positive"), "jobs", "healthy_within_s > 0"
    )
    op.create_check_constraint(
        op.f("ck_jobs_watch_whole"),
        "jobs",
        " AND ".join(f"{c} IS NULL" for c in WATCH)
        + " OR "
        + " AND ".join(f"{c} IS NOT NULL" for c in WATCH),
    )
    op.create_index(
        "ix_jobs_watch_until",
        "jobs",
        ["watch_until"],
        postgresql_where=sa.text("watch_revision IS NOT NULL"),
    )
    _kinds_constraint(KINDS)


def downgrade() -> None:
    op.execute("DELETE FROM job_events WHERE kind = 'rolled_back'")
    op.drop_index("ix_jobs_watch_until", table_name="jobs")
    _kinds_constraint(PREVIOUS_KINDS)
    op.drop_constraint(op.f("ck_jobs_watch_whole"), "jobs")
    op.drop_constraint(op.f("ck_jobs_healthy_within_positive"), "jobs")
    for column in (*reversed(WATCH), "healthy_within_s", "auto_rollback"):
        op.drop_column("jobs", column)
