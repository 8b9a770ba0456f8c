"""Batch retries end to end: a real server runs a light batch driver (spark-submit, no
SparkSession) that exits nonzero; it is retried with backoff while its ``--max-retries``
budget lasts and FAILED only once the budget is spent."""

from __future__ import annotations

import json
import re
from pathlib import Path

from testing.cluster import HEARTBEAT_JOB, Cluster
from tests.e2e import helpers

FAIL_ONCE_JOB = Path(__file__).parents[2] / "testing" / "jobs" / "fail_once.py"


def _kinds(cluster: Cluster, name: str) -> list[str]:
    return [e["kind"] for e in cluster.events(name)]


def _listed(cluster: Cluster, name: str) -> dict[str, str]:
    """The job's row of ``job list`` (the table, as a person reads it)."""
    lines = cluster.cli("job", "list").stdout.splitlines()
    header = [c.strip() for c in re.split("[│┃]", lines[0])]
    for line in lines[2:]:
        cells = [c.strip() for c in re.split("[│┃]", line)]
        if cells[0] == name:
            return dict(zip(header, cells, strict=True))
    raise AssertionError(f"{name} not in job list: {lines}")


def test_a_failing_batch_job_is_retried_then_failed(cluster: Cluster) -> None:
    helpers.start_cluster(cluster, servers=("s1",))
    cluster.cli("resource", "upload", "heartbeat", str(HEARTBEAT_JOB))
    created = cluster.cli(
        "job", "create", "nightly", "--resource", "heartbeat", "--kind", "batch",
        "--max-retries", "2", f"--arg={cluster.heartbeats}",
        "--arg=--run-for", "--arg=0", "--arg=--exit-code", "--arg=3",
    )  # fmt: skip
    assert "retries 2" in created.stdout
    cluster.cli("job", "start", "nightly")
    job = cluster.wait_job("nightly", lambda j: j["state"] == "failed", 180, "job failed")
    assert (job["restarts"], job["max_restarts"]) == (2, 2)
    assert "exit code 3" in job["last_error"]
    kinds = _kinds(cluster, "nightly")
    assert kinds.count("claimed") == 3, kinds
    ends = [e for e in cluster.events("nightly") if e["kind"] in ("crashed", "failed")]
    assert [e["kind"] for e in ends] == ["crashed", "crashed", "failed"]
    assert [e["detail"].get("next") for e in ends[:2]] == ["backoff", "backoff"]
    assert ends[-1]["detail"]["cause"] == "driver"
    # Three runs, one after the other (the watchdogs' lifetime records).
    starts = [r for r in cluster.driver_records() if r["event"] == "started"]
    assert len(starts) == 3
    # The listings read naturally: nothing more will run, 2 of 2 retries were spent.
    row = _listed(cluster, "nightly")
    assert (row["desired"], row["state"], row["restarts"]) == ("-", "failed", "2/2"), row
    shown = json.loads(cluster.cli("job", "show", "nightly", "--json").stdout)
    assert (shown["desired"], shown["state"]) == ("running", "failed")  # --json: stored


def test_a_batch_job_that_fails_once_then_succeeds_ends_finished(
    cluster: Cluster, tmp_path: Path
) -> None:
    helpers.start_cluster(cluster, servers=("s1",))
    cluster.cli("resource", "upload", "fail-once", str(FAIL_ONCE_JOB))
    marker = tmp_path / "marker"
    cluster.cli(
        "job", "create", "flaky", "--resource", "fail-once", "--kind", "batch",
        "--max-retries", "1", f"--arg={marker}",
    )  # fmt: skip
    cluster.cli("job", "start", "flaky")
    job = cluster.wait_job("flaky", lambda j: j["state"] == "finished", 180, "job finished")
    assert (job["restarts"], job["attempt"]) == (1, 2)
    assert job["last_error"] is None
    # The coordinator's retarget of the finished job (wanted nowhere) may come after it.
    kinds = [k for k in _kinds(cluster, "flaky") if k != "retargeted"]
    assert kinds.count("crashed") == 1 and kinds[-1] == "finished" and "failed" not in kinds
    # The driver ran under its artifact's original file name, not its content hash.
    assert marker.read_text().strip() == "fail_once.py"
    row = _listed(cluster, "flaky")
    assert (row["desired"], row["state"], row["restarts"]) == ("-", "finished", "1/1"), row
