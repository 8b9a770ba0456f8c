"""Adoption (server/adoption.py): a previous incarnation's leases and runs, adopted,
recorded or released; a job re-created under its name (H6); against real PostgreSQL, S3
and spark-submit."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
import sqlalchemy as sa

from resource_center import store
from scheduler import distribution, jobs
from server import rundir, runner, watchdog
from testing import factories, waiting
from tests.integration import runner_harness as harness


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
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    long_lease_runner.poll_once()  # the first incarnation claims; the driver starts
    waiting.wait_until(
        lambda: harness.started(stage) and factories.row(engine, job_id).state == "running",
        harness.SPARK_START_S,
        message="the driver did not start",
    )
    config = dataclasses.replace(harness.config(tmp_path, 3.0), lease_ttl=30.0)
    stepped = harness.stepped(engine, bucket, config, tmp_path)
    successor = next(stepped)
    try:
        (row,) = [r for r in _rows(engine, successor) if r.job_id == job_id]
        successor._clean_orphan(row)  # adopts: the previous incarnation's watchdog is alive
        adopted = factories.row(engine, job_id)
        assert (adopted.owner_incarnation, adopted.epoch) == (config.incarnation, 1)
        # From here the successor takes no step: stalled, or killed without a restart.
        harness.go(stage, "0")
        run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
        waiting.wait_until(
            lambda: (run_dir / "result.json").exists(), harness.SPARK_START_S, message="no exit"
        )
        assert factories.row(engine, job_id).state == "finished"
        assert json.loads((run_dir / "result.json").read_text())["recorded"] is True
        factories.expire_lease(engine, job_id)
        factories.target(engine, job_id, "s2")
        with pytest.raises(distribution.NotClaimable), engine.begin() as conn:
            distribution.claim(conn, job_id, factories.owner("s2"), harness.TTL)
        kinds = harness.kinds(database_url)
        assert kinds.count("claimed") == 1 and kinds.count("finished") == 1, kinds
        assert (stage / "starts").read_text().split() == ["1"]
    finally:
        next(stepped, None)  # its teardown


def _rows(engine: sa.Engine, the_runner: runner.Runner) -> list[distribution.Row]:
    with engine.connect() as conn:
        return distribution.poll(conn, the_runner.owner)


def _started_by_a_first_incarnation(
    engine: sa.Engine, bucket: store.Store, first: runner.Runner, stage: Path, tmp_path: Path
) -> int:
    """A gated batch job claimed by ``first`` (a stepped runner), whose driver has
    started. ``first`` renews while spark-submit starts (beyond 27 s on a loaded
    machine); a successor takes over only from then on. The job's id."""
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    first.poll_once()
    waiting.wait_until(
        lambda: first.renew_once() and harness.started(stage),
        harness.SPARK_START_S,
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
    config = dataclasses.replace(harness.config(tmp_path, 3.0), lease_ttl=30.0)
    stepped = harness.stepped(engine, bucket, config, tmp_path)
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
    harness.go(stage, "0")  # it still runs to its end, once
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "finished" or successor.poll_once() < 0,
        harness.SPARK_START_S,
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
    config = dataclasses.replace(harness.config(tmp_path, 3.0), lease_ttl=30.0)
    stepped = harness.stepped(engine, bucket, config, tmp_path)
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
        kinds = harness.kinds(database_url)
        assert "adopted" not in kinds, f"a dying driver was adopted: {kinds}"
        assert factories.row(engine, job_id).owner is None, "the dying run's lease was kept"
    finally:
        next(stepped, None)


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
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    legacy = tmp_path / "work" / "runs" / "b" / "1"
    legacy.mkdir(parents=True)
    (legacy / "result.json").write_text(
        json.dumps({**identity, "reason": "exited", "exit_code": 0, "ended_at": 1.0})
    )
    if claimed_here:
        rundir.job_dir(tmp_path / "work", job_id).mkdir(parents=True)
    with engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s1", "old"), harness.TTL)
    cleaned = _orphan_cleaned(stepped_runner, monkeypatch)
    stepped_runner.poll_once()  # an orphan of the previous incarnation: its task runs
    waiting.wait_until(cleaned.is_set, 10, message="the orphan task did not run")
    stepped_runner.poll_once()  # and records whatever it decided
    assert factories.row(engine, job_id).state != "finished"
    assert "finished" not in harness.kinds(database_url)
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
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    legacy = tmp_path / "work" / "runs" / "b" / "1"
    legacy.mkdir(parents=True)
    (legacy / "result.json").write_text(
        json.dumps(
            {"job": "b", "epoch": 1, "server": "s1", "reason": "exited", "exit_code": 0}
            | {"ended_at": 1.0}
        )
    )
    with engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s1", "old"), harness.TTL)
    cleaned = _orphan_cleaned(stepped_runner, monkeypatch)
    stepped_runner.poll_once()
    waiting.wait_until(cleaned.is_set, 10, message="the orphan task did not run")
    waiting.wait_until(
        lambda: factories.row(engine, job_id).state == "finished" or stepped_runner.poll_once() < 0,
        10,
        message="the old layout's result was not recorded",
    )


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
    job_id = harness.streaming_job(engine, bucket, tmp_path)
    with engine.begin() as conn:
        distribution.claim(conn, job_id, factories.owner("s1", "old"), harness.TTL)
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
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    previous = factories.owner(stepped_runner.owner.server, "previous")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, previous, harness.TTL)
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
    kinds = harness.kinds(database_url)
    assert kinds.count("claimed") == 1 and kinds.count("finished") == 1, kinds
    assert not harness.started(stage), "the finished generation ran again"
