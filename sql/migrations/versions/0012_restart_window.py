"""restart window: a streaming job's restart budget counts the crashes of a sliding window

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26

``jobs.restart_window_s`` (and each revision's copy): a streaming job is FAILED only when
more than ``max_restarts`` crashes (driver failures, restarts on a stall) fall inside
one window of that many seconds, by PostgreSQL's clock. 0 means no window: every crash
since the last start counts, as before. Existing streaming jobs get the default, one
hour; batch jobs 0 (a batch job's retries are counted per run).

``distribution.crash_times``: the crashes of the current window, pruned at each crash
and cleared wherever the count is reset (a start, a new run). It starts empty: a
streaming job's earlier crashes (``restarts``) stop counting at the upgrade, as they
would have left a window that started then.

Expand only: a server of the previous release ignores the columns (its count, the
``restarts`` column, stays as it was written; the new code keeps writing it too).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

DEFAULT_WINDOW_S = 3600.0


def upgrade() -> None:
    for table in ("jobs", "job_revisions"):
        op.add_column(
            table,
            sa.Column(
                "restart_window_s",
                sa.Float(),
                server_default=sa.text(str(DEFAULT_WINDOW_S)),
                nullable=False,
            ),
        )
        op.create_check_constraint(
            op.f(f"ck_{table}_restart_window_not_negative"), table, "restart_window_s >= 0"
        )
    op.execute(
        "UPDATE job_revisions r SET restart_window_s = 0 FROM jobs j "
        "WHERE r.job_id = j.id AND j.kind = 'batch'"
    )
    op.execute("UPDATE jobs SET restart_window_s = 0 WHERE kind = 'batch'")
    op.add_column(
        "distribution",
        sa.Column(
            "crash_times",
            postgresql.ARRAY(sa.DateTime(timezone=True)),
            server_default=sa.text("'{}'"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("distribution", "crash_times")
    for table in ("job_revisions", "jobs"):
        op.drop_constraint(op.f(f"ck_{table}_restart_window_not_negative"), table)
        op.drop_column(table, "restart_window_s")
