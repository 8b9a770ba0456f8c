"""run health: what each job's current Spark application reports, and its health flags

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24

``run_health`` holds one row per job: the Spark application of its present (or last)
run as the owning server's health monitor last saw it (``server/health.py``): the
application id and UI address, the application's state, its executors and cores, for
streaming jobs the last completed batch and its rates, and the health flag
(``stalled`` or ``waiting_for_resources``) with the time it was raised. The row names
the run's epoch; a monitor writes only over rows of the same or an older epoch.

Expand only: servers of the previous release neither read nor write it.

The event kinds of 0007 plus ``health_flagged`` and ``health_cleared``, as in 0005:
the constraint replaced, added NOT VALID, then validated.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
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
    "revised",
)
KINDS = (*PREVIOUS_KINDS, "health_flagged", "health_cleared")
FLAGS = ("stalled", "waiting_for_resources")


def _kinds_constraint(kinds: tuple[str, ...]) -> None:
    op.execute("ALTER TABLE job_events DROP CONSTRAINT IF EXISTS ck_job_events_kind_known")
    op.execute(
        "ALTER TABLE job_events ADD CONSTRAINT ck_job_events_kind_known "
        f"CHECK (kind IN ({', '.join(repr(kind) for kind in kinds)})) NOT VALID"
    )
    op.execute("ALTER TABLE job_events VALIDATE CONSTRAINT ck_job_events_kind_known")


def upgrade() -> None:
    op.create_table(
        "run_health",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("server", sa.Text(), nullable=False),
        sa.Column("app_id", sa.Text(), nullable=True),
        sa.Column("ui_url", sa.Text(), nullable=True),
        sa.Column("app_state", sa.Text(), nullable=False),
        sa.Column("executors", sa.Integer(), nullable=True),
        sa.Column("cores", sa.Integer(), nullable=True),
        sa.Column("last_batch_id", sa.BigInteger(), nullable=True),
        sa.Column("last_batch_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("input_rate", sa.Float(), nullable=True),
        sa.Column("processing_rate", sa.Float(), nullable=True),
        sa.Column("flag", sa.Text(), nullable=True),
        sa.Column("flagged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "checked_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            f"flag IS NULL OR flag IN ({', '.join(repr(f) for f in FLAGS)})",
            name=op.f("ck_run_health_flag_known"),
        ),
        sa.CheckConstraint(
            "(flag IS NULL) = (flagged_at IS NULL)", name=op.f("ck_run_health_flagged_at_with_flag")
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_run_health_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_run_health")),
    )
    _kinds_constraint(KINDS)


def downgrade() -> None:
    op.execute("DELETE FROM job_events WHERE kind IN ('health_flagged', 'health_cleared')")
    _kinds_constraint(PREVIOUS_KINDS)
    op.drop_table("run_health")
