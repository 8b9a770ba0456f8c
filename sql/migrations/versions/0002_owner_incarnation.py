"""owner incarnation: the owner of a lease names one process, not only a server id

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Two processes may carry one server id (a restart before the old session expired, two
hosts with one name). Every fenced statement now checks ``owner_incarnation`` as well
as ``owner`` and ``epoch``, so one incarnation can neither renew nor write the other's
leases. Rows owned at upgrade time get the incarnation ``pre-0002``: no running process
has it, so their leases expire and the jobs are claimed afresh (run the upgrade with
the servers stopped, as docs/upgrade.md says for this release).
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
    op.execute("UPDATE distribution SET owner_incarnation = 'pre-0002' WHERE owner IS NOT NULL")
    op.create_check_constraint(
        op.f("ck_distribution_incarnation_needs_owner"),
        "distribution",
        "(owner IS NULL) = (owner_incarnation IS NULL)",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("ck_distribution_incarnation_needs_owner"), "distribution", type_="check"
    )
    op.drop_column("distribution", "owner_incarnation")
