"""A whole server process (``server/process.py``) inside the test process, against the
stack's real ZooKeeper, PostgreSQL and S3: this test's own chroot, database and bucket."""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry import servers
from server import driver_user, metrics, process, tls
from server import settings as settings_module
from server.web import endpoint
from testing import certificates, services
from testing.waiting import wait_until
from tests import conftest


@pytest.fixture
def server(settings: settings_module.Settings) -> Iterator[process.Server]:
    """A started server whose supervising loop (``Server.run``) runs on a thread."""
    the_server = process.Server(settings, endpoint.open)
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


def test_a_planned_restart_hands_over_without_waiting_for_a_stop_in_flight(
    settings: settings_module.Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hole H10: a planned restart (SIGTERM with a hand-over window) joined the runner's
    tasks before extending the leases. A driver stop in flight (up to the stop grace plus
    10 s) held the hand-over back with no renewals, so every other driver of the server
    died at its deadline and the restart became a full one. The leases are extended
    first; the tasks are waited for after."""
    the_server = process.Server(
        settings.model_copy(update={"handover_window": 60.0}), endpoint.open
    )
    the_server.start()
    assert the_server.runner is not None
    handed = threading.Event()
    hand_over = the_server.runner.hand_over

    def record_hand_over(window: float) -> list[str]:
        handed.set()
        return hand_over(window)

    monkeypatch.setattr(the_server.runner, "hand_over", record_hand_over)
    stop_in_flight = threading.Event()
    the_server.runner._tasks.submit(stop_in_flight.wait, 60)  # a slow driver stop
    the_server.request_hand_over()
    shutdown = threading.Thread(target=the_server.shutdown, name="test-shutdown", daemon=True)
    shutdown.start()
    try:
        wait_until(handed.is_set, 20, message="the hand-over waited for the stop in flight")
    finally:
        stop_in_flight.set()
        shutdown.join(60)
    assert not shutdown.is_alive()


def test_a_server_without_a_driver_user_warns_and_says_so_in_zookeeper(
    server: process.Server, settings: settings_module.Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Drivers under the server's own user can read its credentials: the server says so
    at start and publishes it (``server list`` shows "(own)")."""
    assert not settings.driver_user
    started = " ".join(r.getMessage() for r in caplog.get_records("setup"))  # the fixture's start
    assert "drivers run as the server's own user" in started
    wait_until(
        lambda: (
            server.id in {i.id for i in servers.list_servers(settings.zk_hosts, settings.zk_root)}
        ),
        10,
        message="the server never registered",
    )
    [info] = servers.list_servers(settings.zk_hosts, settings.zk_root)
    assert info.driver_user == process._own_user_name() and not info.driver_user_isolated


def test_a_driver_user_that_cannot_reach_the_work_dir_stops_the_start(
    settings: settings_module.Settings, tmp_path: Path
) -> None:
    """pytest's temporary folders are 0700: a driver could not read its artifacts below
    them. The server refuses to start and names the setting and the folder."""
    try:
        driver_user.resolve("sparkring-driver")
    except driver_user.DriverUserError as exc:
        conftest.unavailable(f"{exc}: run scripts/bootstrap.sh")
    tmp_path.chmod(0o700)
    the_server = process.Server(
        settings.model_copy(update={"driver_user": "sparkring-driver"}), endpoint.open
    )
    try:
        with pytest.raises(process.StartupError) as raised:
            the_server.start()
    finally:
        the_server.shutdown(hand_off=False)
    message = str(raised.value)
    assert message.startswith(f"SPARKRING_WORK_DIR ({settings.work_dir}): the driver user")
    assert "is drwx------" in message


def test_a_server_with_tls_serves_https_and_registers_an_https_url(
    settings: settings_module.Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SPARKRING_TLS_CERT / SPARKRING_TLS_KEY: the API and console answer over HTTPS only,
    and the URL peers and the CLI use (``health_url``) says https, as does the console's
    address the server logs at start."""
    caplog.set_level(logging.INFO, logger=process.log.name)
    cert, key = certificates.self_signed(tmp_path, "server")
    tls_settings = settings.model_copy(
        update={"tls_cert": cert, "tls_key": key, "advertise_host": certificates.HOST}
    )
    the_server = process.Server(tls_settings, endpoint.open)
    try:
        the_server.start()
        assert the_server.http is not None
        url = f"https://{certificates.HOST}:{the_server.http.port}"

        def registered() -> list[servers.ServerInfo]:
            return servers.list_servers(settings.zk_hosts, settings.zk_root)

        wait_until(registered, 10, message="the server never registered")
        assert [info.health_url for info in registered()] == [url]
        assert f"console at {url}/console/" in caplog.messages
        # The stack's PostgreSQL has no standby, and the server says so once.
        said = [m for m in caplog.messages if m.startswith("PostgreSQL has no standby")]
        assert len(said) == 1, caplog.messages
        context = tls.client_context(cert)
        with urllib.request.urlopen(f"{url}/healthz", timeout=10, context=context) as reply:
            assert reply.status == 200
        with pytest.raises(OSError):  # plain HTTP on the TLS port gets no answer
            urllib.request.urlopen(url.replace("https", "http") + "/healthz", timeout=10).read()
    finally:
        the_server.shutdown(hand_off=False)


def test_a_server_with_half_of_its_tls_settings_does_not_start(
    settings: settings_module.Settings, tmp_path: Path
) -> None:
    cert, _ = certificates.self_signed(tmp_path, "server")
    the_server = process.Server(settings.model_copy(update={"tls_cert": cert}), endpoint.open)
    try:
        with pytest.raises(process.StartupError, match="SPARKRING_TLS_KEY go together"):
            the_server.start()
    finally:
        the_server.shutdown(hand_off=False)


def test_a_server_reports_whether_its_spark_masters_answer(
    settings: settings_module.Settings,
) -> None:
    """Issue 29, "Visible": the server's own spark:// masters are probed off the hot path;
    the report is published in its ZooKeeper node (``server list``, ``/api/v1/servers``)
    and exported as sparkring_spark_master_up. /healthz stays about the server."""
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: refuses connections
        up, down = (f"127.0.0.1:{s.getsockname()[1]}" for s in (listening, closed))
        the_server = process.Server(
            settings.model_copy(update={"spark_master": f"spark://{down},{up}"}), endpoint.open
        )
        the_server.start()
        try:
            expected = {down: False, up: True}

            def published() -> dict[str, bool] | None:
                found = servers.list_servers(settings.zk_hosts, settings.zk_root)
                return next((i.spark_masters for i in found if i.id == the_server.id), None)

            wait_until(lambda: published() == expected, 10, message="no master report")
            scrape = metrics.REGISTRY.render()
            assert f'sparkring_spark_master_up{{master="{down}"}} 0.0' in scrape
            assert f'sparkring_spark_master_up{{master="{up}"}} 1.0' in scrape
            # A master down is no reason for the server to be unhealthy.
            wait_until(lambda: the_server.status()[0], 10, message="the server is unhealthy")
            status = the_server.status()[1]
            assert status["master_watch_alive"]
            assert "spark_masters" not in status
        finally:
            the_server.shutdown(hand_off=False)
        assert the_server.master_watch is not None and not the_server.master_watch.is_alive()
