"""A driver's executors on another host: a Spark worker in a network namespace of its
own (its own loopback, another address), the master and the server on the host.

This is the compose deployment in miniature: there the executors run in the worker
containers and reach the driver in a server container over the compose network. A
driver that advertises loopback (``SPARK_LOCAL_IP=127.0.0.1``, the default before
server/driver_network.py) is never reached: each executor dies with "Connection refused:
localhost/127.0.0.1" and the job waits for resources for ever. On one host without a
namespace every address is the host's, so nothing else in the suite can see it.

The job is Spark's own ``pi.py`` from the pyspark wheel, run as a user runs it: uploaded,
created as a batch job on the cluster's ``spark://`` master, started; it must finish
with its answer in the log, its tasks run by an executor at the worker's address.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from testing import services, waiting
from testing.chaos import faults
from testing.cluster import Cluster
from tests import conftest

PI = Path(pyspark.__file__).parent / "examples" / "src" / "main" / "python" / "pi.py"
UP_S = 180.0


@pytest.fixture
def partition() -> Iterator[faults.Partition]:
    reason = faults.namespaces_unavailable()
    if reason:
        conftest.unavailable(reason)
    p = faults.Partition([])  # nothing forwarded: the worker talks to the host's addresses
    p.create()
    yield p
    p.close()


def _start_worker(
    p: faults.Partition, masters: faults.SparkMasters, folder: Path
) -> subprocess.Popen[bytes]:
    env = {**masters.env(), "SPARK_LOCAL_IP": p.peer}
    argv = [
        *p.wrapper,
        str(Path(env["SPARK_HOME"]) / "bin" / "spark-class"),
        "org.apache.spark.deploy.worker.Worker", masters.url(),
        "--host", p.peer, "--cores", "1", "--memory", "1g",
        "--webui-port", str(services.free_port()), "--work-dir", str(folder / "work"),
    ]  # fmt: skip
    with (folder / "worker.log").open("ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def _worker_alive(masters: faults.SparkMasters) -> bool:
    try:
        url = f"http://{masters.host}:{masters.ports[0][1]}/json"
        with urllib.request.urlopen(url, timeout=2) as response:
            state = json.load(response)
    except (OSError, ValueError):
        return False
    return any(w.get("state") == "ALIVE" for w in state.get("workers", []))


@pytest.mark.spark
@pytest.mark.long(40)
def test_a_batch_job_on_a_cluster_master_runs_its_tasks_on_a_worker_at_another_address(
    cluster: Cluster, partition: faults.Partition, tmp_path: Path
) -> None:
    folder = tmp_path / "spark"
    masters = faults.SparkMasters(folder, 1, host=partition.host)
    masters.start()
    worker = None
    try:
        masters.wait_answering(timeout=UP_S)
        worker = _start_worker(partition, masters, folder)
        # The server, as a server on the master's network: its advertised address is the
        # host end of the veth, which the worker's namespace reaches.
        cluster.start_server("s1", env={"SPARKRING_ADVERTISE_HOST": partition.host})
        cluster.wait_members(1)
        waiting.wait_until(
            lambda: _worker_alive(masters), UP_S, interval=1.0, message="the worker registered"
        )
        cluster.cli("resource", "upload", "pi", str(PI))
        cluster.cli(
            "job", "create", "pi", "--resource", "pi", "--kind", "batch",
            "--master", masters.url(), "--max-retries", "0", "--arg", "2",
        )  # fmt: skip
        cluster.cli("job", "start", "pi")
        job = cluster.wait_job(
            "pi", lambda j: j["state"] in ("finished", "failed"), UP_S, "pi ended"
        )
        # An ended run's log is read from S3, where its server ships it once the run ended.
        waiting.wait_until(
            lambda: cluster.cli("job", "logs", "pi", check=False).returncode == 0,
            60,
            interval=0.5,
            message="pi's log shipped",
        )
        log = cluster.cli("job", "logs", "pi", "-n", "1000").stdout
        assert job["state"] == "finished", (job, log[-3000:])
        assert re.search(r"Pi is roughly 3\.1", log), log[-3000:]
        # Its tasks ran on an executor at the worker's address, not inside the driver.
        on_worker = re.findall(
            rf"Finished task .* on {re.escape(partition.peer)} \(executor \d+\)", log
        )
        assert len(on_worker) == 2, log[-3000:]
        kinds = [e["kind"] for e in cluster.events("pi")]
        assert kinds.count("claimed") == 1 and "crashed" not in kinds, kinds
    finally:
        if worker is not None:
            worker.kill()
            worker.wait(timeout=30)
        masters.close()
