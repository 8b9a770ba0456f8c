"""token expiry and last use; the audit trail of resource and token writes

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25

``api_tokens`` gains ``expires_at`` (NULL: never; a token stops working then) and
``last_used_at`` (the last authenticated request, kept to the minute). Existing tokens
keep working: both columns start NULL.

``audit_events`` records the writes that are not a job's own (those are job_events):
artifact uploads and deletes, token creation and revocation, each with its actor.

Expand only: servers of the previous release neither read nor write the new columns or
the new table (their token lookups ignore expiry until they are upgraded).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# The actions as of this revision: never import them from the code, which moves on.
ACTIONS = ("resource_uploaded", "resource_deleted", "token_created", "token_revoked")


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "api_tokens", sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column(
            "detail",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.CheckConstraint(
            f"action IN ({', '.join(repr(a) for a in ACTIONS)})",
            name=op.f("ck_audit_events_action_known"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    op.create_index("ix_audit_events_at", "audit_events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_audit_events_at", table_name="audit_events")
    op.drop_table("audit_events")
    op.drop_column("api_tokens", "last_used_at")
    op.drop_column("api_tokens", "expires_at")
