"""Updates that roll themselves back (scheduler/auto_rollback.py): the pure decision,
then the watch on a real PostgreSQL: started by an update of a job whose setting is on,
ended healthy, or rolled back (crashed, stalled, not healthy by its deadline) with the
same fenced roll as ``job rollback``, once, by whichever server looks first."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

from scheduler import (
    auto_rollback,
    distribution,
    job_events,
    job_revisions,
    job_spec,
    job_views,
    jobs,
    run_health,
)
from sql.states import JobKind
from testing import factories, waiting
from testing.factories import owner

A = auto_rollback
V = A.Verdict

WATCHING = A.Facts(
    kind="streaming",
    desired="running",
    revision=2,
    watched=2,
    healthy_within_s=300.0,
    past_deadline=False,
    crashed=False,
    stalled=False,
    running=True,
    batch_done=False,
)


def facts(**changes: object) -> A.Facts:
    return dataclasses.replace(WATCHING, **changes)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the pure decision


def test_before_the_deadline_a_run_without_trouble_is_still_watched() -> None:
    assert A.decide(facts()).verdict is V.WATCH
    assert A.decide(facts(running=False)).verdict is V.WATCH  # still starting
    assert A.decide(facts(batch_done=True)).verdict is V.WATCH  # up, but not yet for D


def test_a_crash_of_the_new_revision_rolls_back_at_once() -> None:
    decision = A.decide(facts(crashed=True, running=False))
    assert (decision.verdict, decision.cause) == (V.ROLL_BACK, A.Cause.CRASHED)


def test_a_stall_of_the_new_revision_rolls_back_at_once() -> None:
    decision = A.decide(facts(stalled=True, batch_done=True))
    assert (decision.verdict, decision.cause) == (V.ROLL_BACK, A.Cause.STALLED)


def test_at_the_deadline_a_running_streaming_run_with_a_batch_is_healthy() -> None:
    assert A.decide(facts(past_deadline=True, batch_done=True)).verdict is V.HEALTHY


@pytest.mark.parametrize(
    "changes",
    [
        {"batch_done": False},  # up, but no micro-batch completed
        {"running": False},  # not (or no longer) running
        {"running": False, "batch_done": True},
    ],
)
def test_at_the_deadline_anything_less_is_not_healthy(changes: dict[str, bool]) -> None:
    decision = A.decide(facts(past_deadline=True, **changes))
    assert (decision.verdict, decision.cause) == (V.ROLL_BACK, A.Cause.UNHEALTHY)
    assert decision.reason == "not healthy within 5m"


def test_a_watch_ends_unjudged_when_the_revision_moved_on_or_the_job_was_stopped() -> None:
    # A newer update or rollback (by hand, or by another server's verdict) won.
    assert A.decide(facts(revision=3, crashed=True)).verdict is V.ABANDON
    assert A.decide(facts(desired="stopped", crashed=True)).verdict is V.ABANDON


def test_crash_and_stall_win_over_a_deadline_passed() -> None:
    decision = A.decide(facts(past_deadline=True, crashed=True, batch_done=True))
    assert decision.cause is A.Cause.CRASHED


# ---------------------------------------------------------------- on PostgreSQL

S1 = owner("s1")


def _streaming(engine: sa.Engine, name: str = "stream", **spec: object) -> int:
    """A streaming job with revisions 1 (app v1), started and running on s1."""
    with engine.begin() as conn:
        job_id = jobs.create(
            conn,
            job_spec.JobSpec(
                name=name,
                kind=JobKind.STREAMING,
                resource_id=factories.resource(conn, "app"),
                **spec,  # type: ignore[arg-type]
            ),
        )
        jobs.start(conn, name)
    factories.target(engine, job_id, "s1")
    _run(engine, job_id)
    return job_id


def _run(engine: sa.Engine, job_id: int) -> int:
    """Claim and mark running on s1; the epoch."""
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE distribution SET not_before = NULL WHERE job_id = :j"), {"j": job_id}
        )
        claim = distribution.claim(conn, job_id, S1, ttl=30.0)
        distribution.mark_running(conn, job_id, S1, claim.epoch, pid=1)
    return claim.epoch


def _roll(engine: sa.Engine, job_id: int, epoch: int) -> int:
    """The owner stops the old run and claims the new generation; the new epoch."""
    with engine.begin() as conn:
        distribution.begin_stop(conn, job_id, S1, epoch, "rolling")
        distribution.release(conn, job_id, S1, epoch)
    return _run(engine, job_id)


def _update(engine: sa.Engine, name: str = "stream", **settings: object) -> job_revisions.Revised:
    with engine.begin() as conn:
        v2 = factories.resource(conn, "app", content=b"raise SystemExit(3)\n")
        return job_revisions.update(conn, name, job_spec.Change(resource_id=v2), **settings)  # type: ignore[arg-type]


def _check(engine: sa.Engine) -> list[A.Applied]:
    with engine.connect() as conn:
        return A.check_all(conn.engine, server="s9")


def _watch(engine: sa.Engine, name: str = "stream") -> dict[str, object] | None:
    with engine.connect() as conn:
        return job_views.show(conn, name).as_json()["auto_rollback"]["watch"]


def _kinds(engine: sa.Engine, name: str = "stream") -> list[str]:
    with engine.connect() as conn:
        return [e["kind"] for e in job_events.events(conn, name)]


def _rolled_back(engine: sa.Engine, name: str = "stream") -> list[dict[str, object]]:
    with engine.connect() as conn:
        return [e["detail"] for e in job_events.events(conn, name) if e["kind"] == "rolled_back"]


def _pass_deadline(engine: sa.Engine, job_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE jobs SET watch_until = now() - interval '1 second' WHERE id = :j"),
            {"j": job_id},
        )


def _batch(engine: sa.Engine, job_id: int, epoch: int, flag: str | None = None) -> None:
    with engine.begin() as conn:
        run_health.record(
            conn,
            run_health.Report(
                job_id=job_id, epoch=epoch, server="s1", app_state="running",
                last_batch_id=7, flag=flag,
                flagged_at=None if flag is None else sa.func.now(),  # type: ignore[arg-type]
            ),
        )  # fmt: skip


def test_an_update_with_auto_rollback_is_watched_until_its_deadline(engine: sa.Engine) -> None:
    job_id = _streaming(engine)
    revised = _update(engine, auto_rollback=True, healthy_within_s=120.0)
    assert revised.revision == 2 and revised.watched_until is not None
    watch = _watch(engine)
    assert watch is not None and (watch["revision"], watch["fallback"]) == (2, 1)
    with engine.connect() as conn:
        setting = job_views.show(conn, "stream").as_json()["auto_rollback"]
    assert (setting["enabled"], setting["healthy_within_s"]) == (True, 120.0)
    assert _check(engine) == []  # nothing to decide yet
    assert _watch(engine) is not None
    assert job_id


def test_a_crash_of_the_new_revision_rolls_back_to_the_previous_one(engine: sa.Engine) -> None:
    job_id = _streaming(engine)
    epoch = factories.row(engine, job_id).epoch
    _update(engine, auto_rollback=True)
    new_epoch = _roll(engine, job_id, epoch)
    with engine.begin() as conn:
        distribution.record_crash(
            conn, job_id, S1, new_epoch, "exit 3: boom",
            retry=True, backoff_base=10, backoff_max=600,
        )  # fmt: skip
    applied = _check(engine)
    assert [(a.name, a.decision.cause) for a in applied] == [("stream", A.Cause.CRASHED)]
    with engine.connect() as conn:
        shown = job_views.show(conn, "stream").as_json()
        history = job_revisions.history(conn, "stream")
    assert shown["revision"] == 3 and history[-1]["rollback_of"] == 1
    assert history[-1]["created_by"] == "auto-rollback"
    assert shown["auto_rollback"]["watch"] is None, "the rollback itself is never watched"
    assert _rolled_back(engine) == [
        {"cause": "crashed", "reason": "crashed", "revision": 2, "to": 1, "as_revision": 3,
         "by": "auto-rollback"},
    ]  # fmt: skip
    assert _kinds(engine)[-2:] == ["revised", "rolled_back"]
    # Nothing left to judge: a second look (another server) does nothing.
    assert _check(engine) == []
    assert len(_rolled_back(engine)) == 1


def test_a_crash_of_the_old_revisions_run_while_it_stops_does_not_count(
    engine: sa.Engine,
) -> None:
    job_id = _streaming(engine)
    epoch = factories.row(engine, job_id).epoch
    _update(engine, auto_rollback=True)
    with engine.begin() as conn:
        distribution.begin_stop(conn, job_id, S1, epoch, "rolling")
        distribution.record_crash(
            conn, job_id, S1, epoch, "exit 1 while stopping",
            retry=True, backoff_base=10, backoff_max=600,
        )  # fmt: skip
    assert _check(engine) == []
    assert _watch(engine) is not None


def test_a_stall_of_the_new_revision_rolls_back(engine: sa.Engine) -> None:
    job_id = _streaming(engine)
    epoch = factories.row(engine, job_id).epoch
    _update(engine, auto_rollback=True)
    new_epoch = _roll(engine, job_id, epoch)
    _batch(engine, job_id, new_epoch, flag="stalled")
    [applied] = _check(engine)
    assert applied.decision.cause is A.Cause.STALLED
    assert _rolled_back(engine)[0]["reason"] == "stalled"


def test_a_stall_flag_of_the_old_run_does_not_count(engine: sa.Engine) -> None:
    job_id = _streaming(engine)
    epoch = factories.row(engine, job_id).epoch
    _batch(engine, job_id, epoch, flag="stalled")
    _update(engine, auto_rollback=True)
    assert _check(engine) == []


def test_not_healthy_by_the_deadline_rolls_back(engine: sa.Engine) -> None:
    job_id = _streaming(engine)
    epoch = factories.row(engine, job_id).epoch
    _update(engine, auto_rollback=True, healthy_within_s=60.0)
    _roll(engine, job_id, epoch)  # running, but no micro-batch completed
    _pass_deadline(engine, job_id)
    [applied] = _check(engine)
    assert applied.decision.cause is A.Cause.UNHEALTHY
    assert _rolled_back(engine)[0]["reason"] == "not healthy within 1m"
    with engine.connect() as conn:
        assert (
            job_views.show(conn, "stream").as_json()["generation"] == 3
        )  # update roll + rollback roll


def test_a_healthy_revision_ends_the_watch_and_stays(engine: sa.Engine) -> None:
    job_id = _streaming(engine)
    epoch = factories.row(engine, job_id).epoch
    _update(engine, auto_rollback=True)
    new_epoch = _roll(engine, job_id, epoch)
    _batch(engine, job_id, new_epoch)
    assert _check(engine) == []  # healthy so far, but not up for the deadline yet
    _pass_deadline(engine, job_id)
    [applied] = _check(engine)
    assert applied.decision.verdict is V.HEALTHY
    assert _watch(engine) is None
    assert "rolled_back" not in _kinds(engine)
    with engine.connect() as conn:
        assert job_views.show(conn, "stream").as_json()["revision"] == 2


def test_the_jobs_setting_watches_every_later_update_until_turned_off(
    engine: sa.Engine,
) -> None:
    _streaming(engine, auto_rollback=True, healthy_within_s=90.0)
    revised = _update(engine)
    assert revised.watched_until is not None
    revised = _update(engine, auto_rollback=False)
    assert revised.watched_until is None and _watch(engine) is None


def test_turning_the_setting_on_alone_makes_no_revision(engine: sa.Engine) -> None:
    _streaming(engine)
    with engine.begin() as conn:
        revised = job_revisions.update(conn, "stream", job_spec.Change(), auto_rollback=True)
        assert revised.effect is job_revisions.Effect.UNCHANGED
        assert job_views.show(conn, "stream").as_json()["auto_rollback"]["enabled"] is True


def test_an_update_by_hand_during_a_watch_ends_it_without_a_rollback(engine: sa.Engine) -> None:
    job_id = _streaming(engine)
    epoch = factories.row(engine, job_id).epoch
    _update(engine, auto_rollback=True)
    with engine.begin() as conn:
        job_revisions.rollback(conn, "stream")  # the operator was faster
    new_epoch = _roll(engine, job_id, epoch)
    with engine.begin() as conn:
        distribution.record_crash(
            conn, job_id, S1, new_epoch, "exit 3", retry=True, backoff_base=10, backoff_max=600
        )
    assert _check(engine) == []
    assert "rolled_back" not in _kinds(engine)


def test_a_job_failed_by_the_new_revision_is_rolled_back_and_runs_again(
    engine: sa.Engine,
) -> None:
    job_id = _streaming(engine, max_restarts=0)
    epoch = factories.row(engine, job_id).epoch
    _update(engine, auto_rollback=True)
    new_epoch = _roll(engine, job_id, epoch)
    with engine.begin() as conn:
        state = distribution.record_crash(
            conn, job_id, S1, new_epoch, "exit 3", retry=True, backoff_base=10, backoff_max=600
        )
    assert state == "failed"
    [applied] = _check(engine)
    assert applied.decision.cause is A.Cause.CRASHED
    row = factories.row(engine, job_id)
    assert row.state == "pending", "the rolled-back job was left FAILED"
    with engine.connect() as conn:
        started = [e for e in job_events.events(conn, "stream") if e["kind"] == "start_requested"]
    assert started[-1]["detail"]["by"] == "auto-rollback"  # a start, said so (S4)


def test_auto_rollback_is_refused_for_a_batch_job(engine: sa.Engine) -> None:
    with engine.begin() as conn, pytest.raises(job_spec.JobError, match="streaming"):
        jobs.create(
            conn,
            job_spec.JobSpec(
                name="nightly", kind=JobKind.BATCH, resource_id=factories.resource(conn),
                auto_rollback=True,
            ),
        )  # fmt: skip
    factories.job(engine, "nightly", kind=JobKind.BATCH)
    with engine.begin() as conn, pytest.raises(job_spec.JobError, match="streaming"):
        job_revisions.update(conn, "nightly", job_spec.Change(), auto_rollback=True)


@pytest.mark.parametrize("seconds", [0.0, -1.0, 8 * 86400.0])
def test_a_deadline_out_of_range_is_refused(engine: sa.Engine, seconds: float) -> None:
    _streaming(engine)
    with engine.begin() as conn, pytest.raises(job_spec.JobError, match="healthy-within"):
        job_revisions.update(
            conn, "stream", job_spec.Change(), auto_rollback=True, healthy_within_s=seconds
        )


def test_two_servers_deciding_at_once_roll_back_once(engine: sa.Engine) -> None:
    """The first holds the job row (FOR UPDATE); the second skips it, and finds nothing
    left to judge once the first committed."""
    job_id = _streaming(engine)
    epoch = factories.row(engine, job_id).epoch
    _update(engine, auto_rollback=True)
    new_epoch = _roll(engine, job_id, epoch)
    with engine.begin() as conn:
        distribution.record_crash(
            conn, job_id, S1, new_epoch, "exit 3", retry=True, backoff_base=10, backoff_max=600
        )
    with engine.begin() as first:
        assert A.check_one(first, job_id, server="s1") is not None
        with engine.begin() as second:
            assert A.check_one(second, job_id, server="s2") is None  # locked: skipped
    with engine.begin() as third:
        assert A.check_one(third, job_id, server="s3") is None  # nothing watched
    assert len(_rolled_back(engine)) == 1


def test_the_watch_loop_judges_on_its_own_and_stops_twice(engine: sa.Engine) -> None:
    job_id = _streaming(engine)
    epoch = factories.row(engine, job_id).epoch
    _update(engine, auto_rollback=True)
    new_epoch = _roll(engine, job_id, epoch)
    loop = A.WatchLoop(engine, "s1", interval=0.05)
    loop.start()
    try:
        with engine.begin() as conn:
            distribution.record_crash(
                conn, job_id, S1, new_epoch, "exit 3", retry=True, backoff_base=10, backoff_max=600
            )
        waiting.wait_until(lambda: _rolled_back(engine), 10, message="rolled back by the loop")
        assert loop.is_alive()
    finally:
        loop.stop()
        loop.stop()  # idempotent
    assert not loop.is_alive()
    assert len(_rolled_back(engine)) == 1


def test_past_the_deadline_a_deferred_run_of_the_new_revision_is_watched_longer() -> None:
    decision = A.decide(facts(past_deadline=True, running=False, deferred=True))
    assert decision.verdict is A.Verdict.EXTEND
    # A crash still wins; a run that is not deferred is judged at the deadline.
    assert A.decide(facts(past_deadline=True, deferred=True, crashed=True)).verdict is (
        A.Verdict.ROLL_BACK
    )


def test_an_outage_spanning_the_deadline_moves_it_instead_of_rolling_back(
    engine: sa.Engine,
) -> None:
    """The new revision's claim is deferred (no Spark master answers: no budget spent)
    past the deadline: the watch goes on, its deadline moved by healthy-within from now,
    and the revision is judged once it could run (here: healthy)."""
    job_id = _streaming(engine)
    epoch = factories.row(engine, job_id).epoch
    _update(engine, auto_rollback=True, healthy_within_s=60.0)
    with engine.begin() as conn:
        distribution.begin_stop(conn, job_id, S1, epoch, "rolling")
        distribution.release(conn, job_id, S1, epoch)
        claim = distribution.claim(conn, job_id, S1, ttl=30.0)
        distribution.defer(
            conn, job_id, S1, claim.epoch, "no Spark master answers", 5.0,
            cause="spark-master-unreachable",
        )  # fmt: skip
    _pass_deadline(engine, job_id)
    [applied] = _check(engine)
    assert applied.decision.verdict is A.Verdict.EXTEND
    assert _rolled_back(engine) == []
    with engine.connect() as conn:
        left = conn.execute(
            sa.text("SELECT extract(epoch FROM watch_until - now()) FROM jobs WHERE id = :j"),
            {"j": job_id},
        ).scalar_one()
    assert 50 < left <= 60
    new_epoch = _run(engine, job_id)  # the master is back: the new revision runs
    _batch(engine, job_id, new_epoch)
    _pass_deadline(engine, job_id)
    [judged] = _check(engine)
    assert judged.decision.verdict is A.Verdict.HEALTHY and _rolled_back(engine) == []
