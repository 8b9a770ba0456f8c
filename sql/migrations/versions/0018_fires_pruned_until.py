"""jobs.fires_pruned_until: the latest fire time whose run row history retention deleted

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28

``job backfill`` decided "already ran" from ``runs`` rows, and history retention deletes
ended rows after 30 days: a backfill that reached past the retention ran every old fire
time again, failed ones included (hole W2 of safety review 3). Each prune now keeps the
latest fire time it deleted on the job, and a backfill refuses to judge a time up to it.

Expand only: a server of the previous release neither reads nor writes the column (its
prune leaves it as it was; its backfill judges as before).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("fires_pruned_until", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("jobs", "fires_pruned_until")
