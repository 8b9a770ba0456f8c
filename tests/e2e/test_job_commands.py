"""``job start --wait``, ``job stop --wait`` and ``job logs --follow`` against a real
server and a light driver (testing/jobs/heartbeat.py under spark-submit)."""

from __future__ import annotations

import subprocess
import sys
import threading

from testing import waiting
from testing.cluster import Cluster
from tests.e2e import helpers


def test_start_and_stop_wait_until_the_job_is_there(cluster: Cluster) -> None:
    helpers.start_cluster(cluster, servers=("s1",))
    helpers.heartbeat_job(cluster, "hb")
    started = cluster.cli("job", "start", "hb", "--wait", "--timeout", "100")
    assert started.stdout.splitlines()[-1] == "job hb: running", started.stdout
    assert helpers.running(cluster.job("hb"))  # at once: the wait saw it
    stopped = cluster.cli("job", "stop", "hb", "--wait", "--timeout", "100")
    assert stopped.stdout.splitlines()[-1] == "job hb: stopped", stopped.stdout
    job = cluster.job("hb")
    assert (job["state"], job["owner"]) == ("stopped", None)


def test_logs_follow_survives_a_restart_and_says_why_it_ends(cluster: Cluster) -> None:
    """`job logs -f` follows the job's next run after a restart, and when the job is
    stopped it says so on stderr (before issue 23 it ended silently with the first run)."""
    helpers.start_cluster(cluster, servers=("s1",))
    helpers.heartbeat_job(cluster, "talk")
    cluster.cli("job", "start", "talk", "--wait", "--timeout", "100")
    errors = cluster.root / "follow.err"
    with errors.open("wb") as stderr:
        follower = subprocess.Popen(
            [sys.executable, "-m", "server", "job", "logs", "talk", "--follow", "-n", "5"],
            env={**cluster.env, "SPARKRING_WORK_DIR": str(cluster.root / "cli")},
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    received = bytearray()

    def read() -> None:
        assert follower.stdout is not None
        with follower.stdout:
            while chunk := follower.stdout.read1(4096):
                received.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        waiting.wait_until(lambda: received, 60, message="the log's tail was printed")
        epoch = cluster.job("talk")["epoch"]
        cluster.cli("job", "restart", "talk")
        waiting.wait_until(
            lambda: f"following its next run (epoch {epoch + 1}" in errors.read_text(),
            120,
            message="the follow moved to the next run",
        )
        # Written after the follow moved on: the stop, and the watchdog's last line.
        cluster.cli("job", "stop", "talk")
        assert follower.wait(timeout=120) == 0, errors.read_text()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        reader.join(timeout=10)
    assert b"stop requested" in received, bytes(received[-2000:])
    assert b"driver ended: reason=stopped" in received, bytes(received[-2000:])
    assert received.count(b"[sparkring] follow ended: the run ended\n") == 2
    assert "job talk: the run ended; the job is stopped" in errors.read_text()
