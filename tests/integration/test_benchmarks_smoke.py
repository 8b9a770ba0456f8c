"""The PostgreSQL benchmarks (distribution table, history prune) run end to end at a tiny
size.

It keeps ``benchmarks/distribution_db.py`` from rotting: every figure must still be in
its JSON, its own checks (each contended job claimed once, renewals and polls returning
the rows they should) must still pass, and its scratch database must be gone afterwards.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import (
    alert_delivery,
    distribution_db,
    history_prune,
    pg_failover,
    schedule_fires,
    spark_master_failover,
)
from server import defaults
from testing import services
from testing.chaos import faults
from tests import conftest

PERCENTILES = {"p50_ms", "p99_ms", "max_ms"}
PLAN = {"seq_scan", "uses_target_index", "uses_owner_index", "seq_scan_jobs", "join", "lines"}
STEP = {"step", "servers", "changed", "read_s", "place_s", "write_s", "commit_s", "total_s"}


def test_distribution_benchmark_reports_every_figure(
    postgres_url: str, bench_databases: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    distribution_db.main(
        [
            *("--jobs", "200", "--servers", "5", "--repeat", "1"),
            *("--renew-calls", "20", "--renew-rounds", "1", "--polls", "20"),
            *("--database-url", postgres_url, "--json"),
        ]
    )
    figures = json.loads(capsys.readouterr().out)

    assert (figures["jobs"], figures["servers"]) == (200, 5)
    steps = {step["step"]: step for step in figures["rebalance"]}
    assert set(steps) == {"first", "steady", "leave", "join"}
    assert all(STEP <= step.keys() for step in steps.values())
    assert steps["first"]["changed"] == 200
    assert steps["steady"]["changed"] == 0
    assert steps["leave"]["changed"] > 0 and steps["join"]["changed"] > 0

    claims = figures["claims"]
    assert [c["claimers"] for c in claims["distinct"]] == [1, 4, 8]
    assert all(c["claims_per_s"] > 0 for c in claims["distinct"])
    contended = claims["contended"]
    assert contended["each_claimed_once"] is True
    assert contended["won"] == claims["block"] == contended["jobs"]
    assert contended["won"] + contended["rejected"] == contended["attempts"]

    assert [r["requested"] for r in figures["renew"]] == [10, 100, 1000]
    assert all(PERCENTILES | {"server_exec_ms"} <= r.keys() for r in figures["renew"])
    load = figures["renew_load"]
    assert load["servers"] == 5
    assert load["required_rows_per_s"] == pytest.approx(200 / defaults.LEASE_RENEW_INTERVAL_S)
    assert PERCENTILES <= load["capacity_latency"].keys()
    assert PERCENTILES <= load["paced_latency"].keys()
    assert 0 < load["updates_counted"] and 0 <= load["hot_fraction"] <= 1
    for key in (
        "capacity_rows_per_s",
        "utilisation",
        "paced_in_flight",
        "paced_wal_mb_per_s",
        "server_exec_ms",
        "db_cores_needed",
    ):
        assert load[key] >= 0

    poll = figures["poll"]
    assert poll["table_rows"] == 200 and poll["rows_returned"] == 40
    assert PERCENTILES <= poll.keys()
    for plan in (
        poll["plan"],
        poll["generic_plan"],
        poll["index_join"]["plan"],
        poll["proposed"]["plan"],
    ):
        assert PLAN <= plan.keys() and plan["lines"]
    for figure in (poll["index_join"], poll["proposed"], poll["reap"]):
        assert PERCENTILES <= figure.keys()

    assert services.bench_databases(postgres_url) == bench_databases, (
        "the scratch database was left behind"
    )


def test_history_prune_benchmark_reports_every_figure(
    postgres_url: str, bench_databases: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``benchmarks/history_prune.py`` at a tiny size: every figure, its own checks."""
    history_prune.main(
        [
            *("--events", "300", "--jobs", "4", "--recent", "20", "--batch-size", "50"),
            *("--database-url", postgres_url, "--json"),
        ]
    )
    figures = json.loads(capsys.readouterr().out)
    # 300 generated + 2 events of each of the 4 jobs, moved back with the rest.
    assert (figures["events_old"], figures["deleted"]) == (308, 306)
    assert figures["kept_newest_of_live_jobs"] == 2  # the 2 jobs without recent events
    assert figures["batches"] == 7 and figures["nothing_to_prune_deleted"] == 0
    assert figures["longest_batch_ms"] > 0
    assert PERCENTILES <= figures["renewals_during_prune"].keys()
    assert PERCENTILES <= figures["renewals_without_prune"].keys()
    assert services.bench_databases(postgres_url) == bench_databases, (
        "the scratch database was left behind"
    )


