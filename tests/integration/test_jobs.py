"""Operator commands on the real PostgreSQL: idempotent, race-safe, clear errors."""

from __future__ import annotations

import re
import threading

import pytest
import sqlalchemy as sa

from scheduler import distribution, job_events, job_spec, job_views, jobs
from sql.states import JobKind, RunState
from testing import factories
from testing.factories import owner


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
        shown = job_views.show(conn, "etl").as_json()
    assert (shown["desired"], shown["state"], shown["generation"]) == ("running", "pending", 1)


def test_stop_without_owner_is_immediate_and_idempotent(engine: sa.Engine) -> None:
    factories.job(engine, "etl")
    assert _do(engine, jobs.stop, "etl") == "stopped"
    assert _do(engine, jobs.stop, "etl") == "already stopped"
    with engine.connect() as conn:
        assert job_views.show(conn, "etl").as_json()["state"] == "stopped"


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
        shown = job_views.show(conn, "b").as_json()
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
        shown = job_views.show(conn, "b").as_json()
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


def _running_on_s1(engine: sa.Engine, name: str, max_restarts: int = 3) -> tuple[int, int]:
    """A streaming job running on s1 (claimed, driver started): (job id, epoch)."""
    job_id = factories.job(engine, name, max_restarts=max_restarts)
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, owner("s1"), 60)
        distribution.mark_running(conn, job_id, owner("s1"), claim.epoch, pid=1)
    return job_id, claim.epoch


def _restart_run(engine: sa.Engine, job_id: int, epoch: int, who: str = "s1") -> jobs.RunRestarted:
    with engine.begin() as conn:
        return jobs.restart_run(conn, job_id, owner(who), epoch, "stalled")


def test_a_run_restarted_by_its_owner_gets_one_new_generation_and_spends_a_restart(
    engine: sa.Engine,
) -> None:
    job_id, epoch = _running_on_s1(engine, "s")
    done = _restart_run(engine, job_id, epoch)
    assert (done.name, done.generation, done.restarts, done.max_restarts) == ("s", 2, 1, 3)
    # Asked again (a retry after a commit whose outcome was lost): the generation moved
    # past the run's, so nothing happens.
    with pytest.raises(distribution.FencedError, match="generation 1 of 2"):
        _restart_run(engine, job_id, epoch)
    with engine.connect() as conn:
        shown = job_views.show(conn, "s").as_json()
        events = job_events.events(conn, "s")
    assert (shown["generation"], shown["restarts"], shown["owner"]) == (2, 1, "s1")
    restarts = [e for e in events if e["kind"] == "restart_requested"]
    assert len(restarts) == 1
    assert (restarts[0]["server"], restarts[0]["epoch"]) == ("s1", epoch)
    assert restarts[0]["detail"] == {
        "generation": 2,
        "restarts": 1,
        "max_restarts": 3,
        "by": "stalled",
    }


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ("owner = 's2', owner_incarnation = 's2-incarnation', epoch = epoch + 1", "s2 at epoch 2"),
        ("epoch = epoch + 1", "s1 at epoch 2"),  # claimed again here
        ("owner_incarnation = 'a-later-one'", "s1 at epoch 1"),
        ("lease_until = now() - interval '1 second'", "expired or none"),
        ("state = 'stopping'", "s1 at epoch 1 (stopping"),
    ],
)
def test_a_run_restart_is_fenced_by_owner_incarnation_epoch_and_a_live_lease(
    engine: sa.Engine, change: str, names: str
) -> None:
    job_id, epoch = _running_on_s1(engine, "s")
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE distribution SET {change} WHERE job_id = :j"), {"j": job_id})
    before = factories.row(engine, job_id)
    with pytest.raises(distribution.FencedError, match=re.escape(names)):
        _restart_run(engine, job_id, epoch)
    with engine.connect() as conn:
        shown = job_views.show(conn, "s").as_json()
        kinds = [e["kind"] for e in job_events.events(conn, "s")]
    assert (shown["generation"], shown["restarts"]) == (1, before.restarts)
    assert "restart_requested" not in kinds


def test_a_run_restart_waits_for_nothing_the_operator_asked(engine: sa.Engine) -> None:
    """A stop or restart asked meanwhile wins: the run is not restarted on top of it."""
    job_id, epoch = _running_on_s1(engine, "s")
    assert _do(engine, jobs.restart, "s") == "restarting"
    with pytest.raises(distribution.FencedError, match="generation 1 of 2"):
        _restart_run(engine, job_id, epoch)
    assert _do(engine, jobs.stop, "s") == "stopping"
    with pytest.raises(distribution.FencedError, match="desired stopped"):
        _restart_run(engine, job_id, epoch)
    with engine.connect() as conn:
        assert job_views.show(conn, "s").as_json()["generation"] == 2


def test_a_run_restart_waiting_behind_a_stop_sees_the_stop(engine: sa.Engine) -> None:
    """The run restart locks the job row first: one that waits behind an operator's
    uncommitted stop checks its guard again on the committed row (no restart)."""
    job_id, epoch = _running_on_s1(engine, "s")
    outcome: list[object] = []

    def restart_run() -> None:
        try:
            outcome.append(_restart_run(engine, job_id, epoch))
        except Exception as exc:
            outcome.append(exc)

    with engine.connect() as operator:
        with operator.begin():
            assert jobs.stop(operator, "s") == "stopping"
            waiter = threading.Thread(target=restart_run)
            waiter.start()
            waiter.join(0.5)
            assert waiter.is_alive() and not outcome  # waiting for the job row
        waiter.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], distribution.FencedError), outcome
    with engine.connect() as conn:
        shown = job_views.show(conn, "s").as_json()
    assert (shown["desired"], shown["generation"], shown["restarts"]) == ("stopped", 1, 0)


