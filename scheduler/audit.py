"""The audit trail of writes that are not a job's own: artifact uploads and deletes,
token creation and revocation, alert creation and deletion (job writes are job events,
with ``detail.by``).

An actor is ``token:<name>`` for the HTTP API (the token authenticated the request) and
``cli:<user> (claimed)`` for the CLI: the CLI connects to PostgreSQL directly, so its
user name is what the operating system account says, which nothing verifies (anyone
who can run the CLI holds the database URL and could write any name).
"""

from __future__ import annotations

import getpass
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from sql import tables


class Action(StrEnum):
    RESOURCE_UPLOADED = "resource_uploaded"  # a new version of an artifact stored
    RESOURCE_DELETED = "resource_deleted"  # one version, or every version of a name
    TOKEN_CREATED = "token_created"  # a viewer or operator token made
    TOKEN_REVOKED = "token_revoked"  # a token revoked
    ALERT_CREATED = "alert_created"  # a webhook alert made (never its secret)
    ALERT_DELETED = "alert_deleted"  # an alert and its deliveries deleted
    SECRET_PUT = "secret_put"  # a secret created or given a new value (never the value)
    SECRET_DELETED = "secret_deleted"
    SECRETS_ROTATED = "secrets_rotated"  # every value encrypted anew under the first key


def cli_actor() -> str:
    """How the audit trail and job events name a CLI user: claimed, not authenticated."""
    try:
        return f"cli:{getpass.getuser()} (claimed)"
    except (KeyError, OSError):  # no user name in this environment (a bare container)
        return "cli (claimed)"


def record(
    conn: sa.Connection,
    actor: str,
    action: Action,
    subject: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """One audit event, in the caller's transaction (with the write it records)."""
    conn.execute(
        sa.insert(tables.audit_events).values(
            actor=actor, action=Action(action).value, subject=subject, detail=detail or {}
        )
    )


def record_alone(
    engine: sa.Engine,
    actor: str,
    action: Action,
    subject: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """One audit event in its own transaction, for a write that made its own (the
    resource catalog's): recorded right after it succeeded."""
    with engine.begin() as conn:
        record(conn, actor, action, subject, detail)


def recent(conn: sa.Connection, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
    """Audit events with an id above ``after``, oldest first, at most ``limit``."""
    a = tables.audit_events
    rows = conn.execute(sa.select(a).where(a.c.id > after).order_by(a.c.id).limit(limit)).mappings()
    return [dict(row) for row in rows]
