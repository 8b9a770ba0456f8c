"""ring members: the coordinator's memory of membership, and rebalance requests

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ring_members",
        sa.Column("server", sa.Text(), nullable=False),
        sa.Column(
            "joined_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("settled", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("left_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "server ~ '^[A-Za-z0-9._-]{1,64}$'", name=op.f("ck_ring_members_server_is_name")
        ),
        sa.PrimaryKeyConstraint("server", name=op.f("pk_ring_members")),
    )
    op.add_column(
        "coordinator",
        sa.Column("rebalance_requested_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("coordinator", "rebalance_requested_at")
    op.drop_table("ring_members")
