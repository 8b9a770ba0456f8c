"""reaped_from: the owner a reap cleared, so that its late outcome is still taken

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26

A batch driver that exits 0 while its server is cut off from PostgreSQL cannot be
recorded; its lease expires and the coordinator reaps the row (owner cleared,
``pending``). If the cut heals before anybody claims the job, the old owner's
``finished`` at the same epoch is the truth: ``distribution.reap`` writes the owner it
cleared into ``reaped_from``, a claim clears it (and bumps the epoch), and
``distribution.finish`` accepts that owner at that epoch meanwhile (found by the
randomized campaign, CHAOS_SEED=390332867: a batch generation ran twice).

Expand only: a server of the previous release neither reads nor writes the column (its
reap leaves it empty: the late record is refused, as before).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("distribution", sa.Column("reaped_from", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("distribution", "reaped_from")
