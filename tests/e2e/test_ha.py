"""End-to-end HA: three real servers (``sparkring server run`` subprocesses), the
stack's ZooKeeper, PostgreSQL and S3, and real drivers started by spark-submit.

Most cases use a light driver (tests/jobs/heartbeat.py: spark-submit, no SparkSession)
so that many can run on two cores; the streaming case runs real Structured Streaming
with its executors on the Spark standalone cluster. S1 (never two drivers of one job)
is proved from the heartbeats the drivers write and the watchdogs' lifetime records.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests import cluster as cluster_module
from tests import sink, waiting
from tests.cluster import Cluster
from tests.e2e import helpers


def _overlapping_heartbeats(records: list[dict[str, Any]]) -> list[str]:
    """Two driver processes of one job alive in the same instant (heartbeat spans)."""
    spans: dict[tuple[str, int], list[float]] = {}
    for r in records:
        span = spans.setdefault((r["job"], r["pid"]), [r["t"], r["t"]])
        span[0], span[1] = min(span[0], r["t"]), max(span[1], r["t"])
    by_job: dict[str, list[list[float]]] = defaultdict(list)
    for (job, _), span in spans.items():
        by_job[job].append(span)
    problems = []
    for job, items in by_job.items():
        items.sort()
        for before, after in itertools.pairwise(items):
            if after[0] < before[1]:
                problems.append(f"{job}: {before} overlaps {after}")
    return problems


def _assert_single_drivers(c: Cluster) -> None:
    assert _overlapping_heartbeats(c.heartbeat_records()) == []
    assert cluster_module.overlaps(c.driver_records()) == []


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
    _assert_single_drivers(cluster)


@pytest.mark.long(55)
def test_a_joining_server_moves_only_retargeted_jobs_stop_then_start(cluster: Cluster) -> None:
    """(b) expansion: jobs whose target did not change keep their driver and epoch."""
    helpers.start_cluster(cluster, capacity=3)
    names = [f"grow-{i}" for i in range(6)]
    before = helpers.start_running(cluster, names)
    cluster.start_server("s4", capacity=3)
    cluster.wait_members(4)
    # The coordinator retargets after its debounce; until then everything looks settled.
    waiting.wait_until(
        lambda: any(cluster.job(n)["target"] == "s4" for n in names),
        60,
        interval=0.2,
        message="the coordinator targeted jobs at the new server",
    )

    # A gentle join moves one job at a time; it is over once s4 is marked settled.
    waiting.wait_until(
        lambda: cluster.sql("SELECT 1 FROM ring_members WHERE server = 's4' AND settled"),
        180,
        interval=0.5,
        message="s4's join over",
    )

    def settled() -> bool:
        jobs = {name: cluster.job(name) for name in names}
        return all(helpers.running(j) and j["owner"] == j["target"] for j in jobs.values())

    # Each move is a driver's stop and a spark-submit start (10-60 s on a loaded 2-core
    # machine: a clean-clone run timed out at 120 s while other suites ran beside it).
    waiting.wait_until(settled, 240, interval=0.5, message="jobs settled on their new targets")
    after = {name: cluster.job(name) for name in names}
    moved = [n for n in names if after[n]["owner"] != before[n]["owner"]]
    stayed = [n for n in names if n not in moved]
    assert moved, "a fourth server took no job"
    assert all(after[n]["owner"] == "s4" for n in moved)
    for name in stayed:
        assert after[name]["epoch"] == before[name]["epoch"], f"{name} restarted needlessly"
    for name in moved:
        kinds = _kinds(cluster, name)
        assert kinds.index("stopping") < kinds.index("released") < len(kinds)
    _assert_single_drivers(cluster)


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
    # A deadline, not a wait: in a clean-clone run at stop 39 on this loaded 2-core
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
    _assert_single_drivers(cluster)
