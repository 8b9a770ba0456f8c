"""The runner against real PostgreSQL, S3 and spark-submit, with faults timed into the
windows where a run ends or starts (issue "Run once, never lost, never resurrected").

One runner, no coordinator: a test targets its job at the runner's server itself. The
driver is a tiny PySpark-free Python main run by the real spark-submit, gated on files,
so every step happens when the test says. PostgreSQL is made unreachable for this test's
database only (``ALLOW_CONNECTIONS false`` and its sessions terminated): the shared
server stays up for every other test.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import socket
import textwrap
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from resource_center import cache, catalog, store
from scheduler import distribution, jobs
from server import (
    checkpoint,
    launch,
    log_shipping,
    outcomes,
    run_context,
    run_table,
    rundir,
    runner,
    runs,
    stops,
    watchdog,
)
from server import driver as driver_module
from server import settings as settings_module
from sql import database
from sql.states import JobKind
from tests import factories, services, waiting

# The driver: records its start, waits for a "go" file, then exits with the code in it.
GATED_MAIN = textwrap.dedent(
    """
    import os, sys, time
    here = sys.argv[1]
    with open(os.path.join(here, "starts"), "a") as f:
        f.write(os.environ["SPARKRING_EPOCH"] + "\\n")
    while not os.path.exists(os.path.join(here, "go")):
        time.sleep(0.05)
    sys.exit(int(open(os.path.join(here, "go")).read() or 0))
    """
)


def _go(stage: Path, exit_code: object) -> None:
    """Let the gated driver exit with ``exit_code``: its "go" file written whole, then
    renamed into place. Written in place, the driver polling for it could read it empty
    (an exit 0 for a failure: a flaky failure of
    test_a_batch_failure_as_its_migration_begins_spends_its_budget)."""
    partial = stage / "go.partial"
    partial.write_text(str(exit_code))
    partial.rename(stage / "go")


SPARK_START_S = 90  # spark-submit of a plain Python main on a busy 2-core machine
TTL = 8.0


def _started(stage: Path) -> bool:
    """The gated driver wrote its start line. Its "starts" file exists a moment before
    it holds one (CI at 18d03ea: read empty right after it appeared)."""
    starts = stage / "starts"
    return starts.exists() and starts.read_text().endswith("\n")


def _wait_started(stage: Path) -> None:
    """Wait until the gated driver wrote its start line."""
    waiting.wait_until(lambda: _started(stage), SPARK_START_S, message="the driver did not start")


@pytest.fixture
def stage(tmp_path: Path) -> Path:
    folder = tmp_path / "stage"
    folder.mkdir()
    return folder


def _config(tmp_path: Path, margin: float) -> runner.RunnerConfig:
    """One server, s1, with the harness's lease timings and a work dir of the test's."""
    return runner.RunnerConfig(
        server="s1",
        incarnation=uuid.uuid4().hex,
        capacity=2,
        work_dir=tmp_path / "work",
        checkpoint_root=tmp_path / "checkpoints",
        spark_master="local[1]",
        lease_ttl=TTL,
        watchdog_margin=margin,
        renew_interval=1.0,
        poll_interval=0.5,
        stop_grace=5.0,
        backoff_base=0.5,
        backoff_max=2.0,
        fetch_retry=3.0,
        records=tmp_path / "records.jsonl",
    )


@pytest.fixture
def margin() -> float:
    """The runner's watchdog margin (a test overrides it to squeeze the deadline)."""
    return 3.0


@pytest.fixture
def the_runner(
    engine: sa.Engine,
    bucket: store.Store,
    settings: settings_module.Settings,
    tmp_path: Path,
    margin: float,
) -> Iterator[runner.Runner]:
    the_runner = runner.Runner(
        engine,
        bucket,
        cache.Cache(root=tmp_path / "cache", max_bytes=1 << 30),
        _config(tmp_path, margin),
    )
    the_runner.start()
    the_runner.registered(settle=0.0)  # no registry here: as if ZooKeeper accepted us
    yield the_runner
    the_runner.hand_off(timeout=20)
    the_runner.stop()


def _batch_job(
    engine: sa.Engine,
    bucket: store.Store,
    stage: Path,
    tmp_path: Path,
    *,
    max_retries: int | None = None,
    kind: JobKind = JobKind.BATCH,
) -> int:
    main = tmp_path / "gated.py"
    main.write_text(GATED_MAIN)
    resource = catalog.upload(engine, bucket, name="gated", path=main, max_bytes=1 << 20)
    with engine.begin() as conn:
        job_id = jobs.create(
            conn,
            jobs.JobSpec(
                name="b",
                kind=kind,
                resource_id=resource.id,
                args=[str(stage)],
                max_restarts=max_retries,
            ),
        )
        jobs.start(conn, "b")
    factories.target(engine, job_id, "s1")
    return job_id


def _kinds(database_url: str) -> list[str]:
    engine = database.create_engine(database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            return [e["kind"] for e in jobs.events(conn, "b")]
    finally:
        engine.dispose()


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
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    the_runner.wake()
    # The main itself runs (not only its spark-submit): from here it exits at "go".
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "running" and _started(stage),
        SPARK_START_S,
        message="the batch driver did not start",
    )
    services.set_connections(database_url, allowed=False)
    try:
        _go(stage, "0")  # the driver exits 0 while PostgreSQL is away
        run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
        waiting.wait_until(
            lambda: (
                (run_dir / "result.json").exists()
                and (job_id not in the_runner.runs() or the_runner.runs()[job_id].phase == "ended")
            ),
            SPARK_START_S,
            message="the driver's exit was not noticed",
        )
    finally:
        services.set_connections(database_url, allowed=True)
    engine.dispose()  # drop the pool's terminated sessions
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "finished" and not the_runner.runs(),
        SPARK_START_S,
        message="the finished batch job was not recorded",
    )
    kinds = _kinds(database_url)
    result = (rundir.run_dir(tmp_path / "work", job_id, 1) / "result.json").read_text()
    assert kinds.count("claimed") == 1, (kinds, result)
    assert (stage / "starts").read_text().split() == ["1"]
    assert len(_starts(tmp_path)) == 1
    row = factories.row(engine, job_id)
    assert (row.state, row.owner, row.epoch) == ("finished", None, 1)


