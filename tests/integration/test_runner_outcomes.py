"""End-of-run recording (server/outcomes.py): a run once, never lost, never resurrected,
with faults timed into the windows where a run ends; against real PostgreSQL, S3 and
spark-submit. PostgreSQL is made unreachable for this test's database only
(``ALLOW_CONNECTIONS false`` and its sessions terminated): the shared server stays up."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from resource_center import store
from scheduler import distribution
from server import driver as driver_module
from server import log_shipping, outcomes, rundir, runner, runs, watchdog
from sql.states import JobKind
from testing import factories, services, waiting
from tests.integration import runner_harness as harness


def _records(tmp_path: Path) -> list[dict[str, object]]:
    """The watchdogs' lifetime records (``--records``)."""
    path = tmp_path / "records.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return list(map(json.loads, lines))


def _starts(tmp_path: Path) -> list[dict[str, object]]:
    return [r for r in _records(tmp_path) if r["event"] == "started"]


def test_a_batch_driver_exiting_0_while_postgresql_is_away_ends_finished_and_runs_once(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    the_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    the_runner.wake()
    # The main itself runs (not only its spark-submit): from here it exits at "go".
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "running" and harness.started(stage),
        harness.SPARK_START_S,
        message="the batch driver did not start",
    )
    services.set_connections(database_url, allowed=False)
    try:
        harness.go(stage, "0")  # the driver exits 0 while PostgreSQL is away
        run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
        waiting.wait_until(
            lambda: (
                (run_dir / "result.json").exists()
                and (job_id not in the_runner.runs() or the_runner.runs()[job_id].phase == "ended")
            ),
            harness.SPARK_START_S,
            message="the driver's exit was not noticed",
        )
    finally:
        services.set_connections(database_url, allowed=True)
    engine.dispose()  # drop the pool's terminated sessions
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "finished" and not the_runner.runs(),
        harness.SPARK_START_S,
        message="the finished batch job was not recorded",
    )
    kinds = harness.kinds(database_url)
    result = (rundir.run_dir(tmp_path / "work", job_id, 1) / "result.json").read_text()
    assert kinds.count("claimed") == 1, (kinds, result)
    assert (stage / "starts").read_text().split() == ["1"]
    assert len(_starts(tmp_path)) == 1
    row = factories.row(engine, job_id)
    assert (row.state, row.owner, row.epoch) == ("finished", None, 1)


