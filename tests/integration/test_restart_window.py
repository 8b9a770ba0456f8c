"""The restart window on a real PostgreSQL (scheduler/distribution/ends.py IN_WINDOW): a
streaming job is FAILED only when more than ``max_restarts`` crashes fall inside one
window, by PostgreSQL's clock; crashes older than the window no longer count, and the
backoff starts again from its base with them."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from scheduler import distribution, job_revisions, job_spec, job_views, jobs
from sql.states import JobKind, RunState
from testing import factories
from testing.factories import owner


def _age_crashes(engine: sa.Engine, job_id: int, seconds: float) -> None:
    """Move every recorded crash ``seconds`` into the past (no sleeping)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE distribution SET crash_times = ARRAY(SELECT c - make_interval(secs => :s) "
                "FROM unnest(crash_times) AS c) WHERE job_id = :j"
            ),
            {"s": seconds, "j": job_id},
        )


def _backoff_s(engine: sa.Engine, job_id: int) -> float:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT EXTRACT(EPOCH FROM not_before - now()) FROM distribution WHERE job_id = :j"
            ),
            {"j": job_id},
        ).scalar_one()


def test_crashes_older_than_the_window_do_not_count(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "months", max_restarts=1, restart_window_s=600.0)
    factories.target(engine, job_id, "s1")
    assert factories.crash(engine, job_id) == RunState.BACKOFF
    _age_crashes(engine, job_id, 601)  # the first crash left the window
    assert factories.crash(engine, job_id) == RunState.BACKOFF, "an old crash spent the budget"
    assert 9 < _backoff_s(engine, job_id) <= 10, "the backoff did not start again"
    assert factories.crash(engine, job_id) == RunState.FAILED  # two inside one window: past 1
    row = factories.row(engine, job_id)
    assert row.restarts == 1 and len(row.crash_times) == 1


def test_without_a_window_every_crash_since_the_start_counts(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "strict", max_restarts=1, restart_window_s=0.0)
    factories.target(engine, job_id, "s1")
    assert factories.crash(engine, job_id) == RunState.BACKOFF
    _age_crashes(engine, job_id, 10 * 86400)
    assert factories.crash(engine, job_id) == RunState.FAILED


def test_a_start_clears_the_window(engine: sa.Engine) -> None:
    job_id = factories.job(engine, "again", max_restarts=1, restart_window_s=600.0)
    factories.target(engine, job_id, "s1")
    assert factories.crash(engine, job_id) == RunState.BACKOFF
    assert factories.crash(engine, job_id) == RunState.FAILED
    with engine.begin() as conn:
        jobs.start(conn, "again")
    row = factories.row(engine, job_id)
    assert (row.restarts, row.crash_times) == (0, [])
    assert factories.crash(engine, job_id) == RunState.BACKOFF


def test_a_window_is_refused_for_a_batch_job_and_a_negative_one_for_any(
    engine: sa.Engine,
) -> None:
    with pytest.raises(job_spec.JobError, match="--restart-window is for streaming jobs"):
        factories.job(engine, "nightly", kind=JobKind.BATCH, restart_window_s=60.0)
    with pytest.raises(job_spec.JobError, match="--restart-window must be 0 \\(none\\) to"):
        factories.job(engine, "neg", restart_window_s=-1.0)


def test_a_window_change_is_a_revision(engine: sa.Engine) -> None:
    factories.job(engine, "rev", start=False)
    with engine.begin() as conn:
        revised = job_revisions.update(conn, "rev", job_spec.Change(restart_window_s=86400.0))
        shown = job_views.show(conn, "rev").as_json()
    assert revised.changed == ("restart_window",)
    assert (shown["restart_window_s"], shown["crashes_in_window"]) == (86400.0, 0)


def test_a_stall_restart_spends_from_the_same_window(engine: sa.Engine) -> None:
    """Restart-on-stall (jobs.restart_run) spends the budget crashes spend: with
    max_restarts 1 a second stall restart inside the window is refused, and allowed
    once the first has left the window."""
    job_id = factories.job(engine, "stally", max_restarts=1, restart_window_s=600.0)
    factories.target(engine, job_id, "s1")

    def running_epoch() -> int:
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE distribution SET not_before = NULL WHERE job_id = :j"),
                {"j": job_id},
            )
            row = factories.row(engine, job_id)
            if row.owner is not None:  # the restart's stop: released by the owner
                distribution.release(conn, job_id, owner("s1"), row.epoch)
            claim = distribution.claim(conn, job_id, owner("s1"), ttl=30.0)
            distribution.mark_running(conn, job_id, owner("s1"), claim.epoch, pid=1)
            return claim.epoch

    def restart(epoch: int) -> jobs.RunRestarted:
        with engine.begin() as conn:
            return jobs.restart_run(conn, job_id, owner("s1"), epoch, "stalled")

    assert restart(running_epoch()).restarts == 1
    epoch = running_epoch()
    with pytest.raises(job_spec.RestartBudgetSpent, match="1 of 1"):
        restart(epoch)
    _age_crashes(engine, job_id, 601)
    assert restart(epoch).restarts == 1  # the old one no longer counts
