"""Operator commands on the real PostgreSQL: idempotent, race-safe, clear errors."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from scheduler import distribution, jobs
from scheduler.states import JobKind, RunState
from tests import factories
from tests.factories import owner


def _do(engine: sa.Engine, command, name: str):
    with engine.begin() as conn:
        return command(conn, name)


def test_duplicate_concurrent_starts_make_one_generation(engine: sa.Engine) -> None:
    factories.job(engine, "etl", start=False)
    barrier = threading.Barrier(6)
    outcomes: list[str] = []

    def click() -> None:
        barrier.wait()
        outcomes.append(_do(engine, jobs.start, "etl"))

    threads = [threading.Thread(target=click) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["already running"] * 5 + ["started"]
    with engine.connect() as conn:
        shown = jobs.show(conn, "etl")
    assert (shown["desired"], shown["state"], shown["generation"]) == ("running", "pending", 1)


def test_stop_without_owner_is_immediate_and_idempotent(engine: sa.Engine) -> None:
    factories.job(engine, "etl")
    assert _do(engine, jobs.stop, "etl") == "stopped"
    assert _do(engine, jobs.stop, "etl") == "already stopped"
    with engine.connect() as conn:
        assert jobs.show(conn, "etl")["state"] == "stopped"


def test_stop_with_owner_leaves_the_driver_to_its_owner(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "etl")
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        distribution.claim(conn, job_id, owner("s1"), 10)
    assert _do(engine, jobs.stop, "etl") == "stopping"
    row = factories.row(engine, job_id)
    assert (row.owner, row.state) == ("s1", "starting")


def test_stop_of_a_failed_job_says_that_nothing_runs(engine: sa.Engine) -> None:
    """A failed (or finished) job has no driver to stop: the command says so instead of
    "stopping", which promised a `stopped` the job never reaches (issue 15)."""
    job_id = factories.job(engine, "b", kind=JobKind.BATCH)
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, owner("s1"), 10)
        distribution.mark_running(conn, job_id, owner("s1"), claim.epoch, pid=1)
        distribution.record_crash(
            conn, job_id, owner("s1"), claim.epoch, "exit 1", retry=False,
            backoff_base=0.5, backoff_max=2,
        )  # fmt: skip
    assert _do(engine, jobs.stop, "b") == "stopped (failed: no driver runs)"
    assert _do(engine, jobs.stop, "b") == "already stopped"
    with engine.connect() as conn:
        shown = jobs.show(conn, "b")
    assert (shown["desired"], shown["state"], shown["owner"]) == ("stopped", "failed", None)


def test_start_reruns_a_finished_job_with_a_new_generation(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "b", kind=JobKind.BATCH)
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, owner("s1"), 10)
        distribution.mark_running(conn, job_id, owner("s1"), claim.epoch, pid=1)
        distribution.finish(conn, job_id, owner("s1"), claim.epoch)
    assert _do(engine, jobs.start, "b") == "started"
    with engine.connect() as conn:
        shown = jobs.show(conn, "b")
    assert (shown["state"], shown["generation"]) == ("pending", 2)


def test_restart_of_an_owned_job_bumps_the_generation(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "s")
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        distribution.claim(conn, job_id, owner("s1"), 10)
    assert _do(engine, jobs.restart, "s") == "restarting"
    with engine.connect() as conn:
        (row,) = distribution.poll(conn, owner("s1"))
    assert row.job_generation == row.generation + 1


def test_delete_refuses_a_running_job_and_keeps_events(engine: sa.Engine) -> None:
    factories.job(engine, "etl")
    with pytest.raises(jobs.JobError, match="stop it first"):
        _do(engine, jobs.delete, "etl")
    _do(engine, jobs.stop, "etl")
    _do(engine, jobs.delete, "etl")
    with engine.connect() as conn:
        kinds = [e["kind"] for e in jobs.events(conn, "etl")]
        with pytest.raises(jobs.JobError, match="no job named 'etl'"):
            jobs.show(conn, "etl")
    assert kinds == ["created", "start_requested", "stop_requested", "deleted"]


def test_bad_input_is_refused_clearly(engine: sa.Engine) -> None:
    with pytest.raises(jobs.JobError, match="is not KEY=VALUE"):
        jobs.parse_conf(["spark.x=1", "oops"])
    assert jobs.parse_conf(["a=b=c"]) == {"a": "b=c"}
    factories.job(engine, "etl", start=False)
    with engine.begin() as conn:
        rid = factories.resource(conn)
        with pytest.raises(jobs.JobError, match="already exists"):
            jobs.create(conn, jobs.JobSpec("etl", JobKind.BATCH, rid))
        with pytest.raises(jobs.JobError, match="job name"):
            jobs.create(conn, jobs.JobSpec("../etc", JobKind.BATCH, rid))
    with pytest.raises(jobs.JobError, match="no job named 'nope'"):
        _do(engine, jobs.start, "nope")


def test_show_carries_the_public_fields(engine: sa.Engine) -> None:
    factories.job(engine, "etl")
    with engine.connect() as conn:
        shown = jobs.show(conn, "etl")
    for key in (
        "name kind desired state owner target epoch attempt restarts resource "
        "started_at updated_at last_error"
    ).split():
        assert key in shown
    assert set(shown["resource"]) >= {"name", "version", "sha256"}
    assert shown["state"] == RunState.PENDING


def test_the_restart_budget_is_per_kind_and_max_retries_is_its_batch_name() -> None:
    assert jobs.restart_budget(JobKind.STREAMING) == 3
    assert jobs.restart_budget(JobKind.BATCH) == 0
    assert jobs.restart_budget(JobKind.BATCH, max_retries=2) == 2
    assert jobs.restart_budget("batch", max_restarts=5) == 5  # one column, both names
    assert jobs.restart_budget(JobKind.STREAMING, max_restarts=0) == 0
    for kind, restarts, retries, message in [
        (JobKind.STREAMING, None, 1, "--max-retries is for batch jobs"),
        (JobKind.BATCH, 1, 1, "not both"),
        (JobKind.BATCH, None, -1, "--max-retries must be 0 or more"),
        (JobKind.STREAMING, -2, None, "--max-restarts must be 0 or more"),
    ]:
        with pytest.raises(jobs.JobError, match=message):
            jobs.restart_budget(kind, restarts, retries)


def test_a_batch_job_created_without_a_budget_retries_nothing(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        resource = factories.resource(conn)
        jobs.create(conn, jobs.JobSpec(name="b", kind=JobKind.BATCH, resource_id=resource))
        jobs.create(conn, jobs.JobSpec(name="s", kind=JobKind.STREAMING, resource_id=resource))
        assert jobs.show(conn, "b")["max_restarts"] == 0
        assert jobs.show(conn, "s")["max_restarts"] == 3
