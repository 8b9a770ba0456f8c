"""Clients of the backing services built from settings: the one place that unwraps the
secrets and hands plain values to the library packages."""

from __future__ import annotations

import sqlalchemy as sa

from resource_center import store
from server import settings as settings_module
from sql import database


def engine(
    settings: settings_module.Settings, pool_size: int = 1, *, server: bool = False
) -> sa.Engine:
    """A checked engine: a clear one-line DatabaseError if PostgreSQL is unreachable.

    ``server``: the engine of a server process, whose sessions get the lock and
    idle-transaction limits that keep every wait inside a lease (SessionLimits)."""
    result = database.create_engine(
        settings.database_url.get_secret_value(),
        pool_size=pool_size,
        limits=server_limits(settings) if server else None,
    )
    database.check(result)
    return result


def server_limits(settings: settings_module.Settings) -> database.SessionLimits:
    return database.SessionLimits(
        lock_timeout=settings.db_lock_timeout,
        idle_in_transaction_timeout=settings.db_idle_in_transaction_timeout,
        statement_timeout=settings.db_statement_timeout,
    )


def bucket(settings: settings_module.Settings) -> store.Store:
    return store.Store(
        endpoint=settings.s3_endpoint,
        access_key=settings.s3_access_key.get_secret_value(),
        secret_key=settings.s3_secret_key.get_secret_value(),
        bucket=settings.s3_bucket,
        secure=settings.s3_secure,
        region=settings.s3_region,
    )