def test_spark_master_failover_benchmark_reads_its_figures(zk_hosts: str) -> None:
    """``benchmarks/spark_master_failover.py`` needs real Spark masters, a worker and
    PySpark drivers (minutes per trial: docs/benchmarks.md has its run), too heavy for
    this suite; its pure parts are checked here: the summary and the ZooKeeper setting
    it reports its figures with."""
    script = spark_master_failover
    assert script.summary([3.0, 1.0, 2.0]) == {"n": 3, "p50": 2.0, "max": 3.0, "min": 1.0}
    assert script.summary([]) == {"n": 0}
    assert int(script.max_session_timeout(zk_hosts)) >= 2000  # the stack's zoo.cfg


def test_schedule_fires_benchmark_fires_each_job_once(
    postgres_url: str, bench_databases: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    schedule_fires.main(
        [
            "--jobs", "20", "--servers", "3", "--every", "@every 5s", "--lead", "1",
            "--database-url", postgres_url, "--json",
        ]
    )  # fmt: skip
    figures = json.loads(capsys.readouterr().out)
    assert (figures["fired"], figures["max_runs_per_job"]) == (20, 1)
    assert figures["lateness_p50_s"] is not None and figures["fires_per_s"] is not None
    assert services.bench_databases(postgres_url) == bench_databases


def test_alert_delivery_benchmark_delivers_each_healthy_alert_once(
    postgres_url: str, bench_databases: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    alert_delivery.main(
        ["--alerts", "40", "--failing", "0.25", "--servers", "2", "--database-url", postgres_url,
         "--json"]
    )  # fmt: skip
    figures = json.loads(capsys.readouterr().out)
    assert (figures["healthy"], figures["failing"]) == (30, 10)
    assert figures["all_arrived"] is True
    assert figures["healthy_distinct"] == figures["healthy_received"] == 30
    assert figures["healthy_rows"] == {"delivered": 30}
    assert figures["failing_rows"] == {"pending": 10} and figures["failing_attempts"] >= 10
    assert figures["latency_p99_s"] is not None
    assert services.bench_databases(postgres_url) == bench_databases


@pytest.mark.long(45)
def test_pg_failover_benchmark_measures_one_failover(
    zk_hosts: str, s3_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``benchmarks/pg_failover.py``, one trial on three jobs: a PostgreSQL pair of its
    own fails over while a server is killed; every figure is measured, and the
    survivors' jobs run on where they were."""
    reason = faults.PgPair.unavailable()
    if reason:
        conftest.unavailable(reason)
    pg_failover.main(["--trials", "1", "--jobs", "3", "--json"])
    figures = json.loads(capsys.readouterr().out)
    summary = figures["summary"]
    counts = {k: s["n"] for k, s in summary.items()}
    assert counts.pop("killed_server_jobs_started") >= 1  # the victim owned a job
    assert counts == {"promoted": 1, "start_committed": 1, "new_job_started": 1}
    raw = figures["raw"]
    assert 0 < raw["start_committed"][0] < raw["new_job_started"][0]
    assert 0 < raw["killed_server_jobs_started"][0]
    assert figures["survivor_restarts"] == 0
