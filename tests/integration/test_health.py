"""The health monitor (server/health.py): its flags as a pure function, and one monitor
pass at a time against a real PostgreSQL, with the driver's log written by the test
and its REST API answered by testing/spark_ui.py (the real Spark cases are in
tests/e2e/test_health.py).

Both clocks are the test's: ``at(t)`` / ``check(monitor, t)`` is ``t`` seconds on the
lease clock and ``s(t)`` on the wall clock; a test that steps the wall clock moves
only the second."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from scheduler import distribution, health_policy, job_events, job_spec, job_views, jobs, run_health
from server import driver, health, reconcile, rundir, spark_status
from server.runs import Run
from sql import tables
from sql.states import HealthFlag, JobKind
from testing import factories, spark_ui
from testing.hostile_http import HostileServer

T0 = dt.datetime(2026, 11, 24, 9, 0, 0, tzinfo=dt.UTC)
POLICY = health_policy.Policy(stall_timeout=60.0, resource_wait_timeout=30.0)


def _tracker(kind: str = "streaming", **changes: object) -> health.Tracker:
    tracker = health.Tracker(
        job_id=1, name="j", kind=kind, epoch=1, log_file=Path("/nonexistent"),
        policy=POLICY, since=0.0,
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


def at(seconds: float, wall_step: float = 0.0) -> health.Instant:
    """``seconds`` into the test on the lease clock; the wall clock ``wall_step`` off."""
    return health.Instant(s(seconds + wall_step), seconds)


# ---------------------------------------------------------------- assess (pure)


def test_a_query_with_no_new_batch_for_the_timeout_is_stalled() -> None:
    tracker = _tracker()
    tracker.observe_progress([_progress(0, s(0)), _progress(1, s(10))], at(11))
    assert health.assess(tracker, 70)[0] is None  # 59.5 s since batch 1 completed
    flag, detail = health.assess(tracker, 71)
    assert flag == HealthFlag.STALLED
    assert detail["last_batch_id"] == 1 and detail["no_batch_for_s"] == 60.5
    assert detail["last_batch_at"] == str(s(10.5))  # as the driver logged it
    # Progress events of an idle query repeat the batch id: still stalled.
    tracker.observe_progress([_progress(1, s(80))], at(80.5))
    assert health.assess(tracker, 81)[0] == HealthFlag.STALLED
    tracker.observe_progress([_progress(2, s(80))], at(81))
    assert health.assess(tracker, 81)[0] is None


def test_the_stall_window_follows_the_querys_batch_interval() -> None:
    """A query that completes a batch every 10 minutes (a processing-time trigger of
    10 min) is not stalled 60 s after its last batch, as a fixed timeout would have it
    (the Flink operator's false restarts, FLINK-37354): its window is STALL_INTERVALS
    times its typical interval. One batch late by that much is stalled."""
    tracker = _tracker()
    for batch in range(4):  # batches at 0, 600, 1200, 1800 s
        tracker.observe_progress([_progress(batch, s(600 * batch))], at(600 * batch + 0.5))
    window = health.STALL_INTERVALS * 600
    assert health.assess(tracker, 1800 + 600 + 1)[0] is None  # one interval later: fine
    assert health.assess(tracker, 1800 + window - 1)[0] is None
    flag, detail = health.assess(tracker, 1800 + window + 1)
    assert flag == HealthFlag.STALLED
    assert (detail["timeout_s"], detail["batch_interval_s"]) == (window, 600.0)
    # A fast query keeps the configured timeout as its floor.
    fast = _tracker()
    for batch in range(4):
        fast.observe_progress([_progress(batch, s(batch))], at(batch + 0.5))
    assert health.assess(fast, 3 + POLICY.stall_timeout + 1)[0] == HealthFlag.STALLED


def test_the_stall_timeout_is_the_policys_until_the_interval_is_known() -> None:
    assert health.stall_timeout(60.0, []) == 60.0
    assert health.stall_timeout(60.0, [5.0]) == 60.0  # one gap is no interval yet
    assert health.stall_timeout(60.0, [600.0, 600.0]) == health.STALL_INTERVALS * 600.0
    # The median: one long pause (a backlog, a GC) does not stretch the window.
    assert health.stall_timeout(60.0, [10.0, 10.0, 10.0, 5000.0]) == 60.0


def test_no_stall_before_a_query_starts_nor_for_a_batch_job() -> None:
    # A streaming job whose log shows no query (none, or its log level hides it) is not
    # judged; nor is a batch job, whose "batches" are not a heartbeat.
    assert health.assess(_tracker(), 3600)[0] is None
    batch = _tracker(kind="batch")
    batch.observe_progress([_progress(0, s(0))], at(1))
    assert health.assess(batch, 3600)[0] is None


def _scan(started: int = 0, errors: tuple[str, ...] = ()) -> spark_status.LogScan:
    return spark_status.LogScan(None, [], b"", queries_started=started, query_errors=[*errors])


def test_a_query_that_never_completes_a_batch_is_stalled_from_its_start() -> None:
    tracker = _tracker()
    tracker.observe_queries(_scan(started=1), at(100))
    assert health.assess(tracker, 159)[0] is None
    flag, detail = health.assess(tracker, 160)
    assert flag == HealthFlag.STALLED and detail["last_batch_id"] is None


def test_a_query_that_failed_while_its_driver_lives_is_stalled_with_its_error() -> None:
    tracker = _tracker()
    tracker.observe_queries(_scan(started=1), at(0))
    tracker.observe_progress([_progress(0, s(1))], at(2))
    tracker.observe_queries(_scan(errors=("Query q terminated with error",)), at(5))
    flag, detail = health.assess(tracker, 62)
    assert flag == HealthFlag.STALLED
    assert detail["query_error"] == "Query q terminated with error"
    # A new query (the job restarted it itself) forgets the old error.
    tracker.observe_queries(_scan(started=1), at(70))
    assert health.assess(tracker, 71)[0] is None
    assert "query_error" not in health.assess(tracker, 130)[1]


def test_a_stall_counts_from_when_tracking_began_not_from_an_old_batch() -> None:
    # An adopted run whose log shows a batch from long ago: the monitor started now.
    tracker = _tracker()
    tracker.observe_progress([_progress(5, T0 - dt.timedelta(hours=2))], at(0))
    assert health.assess(tracker, 59)[0] is None
    assert health.assess(tracker, 61)[0] == HealthFlag.STALLED


def test_an_application_without_cores_for_the_timeout_waits_for_resources() -> None:
    tracker = _tracker()
    tracker.observe_application(_app(0), at(1))
    assert health.assess(tracker, 29)[0] is None
    flag, detail = health.assess(tracker, 30)
    assert flag == HealthFlag.WAITING_FOR_RESOURCES and detail["timeout_s"] == 30.0
    # Waiting wins over stalled: the query cannot progress without executors.
    tracker.observe_progress([_progress(0, s(0))], at(1))
    assert health.assess(tracker, 100)[0] == HealthFlag.WAITING_FOR_RESOURCES
    # Cores arrive: the wait is over, counted afresh if they go again; a stall is
    # counted from their arrival, not from the last batch before the wait.
    tracker.observe_application(_app(2), at(101))
    assert health.assess(tracker, 102)[0] is None
    assert health.assess(tracker, 161)[0] == HealthFlag.STALLED
    tracker.observe_application(_app(0), at(103))
    assert health.assess(tracker, 130)[0] is None
    assert health.assess(tracker, 131)[0] == HealthFlag.WAITING_FOR_RESOURCES


def test_a_completed_or_unreachable_application_is_not_waiting() -> None:
    tracker = _tracker()
    tracker.observe_application(_app(0, completed=True), at(1))
    assert health.assess(tracker, 100)[0] is None
    tracker.observe_application(None, at(101))
    assert health.assess(tracker, 200)[0] is None


def test_a_batch_read_after_a_wall_clock_step_is_dated_at_most_one_pass_back() -> None:
    """Durations are read on the lease clock; the driver's timestamps (wall clock) only
    place a batch between the previous pass and this one."""
    tracker = _tracker()
    tracker.observe_progress([_progress(0, s(0))], at(1))
    assert tracker.last_batch_done == 0.5
    # The wall clock steps an hour forward after the pass at 5 s. Batch 1 completed at
    # 10 s, read at 15 s: an hour and 5 s old by the stepped clock, dated at the
    # previous pass (5 s), not an hour back.
    tracker.looked_at = 5.0
    tracker.observe_progress([_progress(1, s(9.5))], at(15, wall_step=3600))
    assert tracker.last_batch_done == 5.0
    assert health.assess(tracker, 64)[0] is None
    assert health.assess(tracker, 65)[0] == HealthFlag.STALLED
    # Stepped back: a batch "from the future" is dated when it was read.
    tracker.looked_at = 15.0
    tracker.observe_progress([_progress(2, s(100))], at(20, wall_step=-3600))
    assert tracker.last_batch_done == 20.0


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
    with engine.begin() as conn, pytest.raises(job_spec.JobError, match="stallTimeout"):
        jobs.create(
            conn,
            job_spec.JobSpec(
                name="bad", kind=JobKind.STREAMING, resource_id=factories.resource(conn),
                conf={health_policy.STALL_TIMEOUT: "soon"},
            ),
        )  # fmt: skip


# ---------------------------------------------------------------- the monitor


@pytest.fixture
def ui() -> Iterator[spark_ui.SparkUi]:
    with spark_ui.serving() as stand_in:
        yield stand_in


S1 = factories.owner("s1")


def _running(
    engine: sa.Engine, name: str, tmp_path: Path, conf: dict[str, str], max_restarts: int = 3
) -> Run:
    """A started job claimed by s1 (epoch 1, driver started), and its local run here."""
    with engine.begin() as conn:
        job_id = jobs.create(
            conn,
            job_spec.JobSpec(
                name=name, kind=JobKind.STREAMING, resource_id=factories.resource(conn),
                conf=conf, max_restarts=max_restarts,
            ),
        )  # fmt: skip
        jobs.start(conn, name)
    factories.target(engine, job_id, "s1")
    return _claimed(engine, job_id, name, tmp_path)


def _claimed(engine: sa.Engine, job_id: int, name: str, tmp_path: Path) -> Run:
    """Claim the job for s1 and record its driver started: the run, here."""
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, S1, 3600)
        distribution.mark_running(conn, job_id, S1, claim.epoch, pid=os.getpid())
    run_dir = tmp_path / name / str(claim.epoch)
    run_dir.mkdir(parents=True)
    return Run(
        job_id=job_id, name=name, kind="streaming", epoch=claim.epoch, attempt=claim.attempt,
        claimed_at=0.0, deadline=0.0, owner=S1, phase=reconcile.Phase.RUNNING,
        revision=claim.revision, driver=driver.Driver(run_dir, os.getpid(), is_child=False),
    )  # fmt: skip


def _log(run: Run, text: str) -> None:
    assert run.driver is not None
    with run.driver.log_file.open("a") as f:
        f.write(text)


def _progress_block(batch_id: int, when: dt.datetime) -> str:
    body = json.dumps(
        {
            "id": "q1",
            "timestamp": when.isoformat().replace("+00:00", "Z"),
            "batchId": batch_id,
            "batchDuration": 1000,
            "inputRowsPerSecond": 4.5,
            "processedRowsPerSecond": 12.25,
        },
        indent=2,
    )
    return f"26/11/24 INFO ProgressReporter: Streaming query made progress: {body}\n"


def _no_clock() -> float:
    raise AssertionError("a test pass gives both clocks' times (check)")


def _monitor(
    engine: sa.Engine, run: Run, runs: dict[int, Run] | None = None
) -> health.HealthMonitor:
    """A monitor of ``run`` (or of ``runs``, a dict the test may change)."""
    live = {run.job_id: run} if runs is None else runs

    def kill_as(job_id: int, epoch: int, write: Callable[[sa.Connection], object]) -> Run | None:
        # As Runner.kill_as does, without a runner: the test records ``killed_as`` itself.
        found = live.get(job_id)
        if found is None or found.epoch != epoch or found.killed_as is not None:
            return None
        found.killed_as = write
        return found

    return health.HealthMonitor(
        engine, "s1", "host-a", lambda: live, kill_as,
        interval=1.0, stall_timeout=60.0, resource_wait_timeout=30.0,
        clock=_no_clock, wall_clock=lambda: T0 + dt.timedelta(seconds=_no_clock()),
    )  # fmt: skip


def check(monitor: health.HealthMonitor, seconds: float, wall_step: float = 0.0) -> None:
    """One pass ``seconds`` into the test (lease clock), the wall clock ``wall_step`` off."""
    moment = at(seconds, wall_step)
    monitor.check_once(now=moment.wall, mono=moment.mono)


def _events(engine: sa.Engine, name: str) -> list[tuple[str, dict[str, object]]]:
    with engine.connect() as conn:
        return [
            (e["kind"], e["detail"])
            for e in job_events.events(conn, name)
            if e["kind"].startswith("health") or e["kind"] == "restart_requested"
        ]


def _shown(engine: sa.Engine, name: str) -> dict[str, object]:
    with engine.connect() as conn:
        shown = job_views.show(conn, name).as_json()["health"]
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
    check(monitor, 0)
    shown = _shown(engine, "stream")
    assert shown["ui_url"] == f"http://host-a:{port}"
    assert (shown["app_id"], shown["app_state"], shown["cores"]) == ("app-7", "running", 2)
    assert shown["flag"] is None

    _log(run, _progress_block(3, s(1)))
    check(monitor, 30)
    shown = _shown(engine, "stream")
    assert (shown["last_batch_id"], shown["input_rate"], shown["processing_rate"]) == (
        3, 4.5, 12.25,
    )  # fmt: skip
    check(monitor, 61)  # batch 3 completed at 2 s: 59 s ago
    assert _shown(engine, "stream")["flag"] is None
    check(monitor, 62.5)
    shown = _shown(engine, "stream")
    assert shown["flag"] == HealthFlag.STALLED.value
    assert monitor.flagged(HealthFlag.STALLED) == 1
    check(monitor, 70)  # still stalled: no second event
    _log(run, _progress_block(4, s(71)))
    check(monitor, 73)
    assert _shown(engine, "stream")["flag"] is None
    events = _events(engine, "stream")
    assert [kind for kind, _ in events] == ["health_flagged", "health_cleared"]
    assert events[0][1]["flag"] == "stalled" and events[0][1]["last_batch_id"] == 3
    assert events[1][1]["flag"] == "stalled"
    # Nothing was restarted: the job did not opt in.
    with engine.connect() as conn:
        assert job_views.show(conn, "stream").as_json()["generation"] == 1


def test_a_job_without_cores_is_flagged_waiting_for_resources(
    engine: sa.Engine, tmp_path: Path, ui: spark_ui.SparkUi
) -> None:
    port = ui.port
    ui.set_cores(0)
    run = _running(engine, "starved", tmp_path, {health_policy.RESOURCE_WAIT_TIMEOUT: "10"})
    monitor = _monitor(engine, run)
    _log(run, f"x INFO Utils: Successfully started service 'SparkUI' on port {port}.\n")
    check(monitor, 0)
    check(monitor, 9)
    assert _shown(engine, "starved")["flag"] is None
    check(monitor, 10)  # the job's own timeout, not the server's 30 s
    shown = _shown(engine, "starved")
    assert (shown["flag"], shown["executors"], shown["cores"]) == ("waiting_for_resources", 0, 0)
    ui.set_cores(1)
    check(monitor, 11)
    assert _shown(engine, "starved")["flag"] is None
    assert [k for k, _ in _events(engine, "starved")] == ["health_flagged", "health_cleared"]


RESTART_ON_STALL = {health_policy.RESTART_ON_STALL: "true", health_policy.STALL_TIMEOUT: "20"}


def _kinds(engine: sa.Engine, name: str) -> list[str]:
    return [kind for kind, _ in _events(engine, name)]


def _generation(engine: sa.Engine, name: str) -> int:
    with engine.connect() as conn:
        return int(job_views.show(conn, name).as_json()["generation"])


def test_a_job_that_opted_in_is_restarted_once_when_it_stalls(
    engine: sa.Engine, tmp_path: Path
) -> None:
    run = _running(engine, "flaky", tmp_path, RESTART_ON_STALL)
    monitor = _monitor(engine, run)
    check(monitor, 0)
    _log(run, _progress_block(0, s(0)))
    check(monitor, 5)
    check(monitor, 22)
    check(monitor, 30)
    events = _events(engine, "flaky")
    assert [k for k, _ in events] == ["health_flagged", "restart_requested"]
    assert "stalled" in str(events[1][1]["by"])
    assert (events[1][1]["restarts"], events[1][1]["max_restarts"]) == (1, 3)
    assert _generation(engine, "flaky") == 2


@pytest.mark.parametrize(
    "moved",
    [
        # The server was stopped (SIGSTOP) past its lease: the job runs on s2 now.
        "owner = 's2', owner_incarnation = 's2-incarnation', epoch = 2",
        "epoch = 2",  # claimed again by this server: another run
        "owner_incarnation = 's1-next'",  # a later incarnation of s1 adopted it
        "lease_until = now() - interval '1 second'",  # expired: its driver is dying
    ],
)
def test_a_stalled_run_that_is_no_longer_ours_is_never_restarted(
    engine: sa.Engine, tmp_path: Path, moved: str
) -> None:
    """Case 1 of H9: the tracker still holds the old run (the runner has not dropped it
    yet) and sees a long idle; the job, healthy elsewhere, must not be restarted."""
    run = _running(engine, "moved", tmp_path, RESTART_ON_STALL)
    monitor = _monitor(engine, run)
    check(monitor, 0)
    _log(run, _progress_block(0, s(0)))
    check(monitor, 5)
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE distribution SET {moved} WHERE job_id = :j"), {"j": run.job_id}
        )
    check(monitor, 22)
    check(monitor, 30)
    assert "restart_requested" not in _kinds(engine, "moved")
    assert _generation(engine, "moved") == 1
    assert monitor.trackers[(run.job_id, run.epoch)].restart_asked  # refused for good


def test_a_wall_clock_step_restarts_nothing(engine: sa.Engine, tmp_path: Path) -> None:
    """Case 2 of H9: the host's wall clock steps an hour forward; the stall is measured
    on the lease clock, so nothing is flagged, and a real stall still is, on time."""
    run = _running(engine, "stepped", tmp_path, RESTART_ON_STALL)
    monitor = _monitor(engine, run)
    check(monitor, 0)
    _log(run, _progress_block(0, s(0)))
    check(monitor, 5)
    check(monitor, 10, wall_step=3600)
    check(monitor, 15, wall_step=3600)
    assert _kinds(engine, "stepped") == []
    assert _generation(engine, "stepped") == 1
    # The driver's batches carry the stepped clock too; then the query stops.
    _log(run, _progress_block(1, s(16 + 3600)))
    check(monitor, 18, wall_step=3600)
    check(monitor, 36, wall_step=3600)  # 19 s after batch 1 completed (17 s): not yet
    assert _kinds(engine, "stepped") == []
    check(monitor, 37, wall_step=3600)
    assert _kinds(engine, "stepped") == ["health_flagged", "restart_requested"]


def test_a_restart_whose_write_failed_is_asked_again_at_the_next_pass(
    engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _running(engine, "retried", tmp_path, RESTART_ON_STALL)
    monitor = _monitor(engine, run)
    real = jobs.restart_run
    calls: list[int] = []

    def fails_once(*args: object, **kwargs: object) -> jobs.RunRestarted:
        calls.append(1)
        if len(calls) == 1:
            raise sa.exc.OperationalError("restart_run", {}, Exception("connection lost"))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(jobs, "restart_run", fails_once)
    check(monitor, 0)
    _log(run, _progress_block(0, s(0)))
    check(monitor, 5)
    check(monitor, 22)  # stalled; the restart's write fails
    assert _kinds(engine, "retried") == ["health_flagged"]
    assert not monitor.trackers[(run.job_id, run.epoch)].restart_asked
    check(monitor, 23)  # asked again: done
    check(monitor, 30)  # once
    assert len(calls) == 2
    assert _kinds(engine, "retried") == ["health_flagged", "restart_requested"]
    assert _generation(engine, "retried") == 2


def test_restarts_on_stall_spend_the_restart_budget_then_the_job_ends_failed(
    engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query whose first batch takes longer than the stall timeout would be restarted
    forever: the restarts are paid from the job's max_restarts, and a stall past the
    budget ends the job FAILED (event ``failed``, cause ``stalled``), like a crash past
    it; its driver is killed (issue 26: a stall loop ends FAILED, not flagged forever).
    The kill comes before the record: while the driver may live, the lease stays held
    (M1 of safety review 3), and the runner records the end once the driver is dead."""
    killed: list[int] = []
    held_at_kill: list[tuple[str, str | None]] = []

    def kill(self: driver.Driver) -> None:
        row = factories.row(engine, run.job_id)
        held_at_kill.append((row.state, row.owner))
        killed.append(self.pid)

    monkeypatch.setattr(driver.Driver, "kill", kill)
    run = _running(engine, "slow", tmp_path, RESTART_ON_STALL, max_restarts=1)
    runs = {run.job_id: run}
    monitor = _monitor(engine, run, runs)
    _log(run, "x INFO MicroBatchExecution: Starting new streaming query.\n")
    check(monitor, 0)
    check(monitor, 20)  # no batch yet, 20 s after the query started: restart 1 of 1
    assert _kinds(engine, "slow") == ["health_flagged", "restart_requested"]
    assert killed == []
    # Its owner stops the old generation; the job is claimed again here.
    with engine.begin() as conn:
        distribution.begin_stop(conn, run.job_id, S1, run.epoch, "restart")
        distribution.release(conn, run.job_id, S1, run.epoch)
    again = _claimed(engine, run.job_id, "slow", tmp_path)
    runs[run.job_id] = again
    _log(again, "x INFO MicroBatchExecution: Starting new streaming query.\n")
    check(monitor, 30)
    check(monitor, 50)  # stalled again: the budget is spent
    assert held_at_kill == [("running", S1.server)], "the lease was let go before the kill"
    assert again.killed_as is not None
    with engine.begin() as conn:  # the runner's record, once the killed driver is dead
        again.killed_as(conn)
    check(monitor, 60)
    # The first run's flag is cleared as the second run reports (why: run ended).
    assert _kinds(engine, "slow") == [
        "health_flagged", "restart_requested", "health_cleared", "health_flagged",
    ]  # fmt: skip
    assert _generation(engine, "slow") == 2
    row = factories.row(engine, run.job_id)
    assert (row.state, row.owner, row.epoch, row.restarts) == ("failed", None, again.epoch, 1)
    assert "stalled" in row.last_error and "restart budget" in row.last_error
    with engine.connect() as conn:
        failed = [e for e in job_events.events(conn, "slow") if e["kind"] == "failed"]
    assert [(e["epoch"], e["detail"]["cause"]) for e in failed] == [(again.epoch, "stalled")]
    assert killed == [os.getpid()], "the failed run's driver was left running"
    assert monitor.trackers[(again.job_id, again.epoch)].restart_asked
    check(monitor, 70)  # once: no second failure, no second kill
    assert len(killed) == 1


def test_a_stall_past_the_budget_of_a_run_no_longer_ours_fails_nothing(
    engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    killed: list[int] = []
    monkeypatch.setattr(driver.Driver, "kill", lambda self: killed.append(self.pid))
    run = _running(engine, "spent", tmp_path, RESTART_ON_STALL, max_restarts=0)
    monitor = _monitor(engine, run)
    _log(run, "x INFO MicroBatchExecution: Starting new streaming query.\n")
    check(monitor, 0)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE distribution SET epoch = 2 WHERE job_id = :j"), {"j": run.job_id}
        )
    check(monitor, 20)
    assert factories.row(engine, run.job_id).state == "running"
    with engine.connect() as conn:
        assert "failed" not in [e["kind"] for e in job_events.events(conn, "spent")]
    assert killed == []


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
    check(monitor, 0)
    shown = _shown(engine, "adopted")
    assert shown["ui_url"] == f"http://host-a:{ui.port}"
    assert shown["last_batch_id"] == 500


@pytest.mark.parametrize("mode", ["trickle", "huge"])
def test_a_driver_ui_that_answers_slowly_or_hugely_holds_no_other_jobs_check(
    engine: sa.Engine, tmp_path: Path, ui: spark_ui.SparkUi, mode: str
) -> None:
    """Issue 45: one monitor thread read every driver's UI in turn, whole, with a
    per-read timeout: a UI that trickled its answer held every other job's check (9 s
    under a 2 s timeout), and a 128 MiB answer cost the server 768 MiB. Now each UI is
    asked on a thread of its own, within a deadline and a byte cap."""
    hostile = HostileServer(mode, seconds=20.0).start()
    try:
        ui.set_cores(2)
        bad = _running(engine, "hostile", tmp_path, {})
        good = _running(engine, "good", tmp_path, {})
        monitor = _monitor(engine, bad, {bad.job_id: bad, good.job_id: good})
        _log(bad, f"x INFO Utils: Successfully started service 'SparkUI' on port {hostile.port}.\n")
        _log(good, f"x INFO Utils: Successfully started service 'SparkUI' on port {ui.port}.\n")
        tracemalloc.start()
        started = time.monotonic()
        try:
            check(monitor, 0)
            took = time.monotonic() - started
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert hostile.seen.is_set()
        assert took < health.PROBE_WAIT_S + 2.0, took
        assert peak < 32 << 20, f"peak {peak >> 20} MiB"
        shown = _shown(engine, "good")
        assert (shown["app_state"], shown["cores"]) == ("running", 2)
        assert _shown(engine, "hostile")["app_state"] == "unreachable"
    finally:
        monitor.stop()
        hostile.stop()


def test_a_ui_port_the_log_names_outside_the_one_the_server_gave_is_never_probed(
    engine: sa.Engine, tmp_path: Path, ui: spark_ui.SparkUi
) -> None:
    """Issue 45: the monitor probed whatever port any line of the driver's log named, and
    the job writes that log. The server now gives each driver its UI port (ui.json):
    a line naming a port outside it (and Spark's 16 retries after it) is not probed;
    one inside is."""
    ui.set_cores(2)
    run = _running(engine, "liar", tmp_path, {})
    assert run.driver is not None
    given = ui.port + 100 if ui.port < 60000 else ui.port - 100
    rundir.write_json_atomically(run.driver.run_dir / rundir.UI_FILE, {"port": given})
    monitor = _monitor(engine, run)
    try:
        _log(run, f"x INFO Utils: Successfully started service 'SparkUI' on port {ui.port}.\n")
        check(monitor, 0)
        assert _shown(engine, "liar")["ui_url"] is None  # never asked
        rundir.write_json_atomically(run.driver.run_dir / rundir.UI_FILE, {"port": ui.port - 3})
        other = _running(engine, "honest", tmp_path, {})
        assert other.driver is not None
        rundir.write_json_atomically(other.driver.run_dir / rundir.UI_FILE, {"port": ui.port - 3})
        honest = _monitor(engine, other)
        _log(other, f"x INFO Utils: Successfully started service 'SparkUI' on port {ui.port}.\n")
        check(honest, 0)  # Spark moved 3 ports on from the one given: that is its UI
        shown = _shown(engine, "honest")
        assert (shown["app_state"], shown["cores"]) == ("running", 2)
        honest.stop()
    finally:
        monitor.stop()


def test_a_flag_whose_run_ended_is_cleared_when_the_next_run_reports(engine: sa.Engine) -> None:
    """A run flagged stalled, then replaced (a restart on stall, a failover, a roll): the
    next run's first report clears the old flag with one health_cleared event of the old
    epoch (why: run ended), which raises the recovered alert the stalled one awaits."""
    job_id = factories.job(engine, "flagged", start=False)
    stalled = run_health.Report(
        job_id=job_id,
        epoch=1,
        server="s1",
        app_state="running",
        flag=HealthFlag.STALLED.value,
        flagged_at=dt.datetime.now(dt.UTC),
    )
    with engine.begin() as conn:
        conn.execute(
            sa.insert(tables.alerts).values(
                name="pager", webhook_url="http://127.0.0.1:9/", kinds=["stalled", "recovered"]
            )
        )
        assert run_health.record(conn, stalled)
        run_health.flag_changed(conn, stalled, "flagged", None, {})
    healthy = run_health.Report(job_id=job_id, epoch=2, server="s2", app_state="running")
    for _ in range(2):  # the next run reports again: the old flag is cleared once
        with engine.begin() as conn:
            assert run_health.record(conn, healthy)
    with engine.connect() as conn:
        events = conn.execute(
            sa.text(
                "SELECT kind, epoch, server, detail FROM job_events WHERE job_name = 'flagged' "
                "AND kind LIKE 'health_%' ORDER BY id"
            )
        ).all()
        kinds = conn.execute(sa.text("SELECT kind FROM alert_deliveries ORDER BY at")).scalars()
        assert list(kinds) == ["stalled", "recovered"]
    assert [(e.kind, e.epoch, e.server) for e in events] == [
        ("health_flagged", 1, "s1"),
        ("health_cleared", 1, "s1"),
    ]
    assert events[1].detail == {"flag": "stalled", "why": "run ended"}
