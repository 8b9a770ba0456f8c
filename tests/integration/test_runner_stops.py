"""A running driver's stop (server/stops.py): a migration that meets the driver's own
exit, a stop file that cannot be written, a killed watchdog; against real PostgreSQL, S3
and spark-submit."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import sqlalchemy as sa

from resource_center import store
from scheduler import distribution, jobs
from server import driver as driver_module
from server import run_context, run_table, rundir, runner, runs, stops, watchdog
from testing import factories, waiting
from tests.integration import runner_harness as harness


def _exit_as_the_migration_begins(
    engine: sa.Engine,
    the_runner: runner.Runner,
    job_id: int,
    stage: Path,
    tmp_path: Path,
    exit_code: int,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """Claim and start the gated batch job; then the coordinator moves it to s2, the
    owner commits ``stopping``, and the driver exits ``exit_code`` on its own before the
    stop reaches it; wait until the run is recorded. Returns its run directory."""
    the_runner.poll_once()  # claims; the driver starts in a task
    harness.wait_started(stage)
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "running" or the_runner.poll_once() < 0,
        30,
        message="the run was not recorded running",
    )
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    stop_driver = stops.stop_driver

    def exit_first(table: run_table.RunTable, ctx: run_context.Context, run: runs.Run) -> None:
        # ``stopping`` is committed; the driver ends on its own before it is signalled.
        harness.go(stage, str(exit_code))
        waiting.wait_until(
            lambda: (run_dir / "result.json").exists(), harness.SPARK_START_S, message="no exit"
        )
        stop_driver(table, ctx, run)

    monkeypatch.setattr(stops, "stop_driver", exit_first)
    factories.target(engine, job_id, "s2")  # the coordinator moves the job
    the_runner.poll_once()  # decides the stop: stopping, then the task above
    waiting.wait_until(
        lambda: not the_runner.runs() or the_runner.poll_once() < 0,
        60,
        message="the stopped run was not recorded",
    )
    return run_dir


def test_a_batch_exit_0_as_its_migration_begins_is_finished_not_rerun(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The coordinator retargets a batch job while its driver ends on its own: the owner
    has recorded ``stopping`` when the driver exits 0, before its SIGTERM arrives. The
    run ran to its end, so it is finished, never released to another server to run
    again (found by the 20-minute randomized campaign, seed 27767549: generation 30 of
    ``b1`` exited 0 on s3 at 88.98 s, s3 recorded ``stopping ... migrating to s2`` at
    89.45 s, released it ``pending`` and s2 ran it again)."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    _exit_as_the_migration_begins(
        engine, long_lease_runner, job_id, stage, tmp_path, 0, monkeypatch
    )
    assert factories.row(engine, job_id).state == "finished"
    with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s2"), harness.TTL)
    kinds = harness.kinds(database_url)
    assert kinds.count("claimed") == 1 and kinds.count("finished") == 1, kinds
    assert (stage / "starts").read_text().split() == ["1"]


@pytest.mark.parametrize("watchdog_records", [True, False])
def test_a_batch_failure_as_its_migration_begins_spends_its_budget(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    watchdog_records: bool,
) -> None:
    """The failing twin of the exit-0 case above (CHAOS_SEED=593937538: ``bf0``, batch
    with ``--max-retries 0``, exited 3; a stop came 2 s later, before its watchdog had
    recorded the failure; the crash write found the row ``stopping`` and matched
    nothing, the server released the run ``pending``, and it ran again past its
    budget). The failure came before the stop reached the driver: it is the job's own,
    counted, whether the watchdog records it or (PostgreSQL out of its reach) the
    server does from the watchdog's result."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path, max_retries=0)
    if not watchdog_records:
        # A watchdog whose database URL cannot even be parsed records nothing, at once:
        # the failure is left to the server, which reads it from the result file.
        real_report = driver_module.FinishReport
        monkeypatch.setattr(
            driver_module,
            "FinishReport",
            lambda **kw: real_report(**{**kw, "database_url": "not a database url"}),
        )
    run_dir = _exit_as_the_migration_begins(
        engine, long_lease_runner, job_id, stage, tmp_path, 3, monkeypatch
    )
    assert factories.row(engine, job_id).state == "failed"
    with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s2"), harness.TTL)
    kinds = harness.kinds(database_url)
    assert kinds.count("claimed") == 1 and kinds.count("failed") == 1, kinds
    assert (stage / "starts").read_text().split() == ["1"]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["recorded"] is watchdog_records


def test_a_watchdog_killed_with_sigkill_leaves_no_process_of_its_run_when_released(
    engine: sa.Engine,
    bucket: store.Store,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hole H1: a watchdog OOM-killed or ``kill -9``'d leaves no result. Its driver group's
    leader (the JVM) dies with it, but the job's Python main is the JVM's child, orphaned
    to init, and keeps running. The job must not be released (claimable elsewhere) while
    any process of the run lives: before, the poll reaped the run as ``killed`` and
    released it at once, and the new driver ran beside the old Python main."""
    job_id, run = harness.running_batch(engine, bucket, long_lease_runner, stage, tmp_path)
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    assert watchdog.marked_processes(run_dir), "the run has no marked process to survive"
    state = rundir.read_json(run_dir / "watchdog.json")
    assert state is not None
    os.kill(state["watchdog_pid"], signal.SIGKILL)
    assert run.driver is not None
    waiting.wait_until(lambda: run.driver.poll() is not None, 10, message="watchdog not reaped")
    left_at_release: list[list[int]] = []
    release = distribution.release

    def release_and_look(conn: sa.Connection, *args: object, **kwargs: object) -> object:
        left_at_release.append(watchdog.marked_processes(run_dir))
        return release(conn, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(distribution, "release", release_and_look)
    waiting.wait_until(
        lambda: left_at_release or long_lease_runner.poll_once() < 0,
        30,
        message="the run of the killed watchdog was never released",
    )
    assert left_at_release[0] == [], f"released while these lived: {left_at_release[0]}"
    assert watchdog.marked_processes(run_dir) == []


def test_a_stop_that_cannot_write_its_stop_file_still_stops_the_driver(
    engine: sa.Engine,
    bucket: store.Store,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hole H8: an error while stopping a driver (here the stop file cannot be written:
    a full disk, EIO, the run dir removed) left the run ``stopping`` for ever: the poll
    skips stopping runs and the renewals kept the lease and the driver alive, so the
    operator's stop never took effect. The stop falls back to killing the run, then
    releases the job."""
    job_id, run = harness.running_batch(engine, bucket, long_lease_runner, stage, tmp_path)
    write = rundir.write_json_atomically

    def disk_full_for_the_stop_file(path: Path, payload: dict[str, object]) -> None:
        if path.name == "stop.json":
            raise OSError(28, "No space left on device", str(path))
        write(path, payload)

    monkeypatch.setattr(rundir, "write_json_atomically", disk_full_for_the_stop_file)
    with engine.begin() as conn:
        jobs.stop(conn, "b")
    waiting.wait_until(
        lambda: (
            factories.row(engine, job_id).state == "stopped" or long_lease_runner.poll_once() < 0
        ),
        60,
        interval=0.2,
        message="the stop never completed",
    )
    assert run.driver is not None and run.driver.poll() is not None
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    assert watchdog.marked_processes(run_dir) == []
    waiting.wait_until(lambda: not long_lease_runner.runs(), 10, message="the run was kept")
