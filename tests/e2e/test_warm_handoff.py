"""The warm hand-off of a real Structured Streaming job (docs/drivers.md, "Warm
hand-off"): an update roll and a drain start the next driver's JVM and SparkSession
while the old driver still runs; the job's main runs only after the claim. The output
gap is measured from the committed files and printed (a liveness figure: measured by
benchmarks/warm_handoff.py, not asserted), and the output holds every value once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testing import cluster as cluster_module
from testing import sink, waiting
from testing.cluster import EXAMPLES, Cluster
from tests.e2e import helpers


def _claims(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events(name) if e["kind"] == "claimed"]


def _moved(cluster: Cluster, name: str, before: dict[str, Any], check: Any, what: str) -> dict:
    return cluster.wait_job(
        name, lambda j: helpers.running(j) and j["epoch"] > before["epoch"] and check(j), 180, what
    )


@pytest.mark.spark
@pytest.mark.long(65)
def test_an_update_roll_and_a_drain_of_a_stream_are_warm_and_exactly_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    helpers.start_cluster(cluster, servers=("s1", "s2"))
    output, first = helpers.start_streaming_counter(cluster)
    helpers.upload_counter_version(cluster, tmp_path / "v2", lambda text: text + "\n# version 2\n")
    cluster.cli("job", "update", "stream", "--resource", "counter")
    rolled = _moved(cluster, "stream", first, lambda j: j["run_revision"] == 2, "rolled")
    assert rolled["epoch"] == first["epoch"] + 1 and rolled["owner"] == first["owner"]
    assert rolled["resource"]["version"] == 2
    waiting.wait_until(
        lambda: rolled["epoch"] in sink.written_by_epoch(output), 120, interval=0.5,
        message="the rolled driver committed",
    )  # fmt: skip
    roll_gap = sink.output_gap(output, first["epoch"], rolled["epoch"])

    cluster.cli("server", "drain", rolled["owner"])
    drained = _moved(cluster, "stream", rolled, lambda j: j["owner"] != rolled["owner"], "moved")
    assert drained["epoch"] == rolled["epoch"] + 1
    waiting.wait_until(
        lambda: drained["epoch"] in sink.written_by_epoch(output), 120, interval=0.5,
        message="the moved driver committed",
    )  # fmt: skip
    drain_gap = sink.output_gap(output, rolled["epoch"], drained["epoch"])
    print(f"output gap: update roll {roll_gap:.1f} s, drain {drain_gap:.1f} s")

    claims = _claims(cluster, "stream")
    assert [c["detail"].get("warm", False) for c in claims] == [False, True, True], claims
    helpers.stop_after_more_batches_exactly_once(cluster, "stream", output, 180, "the moved driver")
    assert cluster_module.overlaps(cluster.driver_records()) == []


@pytest.mark.spark
def test_a_job_that_opts_out_is_moved_cold(cluster: Cluster) -> None:
    """``--conf sparkring.handoff.warm=false``: for a program that builds its own
    SparkContext, which the warm session would refuse."""
    helpers.start_cluster(cluster, servers=("s1", "s2"))
    output = cluster.root / "stream-out"
    cluster.cli("resource", "upload", "counter", str(EXAMPLES / "streaming_counter.py"))
    cluster.cli(
        "job", "create", "stream", "--resource", "counter", "--master", "local[1]",
        "--conf", "sparkring.handoff.warm=false", f"--arg={output}",
    )  # fmt: skip
    cluster.cli("job", "start", "stream")
    first = cluster.wait_job("stream", helpers.running, 120, "streaming job running")
    cluster.cli("server", "drain", first["owner"])
    _moved(cluster, "stream", first, lambda j: j["owner"] != first["owner"], "moved")
    assert [c["detail"].get("warm", False) for c in _claims(cluster, "stream")] == [False, False]
    stopping = [e for e in cluster.events("stream") if e["kind"] == "stopping"]
    assert stopping and not stopping[-1]["detail"].get("warm"), stopping
