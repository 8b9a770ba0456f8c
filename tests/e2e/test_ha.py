"""End-to-end HA: three real servers (``sparkring server run`` subprocesses), the
stack's ZooKeeper, PostgreSQL and S3, and real drivers started by spark-submit.

Most cases use a light driver (testing/jobs/heartbeat.py: spark-submit, no SparkSession)
so that many can run on two cores; the streaming case runs real Structured Streaming
with its executors on the Spark standalone cluster. S1 (never two drivers of one job)
is proved from the heartbeats the drivers write and the watchdogs' lifetime records.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from testing import sink, waiting
from testing.cluster import Cluster
from tests.e2e import helpers


def _kinds(c: Cluster, name: str) -> list[str]:
    return [e["kind"] for e in c.events(name)]


def test_sigterm_hands_jobs_off_and_none_fail(cluster: Cluster) -> None:
    """(d) graceful shutdown: jobs move, none FAILED, the server exits 0."""
    helpers.start_cluster(cluster)
    names = [f"handoff-{i}" for i in range(3)]
    helpers.start_running(cluster, names, timeout=90)
    owners = {name: cluster.job(name)["owner"] for name in names}
    victim = max(set(owners.values()), key=lambda s: list(owners.values()).count(s))
    assert cluster.terminate(victim, timeout=60) == 0
    for name in names:
        job = cluster.wait_job(
            name, lambda j: helpers.running(j) and j["owner"] != victim, 90, f"{name} handed off"
        )
        assert job["state"] != "failed"
    for name in (n for n, o in owners.items() if o == victim):
        assert "released" in _kinds(cluster, name)
    helpers.assert_single_drivers(cluster)


def test_crash_looping_job_ends_failed_after_max_restarts(cluster: Cluster) -> None:
    """(f) a driver that keeps crashing: FAILED with its error after max_restarts."""
    helpers.start_cluster(cluster, servers=("s1", "s2"))
    crash = ["--run-for", "0", "--exit-code", "3"]
    helpers.heartbeat_job(cluster, "crashy", extra=crash, max_restarts=2)
    cluster.cli("job", "start", "crashy")
    job = cluster.wait_job("crashy", lambda j: j["state"] == "failed", 120, "job failed")
    assert job["restarts"] == 2
    assert "exit code 3" in job["last_error"]
    # The coordinator's retarget of the failed job (wanted nowhere) may come after it.
    kinds = [k for k in _kinds(cluster, "crashy") if k != "retargeted"]
    assert kinds.count("claimed") == 3 and kinds[-1] == "failed", kinds


@pytest.mark.spark
@pytest.mark.long(70)
def test_streaming_on_the_standalone_cluster_fails_over_from_its_checkpoint(
    cluster: Cluster, stack_env: dict[str, str]
) -> None:
    """(a) + (h): kill -9 the owner of a streaming job whose executors run on the Spark
    standalone cluster; it runs again elsewhere and resumes from its checkpoint with no
    micro-batch duplicated or lost. Then the killed server comes back: one fault, one
    restart (issue 24): it takes the job back neither at its return nor later, so the
    job has exactly one new claim over the whole scenario (``job events``)."""
    master = stack_env["SPARKRING_STACK_SPARK_MASTER_URL"]
    test_started_ms = time.time() * 1000
    helpers.start_cluster(cluster)
    output = cluster.root / "stream-out"
    counter = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "streaming_counter.py"
    cluster.cli("resource", "upload", "counter", str(counter))
    cluster.cli(
        "job", "create", "stream", "--resource", "counter", "--kind", "streaming",
        "--master", master, "--conf", "spark.cores.max=1", "--conf", "spark.executor.memory=512m",
        f"--arg={output}", f"--arg=--heartbeats={cluster.heartbeats}",
    )  # fmt: skip
    cluster.cli("job", "start", "stream")
    first = cluster.wait_job("stream", helpers.running, 90, "streaming job running")
    # A deadline, not a wait: in a clean-clone run at c838dca on this loaded 2-core
    # machine the executor's JVM took 52 s to start, and 120 s ran out before batch 3.
    waiting.wait_until(
        lambda: sink.committed_batches(output) >= 3, 240, interval=0.5,
        message="three micro-batches committed",
    )  # fmt: skip
    killed_at = time.time()
    cluster.kill(first["owner"])
    moved = cluster.wait_job(
        "stream",
        lambda j: helpers.running(j) and j["owner"] != first["owner"],
        90,
        "job failed over",
    )
    # The killed server returns (same id, same work dir). The coordinator's pass that
    # sees it back records the return (left_at cleared) and, in the same transaction,
    # that it is no joiner (settled): no later pass can move a job to it as one.
    cluster.start_server(first["owner"])
    waiting.wait_until(
        lambda: cluster.sql(
            "SELECT 1 FROM ring_members WHERE server = :s AND left_at IS NULL AND settled",
            s=first["owner"],
        ),
        90,
        interval=0.5,
        message="the killed server's return recorded",
    )
    helpers.stop_after_more_batches_exactly_once(cluster, "stream", output, 120, "the new driver")
    assert moved["epoch"] > first["epoch"]
    history = json.loads(cluster.cli("job", "events", "stream", "--json", "--limit", "1000").stdout)
    claims = [e for e in history if e["kind"] == "claimed"]
    assert [e["epoch"] for e in claims if e["epoch"] > first["epoch"]] == [moved["epoch"]], claims
    assert not [e for e in history if (e.get("detail") or {}).get("why") == "joined"], history
    heartbeats = cluster.heartbeat_records()
    new_driver = [h for h in heartbeats if h["epoch"] == str(moved["epoch"])]
    assert new_driver and min(h["t"] for h in new_driver) > killed_at
    # The executors ran on the standalone cluster, not in local mode.
    with urllib.request.urlopen(stack_env["SPARKRING_STACK_SPARK_UI_URL"] + "/json") as reply:
        apps = json.load(reply)
    ours = [
        a
        for a in apps.get("completedapps", []) + apps.get("activeapps", [])
        if a["starttime"] >= test_started_ms
        and a["name"] in ("streaming_counter", "sparkring-stream")
    ]
    assert len(ours) >= 2, "both drivers should have run executors on the standalone cluster"
    helpers.assert_single_drivers(cluster)
