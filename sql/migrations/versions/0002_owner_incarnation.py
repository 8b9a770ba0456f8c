"""owner incarnation: the owner of a lease names one process, not only a server id

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Two processes may carry one server id (a restart before the old ZooKeeper session
expired, two hosts with one name). Every fenced statement now checks
``owner_incarnation`` as well as ``owner`` and ``epoch``, so one incarnation can neither
renew nor write the other's leases.

Expand only: servers of the previous release keep claiming with no incarnation during a
rolling upgrade (their rows have ``owner_incarnation`` NULL, which no new server's fenced
write matches; such leases are handed off by their owners or expire). A constraint
``(owner IS NULL) = (owner_incarnation IS NULL)`` belongs to a later, contracting release.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("distribution", sa.Column("owner_incarnation", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("distribution", "owner_incarnation")
