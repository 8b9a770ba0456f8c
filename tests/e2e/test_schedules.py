"""Scheduled runs end to end: three real servers fire a light batch job ``@every 5s``
for a minute while the coordinator is killed (-9); ``job runs`` shows every fire time
once, run or skipped with an allowed reason (the S6 checker of the chaos campaign)."""

from __future__ import annotations

import importlib.util
import json
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests import waiting
from tests.chaos import invariants
from tests.cluster import Cluster, overlaps
from tests.e2e import helpers

# A fire's run must be claimed within the lease TTL (8 s here) plus a server's loss
# (ZooKeeper session 4 s) and a loaded machine's slack, seconds.
LATENESS_BOUND_S = 15.0
WINDOW_S = 60.0


def _runs(cluster: Cluster, name: str) -> list[dict]:
    return json.loads(cluster.cli("job", "runs", name, "--json", "--limit", "1000").stdout)


@pytest.mark.long(65)
def test_every_5s_for_a_minute_through_a_coordinator_kill_fires_each_time_once(
    cluster: Cluster,
) -> None:
    helpers.start_cluster(cluster)
    helpers.heartbeat_job(cluster, "tick", kind="batch", extra=["--run-for", "0.5"])
    cluster.cli("job", "update", "tick", "--schedule", "@every 5s")
    assert "schedule on" in cluster.cli("job", "start", "tick").stdout
    ((switched_on,),) = cluster.sql("SELECT fires_checked_until FROM jobs WHERE name = 'tick'")

    def finished(count: int) -> bool:
        return sum(r["state"] == "finished" for r in _runs(cluster, "tick")) >= count

    waiting.wait_until(lambda: finished(2), 90, interval=1, message="two scheduled runs finished")
    ((coordinator,),) = cluster.sql("SELECT server FROM coordinator")
    ((killed_at,),) = cluster.sql("SELECT now()")
    cluster.kill(coordinator)
    deadline = switched_on.timestamp() + WINDOW_S

    def window_passed() -> bool:
        ((now,),) = cluster.sql("SELECT now()")
        return now.timestamp() > deadline

    waiting.wait_until(window_passed, WINDOW_S + 30, interval=1, message="a minute of fires")
    ((checked_until,),) = cluster.sql("SELECT fires_checked_until FROM jobs WHERE name = 'tick'")
    cluster.cli("job", "stop", "tick")
    cluster.wait_job("tick", lambda j: j["owner"] is None, 60, "the last run ended")
    rows = _runs(cluster, "tick")
    expected = invariants.fire_times("@every 5s", "UTC", switched_on, checked_until)
    assert len(expected) >= WINDOW_S / 5 - 1
    window = invariants.ScheduleWindow("tick", expected, "forbid")
    assert invariants.fire_problems(window, rows, lateness_bound=LATENESS_BOUND_S) == []
    scheduled = [r for r in rows if r["trigger"] == "schedule"]
    ran = [r for r in scheduled if r["state"] != "skipped"]
    # The fires went on after the kill (how many ran depends on the machine's load:
    # under forbid a fire is skipped while the previous run is still running).
    after_kill = [
        r
        for r in ran
        if r["started_at"]
        and datetime.fromisoformat(r["started_at"].replace("Z", "+00:00")) > killed_at
    ]
    assert after_kill, rows
    assert {r["reason"] for r in scheduled if r["state"] == "skipped"} <= {
        "previous run still running"
    }
    assert overlaps(cluster.driver_records()) == []
    # The fire times the runs table holds are the unique key's: none twice.
    with cluster.engine.connect() as conn:
        doubled = conn.execute(
            sa.text(
                "SELECT scheduled_time FROM runs GROUP BY job_id, scheduled_time "
                "HAVING count(*) > 1"
            )
        ).all()
    assert doubled == []


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