def test_run_restarts_share_the_crash_budget(engine: sa.Engine) -> None:
    job_id, epoch = _running_on_s1(engine, "s", max_restarts=1)
    _restart_run(engine, job_id, epoch)
    # The owner stops the old generation and the job is claimed again.
    with engine.begin() as conn:
        distribution.begin_stop(conn, job_id, owner("s1"), epoch, "restart")
        distribution.release(conn, job_id, owner("s1"), epoch)
        claim = distribution.claim(conn, job_id, owner("s1"), 60)
        distribution.mark_running(conn, job_id, owner("s1"), claim.epoch, pid=2)
    with pytest.raises(job_spec.RestartBudgetSpent, match="1 of 1 restarts"):
        _restart_run(engine, job_id, claim.epoch)
    assert factories.row(engine, job_id).state == "running"  # refused: left running
    # A crash now finds the budget spent too: failed, not backoff.
    with engine.begin() as conn:
        state = distribution.record_crash(
            conn, job_id, owner("s1"), claim.epoch, "exit 1", retry=True,
            backoff_base=0.5, backoff_max=2,
        )  # fmt: skip
    assert state == RunState.FAILED


def test_a_stopped_job_is_never_restarted_by_a_run_restart(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "idle", start=False)
    with pytest.raises(distribution.FencedError):
        _restart_run(engine, job_id, 0)
    with pytest.raises(job_spec.JobNotFound):
        _restart_run(engine, 424242, 1)


def test_delete_refuses_a_running_job_and_keeps_events(engine: sa.Engine) -> None:
    factories.job(engine, "etl")
    with pytest.raises(job_spec.JobError, match="stop it first"):
        _do(engine, jobs.delete, "etl")
    _do(engine, jobs.stop, "etl")
    _do(engine, jobs.delete, "etl")
    with engine.connect() as conn:
        kinds = [e["kind"] for e in job_events.events(conn, "etl")]
        with pytest.raises(job_spec.JobError, match="no job named 'etl'"):
            job_views.show(conn, "etl").as_json()
    assert kinds == ["created", "start_requested", "stop_requested", "deleted"]


def test_bad_input_is_refused_clearly(engine: sa.Engine) -> None:
    with pytest.raises(job_spec.JobError, match="is not KEY=VALUE"):
        job_spec.parse_conf(["spark.x=1", "oops"])
    assert job_spec.parse_conf(["a=b=c"]) == {"a": "b=c"}
    factories.job(engine, "etl", start=False)
    with engine.begin() as conn:
        rid = factories.resource(conn)
        with pytest.raises(job_spec.JobError, match="already exists"):
            jobs.create(conn, job_spec.JobSpec("etl", JobKind.BATCH, rid))
        with pytest.raises(job_spec.JobError, match="job name"):
            jobs.create(conn, job_spec.JobSpec("../etc", JobKind.BATCH, rid))
    with pytest.raises(job_spec.JobError, match="no job named 'nope'"):
        _do(engine, jobs.start, "nope")


def test_show_carries_the_public_fields(engine: sa.Engine) -> None:
    factories.job(engine, "etl")
    with engine.connect() as conn:
        shown = job_views.show(conn, "etl").as_json()
    for key in (
        "name kind desired state owner target epoch attempt restarts resource "
        "started_at updated_at last_error"
    ).split():
        assert key in shown
    assert set(shown["resource"]) >= {"name", "version", "sha256"}
    assert shown["state"] == RunState.PENDING


def test_the_restart_budget_is_per_kind_and_max_retries_is_its_batch_name() -> None:
    assert job_spec.restart_budget(JobKind.STREAMING) == 3
    assert job_spec.restart_budget(JobKind.BATCH) == 0
    assert job_spec.restart_budget(JobKind.BATCH, max_retries=2) == 2
    assert job_spec.restart_budget("batch", max_restarts=5) == 5  # one column, both names
    assert job_spec.restart_budget(JobKind.STREAMING, max_restarts=0) == 0
    for kind, restarts, retries, message in [
        (JobKind.STREAMING, None, 1, "--max-retries is for batch jobs"),
        (JobKind.BATCH, 1, 1, "not both"),
        (JobKind.BATCH, None, -1, "--max-retries must be 0 or more"),
        (JobKind.STREAMING, -2, None, "--max-restarts must be 0 or more"),
    ]:
        with pytest.raises(job_spec.JobError, match=message):
            job_spec.restart_budget(kind, restarts, retries)


def test_a_batch_job_created_without_a_budget_retries_nothing(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        resource = factories.resource(conn)
        jobs.create(conn, job_spec.JobSpec(name="b", kind=JobKind.BATCH, resource_id=resource))
        jobs.create(conn, job_spec.JobSpec(name="s", kind=JobKind.STREAMING, resource_id=resource))
        assert job_views.show(conn, "b").as_json()["max_restarts"] == 0
        assert job_views.show(conn, "s").as_json()["max_restarts"] == 3
