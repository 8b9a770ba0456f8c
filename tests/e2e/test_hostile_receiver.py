"""A webhook receiver that holds its answer, against a real server: its SIGTERM still
hands its jobs over at once (issue 45: the alert sender's stop waited for its sends,
before the hand-over, so a trickling receiver held a graceful stop until the service
manager's SIGKILL, and the drivers died with it)."""

from __future__ import annotations

import time

from scheduler import alerts
from testing import factories
from testing.cluster import Cluster
from testing.hostile_http import HostileServer
from tests.e2e import helpers


def test_sigterm_hands_over_at_once_while_a_receiver_holds_its_answer(cluster: Cluster) -> None:
    hostile = HostileServer("trickle", seconds=120.0).start()
    try:
        helpers.start_cluster(cluster, servers=("s1",))
        helpers.heartbeat_job(cluster, "beat")
        cluster.cli("job", "start", "beat")
        cluster.wait_job("beat", lambda j: j["state"] == "running", 120, "beat running")
        with cluster.engine.begin() as conn:
            alerts.create(conn, "slow", hostile.url, kinds="all", allow_networks=factories.LOOPBACK)
        cluster.cli("alert", "test", "slow")  # a delivery to the receiver, queued now
        assert hostile.seen.wait(60), "the server never posted to the receiver"
        started = time.monotonic()
        code = cluster.terminate("s1", timeout=90)
        took = time.monotonic() - started
        assert code == 0
        # Its stop grace (10 s here) and the hand-off, not the receiver's 120 s.
        assert took < 30, f"SIGTERM took {took:.1f} s with a receiver holding its answer"
        # It handed its job off (released it) rather than leaving it to its lease.
        assert "released" in [e["kind"] for e in cluster.events("beat")]
    finally:
        hostile.stop()
