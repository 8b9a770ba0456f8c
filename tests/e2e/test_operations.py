"""Operating a live cluster through the CLI: logs, ring, health and metrics, bad
commands. Real servers and light drivers (testing/jobs/heartbeat.py). In the chaos
campaign: a second server with a live server's id is refused
(``test_a_second_process_with_a_live_servers_id``); a drain moves a server's jobs off,
``ring show`` lists it holding nothing, and ``drain --undo`` makes it placeable again
(``test_the_target_of_a_warm_hand_off_killed_while_its_driver_warms``; the randomized
mode drains and undoes through the CLI beside its faults)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testing import waiting
from testing.cluster import Cluster
from tests.e2e import helpers


def _health_url(c: Cluster, server_id: str) -> str:
    servers = json.loads(c.cli("server", "list", "--json").stdout)
    return next(s["health_url"] for s in servers if s["id"] == server_id)


def test_logs_health_metrics_and_ring_explain_of_a_running_job(cluster: Cluster) -> None:
    helpers.start_cluster(cluster, servers=("s1", "s2"))
    helpers.heartbeat_job(cluster, "talker")
    cluster.cli("job", "start", "talker")
    job = cluster.wait_job("talker", helpers.running, 90, "job running")
    # The live log, read from the owner's HTTP endpoint: spark-submit writes there.
    waiting.wait_until(
        lambda: cluster.cli("job", "logs", "talker", check=False).stdout.strip() != "",
        30,
        message="a live driver log",
    )
    url = _health_url(cluster, job["owner"])
    with urllib.request.urlopen(url + "/healthz", timeout=5) as reply:
        health = json.load(reply)
    # Open to anyone: counts only, never job names (issue 23).
    assert health["running"] == 1 and "jobs" not in health and "talker" not in json.dumps(health)
    assert health["zookeeper"] == "connected"
    with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(reply.read().decode())
            for s in family.samples
        }
    assert samples[("sparkring_jobs_owned", ())] == 1
    assert samples[("sparkring_claims_total", ())] == 1
    assert samples[("sparkring_jobs", (("state", "running"),))] == 1
    assert samples[("sparkring_lease_renew_seconds_count", ())] >= 1
    # The owner serves the live log only to a token holder (the CLI used the cluster
    # credential above); anyone else reaching the port gets 401.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url + "/logs/talker", timeout=5)
    refused.value.close()
    assert refused.value.code == 401
    explained = json.loads(cluster.cli("ring", "explain", "talker", "--json").stdout)
    assert explained["target"] == job["target"]
    # Follow the live log through the other server (it relays the owner's stream with
    # the cluster credential); the stream ends when the run does.
    token = cluster.cli("token", "create", "e2e", "--role", "viewer").stdout.strip()
    other = _health_url(cluster, "s1" if job["owner"] == "s2" else "s2")
    received: list[bytes] = []
    statuses: list[int] = []
    ended = threading.Event()

    def read_stream() -> None:
        with httpx.stream(
            "GET",
            f"{other}/api/v1/jobs/talker/logs",
            params={"follow": "true"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=90,
        ) as reply:
            statuses.append(reply.status_code)
            received.extend(reply.iter_bytes())
        ended.set()

    threading.Thread(target=read_stream, name="follow", daemon=True).start()
    waiting.wait_until(lambda: received, 30, message="the followed log's tail")
    # After a stop, the shipped log of the last run is what `job logs` shows.
    cluster.cli("job", "stop", "talker")
    cluster.wait_job("talker", lambda j: j["state"] == "stopped", 60, "job stopped")
    assert ended.wait(30), "the followed log did not end with its run"
    assert statuses == [200] and b"".join(received).strip()
    waiting.wait_until(
        lambda: cluster.cli("job", "logs", "talker", check=False).returncode == 0,
        30,
        message="the shipped log",
    )
    unknown = cluster.cli("job", "logs", "nope", check=False)
    assert unknown.returncode == 1 and "no job named 'nope'" in unknown.stderr


def test_bad_commands_are_one_clear_line(cluster: Cluster) -> None:
    helpers.start_cluster(cluster, servers=("s1",))
    cases = [
        (("job", "create", "x", "--resource", "missing"), "missing"),
        (("job", "start", "ghost"), "no job named 'ghost'"),
        (("job", "create", "x", "--resource", "r", "--conf", "nokey"), "is not KEY=VALUE"),
    ]
    for args, expected in cases:
        result = cluster.cli(*args, check=False)
        assert result.returncode != 0, args
        assert expected in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