@pytest.mark.parametrize("margin", [TTL - 0.001])
def test_a_lease_deadline_passing_while_the_driver_is_prepared_defers_never_fails(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    the_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    # The watchdog deadline is 1 ms after the claim: it passes while the artifact is
    # fetched, as it would in a stall or a PostgreSQL restart of a few seconds.
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    the_runner.wake()
    waiting.wait_until(
        lambda: "deferred" in _kinds(database_url) or "failed" in _kinds(database_url),
        SPARK_START_S,
        message="the start was neither deferred nor failed",
    )
    kinds = _kinds(database_url)
    assert "failed" not in kinds, kinds
    assert factories.row(engine, job_id).state in ("backoff", "starting", "pending")
    assert not (stage / "starts").exists()  # no driver ran past its deadline


@pytest.fixture
def stepped_runner(
    engine: sa.Engine, bucket: store.Store, tmp_path: Path
) -> Iterator[runner.Runner]:
    """A runner whose loops do not run: the test calls poll_once and renew_once itself,
    in the order a paused server would run them when it resumes."""
    yield from _stepped(engine, bucket, _config(tmp_path, 3.0), tmp_path)


def _stepped(
    engine: sa.Engine, bucket: store.Store, config: runner.RunnerConfig, tmp_path: Path
) -> Iterator[runner.Runner]:
    the_runner = runner.Runner(
        engine, bucket, cache.Cache(root=tmp_path / "cache", max_bytes=1 << 30), config
    )
    the_runner.registered(settle=0.0)
    yield the_runner
    for run in the_runner.runs().values():
        if run.driver is not None:
            run.driver.kill()
    the_runner.stop()


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
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    stepped_runner.poll_once()  # claims; the driver starts in a task
    # Renewed while spark-submit starts (seconds on a busy machine, beyond the 5 s the
    # lease leaves a driver that is never confirmed); the pause comes after its exit.
    waiting.wait_until(
        lambda: stepped_runner.renew_once() and _started(stage),
        SPARK_START_S,
        interval=0.5,
        message="the driver did not start",
    )
    _go(stage, "0")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(
        lambda: stepped_runner.renew_once() and (run_dir / "result.json").exists(),
        SPARK_START_S,
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
    kinds = _kinds(database_url)
    assert kinds.count("claimed") == 1, kinds
    assert (stage / "starts").read_text().split() == ["1"]


@pytest.fixture
def long_lease_runner(
    engine: sa.Engine, bucket: store.Store, tmp_path: Path
) -> Iterator[runner.Runner]:
    """A stepped runner (no loops) with a 30 s lease: its driver outlives spark-submit's
    start and exit on a busy machine without a single renewal."""
    config = dataclasses.replace(_config(tmp_path, 3.0), lease_ttl=30.0)
    yield from _stepped(engine, bucket, config, tmp_path)


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
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    long_lease_runner.poll_once()  # claims; the driver starts in a task
    _wait_started(stage)
    # From here the server takes no step: no renewal, no poll, no record of its own.
    _go(stage, "0")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(lambda: (run_dir / "result.json").exists(), SPARK_START_S, message="no exit")
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "finished",
        10,
        message="nobody recorded the batch driver's exit 0 while its server was stalled",
    )
    factories.expire_lease(engine, job_id)  # the stall outlasted the lease
    factories.target(engine, job_id, "s2")
    with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s2"), TTL)
    kinds = _kinds(database_url)
    assert kinds.count("claimed") == 1 and kinds.count("finished") == 1, kinds
    assert json.loads((run_dir / "result.json").read_text())["recorded"] is True
    # The server, resuming, finds the outcome recorded: nothing more is written.
    long_lease_runner.renew_once()
    waiting.wait_until(
        lambda: not long_lease_runner.runs() or long_lease_runner.poll_once() < 0,
        30,
        message="the resumed server did not forget the recorded run",
    )
    assert _kinds(database_url).count("finished") == 1
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
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    long_lease_runner.poll_once()
    _wait_started(stage)
    factories.expire_lease(engine, job_id)
    factories.target(engine, job_id, "s2")
    with engine.begin() as conn:
        taken = distribution.claim(conn, job_id, factories.owner("s2"), TTL)
    _go(stage, "0")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(lambda: (run_dir / "result.json").exists(), SPARK_START_S, message="no exit")
    result = json.loads((run_dir / "result.json").read_text())
    assert result["recorded"] is False, result
    now = factories.row(engine, job_id)
    assert (now.owner, now.epoch, now.state) == ("s2", taken.epoch, "starting")


def test_an_adopted_batch_run_s_exit_0_is_recorded_by_its_watchdog(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """Hole H2 (safety review): a restarted server adopts a batch run (the lease moves to
    its incarnation, the epoch stays), then stalls or dies as the driver exits 0. The
    watchdog's own record must still go through: before, it was fenced on the
    incarnation that launched it, nobody recorded the exit, and the finished generation
    ran again once the lease expired."""
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    long_lease_runner.poll_once()  # the first incarnation claims; the driver starts
    waiting.wait_until(
        lambda: _started(stage) and factories.row(engine, job_id).state == "running",
        SPARK_START_S,
        message="the driver did not start",
    )
    config = dataclasses.replace(_config(tmp_path, 3.0), lease_ttl=30.0)
    stepped = _stepped(engine, bucket, config, tmp_path)
    successor = next(stepped)
    try:
        (row,) = [r for r in _rows(engine, successor) if r.job_id == job_id]
        successor._clean_orphan(row)  # adopts: the previous incarnation's watchdog is alive
        adopted = factories.row(engine, job_id)
        assert (adopted.owner_incarnation, adopted.epoch) == (config.incarnation, 1)
        # From here the successor takes no step: stalled, or killed without a restart.
        _go(stage, "0")
        run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
        waiting.wait_until(
            lambda: (run_dir / "result.json").exists(), SPARK_START_S, message="no exit"
        )
        assert factories.row(engine, job_id).state == "finished"
        assert json.loads((run_dir / "result.json").read_text())["recorded"] is True
        factories.expire_lease(engine, job_id)
        factories.target(engine, job_id, "s2")
        with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
            distribution.claim(conn, job_id, factories.owner("s2"), TTL)
        kinds = _kinds(database_url)
        assert kinds.count("claimed") == 1 and kinds.count("finished") == 1, kinds
        assert (stage / "starts").read_text().split() == ["1"]
    finally:
        next(stepped, None)  # its teardown


def _rows(engine: sa.Engine, the_runner: runner.Runner) -> list[distribution.Row]:
    with engine.connect() as conn:
        return distribution.poll(conn, the_runner.owner)


def _crash_while_stalled(
    engine: sa.Engine, the_runner: runner.Runner, stage: Path, tmp_path: Path, job_id: int
) -> dict[str, object]:
    """The driver exits 1 while its server takes no step (stalled, or dead): the result
    the watchdog left."""
    the_runner.poll_once()  # claims; the driver starts in a task
    waiting.wait_until(
        lambda: _started(stage) and factories.row(engine, job_id).state == "running",
        SPARK_START_S,
        message="the driver did not start",
    )
    _go(stage, "1")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(lambda: (run_dir / "result.json").exists(), SPARK_START_S, message="no exit")
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
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    result = _crash_while_stalled(engine, long_lease_runner, stage, tmp_path, job_id)
    factories.expire_lease(engine, job_id)  # the stall outlasted the lease
    factories.target(engine, job_id, "s2")
    with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s2"), TTL)
    assert (result["exit_code"], result["recorded"]) == (1, True), result
    now = factories.row(engine, job_id)
    assert (now.state, now.owner, now.epoch) == ("failed", None, 1)
    assert "driver exited with exit code 1" in now.last_error, now.last_error
    _resume(long_lease_runner)
    kinds = _kinds(database_url)
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
    job_id = _batch_job(engine, bucket, stage, tmp_path, max_retries=2, kind=kind)
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
    kinds = _kinds(database_url)
    assert kinds.count("crashed") == 1 and "failed" not in kinds, kinds


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
    _wait_started(stage)
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "running" or the_runner.poll_once() < 0,
        30,
        message="the run was not recorded running",
    )
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    stop_driver = stops.stop_driver

    def exit_first(table: run_table.RunTable, ctx: run_context.Context, run: runs.Run) -> None:
        # ``stopping`` is committed; the driver ends on its own before it is signalled.
        _go(stage, str(exit_code))
        waiting.wait_until(
            lambda: (run_dir / "result.json").exists(), SPARK_START_S, message="no exit"
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
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    _exit_as_the_migration_begins(
        engine, long_lease_runner, job_id, stage, tmp_path, 0, monkeypatch
    )
    assert factories.row(engine, job_id).state == "finished"
    with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s2"), TTL)
    kinds = _kinds(database_url)
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
    job_id = _batch_job(engine, bucket, stage, tmp_path, max_retries=0)
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
        distribution.claim(conn, job_id, factories.owner("s2"), TTL)
    kinds = _kinds(database_url)
    assert kinds.count("claimed") == 1 and kinds.count("failed") == 1, kinds
    assert (stage / "starts").read_text().split() == ["1"]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["recorded"] is watchdog_records


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
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    runner_ = long_lease_runner
    runner_.poll_once()  # claims; the driver starts in a task
    _wait_started(stage)
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
    _go(stage, "0")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(lambda: (run_dir / "result.json").exists(), SPARK_START_S, message="no exit")
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
    kinds = _kinds(database_url)
    assert kinds.count("claimed") == 1 and kinds.count("finished") == 1, kinds


def _started_by_a_first_incarnation(
    engine: sa.Engine, bucket: store.Store, first: runner.Runner, stage: Path, tmp_path: Path
) -> int:
    """A gated batch job claimed by ``first`` (a stepped runner), whose driver has
    started. ``first`` renews while spark-submit starts (beyond 27 s on a loaded
    machine); a successor takes over only from then on. The job's id."""
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    first.poll_once()
    waiting.wait_until(
        lambda: first.renew_once() and _started(stage),
        SPARK_START_S,
        interval=0.5,
        message="the driver did not start",
    )
    return job_id


def test_an_adoption_committed_while_a_poll_reads_its_rows_kills_nothing(
    engine: sa.Engine,
    bucket: store.Store,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restarted server adopts its previous incarnation's driver in a task while its
    poll runs: the poll read the row before the adoption committed (the old incarnation
    owns it) and listed its local runs after (the adopted run is there). It must not
    take that for a run whose lease is gone: it killed the adopted driver and left the
    job ``running`` with no driver and a lease renewed for ever (a lost job; found by
    `benchmarks/adoption.py`'s rolling restart: `the job is no longer ours; killing the
    driver` 0 ms after `adopted a running driver of the previous incarnation`)."""
    job_id = _started_by_a_first_incarnation(engine, bucket, long_lease_runner, stage, tmp_path)
    # The first incarnation is gone (its loops never ran); the next one, same id and
    # work dir, adopts. Its adoption commits between the poll's read and its run list.
    config = dataclasses.replace(_config(tmp_path, 3.0), lease_ttl=30.0)
    stepped = _stepped(engine, bucket, config, tmp_path)
    successor = next(stepped)
    try:
        _adopt_during_a_poll(engine, successor, job_id, config, stage, monkeypatch)
    finally:
        next(stepped, None)  # its teardown


def _adopt_during_a_poll(
    engine: sa.Engine,
    successor: runner.Runner,
    job_id: int,
    config: runner.RunnerConfig,
    stage: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_rows = distribution.poll

    def poll_then_adopt(
        conn: sa.Connection, owner: distribution.Owner, also: Iterable[int] = ()
    ) -> list:
        rows = read_rows(conn, owner, also)
        if not successor.runs():
            (row,) = [r for r in rows if r.job_id == job_id]
            successor._clean_orphan(row)  # what the adoption task does, right now
        return rows

    monkeypatch.setattr(distribution, "poll", poll_then_adopt)
    successor.poll_once()
    monkeypatch.setattr(distribution, "poll", read_rows)
    waiting.wait_until(
        lambda: successor.poll_once() >= 0 and factories.row(engine, job_id).state == "running",
        10,
        message="the adopted run was not recorded running",
    )
    (run,) = successor.runs().values()
    assert run.driver is not None and run.driver.poll() is None, "the adopted driver was killed"
    now = factories.row(engine, job_id)
    assert (now.owner_incarnation, now.state) == (config.incarnation, "running")
    _go(stage, "0")  # it still runs to its end, once
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "finished" or successor.poll_once() < 0,
        SPARK_START_S,
        message="the adopted run did not finish",
    )
    assert (stage / "starts").read_text().split() == ["1"]


def test_a_driver_whose_watchdog_deadline_is_about_to_pass_is_not_adopted(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restarted server finds its previous incarnation's watchdog alive and the lease
    live in PostgreSQL, but the watchdog's own deadline (the lease less its margin) is
    about to pass. Adopting it moved the lease to the successor and then the watchdog
    killed the driver at its old deadline, before the confirmation reached it: the job
    was adopted, then lost its driver and was claimed again (CI's chaos case
    test_handover_during_a_zookeeper_outage[past-the-start-timeout]: job3-0 adopted and
    claimed). Such a run is ended and released instead: one claim, no adoption."""
    job_id = _started_by_a_first_incarnation(engine, bucket, long_lease_runner, stage, tmp_path)
    (run,) = long_lease_runner.runs().values()
    assert run.driver is not None
    # Its last confirmation gave the watchdog half a second more; the lease itself
    # (30 s in PostgreSQL) is live.
    rundir.write_lease(run.driver.lease_file, watchdog.lease_clock() + 0.5)
    config = dataclasses.replace(_config(tmp_path, 3.0), lease_ttl=30.0)
    stepped = _stepped(engine, bucket, config, tmp_path)
    successor = next(stepped)
    adopt = distribution.adopt

    def slow_adopt(*args: object, **kwargs: object) -> object:
        # A loaded machine: the adoption commits after the watchdog's deadline.
        late = watchdog.lease_clock() + 1.5
        while watchdog.lease_clock() < late:
            threading.Event().wait(0.05)
        return adopt(*args, **kwargs)

    monkeypatch.setattr(distribution, "adopt", slow_adopt)
    try:
        with engine.connect() as conn:
            (row,) = [r for r in distribution.poll(conn, successor.owner) if r.job_id == job_id]
        successor._clean_orphan(row)
        kinds = _kinds(database_url)
        assert "adopted" not in kinds, f"a dying driver was adopted: {kinds}"
        assert factories.row(engine, job_id).owner is None, "the dying run's lease was kept"
    finally:
        next(stepped, None)


def test_a_driver_starts_from_the_revision_its_claim_pinned(
    engine: sa.Engine,
    bucket: store.Store,
    long_lease_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """A new revision committed between a claim and its driver's start does not reach
    that driver (it would run a definition no claim recorded): the run starts from the
    revision its claim pinned, and the new one rolls the job afresh (a new claim)."""
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    the_runner = long_lease_runner
    t_sent = watchdog.lease_clock()
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, the_runner.owner, 30.0)
    newer = tmp_path / "stage-2"
    newer.mkdir()
    with engine.begin() as conn:
        jobs.update(conn, "b", jobs.Change(args=[str(newer)]))
    run = runs.Run(
        job_id=job_id,
        name="b",
        kind=JobKind.BATCH,
        epoch=claim.epoch,
        attempt=claim.attempt,
        claimed_at=watchdog.lease_clock(),
        deadline=t_sent + 30.0 - 3.0,
        owner=the_runner.owner,
        revision=claim.revision,
    )
    the_runner.table.add(run)
    launch.start(the_runner.table, the_runner.ctx, run)  # what the claim's task does
    _wait_started(stage)
    assert claim.revision == 1 and not (newer / "starts").exists()
    _go(stage, "0")
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "finished",
        SPARK_START_S,
        message="the batch run did not finish",
    )


def _running_batch(
    engine: sa.Engine, bucket: store.Store, the_runner: runner.Runner, stage: Path, tmp_path: Path
) -> tuple[int, runs.Run]:
    """A batch job claimed by ``the_runner``, its gated driver started and recorded running."""
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    the_runner.poll_once()  # claims; the driver starts in a task
    _wait_started(stage)
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "running" or the_runner.poll_once() < 0,
        30,
        message="the run was not recorded running",
    )
    (run,) = the_runner.runs().values()
    return job_id, run


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
    job_id, run = _running_batch(engine, bucket, long_lease_runner, stage, tmp_path)
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


def _lease_expired(engine: sa.Engine, job_id: int) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text("SELECT lease_until < now() FROM distribution WHERE job_id = :j"),
                {"j": job_id},
            ).scalar_one()
        )


def test_a_claim_whose_commit_outcome_is_unknown_is_not_held_for_ever(
    engine: sa.Engine,
    bucket: store.Store,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hole H3: the connection drops while a claim commits. PostgreSQL has the claim,
    the runner does not know it and has no local run. Before, every renewal extended that
    lease (it renewed every lease of its incarnation), the orphan check found no trace and
    left it 'to expire', and the job stayed ``starting`` with no driver for as long as
    the server lived. Renewals now extend only the leases of local runs: the unknown
    claim expires and the job is claimed again."""
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    claim = distribution.claim

    def claim_then_lose_the_answer(conn: sa.Connection, *args: object, **kwargs: object) -> None:
        with engine.begin() as own:  # committed, whatever happens to the caller's
            claim(own, *args, **kwargs)  # type: ignore[arg-type]
        raise sa.exc.OperationalError("COMMIT", {}, Exception("connection reset"))

    monkeypatch.setattr(distribution, "claim", claim_then_lose_the_answer)
    with pytest.raises(sa.exc.OperationalError):
        stepped_runner.poll_once()
    monkeypatch.setattr(distribution, "claim", claim)
    assert not stepped_runner.runs() and factories.row(engine, job_id).state == "starting"
    stepped_runner.poll_once()  # an orphan of this incarnation with no trace here
    waiting.wait_until(
        lambda: stepped_runner.renew_once() and _lease_expired(engine, job_id),
        3 * TTL,
        interval=0.5,
        message="the unknown claim's lease was renewed past its TTL",
    )
    waiting.wait_until(
        lambda: stepped_runner.poll_once() >= 0 and stepped_runner.runs(),
        10,
        message="the job was not claimed again",
    )
    (run,) = stepped_runner.runs().values()
    assert run.epoch == 2
    waiting.wait_until(
        lambda: stepped_runner.renew_once() and _started(stage),
        SPARK_START_S,
        interval=0.5,
        message="the driver did not start",
    )
    assert (stage / "starts").read_text().split() == ["2"]


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
    job_id, run = _running_batch(engine, bucket, long_lease_runner, stage, tmp_path)
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
    job_id, _ = _running_batch(engine, bucket, long_lease_runner, stage, tmp_path)
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    state = rundir.read_json(run_dir / "watchdog.json")
    assert state is not None
    _go(stage, "143")
    # The driver reaped by its watchdog, which then waits up to SIGTERM_STOP_WAIT_S for
    # its own SIGTERM before it decides (and writes its "ended" record, which says it).
    waiting.wait_until(
        lambda: not Path(f"/proc/{state['driver_pid']}").exists(),
        SPARK_START_S,
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


class _HungDriver:
    """A driver handle whose kill blocks (a driver in uninterruptible sleep)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.killed = threading.Event()

    def ended(self) -> bool:
        return False

    def confirm(self, deadline: float) -> None:
        pass

    def kill(self) -> None:
        self.killed.set()
        self.release.wait(60)


def test_a_hung_kill_of_a_lost_run_does_not_hold_up_the_renewals(
    engine: sa.Engine, stepped_runner: runner.Runner
) -> None:
    """Hole H11: the renewal killed the drivers of lost leases inline. ``Driver.kill``
    can take tens of seconds on a hung driver, and meanwhile no lease of any other job
    on the server was renewed: every other driver died at its deadline."""
    hung = _HungDriver()
    run = runs.Run(
        job_id=1,
        name="lost",
        kind=JobKind.BATCH,
        epoch=1,
        attempt=1,
        claimed_at=watchdog.lease_clock() - 60,  # claimed long before this renewal
        deadline=0.0,
        owner=stepped_runner.owner,
        phase=runner.reconcile.Phase.RUNNING,
        driver=hung,  # type: ignore[arg-type]
    )
    stepped_runner.table.add(run)
    renewal = threading.Thread(target=stepped_runner.renew_once)
    try:
        renewal.start()
        waiting.wait_until(hung.killed.is_set, 10, message="the lost run was never killed")
        renewal.join(5)
        assert not renewal.is_alive(), "the renewal waited for the hung kill"
    finally:
        hung.release.set()
        renewal.join(10)
    assert not stepped_runner.runs()


def test_a_job_whose_lost_run_is_still_being_killed_here_is_not_claimed_here_again(
    engine: sa.Engine,
    bucket: store.Store,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """A randomized run on a starved machine (CHAOS_SEED=81000001): a server lost a lease,
    its kill of the driver went to a task and the run was forgotten at once; the next
    poll claimed the job again on the same server 0.745 s before the old driver was
    dead (an early hand-off; its watchdog had woken 5.2 s past its deadline). A job
    whose previous local run is still being killed is not claimed until the kill is
    over."""
    job_id = _batch_job(engine, bucket, stage, tmp_path)  # targeted here, claimable
    hung = _HungDriver()
    lost = runs.Run(
        job_id=job_id,
        name="b",
        kind=JobKind.BATCH,
        epoch=99,  # no lease of ours holds it: the renewal finds it lost
        attempt=1,
        claimed_at=watchdog.lease_clock() - 60,
        deadline=0.0,
        owner=stepped_runner.owner,
        phase=runner.reconcile.Phase.RUNNING,
        driver=hung,  # type: ignore[arg-type]
    )
    stepped_runner.table.add(lost)
    try:
        stepped_runner.renew_once()
        waiting.wait_until(hung.killed.is_set, 10, message="the lost run was never killed")
        stepped_runner.poll_once()
        assert factories.row(engine, job_id).epoch == 0, "claimed while its old driver lived"
    finally:
        hung.release.set()
    waiting.wait_until(
        lambda: stepped_runner.poll_once() is not None and factories.row(engine, job_id).epoch > 0,
        30,
        interval=0.2,
        message="the job was not claimed once the kill was over",
    )


class _ConfirmedDriver(_HungDriver):
    """A driver handle that records its confirmations (its kill returns at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.release.set()
        self.deadlines: list[float] = []

    def confirm(self, deadline: float) -> None:
        self.deadlines.append(deadline)


def _local_run(the_runner: runner.Runner, job_id: int, epoch: int, deadline_in: float) -> runs.Run:
    """A running batch run ``b`` of ``the_runner`` at ``epoch``, its driver a handle."""
    run = runs.Run(
        job_id=job_id, name="b", kind=JobKind.BATCH, epoch=epoch, attempt=1,
        claimed_at=watchdog.lease_clock(), deadline=watchdog.lease_clock() + deadline_in,
        owner=the_runner.owner, phase=runner.reconcile.Phase.RUNNING,
        driver=_ConfirmedDriver(),  # type: ignore[arg-type]
    )  # fmt: skip
    the_runner.table.add(run)
    return run


def test_a_hand_over_whose_commit_answer_is_lost_is_tried_again(
    engine: sa.Engine,
    bucket: store.Store,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hole H12: the hand-over's lease extension committed but its answer was lost with
    the connection. The server logged "hand-over failed" and left the drivers to die at
    their current deadlines, while PostgreSQL held the window-long leases: the jobs
    waited out the whole window. The extension (idempotent) is tried again."""
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, stepped_runner.owner, TTL)
    handle = _ConfirmedDriver()
    run = runs.Run(
        job_id=job_id,
        name="b",
        kind=JobKind.BATCH,
        epoch=claim.epoch,
        attempt=1,
        claimed_at=watchdog.lease_clock(),
        deadline=watchdog.lease_clock() + TTL - 3.0,
        owner=stepped_runner.owner,
        phase=runner.reconcile.Phase.RUNNING,
        driver=handle,  # type: ignore[arg-type]
    )
    stepped_runner.table.add(run)
    renew = distribution.renew_leases
    answers_lost: list[int] = []

    def renew_then_lose_the_answer(conn: sa.Connection, *args: object, **kwargs: object) -> object:
        if answers_lost:
            return renew(conn, *args, **kwargs)  # type: ignore[arg-type]
        with engine.begin() as own:
            renew(own, *args, **kwargs)  # type: ignore[arg-type]
        answers_lost.append(1)
        raise sa.exc.OperationalError("COMMIT", {}, Exception("connection reset"))

    monkeypatch.setattr(distribution, "renew_leases", renew_then_lose_the_answer)
    before = watchdog.lease_clock()
    assert stepped_runner.hand_over(60.0) == ["b"]
    assert handle.deadlines and handle.deadlines[-1] >= before + 60.0 - 3.0


def test_a_hand_over_extends_only_the_leases_of_local_runs(
    engine: sa.Engine,
    bucket: store.Store,
    stage: Path,
    tmp_path: Path,
    stepped_runner: runner.Runner,
) -> None:
    """M8 of safety review 3: a lease this incarnation holds without a local run (a claim
    whose commit answer was lost: no driver behind it) is not extended by the hand-over:
    it expires at its own time, not after the whole window."""
    local = _batch_job(engine, bucket, stage, tmp_path)
    unknown = factories.job(engine, "no-run-here", kind=JobKind.BATCH)
    factories.target(engine, unknown, stepped_runner.owner.server)
    with engine.begin() as conn:
        claim = distribution.claim(conn, local, stepped_runner.owner, TTL)
        distribution.claim(conn, unknown, stepped_runner.owner, TTL)
    _local_run(stepped_runner, local, claim.epoch, deadline_in=TTL - 3.0)
    assert stepped_runner.hand_over(600.0) == ["b"]
    with engine.connect() as conn:
        left = dict(
            conn.execute(
                sa.text(
                    "SELECT job_id, extract(epoch FROM lease_until - now()) FROM distribution "
                    "WHERE job_id IN (:a, :b)"
                ),
                {"a": local, "b": unknown},
            ).all()
        )
    assert left[local] > 500 and left[unknown] <= TTL


# -------------------------------------------------- H6: a job re-created under its name


def _orphan_cleaned(the_runner: runner.Runner, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once the runner's orphan task (``_clean_orphan``) has returned."""
    done = threading.Event()
    clean = the_runner._clean_orphan

    def clean_then_tell(row: distribution.Row) -> None:
        try:
            clean(row)
        finally:
            done.set()

    monkeypatch.setattr(the_runner, "_clean_orphan", clean_then_tell)
    return done


@pytest.mark.parametrize(
    ("identity", "claimed_here"),
    [
        ({}, False),  # a result as the brief's example writes it: no identity at all
        # The deleted job's own watchdog (the legacy layout) wrote this identity; the new
        # job's claim by the new code left its own run directory behind (runs/<id>/).
        ({"job": "b", "epoch": 1, "server": "s1"}, True),
    ],
)
def test_a_re_created_job_never_ends_with_its_deleted_namesakes_result(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    identity: dict[str, object],
    claimed_here: bool,
) -> None:
    """Hole H6: job b was deleted and created again; its run directory of epoch 1 is
    still there. The new job b is claimed at epoch 1 by the previous incarnation, which
    dies before it launches anything. The successor must not record the deleted job's
    result as the new job's (a batch exit 0 ended ``finished`` though it never ran):
    the lease is left to expire, or released, never ended from another job's trace."""
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    legacy = tmp_path / "work" / "runs" / "b" / "1"
    legacy.mkdir(parents=True)
    (legacy / "result.json").write_text(
        json.dumps({**identity, "reason": "exited", "exit_code": 0, "ended_at": 1.0})
    )
    if claimed_here:
        rundir.job_dir(tmp_path / "work", job_id).mkdir(parents=True)
    with engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s1", "old"), TTL)
    cleaned = _orphan_cleaned(stepped_runner, monkeypatch)
    stepped_runner.poll_once()  # an orphan of the previous incarnation: its task runs
    waiting.wait_until(cleaned.is_set, 10, message="the orphan task did not run")
    stepped_runner.poll_once()  # and records whatever it decided
    assert factories.row(engine, job_id).state != "finished"
    assert "finished" not in _kinds(database_url)
    assert not (stage / "starts").exists()


def test_a_run_of_the_old_layout_is_still_recorded_after_an_upgrade(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Upgrade compatibility: a server restarted onto this code finds the result its
    previous incarnation's (older) code left in ``runs/<name>/<epoch>``, with that code's
    identity (no job id), and no run directory of the new layout for the job: that run
    is the job's own, and its exit 0 is recorded ``finished``."""
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    legacy = tmp_path / "work" / "runs" / "b" / "1"
    legacy.mkdir(parents=True)
    (legacy / "result.json").write_text(
        json.dumps(
            {"job": "b", "epoch": 1, "server": "s1", "reason": "exited", "exit_code": 0}
            | {"ended_at": 1.0}
        )
    )
    with engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s1", "old"), TTL)
    cleaned = _orphan_cleaned(stepped_runner, monkeypatch)
    stepped_runner.poll_once()
    waiting.wait_until(cleaned.is_set, 10, message="the orphan task did not run")
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "finished" or stepped_runner.poll_once() < 0,
        10,
        message="the old layout's result was not recorded",
    )


def _streaming_job(engine: sa.Engine, bucket: store.Store, tmp_path: Path) -> int:
    main = tmp_path / "stream.py"
    main.write_text("print('never run here')\n")
    resource = catalog.upload(engine, bucket, name="stream", path=main, max_bytes=1 << 20)
    with engine.begin() as conn:
        job_id = jobs.create(
            conn, jobs.JobSpec(name="s", kind=JobKind.STREAMING, resource_id=resource.id)
        )
        jobs.start(conn, "s")
    factories.target(engine, job_id, "s1")
    return job_id


def _launched_spec(
    the_runner: runner.Runner, monkeypatch: pytest.MonkeyPatch
) -> list[driver_module.DriverSpec]:
    """Claim and prepare the job targeted at ``the_runner``; the launch itself is only
    recorded (and deferred): what matters is the spec it was given."""
    specs: list[driver_module.DriverSpec] = []

    def launch(spec: driver_module.DriverSpec, *args: object, **kwargs: object) -> None:
        specs.append(spec)
        raise driver_module.DriverError("launch recorded by the test")

    monkeypatch.setattr(driver_module, "launch", launch)
    the_runner.poll_once()
    waiting.wait_until(lambda: specs, 30, message="the driver was never prepared")
    return specs


def test_a_re_created_streaming_job_starts_from_a_checkpoint_of_its_own(
    engine: sa.Engine,
    bucket: store.Store,
    stepped_runner: runner.Runner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hole H6: streaming job s was deleted (its checkpoints are kept) and created again
    under the same name. The new job must not resume the deleted job's checkpoint (its
    offsets and state belong to another job); the deleted job's checkpoint is kept."""
    root = tmp_path / "checkpoints"
    deleted = root / "s"
    (deleted / "offsets").mkdir(parents=True)
    (deleted / "offsets" / "0").write_text("the deleted job's offsets")
    (deleted / checkpoint.LEGACY_OWNER_FILE).write_text("999999\n")  # the deleted job's id
    job_id = _streaming_job(engine, bucket, tmp_path)
    (spec,) = _launched_spec(stepped_runner, monkeypatch)
    assert spec.checkpoint_dir is not None
    assert not (spec.checkpoint_dir / "offsets").exists(), "resumed the deleted job's checkpoint"
    assert checkpoint.owner(root, "s") == str(job_id)
    kept = [p for p in root.rglob("0") if p.read_text() == "the deleted job's offsets"]
    assert kept, "the deleted job's checkpoint was not kept"


def test_a_streaming_job_keeps_its_checkpoint_of_the_old_layout_after_an_upgrade(
    engine: sa.Engine,
    bucket: store.Store,
    stepped_runner: runner.Runner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Upgrade compatibility: a checkpoint the older code left at ``<root>/<name>`` (no
    owner marker) is the job's own: the job resumes it, and it is marked as the job's."""
    root = tmp_path / "checkpoints"
    (root / "s" / "offsets").mkdir(parents=True)
    (root / "s" / "offsets" / "0").write_text("offsets")
    job_id = _streaming_job(engine, bucket, tmp_path)
    (spec,) = _launched_spec(stepped_runner, monkeypatch)
    assert spec.checkpoint_dir == root / "s"
    assert (root / "s" / "offsets" / "0").read_text() == "offsets"
    assert checkpoint.owner(root, "s") == str(job_id)


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
    job_id, _ = _running_batch(engine, bucket, long_lease_runner, stage, tmp_path)
    owner = long_lease_runner.owner
    _go(stage, "0")
    run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
    waiting.wait_until(lambda: (run_dir / "result.json").exists(), SPARK_START_S, message="no exit")
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


class _FullDiskDriver(_ConfirmedDriver):
    def confirm(self, deadline: float) -> None:
        raise OSError(28, "No space left on device", "lease.json")


def test_a_lease_file_that_cannot_be_written_at_launch_never_leaves_the_run_starting(
    engine: sa.Engine,
    bucket: store.Store,
    the_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A clean-clone CI run (CHAOS_SEED=417020630): s2's work dir filled up as it
    launched st0-6. The lease confirmation right after the launch raised ENOSPC out of
    the start task: the run stayed 'starting' with its lease renewed, its driver died at
    its deadline and nobody reaped it, and the job never ran again (lost). A
    confirmation that fails there fails as a renewal's does: the driver dies at its
    launch deadline, and the run is reaped, recorded and claimed again."""

    def disk_full(self: driver_module.Driver, deadline: float) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(driver_module.Driver, "confirm", disk_full)
    job_id = _batch_job(engine, bucket, stage, tmp_path, kind=JobKind.STREAMING)
    the_runner.wake()
    waiting.wait_until(
        lambda: factories.row(engine, job_id).epoch >= 2,
        SPARK_START_S,
        interval=0.5,
        message="the run whose lease could not be confirmed was never reaped",
    )
    kinds = _kinds(database_url=str(engine.url.render_as_string(hide_password=False)))
    assert "released" in kinds, kinds


def test_a_lease_file_that_cannot_be_written_does_not_stop_the_renewals(
    engine: sa.Engine,
    bucket: store.Store,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """A full work dir (found by the chaos fault disk_full, seed 772255147): writing one
    driver's lease file raised ENOSPC inside the renewal, the renew thread died and the
    server exited ('the runner thread died'). One driver's confirmation failing must
    leave it to die at its deadline, not stop every other job's renewals."""
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    with engine.begin() as conn:
        other = jobs.create(
            conn,
            jobs.JobSpec(
                name="c",
                kind=JobKind.BATCH,
                resource_id=conn.execute(
                    sa.text("SELECT resource_id FROM jobs WHERE id = :j"), {"j": job_id}
                ).scalar_one(),
            ),
        )
        jobs.start(conn, "c")
    factories.target(engine, other, "s1")
    handles = {job_id: _FullDiskDriver(), other: _ConfirmedDriver()}
    for jid, handle in handles.items():
        with engine.begin() as conn:
            claim = distribution.claim(conn, jid, stepped_runner.owner, TTL)
        stepped_runner.table.add(
            runs.Run(
                job_id=jid,
                name=claim.name,
                kind=JobKind.BATCH,
                epoch=claim.epoch,
                attempt=1,
                claimed_at=watchdog.lease_clock(),
                deadline=watchdog.lease_clock() + TTL - 3.0,
                owner=stepped_runner.owner,
                phase=runner.reconcile.Phase.RUNNING,
                driver=handle,  # type: ignore[arg-type]
            )
        )
    assert stepped_runner.renew_once()
    assert handles[other].deadlines, "the other job's driver was not confirmed"


def test_a_previous_incarnation_s_expired_lease_of_a_job_wanted_stopped_is_released(
    engine: sa.Engine,
    bucket: store.Store,
    stepped_runner: runner.Runner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the chaos run CHAOS_SEED=798327972 (freeze,kill9): stall0's server was
    killed; its watchdog killed the driver when the lease expired, 4 s later; the
    successor started 13 s after the kill, with the lease already expired, and the job
    was then stopped. Nobody settled it: the successor handled only live leases of its
    server id as orphans, the coordinator places only jobs wanted running (a lapsed
    lease goes to a new target, and there was none) and reaps only departed owners'
    leases. It stayed ``running``, owner s1, target None, for ever. An expired lease of
    this server id whose job is wanted stopped is an orphan now: released, ``stopped``."""
    job_id = _streaming_job(engine, bucket, tmp_path)
    with engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s1", "old"), TTL)
        jobs.stop(conn, "s")
    factories.target(engine, job_id, None)
    factories.expire_lease(engine, job_id)
    cleaned = _orphan_cleaned(stepped_runner, monkeypatch)
    stepped_runner.poll_once()
    waiting.wait_until(cleaned.is_set, 10, message="the expired lease was not handled")
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "stopped" or stepped_runner.poll_once() < 0,
        10,
        message="the expired lease of a stopped job was not released",
    )
    assert factories.row(engine, job_id).owner is None


# ---------------------------------------------------------------- Spark master outages


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _listening(port: int) -> socket.socket:
    """A stand-in for a Spark master's RPC port: it accepts TCP connections (the check
    is a connect; the gated main never talks to a master)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    return listener


def _events(database_url: str) -> list[dict[str, object]]:
    engine = database.create_engine(database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            return jobs.events(conn, "b")
    finally:
        engine.dispose()


def test_a_job_whose_spark_master_does_not_answer_waits_and_starts_once_one_does(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    stage: Path,
    tmp_path: Path,
) -> None:
    """S9: no master of the job's spark:// URL answers, so no driver is launched: the run
    is deferred (no restart counted, no driver started, an event naming the cause) until
    a master answers; then it runs once, to its end. Before, the driver was launched
    anyway and its failure to register spent the job's budget."""
    port = _free_port()
    master = f"spark://127.0.0.1:{port}"
    config = dataclasses.replace(_config(tmp_path, 3.0), spark_master=master, master_wait_max=1.0)
    the_runner = runner.Runner(
        engine, bucket, cache.Cache(root=tmp_path / "cache", max_bytes=1 << 30), config
    )
    job_id = _batch_job(engine, bucket, stage, tmp_path)  # max_restarts 0: one crash fails it
    the_runner.start()
    the_runner.registered(settle=0.0)
    listener = None
    try:
        waiting.wait_until(
            lambda: _kinds(database_url).count("deferred") >= 2,
            30,
            message="the run was not deferred",
        )
        now = factories.row(engine, job_id)
        assert (now.restarts, now.attempt >= 2) == (0, True), now
        assert not (stage / "starts").exists(), "a driver was launched with no master"
        deferred = [e for e in _events(database_url) if e["kind"] == "deferred"]
        assert deferred[0]["detail"] == {
            "cause": "spark-master-unreachable",
            "error": f"cause=spark-master-unreachable master={master}",
        }
        listener = _listening(port)
        _wait_started(stage)
        _go(stage, "0")
        waiting.wait_until(
            lambda: factories.row(engine, job_id).state == "finished",
            SPARK_START_S,
            message="the job did not finish",
        )
    finally:
        the_runner.hand_off(timeout=20)
        the_runner.stop()
        if listener is not None:
            listener.close()
    assert factories.row(engine, job_id).restarts == 0
    kinds = _kinds(database_url)
    assert "crashed" not in kinds and "failed" not in kinds, kinds
    assert (stage / "starts").read_text().split() == [str(factories.row(engine, job_id).epoch)]


@pytest.mark.parametrize("master_back", [False, True])
def test_a_driver_that_never_registered_while_no_master_answers_is_deferred_by_its_watchdog(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    stage: Path,
    tmp_path: Path,
    master_back: bool,
) -> None:
    """The master answers at launch, then dies; the driver exits 1 before its log shows
    the registration. Its watchdog records a deferral (no restart counted, the job not
    failed although it has no retries), its error naming the cause. With a master
    answering again when the driver exits, the exit is the job's own: failed, as before."""
    port = _free_port()
    master = f"spark://127.0.0.1:{port}"
    listener = _listening(port)
    config = dataclasses.replace(_config(tmp_path, 3.0), spark_master=master, lease_ttl=30.0)
    stepped = _stepped(engine, bucket, config, tmp_path)
    the_runner = next(stepped)
    try:
        job_id = _batch_job(engine, bucket, stage, tmp_path)
        the_runner.poll_once()  # claims; the driver starts in a task
        waiting.wait_until(
            lambda: _started(stage) and factories.row(engine, job_id).state == "running",
            SPARK_START_S,
            message="the driver did not start",
        )
        if not master_back:
            listener.close()
        _go(stage, "1")
        run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
        waiting.wait_until(
            lambda: (run_dir / "result.json").exists(), SPARK_START_S, message="no exit"
        )
        result = json.loads((run_dir / "result.json").read_text())
    finally:
        listener.close()
        next(stepped, None)
    assert result["recorded"] is True, result
    now = factories.row(engine, job_id)
    last = _events(database_url)[-1]
    if master_back:
        assert (now.state, now.restarts, last["kind"]) == ("failed", 0, "failed"), now
        return
    assert (now.state, now.owner, now.restarts) == ("backoff", None, 0), now
    assert last["kind"] == "deferred", last
    assert last["detail"]["cause"] == "spark-master-unreachable", last
    error = last["detail"]["error"]
    assert error.startswith(f"cause=spark-master-unreachable master={master} after "), error
    assert "\n" not in error and len(error) <= 300, error


@pytest.mark.parametrize("master_up", [False, True])
def test_an_unregistered_exit_the_server_records_is_a_deferral_while_no_master_answers(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
    master_up: bool,
) -> None:
    """When the watchdog could not record a driver's exit (PostgreSQL away past its
    retries), the server records it, and judges it as the watchdog would: an exit before
    the registration while no master answers is deferred, not counted (S9); with a
    master answering it is the job's crash (no retries: failed)."""
    port = _free_port()
    listener = _listening(port) if master_up else None
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, stepped_runner.owner, TTL)
    run = runs.Run(
        job_id=job_id,
        name="b",
        kind="batch",
        epoch=claim.epoch,
        attempt=claim.attempt,
        claimed_at=watchdog.lease_clock(),
        deadline=watchdog.lease_clock() + TTL,
        owner=stepped_runner.owner,
        master=f"spark://127.0.0.1:{port}",
    )
    log = rundir.run_dir(tmp_path / "work", job_id, claim.epoch) / rundir.LOG_FILE
    log.parent.mkdir(parents=True)
    sample = (Path(__file__).parent / "data" / "spark_driver_no_master.log").read_text()
    if master_up:
        # A driver that failed before registering without Spark giving up on its masters
        # (that give-up is the outage's whatever answers now: spark_master.lost_to_outage).
        sample = "".join(line for line in sample.splitlines(True) if "Giving up" not in line)
    log.write_text(sample)
    outcome = driver_module.Outcome(1, watchdog.Reason.EXITED, 0.0, 1.0, recorded=False)
    try:
        write = outcomes.outcome_write(stepped_runner.table, stepped_runner.ctx, run, outcome)
    finally:
        if listener is not None:
            listener.close()
    with engine.begin() as conn:
        write(conn)
    now = factories.row(engine, job_id)
    last = _events(database_url)[-1]
    if master_up:
        assert (now.state, last["kind"]) == ("failed", "failed"), now
        assert now.last_error.startswith("driver exited with exit code 1: SparkException: ")
        return
    assert (now.state, now.restarts, last["kind"]) == ("backoff", 0, "deferred"), now
    assert last["detail"]["cause"] == "spark-master-unreachable", last


def test_a_start_that_keeps_failing_for_a_passing_reason_waits_longer_each_time(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    stage: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A driver that cannot be started for a reason that may pass (here spark-submit is
    missing; in the clean-clone CI run at cabe3be the driver user could not reach a closed
    folder) is deferred with no restart counted, and each consecutive deferral waits
    twice as long as the one before, up to the restart backoff's cap. Before, every
    deferral waited the base backoff: one server claimed the job again every 0.5 s, 290
    claims in three minutes, each an epoch and events of its own."""
    monkeypatch.setattr(driver_module, "default_spark_submit", lambda: tmp_path / "no-spark")
    config = dataclasses.replace(_config(tmp_path, 3.0), backoff_base=0.25, backoff_max=2.0)
    the_runner = runner.Runner(
        engine, bucket, cache.Cache(root=tmp_path / "cache", max_bytes=1 << 30), config
    )
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    the_runner.start()
    the_runner.registered(settle=0.0)
    try:
        waiting.wait_until(
            lambda: _kinds(database_url).count("deferred") >= 5,
            60,
            message="five deferrals",
        )
    finally:
        the_runner.stop()
    with engine.connect() as conn:
        waits = conn.execute(
            sa.text(
                "SELECT extract(epoch FROM d.not_before - e.at) AS wait FROM job_events e "
                "JOIN distribution d ON d.job_id = e.job_id "
                "WHERE e.job_id = :job AND e.kind = 'deferred' ORDER BY e.id DESC LIMIT 1"
            ),
            {"job": job_id},
        ).scalar_one()
    deferred = [e for e in _events(database_url) if e["kind"] == "deferred"]
    assert all("spark-submit not found" in e["detail"]["error"] for e in deferred), deferred
    # The last one's wait: 0.25 s doubled once per deferral before it, at most 2 s.
    assert float(waits) == pytest.approx(min(2.0, 0.25 * 2 ** (len(deferred) - 1)), abs=0.01)
    assert factories.row(engine, job_id).restarts == 0
    assert not (stage / "starts").exists()


def test_a_start_file_created_but_not_yet_written_is_not_a_start(tmp_path: Path) -> None:
    """What the waits above look for: the gated driver's start line, not its file (an
    existence check let a test read the file empty under load)."""
    (tmp_path / "starts").touch()
    assert not _started(tmp_path)
    (tmp_path / "starts").write_text("2")
    assert not _started(tmp_path)  # the line is not whole yet
    (tmp_path / "starts").write_text("2\n")
    assert _started(tmp_path)


# ---------------------------------------- M1: a run killed on a decision taken before


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
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, stepped_runner.owner, TTL)
        distribution.mark_running(conn, job_id, stepped_runner.owner, claim.epoch, 1)
    run = _local_run(stepped_runner, job_id, claim.epoch, deadline_in=TTL)

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


# ------------------------------- M6: a previous incarnation's outcome left on disk


def test_a_previous_incarnations_exit_0_left_on_disk_is_recorded_not_run_again(
    engine: sa.Engine,
    bucket: store.Store,
    database_url: str,
    stepped_runner: runner.Runner,
    stage: Path,
    tmp_path: Path,
) -> None:
    """M6 of safety review 3: a server restarts (same id, same work dir) after its
    previous incarnation's batch driver exited 0 while neither its watchdog nor that
    incarnation could record it (PostgreSQL away), and the lease expired meanwhile. The
    result file is the only word on that end. Before, the successor claimed the job
    over its own expired lease and ran the finished generation again."""
    job_id = _batch_job(engine, bucket, stage, tmp_path)
    previous = factories.owner(stepped_runner.owner.server, "previous")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, previous, TTL)
        distribution.mark_running(conn, job_id, previous, claim.epoch, 1)
    run_dir = rundir.run_dir(tmp_path / "work", job_id, claim.epoch)
    run_dir.mkdir(parents=True)
    now = time.time()
    rundir.write_json_atomically(
        run_dir / rundir.RESULT_FILE,
        {
            "job_id": job_id, "job": "b", "epoch": claim.epoch,
            "server": stepped_runner.owner.server, "reason": "exited", "exit_code": 0,
            "started_at": now - 5, "ended_at": now - 1, "recorded": False,
        },
    )  # fmt: skip
    factories.expire_lease(engine, job_id)
    stepped_runner.poll_once()  # the orphan's end is recorded (in a task)
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "finished",
        10,
        message="the previous incarnation's exit 0 was not recorded",
    )
    stepped_runner.poll_once()
    kinds = _kinds(database_url)
    assert kinds.count("claimed") == 1 and kinds.count("finished") == 1, kinds
    assert not _started(stage), "the finished generation ran again"
