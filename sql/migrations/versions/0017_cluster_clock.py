"""cluster_clock: when the cluster last reached PostgreSQL, and when its last outage ended

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28

The hold before another server's expired lease is claimed over or reaped was dated by
``pg_postmaster_start_time()``, which a crash-restart of PostgreSQL, a failover to a
standby and a network cut of every server never move (hole W1 of safety review 3: a
batch generation ran twice, a ``--max-retries 0`` failure ran again). Every lease
renewal now stamps ``renewed_at``; a renewal that finds it older than a lease records
``outage_ended_at``, and the hold counts from the later of that and the postmaster's
start (scheduler/distribution.py).

Expand only: a server of the previous release neither reads nor writes the table (its
hold is the postmaster's, as before); its renewals do not stamp, so during a rolling
upgrade the stamp is kept by the upgraded servers alone.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cluster_clock",
        sa.Column("id", sa.SmallInteger(), server_default="1", nullable=False),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outage_ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("id = 1", name=op.f("ck_cluster_clock_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cluster_clock")),
    )
    op.execute("INSERT INTO cluster_clock (id) VALUES (1)")


def downgrade() -> None:
    op.drop_table("cluster_clock")
