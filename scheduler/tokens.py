"""Bearer tokens of the HTTP API and the cluster credential, kept in PostgreSQL.

A token is ``srt_`` + 32 random bytes (URL-safe base64); it is shown once, when
created, and only its SHA-256 is stored. Roles: a *viewer* reads everything, an
*operator* also changes jobs. Revoking a token takes effect on the next request (every
request looks the hash up), and so does its expiry (``expires_in`` at creation; none by
default). Each token's last use is kept to the minute (at most one write a minute per
token, so reads stay cheap). The *cluster* credential is one random secret in
``cluster_credential``, created on first use: servers and the CLI, which can read the
database anyway, present it to read a driver log from the server that runs it.

State changes are guarded statements: creating a name that exists, or revoking a
token that is not active, is an error naming the token.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import math
import re
import secrets
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from sql import tables

PREFIX = "srt_"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


# How stale a token's recorded last use may get before a request rewrites it, seconds.
LAST_USE_RESOLUTION_S = 60


class TokenError(Exception):
    """A token command cannot be done; the message says why in one line."""


class TokenExpired(Exception):
    """A token presented after its expiry; the message names the token, never its value."""

    def __init__(self, name: str, expires_at: datetime.datetime) -> None:
        super().__init__(f"token {name!r} expired at {expires_at.isoformat(timespec='seconds')}")


class Role(StrEnum):
    VIEWER = "viewer"  # reads servers, ring, jobs, events, logs
    # A viewer who may also write: create, start, stop, restart, revise, roll back, run,
    # backfill and delete jobs; upload and delete artifacts (tests/integration/test_api_roles.py).
    OPERATOR = "operator"
    CLUSTER = "cluster"  # the cluster credential: reads, as servers and the CLI do


# Roles a user may give a token (the cluster role belongs to the cluster credential).
GRANTABLE = (Role.VIEWER, Role.OPERATOR)


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who made a request: the token's name (for the audit trail) and its role."""

    name: str
    role: Role

    @property
    def may_write(self) -> bool:
        return self.role == Role.OPERATOR

    @property
    def actor(self) -> str:
        """How job events name this principal (``detail.by``)."""
        return f"token:{self.name}" if self.role != Role.CLUSTER else "cluster"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create(
    conn: sa.Connection, name: str, role: Role | str, expires_in: float | None = None
) -> str:
    """A new token named ``name`` that stops working ``expires_in`` seconds from now
    (None: never); returns the token itself (it is not stored)."""
    if not NAME.fullmatch(name):
        raise TokenError(
            f"token name {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if role not in [r.value for r in GRANTABLE]:
        raise TokenError(f"token role {role!r} must be one of: viewer, operator")
    if expires_in is not None and not (math.isfinite(expires_in) and expires_in > 0):
        raise TokenError("a token must expire after a positive, finite duration")
    token = PREFIX + secrets.token_urlsafe(32)
    inserted = conn.execute(
        sa.text(
            """
            INSERT INTO api_tokens (name, role, token_sha256, expires_at)
            VALUES (:name, :role, :sha,
                    CASE WHEN CAST(:seconds AS float8) IS NULL THEN NULL
                         ELSE now() + make_interval(secs => :seconds) END)
            ON CONFLICT (name) DO NOTHING RETURNING id
            """
        ),
        {"name": name, "role": Role(role).value, "sha": digest(token), "seconds": expires_in},
    ).scalar_one_or_none()
    if inserted is None:
        raise TokenError(f"a token named {name!r} already exists (revoked tokens keep their name)")
    return token


def list_tokens(conn: sa.Connection) -> list[dict[str, Any]]:
    """Every token (never its value): role, created, expires, last used, revoked."""
    t = tables.api_tokens
    expired = sa.and_(t.c.expires_at.is_not(None), t.c.expires_at <= sa.func.now())
    rows = conn.execute(
        sa.select(
            t.c.name,
            t.c.role,
            t.c.created_at,
            t.c.expires_at,
            t.c.last_used_at,
            t.c.revoked_at,
            expired.label("expired"),
        ).order_by(t.c.name)
    ).all()
    return [
        {
            "name": r.name,
            "role": r.role,
            "created_at": r.created_at,
            "expires_at": r.expires_at,
            "last_used_at": r.last_used_at,
            "revoked_at": r.revoked_at,
            "expired": bool(r.expired),
            "active": r.revoked_at is None and not r.expired,
        }
        for r in rows
    ]


def revoke(conn: sa.Connection, name: str) -> None:
    t = tables.api_tokens
    revoked = conn.execute(
        sa.update(t)
        .where(t.c.name == name, t.c.revoked_at.is_(None))
        .values(revoked_at=sa.func.now())
    ).rowcount
    if not revoked:
        raise TokenError(f"no active token named {name!r}")


def authenticate(conn: sa.Connection, token: str) -> Principal | None:
    """The principal ``token`` stands for, or None (unknown, revoked or malformed);
    raises TokenExpired for a token past its expiry. Records the token's last use."""
    if not token or len(token) > 256:
        return None
    if not token.startswith(PREFIX):
        # Read only: a guess must not make the server write (the secret is created by
        # the servers and the CLI that need it, through cluster_secret).
        c = tables.cluster_credential
        secret = conn.execute(sa.select(c.c.secret).where(c.c.id == 1)).scalar_one_or_none()
        if secret is not None and hmac.compare_digest(token.encode(), secret.encode()):
            return Principal(name="cluster", role=Role.CLUSTER)
        return None
    t = tables.api_tokens
    row = conn.execute(
        sa.select(
            t.c.id,
            t.c.name,
            t.c.role,
            t.c.expires_at,
            (t.c.expires_at <= sa.func.now()).label("expired"),
        ).where(t.c.token_sha256 == digest(token), t.c.revoked_at.is_(None))
    ).one_or_none()
    if row is None:
        return None
    if row.expired:
        raise TokenExpired(row.name, row.expires_at)
    conn.execute(
        sa.update(t)
        .where(
            t.c.id == row.id,
            sa.or_(
                t.c.last_used_at.is_(None),
                t.c.last_used_at
                < sa.func.now() - sa.text(f"interval '{LAST_USE_RESOLUTION_S} seconds'"),
            ),
        )
        .values(last_used_at=sa.func.now())
    )
    return Principal(name=row.name, role=Role(row.role))


def cluster_secret(conn: sa.Connection) -> str:
    """The cluster credential, created on first use (concurrent first uses agree)."""
    c = tables.cluster_credential
    conn.execute(
        sa.text(
            "INSERT INTO cluster_credential (id, secret) VALUES (1, :secret) "
            "ON CONFLICT (id) DO NOTHING"
        ),
        {"secret": secrets.token_urlsafe(32)},
    )
    return conn.execute(sa.select(c.c.secret).where(c.c.id == 1)).scalar_one()
