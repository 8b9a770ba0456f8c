"""event kinds: job_events.kind is one of sql.states.EventKind

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# The kinds as of this revision (a later kind needs a migration of its own that
# replaces the constraint): never import them from the code, which moves on.
KINDS = (
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


def upgrade() -> None:
    # Added NOT VALID, then validated (every kind sparkring ever wrote is in KINDS), so
    # that the constraint ends up an ordinary, validated CHECK.
    op.execute(
        "ALTER TABLE job_events ADD CONSTRAINT ck_job_events_kind_known "
        f"CHECK (kind IN ({', '.join(repr(kind) for kind in KINDS)})) NOT VALID"
    )
    op.execute("ALTER TABLE job_events VALIDATE CONSTRAINT ck_job_events_kind_known")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_job_events_kind_known"), "job_events", type_="check")
