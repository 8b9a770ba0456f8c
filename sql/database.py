"""Engines for PostgreSQL: URL normalisation and a connection check with a clean error."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import ArgumentError, DBAPIError


class DatabaseError(Exception):
    """PostgreSQL is unreachable or the URL is wrong; the message never shows a password."""


def parse_url(raw: str) -> URL:
    """Accept ``postgresql://`` and ``postgres://`` and use the psycopg 3 driver."""
    try:
        url = sa.make_url(raw)
    except ArgumentError:
        raise DatabaseError(
            "SPARKRING_DATABASE_URL is not a database URL "
            "(expected postgresql://user:password@host:port/database)"
        ) from None
    if url.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
        url = url.set(drivername="postgresql+psycopg")
    if url.drivername != "postgresql+psycopg":
        raise DatabaseError(
            f"SPARKRING_DATABASE_URL must point at PostgreSQL, not {url.drivername!r}"
        )
    if not url.database:
        raise DatabaseError("SPARKRING_DATABASE_URL names no database")
    return url


def describe(url: URL) -> str:
    """Host, port and database of a URL, for messages (never user or password)."""
    return f"{url.host or 'localhost'}:{url.port or 5432}/{url.database}"


def create_engine(raw_url: str, *, pool_size: int = 5, connect_timeout: float = 5.0) -> Engine:
    url = parse_url(raw_url)
    return sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args={
            "connect_timeout": max(1, int(connect_timeout)),
            "application_name": "sparkring",
        },
    )


def explain(exc: BaseException, url: URL) -> str:
    """One line saying why talking to the database failed, with no secret in it."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    reason = text.splitlines()[0] if text else type(exc).__name__
    if url.password:
        reason = reason.replace(str(url.password), "***")
    return f"cannot reach PostgreSQL at {describe(url)}: {reason}"


def check(engine: Engine) -> None:
    """Open one connection, raising :class:`DatabaseError` with a clear line on failure."""
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except DBAPIError as exc:
        raise DatabaseError(explain(exc, engine.url)) from None
