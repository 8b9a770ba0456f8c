"""A whole server process (``server/process.py``) inside the test process, against the
stack's real ZooKeeper, PostgreSQL and S3: this test's own chroot, database and bucket."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from registry import servers
from server import process
from server import settings as settings_module
from tests import services
from tests.waiting import wait_until


@pytest.fixture
def server(settings: settings_module.Settings) -> Iterator[process.Server]:
    """A started server whose supervising loop (``Server.run``) runs on a thread."""
    the_server = process.Server(settings)
    the_server.start()
    runs = threading.Thread(target=the_server.run, name="test-server-run", daemon=True)
    runs.start()
    yield the_server
    the_server.request_stop()
    runs.join(timeout=60)
    assert not runs.is_alive(), "the server did not stop"


def test_a_server_cut_off_from_postgresql_withdraws_from_zookeeper_and_returns(
    server: process.Server, settings: settings_module.Settings, database_url: str
) -> None:
    """H7: cut off from PostgreSQL only, a server stays in ZooKeeper and keeps the
    targets of jobs whose drivers its watchdogs kill. After one lease TTL without a
    renewal it withdraws (peers then place its jobs elsewhere) and it comes back once
    renewals succeed again; the process itself keeps running throughout."""
    hosts, root = settings.zk_hosts, settings.zk_root

    def listed() -> set[str]:
        return {info.id for info in servers.list_servers(hosts, root)}

    wait_until(lambda: server.id in listed(), 10, message="the server never registered")
    services.set_connections(database_url, allowed=False)
    try:
        wait_until(
            lambda: server.id not in listed(),
            settings.lease_ttl + 10,
            message="the server stayed in ZooKeeper without renewing its leases",
        )
        healthy, status = server.status()
        assert status["withdrawn"] and not healthy
        assert server.dead_component() is None
    finally:
        services.set_connections(database_url, allowed=True)
    wait_until(
        lambda: server.id in listed(),
        settings.lease_ttl + 10,
        message="the server did not come back once PostgreSQL was reachable again",
    )
    assert not server.status()[1]["withdrawn"]
