"""S9 end to end: a Spark master outage costs a batch job nothing but waiting.

The shared stack's master is never stopped: the job names a private master of its own
(free ports, started by ``scripts/stack.py spark start`` in a folder of the test's),
down when the job starts and for about a minute after, then up. The job ends FINISHED
with its retry budget untouched, and its events name the cause in one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testing import waiting
from testing.cluster import REPO, Cluster
from tests.e2e import helpers

BATCH_SUM = REPO / "examples" / "jobs" / "batch_sum.py"
OUTAGE_S = 60.0
SPARK_UP_S = 240.0  # a master and a worker JVM, then a driver, on a busy 2-core machine


def _free_port(pairs: bool = False) -> int:
    """A free port (with ``pairs``, one whose successor is free too: the worker's UI)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if not pairs or port >= 65535:
            return port
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


@dataclass(frozen=True)
class PrivateMaster:
    """A Spark master and worker of this test's, started and stopped by scripts/stack.py
    (``stack.py spark start|stop``) in a stack folder and on free ports of its own."""

    env: dict[str, str]
    port: int

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def stack(self, action: str) -> None:
        argv = [sys.executable, str(REPO / "scripts" / "stack.py"), "spark", action]
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr


@pytest.fixture
def private_master(tmp_path: Path) -> Iterator[PrivateMaster]:
    port = _free_port()
    env = {
        **os.environ,
        "SPARKRING_STACK_DIR": str(tmp_path / "private-stack"),
        "SPARKRING_STACK_SPARK_PORT": str(port),
        "SPARKRING_STACK_SPARK_UI_PORT": str(_free_port(pairs=True)),
    }
    master = PrivateMaster(env, port)
    yield master
    master.stack("stop")


@pytest.mark.spark
@pytest.mark.long(80)
def test_a_batch_job_started_while_its_master_is_down_finishes_with_its_budget_untouched(
    cluster: Cluster, private_master: PrivateMaster
) -> None:
    master = private_master.url
    helpers.start_cluster(cluster, servers=("s1",))
    cluster.cli("resource", "upload", "batch-sum", str(BATCH_SUM))
    output = cluster.root / "sum.json"
    cluster.cli(
        "job", "create", "nightly", "--resource", "batch-sum", "--kind", "batch",
        "--master", master, "--max-retries", "1",
        "--conf", "spark.cores.max=1", "--conf", "spark.executor.memory=512m",
        f"--arg={output}",
    )  # fmt: skip
    cluster.cli("job", "start", "nightly")
    started = time.monotonic()
    deferred: list[dict[str, object]] = []

    def outage_checked() -> bool:
        """Through the outage: deferred, never crashed, failed or counted."""
        events = cluster.events("nightly")
        kinds = [e["kind"] for e in events]
        assert "crashed" not in kinds and "failed" not in kinds, events
        assert cluster.job("nightly")["restarts"] == 0
        deferred[:] = [e for e in events if e["kind"] == "deferred"]
        return bool(deferred) and time.monotonic() - started >= OUTAGE_S

    waiting.wait_until(outage_checked, OUTAGE_S + 60, interval=2.0, message="no deferral")
    assert not output.exists(), "the job ran with no master"
    assert deferred[0]["detail"]["cause"] == "spark-master-unreachable", deferred[0]
    assert deferred[0]["detail"]["error"] == f"cause=spark-master-unreachable master={master}"

    private_master.stack("start")  # a master and a worker
    job = cluster.wait_job("nightly", lambda j: j["state"] == "finished", SPARK_UP_S, "finished")
    assert (job["restarts"], job["last_error"]) == (0, None), job
    assert json.loads(output.read_text())["sum"] == sum(range(1000))
    kinds = [e["kind"] for e in cluster.events("nightly")]
    assert "crashed" not in kinds and "failed" not in kinds, kinds
    assert kinds.count("driver_started") == 1, kinds
    # Each event is one line of `job events`, piped as here, the deferrals with their cause.
    # The server may still append an event after the row says finished (as its run ends):
    # the listing holds at least what was there before it and at most what is there after.
    before = len(cluster.events("nightly"))
    listed = cluster.cli("job", "events", "nightly").stdout.splitlines()
    after = len(cluster.events("nightly"))
    rows = [line for line in listed if " deferred " in line]
    assert rows and all(f"cause=spark-master-unreachable master={master}" in r for r in rows)
    assert before + 2 <= len(listed) <= after + 2, (before, after, listed)  # header and rule
