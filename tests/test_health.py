"""The health monitor (server/health.py): its flags as a pure function, and one monitor
pass at a time against a real PostgreSQL, with the driver's log written by the test
and its REST API answered by tests/spark_ui.py (the real Spark cases are in
tests/e2e/test_health.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from scheduler import health_policy, jobs, run_health
from scheduler.states import HealthFlag, JobKind
from server import driver, health, reconcile, spark_status
from server.runner import Run
from sql import tables
from tests import factories, spark_ui

T0 = dt.datetime(2026, 11, 24, 9, 0, 0, tzinfo=dt.UTC)
POLICY = health_policy.Policy(stall_timeout=60.0, resource_wait_timeout=30.0)


def _tracker(kind: str = "streaming", **changes: object) -> health.Tracker:
    tracker = health.Tracker(
        job_id=1, name="j", kind=kind, epoch=1, log_file=Path("/nonexistent"),
        policy=POLICY, since=T0,
    )  # fmt: skip
    for name, value in changes.items():
        setattr(tracker, name, value)
    return tracker


def _progress(batch_id: int, at: dt.datetime) -> spark_status.Progress:
    return spark_status.Progress("q", batch_id, at, 500, 10, 5.0, 9.0)


def _app(cores: int, completed: bool = False) -> spark_status.Application:
    return spark_status.Application("app-1", "j", completed, executors=cores and 1, cores=cores)


def s(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


# ---------------------------------------------------------------- assess (pure)


def test_a_query_with_no_new_batch_for_the_timeout_is_stalled() -> None:
    tracker = _tracker()
    tracker.observe_progress([_progress(0, s(0)), _progress(1, s(10))])
    assert health.assess(tracker, s(70))[0] is None  # 59.5 s since batch 1 completed
    flag, detail = health.assess(tracker, s(71))
    assert flag == HealthFlag.STALLED
    assert detail["last_batch_id"] == 1 and detail["no_batch_for_s"] == 60.5
    # Progress events of an idle query repeat the batch id: still stalled.
    tracker.observe_progress([_progress(1, s(80))])
    assert health.assess(tracker, s(81))[0] == HealthFlag.STALLED
    tracker.observe_progress([_progress(2, s(80))])
    assert health.assess(tracker, s(81))[0] is None


def test_no_stall_before_a_query_starts_nor_for_a_batch_job() -> None:
    # A streaming job whose log shows no query (none, or its log level hides it) is not
    # judged; nor is a batch job, whose "batches" are not a heartbeat.
    assert health.assess(_tracker(), s(3600))[0] is None
    batch = _tracker(kind="batch")
    batch.observe_progress([_progress(0, s(0))])
    assert health.assess(batch, s(3600))[0] is None


def _scan(started: int = 0, errors: tuple[str, ...] = ()) -> spark_status.LogScan:
    return spark_status.LogScan(None, [], b"", queries_started=started, query_errors=[*errors])


def test_a_query_that_never_completes_a_batch_is_stalled_from_its_start() -> None:
    tracker = _tracker()
    tracker.observe_queries(_scan(started=1), s(100))
    assert health.assess(tracker, s(159))[0] is None
    flag, detail = health.assess(tracker, s(160))
    assert flag == HealthFlag.STALLED and detail["last_batch_id"] is None


def test_a_query_that_failed_while_its_driver_lives_is_stalled_with_its_error() -> None:
    tracker = _tracker()
    tracker.observe_queries(_scan(started=1), s(0))
    tracker.observe_progress([_progress(0, s(1))])
    tracker.observe_queries(_scan(errors=("Query q terminated with error",)), s(5))
    flag, detail = health.assess(tracker, s(62))
    assert flag == HealthFlag.STALLED
    assert detail["query_error"] == "Query q terminated with error"
    # A new query (the job restarted it itself) forgets the old error.
    tracker.observe_queries(_scan(started=1), s(70))
    assert health.assess(tracker, s(71))[0] is None
    assert "query_error" not in health.assess(tracker, s(130))[1]


def test_a_stall_counts_from_when_tracking_began_not_from_an_old_batch() -> None:
    # An adopted run whose log shows a batch from long ago: the monitor started now.
    tracker = _tracker()
    tracker.observe_progress([_progress(5, T0 - dt.timedelta(hours=2))])
    assert health.assess(tracker, s(59))[0] is None
    assert health.assess(tracker, s(61))[0] == HealthFlag.STALLED


def test_an_application_without_cores_for_the_timeout_waits_for_resources() -> None:
    tracker = _tracker()
    tracker.observe_application(_app(0), s(1))
    assert health.assess(tracker, s(29))[0] is None
    flag, detail = health.assess(tracker, s(30))
    assert flag == HealthFlag.WAITING_FOR_RESOURCES and detail["timeout_s"] == 30.0
    # Waiting wins over stalled: the query cannot progress without executors.
    tracker.observe_progress([_progress(0, s(0))])
    assert health.assess(tracker, s(100))[0] == HealthFlag.WAITING_FOR_RESOURCES
    # Cores arrive: the wait is over, counted afresh if they go again; a stall is
    # counted from their arrival, not from the last batch before the wait.
    tracker.observe_application(_app(2), s(101))
    assert health.assess(tracker, s(102))[0] is None
    assert health.assess(tracker, s(161))[0] == HealthFlag.STALLED
    tracker.observe_application(_app(0), s(103))
    assert health.assess(tracker, s(130))[0] is None
    assert health.assess(tracker, s(131))[0] == HealthFlag.WAITING_FOR_RESOURCES


def test_a_completed_or_unreachable_application_is_not_waiting() -> None:
    tracker = _tracker()
    tracker.observe_application(_app(0, completed=True), s(1))
    assert health.assess(tracker, s(100))[0] is None
    tracker.observe_application(None, s(101))
    assert health.assess(tracker, s(200))[0] is None


def test_the_policy_comes_from_the_conf_and_refuses_bad_values() -> None:
    policy = health_policy.of(
        {health_policy.STALL_TIMEOUT: "90", health_policy.RESTART_ON_STALL: "true"}, 300, 120
    )
    assert policy == health_policy.Policy(90.0, 120.0, restart_on_stall=True)
    for conf, key in (
        ({health_policy.STALL_TIMEOUT: "5m"}, "stallTimeout"),
        ({health_policy.RESOURCE_WAIT_TIMEOUT: "0"}, "resourceWaitTimeout"),
        ({health_policy.RESTART_ON_STALL: "sometimes"}, "restartOnStall"),
        ({"sparkring.health.stallTimout": "9"}, "stallTimout"),
    ):
        with pytest.raises(health_policy.PolicyError, match=key):
            health_policy.check(conf)


def test_a_job_with_an_invalid_health_conf_is_refused(engine: sa.Engine) -> None:
    with engine.begin() as conn, pytest.raises(jobs.JobError, match="stallTimeout"):
        jobs.create(
            conn,
            jobs.JobSpec(
                name="bad", kind=JobKind.STREAMING, resource_id=factories.resource(conn),
                conf={health_policy.STALL_TIMEOUT: "soon"},
            ),
        )  # fmt: skip


# ---------------------------------------------------------------- the monitor


@pytest.fixture
def ui() -> Iterator[spark_ui.SparkUi]:
    with spark_ui.serving() as stand_in:
        yield stand_in


def _running(engine: sa.Engine, name: str, tmp_path: Path, conf: dict[str, str]) -> Run:
    """A started job at epoch 1 in its distribution row, and its local run here."""
    with engine.begin() as conn:
        job_id = jobs.create(
            conn,
            jobs.JobSpec(
                name=name, kind=JobKind.STREAMING, resource_id=factories.resource(conn),
                conf=conf,
            ),
        )  # fmt: skip
        jobs.start(conn, name)
        conn.execute(
            sa.update(tables.distribution)
            .where(tables.distribution.c.job_id == job_id)
            .values(epoch=1)
        )
    run_dir = tmp_path / name
    run_dir.mkdir()
    run = Run(
        job_id=job_id, name=name, kind="streaming", epoch=1, attempt=1, claimed_at=0.0,
        deadline=0.0, owner=factories.owner("s1"), phase=reconcile.Phase.RUNNING,
        revision=1, driver=driver.Driver(run_dir, os.getpid(), is_child=False),
    )  # fmt: skip
    return run


def _log(run: Run, text: str) -> None:
    assert run.driver is not None
    with run.driver.log_file.open("a") as f:
        f.write(text)


def _progress_block(batch_id: int, at: dt.datetime) -> str:
    body = json.dumps(
        {
            "id": "q1",
            "timestamp": at.isoformat().replace("+00:00", "Z"),
            "batchId": batch_id,
            "batchDuration": 1000,
            "inputRowsPerSecond": 4.5,
            "processedRowsPerSecond": 12.25,
        },
        indent=2,
    )
    return f"26/11/24 INFO ProgressReporter: Streaming query made progress: {body}\n"


def _monitor(engine: sa.Engine, run: Run) -> health.HealthMonitor:
    return health.HealthMonitor(
        engine, "s1", "host-a", lambda: {run.job_id: run},
        interval=1.0, stall_timeout=60.0, resource_wait_timeout=30.0,
    )  # fmt: skip


def _events(engine: sa.Engine, name: str) -> list[tuple[str, dict[str, object]]]:
    with engine.connect() as conn:
        return [
            (e["kind"], e["detail"])
            for e in jobs.events(conn, name)
            if e["kind"].startswith("health") or e["kind"] == "restart_requested"
        ]


def _shown(engine: sa.Engine, name: str) -> dict[str, object]:
    with engine.connect() as conn:
        shown = jobs.show(conn, name)["health"]
    assert shown is not None
    return shown


def test_a_stall_is_recorded_with_an_event_then_cleared(
    engine: sa.Engine, tmp_path: Path, ui: spark_ui.SparkUi
) -> None:
    port = ui.port
    ui.set_cores(2)
    run = _running(engine, "stream", tmp_path, {})
    monitor = _monitor(engine, run)
    _log(run, f"x INFO Utils: Successfully started service 'SparkUI' on port {port}.\n")
    monitor.check_once(now=s(0))
    shown = _shown(engine, "stream")
    assert shown["ui_url"] == f"http://host-a:{port}"
    assert (shown["app_id"], shown["app_state"], shown["cores"]) == ("app-7", "running", 2)
    assert shown["flag"] is None

    _log(run, _progress_block(3, s(1)))
    monitor.check_once(now=s(30))
    shown = _shown(engine, "stream")
    assert (shown["last_batch_id"], shown["input_rate"], shown["processing_rate"]) == (
        3, 4.5, 12.25,
    )  # fmt: skip
    monitor.check_once(now=s(61))  # batch 3 completed at 2 s: 59 s ago
    assert _shown(engine, "stream")["flag"] is None
    monitor.check_once(now=s(62.5))
    shown = _shown(engine, "stream")
    assert shown["flag"] == HealthFlag.STALLED.value
    assert monitor.flagged(HealthFlag.STALLED) == 1
    monitor.check_once(now=s(70))  # still stalled: no second event
    _log(run, _progress_block(4, s(71)))
    monitor.check_once(now=s(73))
    assert _shown(engine, "stream")["flag"] is None
    events = _events(engine, "stream")
    assert [kind for kind, _ in events] == ["health_flagged", "health_cleared"]
    assert events[0][1]["flag"] == "stalled" and events[0][1]["last_batch_id"] == 3
    assert events[1][1]["flag"] == "stalled"
    # Nothing was restarted: the job did not opt in.
    with engine.connect() as conn:
        assert jobs.show(conn, "stream")["generation"] == 1


def test_a_job_without_cores_is_flagged_waiting_for_resources(
    engine: sa.Engine, tmp_path: Path, ui: spark_ui.SparkUi
) -> None:
    port = ui.port
    ui.set_cores(0)
    run = _running(engine, "starved", tmp_path, {health_policy.RESOURCE_WAIT_TIMEOUT: "10"})
    monitor = _monitor(engine, run)
    _log(run, f"x INFO Utils: Successfully started service 'SparkUI' on port {port}.\n")
    monitor.check_once(now=s(0))
    monitor.check_once(now=s(9))
    assert _shown(engine, "starved")["flag"] is None
    monitor.check_once(now=s(10))  # the job's own timeout, not the server's 30 s
    shown = _shown(engine, "starved")
    assert (shown["flag"], shown["executors"], shown["cores"]) == ("waiting_for_resources", 0, 0)
    ui.set_cores(1)
    monitor.check_once(now=s(11))
    assert _shown(engine, "starved")["flag"] is None
    assert [k for k, _ in _events(engine, "starved")] == ["health_flagged", "health_cleared"]


def test_a_job_that_opted_in_is_restarted_once_when_it_stalls(
    engine: sa.Engine, tmp_path: Path
) -> None:
    conf = {health_policy.RESTART_ON_STALL: "true", health_policy.STALL_TIMEOUT: "20"}
    run = _running(engine, "flaky", tmp_path, conf)
    monitor = _monitor(engine, run)
    monitor.check_once(now=s(0))
    _log(run, _progress_block(0, s(0)))
    monitor.check_once(now=s(5))
    monitor.check_once(now=s(22))
    monitor.check_once(now=s(30))
    events = _events(engine, "flaky")
    assert [k for k, _ in events] == ["health_flagged", "restart_requested"]
    assert "stalled" in str(events[1][1]["by"])
    with engine.connect() as conn:
        assert jobs.show(conn, "flaky")["generation"] == 2


def test_a_report_of_an_older_epoch_never_overwrites_a_newer_one(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "moved")
    newer = run_health.Report(job_id=job_id, epoch=5, server="s2", app_state="running")
    older = run_health.Report(job_id=job_id, epoch=4, server="s1", app_state="unreachable")
    with engine.begin() as conn:
        assert run_health.record(conn, newer)
        assert not run_health.record(conn, older)
        assert run_health.record(conn, newer)
        row = conn.execute(sa.select(tables.run_health)).one()
    assert (row.server, row.epoch, row.app_state) == ("s2", 5, "running")


def test_a_long_log_is_read_from_its_head_and_its_recent_end(
    engine: sa.Engine, tmp_path: Path, ui: spark_ui.SparkUi, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An adopted driver's log: the UI port at its start, old batches, then new ones.
    monkeypatch.setattr(health, "MAX_READ_BYTES", 4096)
    run = _running(engine, "adopted", tmp_path, {})
    _log(run, f"x INFO Utils: Successfully started service 'SparkUI' on port {ui.port}.\n")
    _log(run, _progress_block(1, s(-3600)) + "filler line\n" * 2000)
    _log(run, _progress_block(500, s(-1)))
    monitor = _monitor(engine, run)
    monitor.check_once(now=s(0))
    shown = _shown(engine, "adopted")
    assert shown["ui_url"] == f"http://host-a:{ui.port}"
    assert shown["last_batch_id"] == 500
