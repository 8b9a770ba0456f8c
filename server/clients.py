"""Clients of the backing services built from settings: the one place that unwraps the
secrets and hands plain values to the library packages.

Each client requires the settings it uses (``Settings.require``), so a command fails with
one line naming a missing key only when it talks to that service. The modules of S3 and
ZooKeeper are imported by the clients that use them: a CLI command that never touches a
service does not pay for importing its library.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import sqlalchemy as sa

from server import settings as settings_module
from sql import database

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from registry import servers
    from resource_center import store

# How long a one-shot CLI command waits for ZooKeeper, seconds.
CLI_ZK_TIMEOUT_S = 5.0


def engine(
    settings: settings_module.Settings, pool_size: int = 1, *, server: bool = False
) -> sa.Engine:
    """A checked engine: a clear one-line DatabaseError if PostgreSQL is unreachable.

    ``server``: the engine of a server process, whose sessions get the lock and
    idle-transaction limits that keep every wait inside a lease (SessionLimits)."""
    settings.require(*settings_module.DATABASE_KEYS)
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
    from resource_center import store

    settings.require(*settings_module.S3_KEYS)
    return store.Store(
        endpoint=settings.s3_endpoint,
        access_key=settings.s3_access_key.get_secret_value(),
        secret_key=settings.s3_secret_key.get_secret_value(),
        bucket=settings.s3_bucket,
        secure=settings.s3_secure,
        region=settings.s3_region,
    )


def _quiet_kazoo() -> None:
    # kazoo logs every failed connection attempt to stderr; a one-shot command reports
    # one line of its own instead.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL + 1)


@contextlib.contextmanager
def zookeeper(settings: settings_module.Settings) -> Iterator[tuple[KazooClient, str]]:
    """A short ZooKeeper session of a CLI command and the validated root path."""
    from registry import connection, servers

    settings.require(*settings_module.ZOOKEEPER_KEYS)
    _quiet_kazoo()
    root = servers.validate_root(settings.zk_root)
    with connection.opened(
        settings.zk_hosts,
        settings.zk_auth.get_secret_value(),
        timeout=CLI_ZK_TIMEOUT_S,
        previous_auth=settings.zk_auth_previous.get_secret_value(),
    ) as client:
        yield client, root


def live_servers(settings: settings_module.Settings) -> list[servers.ServerInfo]:
    """The live servers now, sorted by id (one short ZooKeeper session)."""
    from registry import servers

    settings.require(*settings_module.ZOOKEEPER_KEYS)
    _quiet_kazoo()
    return servers.list_servers(
        settings.zk_hosts,
        settings.zk_root,
        settings.zk_auth.get_secret_value(),
        previous_auth=settings.zk_auth_previous.get_secret_value(),
    )
