"""jobs.env and jobs.secret_env (and the same on job_revisions); the secrets table

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28

A job's environment variables are part of its definition (a revision like any other
field): ``env`` maps a variable to its value, ``secret_env`` maps a variable to the name
of a secret. A secret's value is kept only encrypted (``scheduler/secrets.py``: Fernet
with a key from ``SPARKRING_SECRET_KEYS``, which the database never holds).

Expand only: a server of the previous release neither reads nor writes the columns; it
starts a job's driver without them (a job given variables needs the new release on
every server).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_EMPTY = sa.text("'{}'::jsonb")
# The audit trail's actions before and as of this revision.
PREVIOUS_AUDIT_ACTIONS = (
    "resource_uploaded",
    "resource_deleted",
    "token_created",
    "token_revoked",
    "alert_created",
    "alert_deleted",
)
AUDIT_ACTIONS = (*PREVIOUS_AUDIT_ACTIONS, "secret_put", "secret_deleted", "secrets_rotated")


def _audit_actions_constraint(actions: tuple[str, ...]) -> None:
    listed = ", ".join(repr(a) for a in actions)
    op.execute("ALTER TABLE audit_events DROP CONSTRAINT IF EXISTS ck_audit_events_action_known")
    op.execute(
        "ALTER TABLE audit_events ADD CONSTRAINT ck_audit_events_action_known "
        f"CHECK (action IN ({listed})) NOT VALID"
    )
    op.execute("ALTER TABLE audit_events VALIDATE CONSTRAINT ck_audit_events_action_known")


def upgrade() -> None:
    for table in ("jobs", "job_revisions"):
        op.add_column(table, sa.Column("env", JSONB, nullable=False, server_default=_EMPTY))
        op.add_column(table, sa.Column("secret_env", JSONB, nullable=False, server_default=_EMPTY))
    op.create_table(
        "secrets",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("ciphertext", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="1"),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("updated_by", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_secrets")),
        sa.CheckConstraint(
            r"name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'", name=op.f("ck_secrets_name_charset")
        ),
    )
    _audit_actions_constraint(AUDIT_ACTIONS)


def downgrade() -> None:
    op.execute(
        "DELETE FROM audit_events WHERE action IN ('secret_put', 'secret_deleted', "
        "'secrets_rotated')"
    )
    _audit_actions_constraint(PREVIOUS_AUDIT_ACTIONS)
    op.drop_table("secrets")
    for table in ("jobs", "job_revisions"):
        op.drop_column(table, "secret_env")
        op.drop_column(table, "env")
