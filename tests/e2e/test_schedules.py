"""Scheduled runs end to end, through the CLI: Spark's own pi.py on a schedule on the
standalone cluster (``job runs`` and ``job logs --run``), and ``job start --wait`` /
``job run --wait`` of a batch run. A schedule through the coordinator's kill -9 at its
fire instants is the chaos campaign's (``test_coordinator_killed_at_fire_instants``,
three kills, every fire time checked by S6), which replaced the one-minute e2e test."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from testing import waiting
from testing.cluster import Cluster
from tests.e2e import helpers


def _runs(cluster: Cluster, name: str) -> list[dict]:
    return json.loads(cluster.cli("job", "runs", name, "--json", "--limit", "1000").stdout)


def _pi_example() -> Path:
    found = importlib.util.find_spec("pyspark")
    assert found is not None and found.submodule_search_locations
    root = Path(next(iter(found.submodule_search_locations)))
    return root / "examples" / "src" / "main" / "python" / "pi.py"


@pytest.mark.spark
@pytest.mark.long(65)
def test_sparks_pi_on_a_schedule_on_the_standalone_cluster_lists_its_runs(
    cluster: Cluster, stack_env: dict[str, str]
) -> None:
    """Spark's own pi.py every 20 s, its executors on the stack's standalone master:
    two fires run to their end (exit 0), each listed once by ``job runs`` with the
    server and epoch that ran it, and ``job logs --run`` prints that run's answer."""
    master = stack_env["SPARKRING_STACK_SPARK_MASTER_URL"]
    helpers.start_cluster(cluster, servers=("s1", "s2"))
    cluster.cli("resource", "upload", "pi", str(_pi_example()))
    cluster.cli(
        "job", "create", "pi", "--resource", "pi", "--kind", "batch", "--arg=2",
        "--master", master, "--conf", "spark.cores.max=1", "--conf", "spark.executor.memory=512m",
        "--schedule", "@every 20s",
    )  # fmt: skip
    cluster.cli("job", "start", "pi")

    def finished() -> list[dict]:
        return [r for r in _runs(cluster, "pi") if r["state"] == "finished"]

    waiting.wait_until(lambda: len(finished()) >= 2, 300, interval=2, message="two pi runs")
    cluster.cli("job", "stop", "pi")
    runs = finished()
    assert all(r["exit_code"] == 0 and r["trigger"] == "schedule" for r in runs), runs
    assert all(r["server"] in ("s1", "s2") and r["epoch"] for r in runs), runs
    times = [r["scheduled_time"] for r in _runs(cluster, "pi") if r["scheduled_time"]]
    assert len(times) == len(set(times))
    listed = cluster.cli("job", "runs", "pi").stdout
    assert str(runs[0]["run_id"]) in listed and "finished" in listed
    log = ""

    def logged() -> bool:
        nonlocal log
        result = cluster.cli("job", "logs", "pi", "--run", str(runs[-1]["run_id"]), check=False)
        log = result.stdout
        return "Pi is roughly" in log

    # The log is shipped to S3 just after the run is recorded ended.
    waiting.wait_until(logged, 60, interval=1, message="the run's shipped log")


def test_start_and_run_wait_for_a_batch_runs_end_and_exit_with_its_outcome(
    cluster: Cluster,
) -> None:
    """``job start --wait`` of a batch job returns 0 once its run finished (not when its
    driver started); ``job run --wait`` of a run that fails exits 1 naming the exit code."""
    helpers.start_cluster(cluster, servers=("s1",))
    helpers.heartbeat_job(cluster, "ok", kind="batch", extra=["--run-for", "1"])
    done = cluster.cli("job", "start", "ok", "--wait", "--timeout", "120")
    assert done.stdout.strip().splitlines()[-1].endswith("finished (exit code 0)")
    assert cluster.job("ok")["state"] == "finished"
    helpers.heartbeat_job(
        cluster, "bad", kind="batch", extra=["--run-for", "0", "--exit-code", "3"], max_restarts=0
    )
    failed = cluster.cli("job", "run", "bad", "--wait", "--timeout", "120", check=False)
    assert failed.returncode == 1, (failed.stdout, failed.stderr)
    assert "job bad failed: driver exited with exit code 3" in failed.stderr
    (run,) = _runs(cluster, "bad")
    assert (run["state"], run["exit_code"], run["attempts"]) == ("failed", 3, 1)
