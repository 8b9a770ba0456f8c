"""Shipping a new revision of running jobs, through the CLI, on real servers: a
streaming job rolls to it with one stop-then-start, a batch run keeps its revision.
Light drivers (testing/jobs/heartbeat.py) record their epoch, revision and pid. A real
Structured Streaming query's roll, from the same checkpoint and exactly once, is
tests/e2e/test_warm_handoff.py's (the roll is a warm hand-off there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testing import cluster as cluster_module
from testing import waiting
from testing.cluster import HEARTBEAT_JOB, Cluster
from tests.e2e import helpers


def _beats(c: Cluster, job: str) -> list[dict]:
    return [r for r in c.heartbeat_records() if r["job"] == job]


@pytest.mark.long(30)
def test_a_running_streaming_job_rolls_once_and_a_running_batch_job_keeps_its_revision(
    cluster: Cluster,
) -> None:
    helpers.start_cluster(cluster, servers=("s1", "s2"))
    helpers.heartbeat_job(cluster, "stream")
    helpers.heartbeat_job(cluster, "nightly", kind="batch", extra=["--run-for", "600"])
    for name in ("stream", "nightly"):
        cluster.cli("job", "start", name)
    first = {
        n: cluster.wait_job(n, helpers.running, 90, f"{n} running") for n in ("stream", "nightly")
    }
    for name in ("stream", "nightly"):
        waiting.wait_until(lambda n=name: _beats(cluster, n), 30, message=f"{name} beats")

    rolled = cluster.cli("job", "update", "stream", "--conf", "spark.e2e.marker=2")
    assert "revision 2 (conf changed); rolling the running driver" in rolled.stdout
    kept = cluster.cli("job", "update", "nightly", "--conf", "spark.e2e.marker=2")
    assert "keeps revision 1" in kept.stdout

    second = cluster.wait_job(
        "stream",
        lambda j: helpers.running(j) and j["run_revision"] == 2,
        90,
        "stream running revision 2",
    )
    assert second["epoch"] == first["stream"]["epoch"] + 1
    waiting.wait_until(
        lambda: any(r["revision"] == "2" for r in _beats(cluster, "stream")),
        30,
        message="a heartbeat of revision 2",
    )
    # One stop-then-start: two drivers in all, one per epoch and revision, the second
    # started only after the first had ended (heartbeats and watchdog records).
    beats = _beats(cluster, "stream")
    drivers = {(r["epoch"], r["revision"], r["pid"]) for r in beats}
    assert {(e, rev) for e, rev, _ in drivers} == {
        (str(first["stream"]["epoch"]), "1"),
        (str(second["epoch"]), "2"),
    }
    assert len(drivers) == 2
    last_old = max(r["t"] for r in beats if r["revision"] == "1")
    first_new = min(r["t"] for r in beats if r["revision"] == "2")
    assert last_old < first_new
    assert cluster_module.overlaps(cluster.driver_records()) == []
    events = cluster.events("stream")
    stops = [e for e in events if e["kind"] == "stopping"]
    assert [e["detail"]["reason"] for e in stops] == ["rolling to revision 2"]
    claims = [e for e in events if e["kind"] == "claimed"]
    assert [e["detail"]["revision"] for e in claims] == [1, 2]
    revised = [e for e in events if e["kind"] == "revised"]
    assert [(e["detail"]["revision"], e["detail"]["effect"]) for e in revised] == [(2, "rolling")]

    # The batch run was left alone: same epoch, same driver, still revision 1.
    nightly = cluster.job("nightly")
    assert (nightly["state"], nightly["epoch"], nightly["revision"], nightly["run_revision"]) == (
        "running",
        first["nightly"]["epoch"],
        2,
        1,
    )
    assert {(r["revision"], r["pid"]) for r in _beats(cluster, "nightly")} == {
        ("1", _beats(cluster, "nightly")[0]["pid"])
    }
    assert "stopping" not in [e["kind"] for e in cluster.events("nightly")]
    history = cluster.cli("job", "history", "stream").stdout
    assert "conf spark.e2e.marker='2' added" in history


@pytest.mark.long(25)
def test_apply_creates_rolls_and_prunes_a_running_job(cluster: Cluster, tmp_path: Path) -> None:
    """A spec file through real servers: the job it creates runs; the same file again
    changes nothing; new content of its artifact rolls it to revision 2 (one upload);
    --prune of a file without it stops its driver and deletes it."""
    helpers.start_cluster(cluster, servers=("s1",))
    folder = tmp_path / "spec"
    folder.mkdir()
    main = folder / "beat.py"
    main.write_text(HEARTBEAT_JOB.read_text())
    spec = folder / "jobs.toml"
    spec.write_text(
        f'label = "e2e"\n[jobs.beat]\nresource = "./beat.py"\nargs = ["{cluster.heartbeats}"]\n'
    )
    assert cluster.cli("apply", "-f", str(spec)).stdout.splitlines()[0] == (
        "create    beat (streaming, beat:new)"
    )
    first = cluster.wait_job("beat", helpers.running, 90, "beat running")
    assert cluster.cli("apply", "-f", str(spec)).stdout.splitlines() == [
        "unchanged beat",
        "nothing to change",
    ]
    main.write_text(HEARTBEAT_JOB.read_text() + "\n# version 2\n")
    rolled = cluster.cli("apply", "-f", str(spec)).stdout
    assert "update    beat: resource beat:1 -> beat:new" in rolled
    second = cluster.wait_job(
        "beat", lambda j: helpers.running(j) and j["run_revision"] == 2, 90, "beat revision 2"
    )
    assert second["epoch"] == first["epoch"] + 1
    assert second["resource"]["version"] == 2
    spec.write_text('label = "e2e"\n')
    pruned = cluster.cli("apply", "-f", str(spec), "--prune").stdout
    assert pruned.splitlines()[0] == "delete    beat"
    listed = cluster.cli("job", "list", "--json").stdout
    assert json.loads(listed) == []
    assert cluster_module.overlaps(cluster.driver_records()) == []
    kinds = [e["kind"] for e in cluster.events("beat")]
    assert kinds.count("claimed") == 2 and kinds[-1] == "deleted", kinds