def test_a_batch_exit_0_noticed_after_the_lease_ran_out_is_finished_not_rerun(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """A server paused past its lease (SIGSTOP, a stall) whose batch driver exited 0
    meanwhile: when it resumes, the renewal finds the lease gone before the poll has
    seen the driver's end. The outcome must still be recorded: finished, run once."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    stepped_runner.poll_once()  # claims; the driver starts in a task
    # Renewed while spark-submit starts (seconds on a busy machine, beyond the 5 s the
    # lease leaves a driver that is never confirmed); the pause comes after its exit.
    waiting.wait_until(
        lambda: stepped_runner.renew_once() and harness.started(stage),
        harness.SPARK_START_S,
        interval=0.5,
        message="the driver did not start",
    )
    harness.go(stage, "0")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(
        lambda: stepped_runner.renew_once() and (run_dir / "result.json").exists(),
        harness.SPARK_START_S,
        interval=0.5,
        message="no exit",
    )
    factories.expire_lease(engine, job_id)  # the pause outlasted the lease
    stepped_runner.renew_once()  # resumes: the renewal runs first
    stepped_runner.poll_once()
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "finished" or stepped_runner.poll_once() < 0,
        30,
        message="the batch job was not recorded finished",
    )
    kinds = harness.kinds(database_url)
    assert kinds.count("claimed") == 1, kinds
    assert (stage / "starts").read_text().split() == ["1"]


def test_a_batch_exit_0_while_its_server_is_stalled_is_recorded_by_the_watchdog(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """The server is stalled (or killed) when its batch driver exits 0, and stays so past
    the lease: only its watchdog is there to see the end. It records ``finished`` itself
    (fenced on the run's owner and epoch), so the server that claims the expired lease
    finds a finished job instead of running it again (found by the 20-minute randomized
    campaign, seed 784518478: two batch generations ran to their end twice)."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    long_lease_runner.poll_once()  # claims; the driver starts in a task
    harness.wait_started(stage)
    # From here the server takes no step: no renewal, no poll, no record of its own.
    harness.go(stage, "0")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(
        lambda: (run_dir / "result.json").exists(), harness.SPARK_START_S, message="no exit"
    )
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "finished",
        10,
        message="nobody recorded the batch driver's exit 0 while its server was stalled",
    )
    factories.expire_lease(engine, job_id)  # the stall outlasted the lease
    factories.target(engine, job_id, "s2")
    with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s2"), harness.TTL)
    kinds = harness.kinds(database_url)
    assert kinds.count("claimed") == 1 and kinds.count("finished") == 1, kinds
    assert json.loads((run_dir / "result.json").read_text())["recorded"] is True
    # The server, resuming, finds the outcome recorded: nothing more is written.
    long_lease_runner.renew_once()
    waiting.wait_until(
        lambda: not long_lease_runner.runs() or long_lease_runner.poll_once() < 0,
        30,
        message="the resumed server did not forget the recorded run",
    )
    assert harness.kinds(database_url).count("finished") == 1
    assert (stage / "starts").read_text().split() == ["1"]


def test_a_watchdog_cannot_record_a_run_that_is_no_longer_its_own(
    engine: sa.Engine,
    bucket: store.Store,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """The watchdog's write is fenced like the server's: once another server holds a
    newer epoch, a late exit 0 of the old driver records nothing."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    long_lease_runner.poll_once()
    harness.wait_started(stage)
    factories.expire_lease(engine, job_id)
    factories.target(engine, job_id, "s2")
    with engine.begin() as conn:
        taken = distribution.claim(conn, job_id, factories.owner("s2"), harness.TTL)
    harness.go(stage, "0")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(
        lambda: (run_dir / "result.json").exists(), harness.SPARK_START_S, message="no exit"
    )
    result = json.loads((run_dir / "result.json").read_text())
    assert result["recorded"] is False, result
    now = factories.row(engine, job_id)
    assert (now.owner, now.epoch, now.state) == ("s2", taken.epoch, "starting")


def _crash_while_stalled(
    engine: sa.Engine, the_runner: runner.Runner, stage: Path, tmp_path: Path, job_id: int
) -> dict[str, object]:
    """The driver exits 1 while its server takes no step (stalled, or dead): the result
    the watchdog left."""
    the_runner.poll_once()  # claims; the driver starts in a task
    waiting.wait_until(
        lambda: harness.started(stage) and factories.row(engine, job_id).state == "running",
        harness.SPARK_START_S,
        message="the driver did not start",
    )
    harness.go(stage, "1")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(
        lambda: (run_dir / "result.json").exists(), harness.SPARK_START_S, message="no exit"
    )
    return json.loads((run_dir / "result.json").read_text())


def _resume(the_runner: runner.Runner) -> None:
    """The stalled server resumes: it renews, polls and forgets the run."""
    the_runner.renew_once()
    waiting.wait_until(
        lambda: not the_runner.runs() or the_runner.poll_once() < 0,
        30,
        message="the resumed server did not forget the ended run",
    )


def test_a_batch_failure_while_its_server_is_stalled_spends_the_budget_once(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """Hole H5 (safety review): a batch job with no retries (the default) whose driver
    fails while its server is stalled or dead. Its watchdog records the crash itself:
    the job is ``failed``, and the server that finds the expired lease cannot run it a
    second time. Before, only the server recorded a nonzero exit: the lease expired, the
    job was claimed elsewhere and ran again past its budget."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    result = _crash_while_stalled(engine, long_lease_runner, stage, tmp_path, job_id)
    factories.expire_lease(engine, job_id)  # the stall outlasted the lease
    factories.target(engine, job_id, "s2")
    with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s2"), harness.TTL)
    assert (result["exit_code"], result["recorded"]) == (1, True), result
    now = factories.row(engine, job_id)
    assert (now.state, now.owner, now.epoch) == ("failed", None, 1)
    assert "driver exited with exit code 1" in now.last_error, now.last_error
    _resume(long_lease_runner)
    kinds = harness.kinds(database_url)
    assert kinds.count("claimed") == 1 and kinds.count("failed") == 1, kinds
    assert "crashed" not in kinds, kinds
    assert (stage / "starts").read_text().split() == ["1"]


@pytest.mark.parametrize("kind", [JobKind.BATCH, JobKind.STREAMING])
def test_a_failure_while_its_server_is_stalled_is_counted_once_with_restarts_left(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    kind: JobKind,
) -> None:
    """With retries (restarts) left, the watchdog's record puts the job in backoff with
    the crash counted once; the resuming server's own record of the same run is fenced
    (the run is no longer owned at its epoch) and it writes nothing more. A streaming
    job's crash is recorded the same way: before, one while its server was stalled
    was counted by nobody (restarted elsewhere, no backoff, no budget spent)."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path, max_retries=2, kind=kind)
    result = _crash_while_stalled(engine, long_lease_runner, stage, tmp_path, job_id)
    now = factories.row(engine, job_id)
    assert (now.state, now.owner, now.epoch, now.restarts) == ("backoff", None, 1, 1)
    assert result["recorded"] is True, result
    with pytest.raises(distribution.FencedError), engine.begin() as conn:
        distribution.record_crash(
            conn,
            job_id,
            long_lease_runner.owner,
            1,
            "again",
            retry=True,
            backoff_base=0.5,
            backoff_max=2.0,
        )
    # Targeted elsewhere: the resumed server's own claim of the next attempt (its backoff
    # over, on a loaded machine, before _resume returned) is no part of this check.
    factories.target(engine, job_id, "s2")
    _resume(long_lease_runner)
    assert factories.row(engine, job_id).restarts == 1
    kinds = harness.kinds(database_url)
    assert kinds.count("crashed") == 1 and "failed" not in kinds, kinds


def test_a_run_whose_watchdog_just_recorded_its_exit_0_is_reaped_not_killed(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """A batch driver's watchdog records ``finished`` (the owner cleared) and only then
    exits. A poll woken by that write, or a renewal, in between sees a run whose row no
    longer names it: that run is ending, not lost. Before, the server logged 'the job
    is no longer ours; killing the driver', dropped the run and never shipped its log
    (found running Spark's pi.py: 'job logs pi' said 'no driver log yet')."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    runner_ = long_lease_runner
    runner_.poll_once()  # claims; the driver starts in a task
    harness.wait_started(stage)
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "running" or runner_.poll_once() < 0,
        30,
        message="the run was not recorded running",
    )
    # The watchdog's write, as it commits it before exiting; the coordinator then
    # retargets the finished job to nobody.
    with engine.begin() as conn:
        distribution.finish(conn, job_id, runner_.owner, 1)
    factories.target(engine, job_id, None)
    runner_.poll_once()
    runner_.renew_once()
    (run,) = runner_.runs().values()
    assert run.driver is not None and not run.driver.ended(), "the ending run was killed"
    # The watchdog exits: the next polls reap the run and ship its log.
    harness.go(stage, "0")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(
        lambda: (run_dir / "result.json").exists(), harness.SPARK_START_S, message="no exit"
    )
    waiting.wait_until(
        lambda: not runner_.runs() or runner_.poll_once() < 0,
        30,
        message="the ended run was not forgotten",
    )
    assert json.loads((run_dir / "result.json").read_text())["reason"] == "exited"
    waiting.wait_until(
        lambda: bucket.exists(log_shipping.log_key("b", job_id, 1)),
        10,
        message="the log was not shipped",
    )
    kinds = harness.kinds(database_url)
    assert kinds.count("claimed") == 1 and kinds.count("finished") == 1, kinds


def test_a_sigterm_exit_just_before_the_server_sees_its_own_sigterm_is_no_crash(
    engine: sa.Engine,
    bucket: store.Store,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """Hole H13: a service manager that signals the whole unit (systemd's
    ``KillMode=control-group``) SIGTERMs the driver's JVM and the server together. The
    JVM can exit 143 and be reaped before the server's own handler stops claiming: the
    exit was recorded as the job's crash, and a batch job with no retries ended FAILED.
    A SIGTERM exit now waits (briefly, on an event) for the server's shutdown. The
    watchdog, which records a crash itself (hole H5), is signalled too, also just after
    the driver's exit: it waits for that SIGTERM likewise and leaves the exit to the
    server."""
    job_id, _ = harness.running_batch(engine, bucket, long_lease_runner, stage, tmp_path)
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    state = rundir.read_json(run_dir / "watchdog.json")
    assert state is not None
    harness.go(stage, "143")
    # The driver reaped by its watchdog, which then waits up to SIGTERM_STOP_WAIT_S for
    # its own SIGTERM before it decides (and writes its "ended" record, which says it).
    waiting.wait_until(
        lambda: not Path(f"/proc/{state['driver_pid']}").exists(),
        harness.SPARK_START_S,
        interval=0.01,
        message="no exit",
    )
    os.kill(state["watchdog_pid"], signal.SIGTERM)  # the unit's SIGTERM reaches it late
    waiting.wait_until(lambda: (run_dir / "result.json").exists(), 10, message="no result")
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["reason"], result["exit_code"], result["recorded"]) == ("exited", 143, False)
    # The server's SIGTERM handler runs a moment after the poll reaps the driver.
    threading.Timer(0.3, long_lease_runner.stop_claiming).start()
    waiting.wait_until(
        lambda: not long_lease_runner.runs() or long_lease_runner.poll_once() < 0,
        30,
        message="the run was not recorded",
    )
    assert factories.row(engine, job_id).state == "pending"


def test_an_outcome_write_that_raised_a_bug_is_tried_again(
    engine: sa.Engine, stepped_runner: runner.Runner
) -> None:
    """A write of a run's outcome that failed with anything but a database error (a bug,
    an unexpected exception) left ``recording`` set: the outcome was never written again
    and the run's lease was renewed for ever."""
    calls: list[int] = []

    def write(conn: sa.Connection) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("unexpected")

    run = runs.Run(
        job_id=1,
        name="b",
        kind=JobKind.BATCH,
        epoch=1,
        attempt=1,
        claimed_at=watchdog.lease_clock(),
        deadline=0.0,
        owner=stepped_runner.owner,
        phase=runner.reconcile.Phase.ENDED,
        unrecorded=write,
    )
    stepped_runner.table.add(run)
    with pytest.raises(RuntimeError):
        outcomes.record(stepped_runner.table, stepped_runner.ctx, run)
    outcomes.record(stepped_runner.table, stepped_runner.ctx, run)
    assert len(calls) == 2 and not stepped_runner.runs()


def test_an_exit_0_its_watchdog_recorded_is_written_again_if_postgresql_lost_it(
    engine: sa.Engine,
    bucket: store.Store,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """Hole H4: the runner trusted ``result.json``'s ``recorded: true`` over the row. A
    commit that PostgreSQL acknowledged to the watchdog can be gone after a failover to
    an asynchronous replica (outside the model, docs/drivers.md): the row still names
    the run as running, the server wrote nothing and forgot the run, and the finished
    batch was claimed again once its lease ran out. The server now checks the row."""
    job_id, _ = harness.running_batch(engine, bucket, long_lease_runner, stage, tmp_path)
    owner = long_lease_runner.owner
    harness.go(stage, "0")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(
        lambda: (run_dir / "result.json").exists(), harness.SPARK_START_S, message="no exit"
    )
    assert json.loads((run_dir / "result.json").read_text())["recorded"] is True
    # The promoted replica never had the watchdog's commit: the row is as before it.
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE distribution SET state = 'running', owner = :s, owner_incarnation = :i,"
                " lease_until = now() + interval '30 seconds' WHERE job_id = :j"
            ),
            {"s": owner.server, "i": owner.incarnation, "j": job_id},
        )
    waiting.wait_until(
        lambda: not long_lease_runner.runs() or long_lease_runner.poll_once() < 0,
        30,
        message="the ended run was not forgotten",
    )
    assert factories.row(engine, job_id).state == "finished"


def test_a_run_killed_as_failed_is_recorded_failed_not_released(
    engine: sa.Engine,
    bucket: store.Store,
    stage: Path,
    tmp_path: Path,
    stepped_runner: runner.Runner,
) -> None:
    """M1 of safety review 3: a stall past the budget kills the driver before the job is
    recorded FAILED (server/health.py). A kill alone is a release (the job runs again);
    the run carries the decided record, and its killed outcome is written as that."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, stepped_runner.owner, harness.TTL)
        distribution.mark_running(conn, job_id, stepped_runner.owner, claim.epoch, 1)
    run = harness.local_run(stepped_runner, job_id, claim.epoch, deadline_in=harness.TTL)

    def failed(conn: sa.Connection) -> object:
        return distribution.record_crash(
            conn, job_id, stepped_runner.owner, claim.epoch, "stalled",
            retry=False, backoff_base=0.0, backoff_max=0.0, cause="stalled",
        )  # fmt: skip

    assert stepped_runner.kill_as(job_id, claim.epoch + 1, failed) is None  # another epoch
    assert stepped_runner.kill_as(job_id, claim.epoch, failed) is run
    assert stepped_runner.kill_as(job_id, claim.epoch, failed) is None  # decided once
    killed = driver_module.Outcome(None, watchdog.Reason.KILLED, 0.0, 1.0, recorded=False)
    with engine.begin() as conn:
        outcomes.outcome_write(stepped_runner.table, stepped_runner.ctx, run, killed)(conn)
    row = factories.row(engine, job_id)
    assert (row.state, row.owner) == ("failed", None), row
