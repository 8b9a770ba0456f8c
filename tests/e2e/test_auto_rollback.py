"""Updates that roll themselves back, on real servers (scheduler/auto_rollback.py): a
streaming job updated with --auto-rollback to a revision that crashes at start goes back
to the previous revision by itself, once, with one driver at a time; a real Structured
Streaming query does so from the same checkpoint, its output exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from testing import cluster as cluster_module
from testing import waiting
from testing.cluster import Cluster
from tests.e2e import helpers


def _rolled_back(c: Cluster, job: str) -> list[dict]:
    return [e for e in c.events(job) if e["kind"] == "rolled_back"]


@pytest.mark.long(30)
def test_an_update_that_crashes_at_start_rolls_back_by_itself(cluster: Cluster) -> None:
    helpers.start_cluster(cluster, servers=("s1", "s2"))
    helpers.heartbeat_job(cluster, "beat")
    cluster.cli("job", "start", "beat")
    first = cluster.wait_job("beat", helpers.running, 90, "beat running")
    # Revision 2 exits 3 half a second after its start: a crash before it was healthy.
    updated = cluster.cli(
        "job", "update", "beat", "--auto-rollback", "--healthy-within", "5m",
        f"--arg={cluster.heartbeats}", "--arg=--run-for", "--arg=0.5", "--arg=--exit-code",
        "--arg=3",
    )  # fmt: skip
    assert "auto-rollback watches it until" in updated.stdout, updated.stdout
    back = cluster.wait_job(
        "beat",
        lambda j: helpers.running(j) and j["run_revision"] == 3,
        120,
        "beat running revision 3 (revision 1 again)",
    )
    assert back["revision"] == 3 and back["epoch"] > first["epoch"]
    [event] = _rolled_back(cluster, "beat")
    assert (event["detail"]["cause"], event["detail"]["revision"], event["detail"]["to"]) == (
        "crashed", 2, 1,
    )  # fmt: skip
    assert back["auto_rollback"]["watch"] is None
    # Revision 3 is the rollback: never watched, never rolled back again.
    waiting.wait_until(lambda: len(cluster.heartbeat_records()) > 0, 30, message="beats")
    assert len(_rolled_back(cluster, "beat")) == 1
    assert cluster_module.overlaps(cluster.driver_records()) == []


@pytest.mark.spark
@pytest.mark.long(65)
def test_a_streaming_query_updated_to_a_version_that_raises_rolls_back_exactly_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    """examples/jobs/streaming_counter.py updated with --auto-rollback to a v2 that
    raises at start: the job returns to v1 by itself, from the same checkpoint, and the
    committed output still has every value exactly once."""
    helpers.start_cluster(cluster, servers=("s1",))
    output, first = helpers.start_streaming_counter(
        cluster, "--auto-rollback", "--healthy-within", "5m"
    )
    helpers.upload_counter_version(
        cluster,
        tmp_path / "v2",
        lambda text: text.replace(
            "import argparse\n", "import argparse\n\nraise RuntimeError('v2 raises at start')\n", 1
        ),
    )
    cluster.cli("job", "update", "stream", "--resource", "counter")
    back = cluster.wait_job(
        "stream",
        lambda j: helpers.running(j) and j["run_revision"] == 3,
        180,
        "stream running revision 3 (v1 again)",
    )
    assert back["resource"]["version"] == 1 and back["epoch"] >= first["epoch"] + 2
    [event] = _rolled_back(cluster, "stream")
    assert event["detail"]["cause"] == "crashed"
    helpers.stop_after_more_batches_exactly_once(cluster, "stream", output, 180, "v1 again")
    assert cluster_module.overlaps(cluster.driver_records()) == []
