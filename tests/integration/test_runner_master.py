"""A start while no Spark master answers (S9): deferred, never counted a crash, started
once one answers; against real PostgreSQL, S3 and spark-submit."""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path

import pytest
import sqlalchemy as sa

from resource_center import cache, store
from scheduler import distribution
from server import driver as driver_module
from server import outcomes, rundir, runner, runs, watchdog
from testing import factories, waiting
from tests.integration import runner_harness as harness


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
    config = dataclasses.replace(
        harness.config(tmp_path, 3.0), spark_master=master, master_wait_max=1.0
    )
    the_runner = runner.Runner(
        engine, bucket, cache.Cache(root=tmp_path / "cache", max_bytes=1 << 30), config
    )
    job_id = harness.batch_job(
        engine, bucket, stage, tmp_path
    )  # max_restarts 0: one crash fails it
    the_runner.start()
    the_runner.registered(settle=0.0)
    listener = None
    try:
        waiting.wait_until(
            lambda: harness.kinds(database_url).count("deferred") >= 2,
            30,
            message="the run was not deferred",
        )
        now = factories.row(engine, job_id)
        assert (now.restarts, now.attempt >= 2) == (0, True), now
        assert not (stage / "starts").exists(), "a driver was launched with no master"
        deferred = [e for e in harness.events(database_url) if e["kind"] == "deferred"]
        assert deferred[0]["detail"] == {
            "cause": "spark-master-unreachable",
            "error": f"cause=spark-master-unreachable master={master}",
        }
        listener = _listening(port)
        harness.wait_started(stage)
        harness.go(stage, "0")
        waiting.wait_until(
            lambda: factories.row(engine, job_id).state == "finished",
            harness.SPARK_START_S,
            message="the job did not finish",
        )
    finally:
        the_runner.hand_off(timeout=20)
        the_runner.stop()
        if listener is not None:
            listener.close()
    assert factories.row(engine, job_id).restarts == 0
    kinds = harness.kinds(database_url)
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
    config = dataclasses.replace(harness.config(tmp_path, 3.0), spark_master=master, lease_ttl=30.0)
    stepped = harness.stepped(engine, bucket, config, tmp_path)
    the_runner = next(stepped)
    try:
        job_id = harness.batch_job(engine, bucket, stage, tmp_path)
        the_runner.poll_once()  # claims; the driver starts in a task
        waiting.wait_until(
            lambda: harness.started(stage) and factories.row(engine, job_id).state == "running",
            harness.SPARK_START_S,
            message="the driver did not start",
        )
        if not master_back:
            listener.close()
        harness.go(stage, "1")
        run_dir = rundir.run_dir(tmp_path / "work", job_id, 1)
        waiting.wait_until(
            lambda: (run_dir / "result.json").exists(), harness.SPARK_START_S, message="no exit"
        )
        result = json.loads((run_dir / "result.json").read_text())
    finally:
        listener.close()
        next(stepped, None)
    assert result["recorded"] is True, result
    now = factories.row(engine, job_id)
    last = harness.events(database_url)[-1]
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
    job_id = harness.batch_job(engine, bucket, stage, tmp_path)
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, stepped_runner.owner, harness.TTL)
    run = runs.Run(
        job_id=job_id,
        name="b",
        kind="batch",
        epoch=claim.epoch,
        attempt=claim.attempt,
        claimed_at=watchdog.lease_clock(),
        deadline=watchdog.lease_clock() + harness.TTL,
        owner=stepped_runner.owner,
        master=f"spark://127.0.0.1:{port}",
    )
    log = rundir.run_dir(tmp_path / "work", job_id, claim.epoch) / rundir.LOG_FILE
    log.parent.mkdir(parents=True)
    sample = (Path(__file__).parents[1] / "data" / "spark_driver_no_master.log").read_text()
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
    last = harness.events(database_url)[-1]
    if master_up:
        assert (now.state, last["kind"]) == ("failed", "failed"), now
        assert now.last_error.startswith("driver exited with exit code 1: SparkException: ")
        return
    assert (now.state, now.restarts, last["kind"]) == ("backoff", 0, "deferred"), now
    assert last["detail"]["cause"] == "spark-master-unreachable", last
