"""Firing schedules on a real PostgreSQL: each fire time handled exactly once, and each
run's row following its job's distribution row (scheduler/fires.py, scheduler/runs.py)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from scheduler import (
    alerts,
    distribution,
    fires,
    job_revisions,
    job_spec,
    job_views,
    jobs,
    runs,
    schedule,
)
from server import retention
from sql import tables
from sql.states import JobKind
from testing import factories, waiting

OWNER = distribution.Owner("s1", "inc-1")


def _checked_until(engine: sa.Engine, job_id: int, until_sql: str, **params: object) -> None:
    """Make the job's schedule checked only until ``until_sql`` (an SQL expression, with
    ``params``) and due now: the fire times after it are due (no sleeping)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"UPDATE jobs SET fires_checked_until = {until_sql}, "
                "next_fire_at = now() - interval '1 microsecond' WHERE id = :j"
            ),
            {**params, "j": job_id},
        )


def _due(engine: sa.Engine, job_id: int, seconds_ago: float) -> None:
    """Make the job's schedule checked only until ``seconds_ago``."""
    _checked_until(engine, job_id, "now() - make_interval(secs => :s)", s=seconds_ago)


def _due_once(engine: sa.Engine, job_id: int) -> None:
    """Make exactly one fire time of an ``@hourly`` job due (the last full hour): a
    window of 61 s of ``@every 1m`` holds two fire times when the test's statements take
    a second or more on a loaded machine (or now is within a second of a minute), and
    the older one is a recorded misfire."""
    _checked_until(engine, job_id, "date_trunc('hour', now()) - interval '1 second'")


def _fire(engine: sa.Engine) -> fires.Fired | None:
    with engine.begin() as conn:
        return fires.fire_one(conn, "s1")


def _runs(engine: sa.Engine, job_id: int) -> list[dict]:
    with engine.connect() as conn:
        return list(reversed(runs.list_runs(conn, job_id, limit=1000)))


def _state(engine: sa.Engine, job_id: int) -> str:
    return factories.row(engine, job_id).state


def test_start_switches_the_schedule_on_and_runs_nothing_yet(engine: sa.Engine) -> None:
    job_id = factories.scheduled_job(engine)
    with engine.connect() as conn:
        shown = job_views.show(conn, "nightly").as_json()
    assert shown["schedule"]["active"] is True
    assert shown["schedule"]["next_fire"].endswith(":00Z")
    assert _state(engine, job_id) == "stopped"
    assert _fire(engine) is None  # not due yet
    assert _runs(engine, job_id) == []


def test_a_due_fire_makes_the_job_pending_with_its_run_row_once(engine: sa.Engine) -> None:
    job_id = factories.scheduled_job(engine, spec="@hourly")
    _due_once(engine, job_id)
    fired = _fire(engine)
    assert fired is not None and fired.run_id is not None
    assert _state(engine, job_id) == "pending"
    (run,) = _runs(engine, job_id)
    assert run["trigger"] == "schedule" and run["state"] == "pending"
    assert run["scheduled_time"] == schedule.iso(fired.scheduled_time)
    assert _fire(engine) is None  # handled: not due again


def test_two_firers_racing_fire_once(engine: sa.Engine) -> None:
    job_id = factories.scheduled_job(engine, spec="@hourly")
    _due_once(engine, job_id)
    first = engine.connect()
    transaction = first.begin()
    try:
        assert fires.fire_one(first, "s1") is not None  # holds the job row
        assert _fire(engine) is None  # the other firer skips the locked row
        transaction.commit()
    finally:
        first.close()
    assert _fire(engine) is None  # and once committed, nothing is due
    assert [r["trigger"] for r in _runs(engine, job_id)] == ["schedule"]


def test_a_fire_already_recorded_rolls_the_whole_fire_back(engine: sa.Engine) -> None:
    job_id = factories.scheduled_job(engine, spec="@every 1s")
    _due(engine, job_id, 0.5)
    with engine.begin() as conn:
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        at = now.replace(microsecond=0)
        runs.record_skipped(conn, job_id, at, "recorded by another firer")
        conn.execute(
            sa.text("UPDATE jobs SET fires_checked_until = :t - interval '1 ms' WHERE id = :j"),
            {"t": at, "j": job_id},
        )
    with pytest.raises(runs.RunConflict):
        _fire(engine)
    assert _state(engine, job_id) == "stopped"  # the job was not made pending
    assert len(_runs(engine, job_id)) == 1


def test_a_fire_whose_commit_connection_drops_is_fired_once_by_the_next_pass(
    engine: sa.Engine,
) -> None:
    job_id = factories.scheduled_job(engine, spec="@hourly")
    _due_once(engine, job_id)
    conn = engine.connect()
    transaction = conn.begin()
    pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    assert fires.fire_one(conn, "s1") is not None
    with engine.connect() as killer:
        killer.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    with pytest.raises(DBAPIError):
        transaction.commit()
    # The killed connection never goes back to the pool: when the kill lands while the
    # COMMIT is in flight, psycopg's error is not always read as a disconnect, and the
    # next checkout's ping then failed on it ("connection in transaction status ACTIVE").
    conn.invalidate()
    conn.close()
    assert _runs(engine, job_id) == []  # nothing of the lost commit
    fired = _fire(engine)
    assert fired is not None and fired.run_id is not None
    assert len(_runs(engine, job_id)) == 1
    assert _fire(engine) is None


def test_a_run_row_follows_claim_start_crash_retry_and_finish(engine: sa.Engine) -> None:
    job_id = factories.scheduled_job(engine, spec="@hourly")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET max_restarts = 1 WHERE id = :j"), {"j": job_id})
    _due_once(engine, job_id)
    _fire(engine)
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, OWNER, ttl=30)
    (run,) = _runs(engine, job_id)
    assert (run["state"], run["attempts"], run["server"], run["epoch"]) == (
        "starting",
        1,
        "s1",
        claim.epoch,
    )
    assert run["started_at"] is not None
    with engine.begin() as conn:
        distribution.mark_running(conn, job_id, OWNER, claim.epoch, pid=1)
        distribution.record_crash(
            conn,
            job_id,
            OWNER,
            claim.epoch,
            "driver exited with exit code 3: ValueError: bad",
            retry=True,
            backoff_base=0,
            backoff_max=0,
        )
    (run,) = _runs(engine, job_id)
    assert (run["state"], run["exit_code"]) == ("retrying", 3)
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, OWNER, ttl=30)
        distribution.mark_running(conn, job_id, OWNER, claim.epoch, pid=2)
        distribution.finish(conn, job_id, OWNER, claim.epoch)
    (run,) = _runs(engine, job_id)
    assert (run["state"], run["exit_code"], run["attempts"]) == ("finished", 0, 2)
    assert run["ended_at"] is not None and run["epoch"] == claim.epoch


def test_a_run_that_fails_for_good_keeps_its_exit_code(engine: sa.Engine) -> None:
    job_id = factories.scheduled_job(engine, spec="@hourly")
    _due_once(engine, job_id)
    _fire(engine)
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, OWNER, ttl=30)
        distribution.record_crash(
            conn,
            job_id,
            OWNER,
            claim.epoch,
            "driver exited with exit code 7: boom",
            retry=True,
            backoff_base=0,
            backoff_max=0,
        )
    (run,) = _runs(engine, job_id)
    assert (run["state"], run["exit_code"]) == ("failed", 7)
    with engine.connect() as conn:
        assert job_views.show(conn, "nightly").as_json()["last_run"]["state"] == "failed"


def test_forbid_records_a_fire_skipped_while_the_previous_run_runs(engine: sa.Engine) -> None:
    job_id = factories.scheduled_job(engine, spec="@hourly")
    with engine.begin() as conn:
        jobs.run_now(conn, "nightly")  # the previous run, still pending
    _due_once(engine, job_id)
    fired = _fire(engine)
    assert fired is not None and fired.run_id is None and fired.skipped == 1
    first, second = _runs(engine, job_id)
    assert (first["state"], first["trigger"]) == ("pending", "manual")
    assert (second["state"], second["reason"]) == ("skipped", "previous run still running")


def test_a_run_ended_by_a_transaction_begun_before_a_skipping_fire_ends_after_it(
    engine: sa.Engine,
) -> None:
    """A run's ``ended_at`` is when its end was written, not when the writing
    transaction began. A watchdog's or an owner's transaction that began before a fire
    time and recorded the end after a fire skipped for it ("previous run still
    running") used to stamp the run ended *before* the fire: the S6 checker then saw a
    fire skipped while no run ran (CI, 2026-11-26, a coordinator kill under load)."""
    job_id = factories.scheduled_job(engine, spec="@every 1s")
    with engine.begin() as conn:
        jobs.run_now(conn, "nightly")
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, OWNER, ttl=30)
        distribution.mark_running(conn, job_id, OWNER, claim.epoch, pid=1)
    with engine.connect() as ender:
        with ender.begin():
            began = ender.execute(sa.text("SELECT now()")).scalar_one()
            fire_time = began.replace(microsecond=0) + timedelta(seconds=1)
            waiting.wait_until(
                lambda: _pg_now(engine) > fire_time, 10, interval=0.05, message="the fire time"
            )
            _checked_until(engine, job_id, ":t - interval '1 ms'", t=fire_time)
            fired = _fire(engine)  # the run is still running for the fire: skipped
            assert fired is not None and fired.run_id is None and fired.skipped >= 1
            distribution.finish(ender, job_id, OWNER, claim.epoch)
    manual, *skips = _runs(engine, job_id)
    assert [s["reason"] for s in skips][-1] == "previous run still running"
    assert manual["state"] == "finished"
    latest_skip = datetime.fromisoformat(skips[-1]["scheduled_time"])
    assert datetime.fromisoformat(manual["ended_at"]) > latest_skip


def test_a_backfill_refuses_fire_times_whose_runs_history_retention_pruned(
    engine: sa.Engine,
) -> None:
    """Hole W2 of safety review 3: backfill judged "already ran" from run rows, and
    history retention deletes ended ones; a backfill reaching past the retention ran
    every old fire time again, failed ones included, and --dry-run listed them without a
    word. Now it refuses the times it cannot judge, naming the last of them."""
    job_id, start, end = _stopped_hourly_job(engine)
    with engine.begin() as conn:
        fires.backfill(conn, job_id, start, end, dry_run=False)
        conn.execute(
            sa.text("UPDATE runs SET state = 'finished', ended_at = now() - interval '40 days'")
        )
        runs.queue(conn, job_id, end + timedelta(hours=1))  # the job's newest: kept
    with engine.connect() as conn:
        pruned = retention.prune_runs(conn, _pg_now(engine) - timedelta(days=30), batch_size=10)
    assert pruned == 3
    for dry_run in (True, False):
        with engine.begin() as conn, pytest.raises(fires.BackfillTooOld) as refused:
            fires.backfill(conn, job_id, start, end, dry_run=dry_run)
        assert schedule.iso(end) in str(refused.value)
    assert [r["scheduled_time"] for r in _runs(engine, job_id)] == [
        schedule.iso(end + timedelta(hours=1))
    ]
    with engine.begin() as conn:  # after the pruned times: judged as before
        queued, _ = fires.backfill(
            conn, job_id, end + timedelta(seconds=1), end + timedelta(hours=2), dry_run=True
        )
    assert queued == [end + timedelta(hours=2)]


def _stopped_hourly_job(engine: sa.Engine) -> tuple[int, datetime, datetime]:
    """An hourly job, switched off, and a range of three of its fire times three days
    back (whole hours: the schedule handled none of them)."""
    job_id = factories.scheduled_job(engine, spec="0 * * * *")
    with engine.begin() as conn:
        jobs.stop(conn, "nightly")
    start = schedule.next_fire(schedule.parse("@daily"), _pg_now(engine)) - timedelta(days=3)
    return job_id, start, start + timedelta(hours=2)


def test_a_schedule_removed_keeps_the_backfills_queued_before(engine: sa.Engine) -> None:
    """``job update --no-schedule`` drops the schedule's future fires, not the fire times
    an operator backfilled: each queued one still runs once, oldest first (``job stop``
    is what drops queued backfills: recorded skipped)."""
    job_id, start, end = _stopped_hourly_job(engine)
    with engine.begin() as conn:
        queued, _ = fires.backfill(conn, job_id, start, end, dry_run=False)
        job_revisions.update(conn, "nightly", job_spec.Change(clear_schedule=True))
    assert len(queued) == 3
    assert [r["state"] for r in _runs(engine, job_id)] == ["queued"] * 3
    with engine.begin() as conn:
        assert fires.start_queued(conn, "s1") is not None
    rows = _runs(engine, job_id)
    assert [r["state"] for r in rows] == ["pending", "queued", "queued"]
    assert rows[0]["scheduled_time"] == schedule.iso(start)


def _pg_now(engine: sa.Engine) -> datetime:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT now()")).scalar_one()


def test_replace_stops_the_previous_run_and_starts_the_fire(engine: sa.Engine) -> None:
    job_id = factories.scheduled_job(engine, spec="@hourly", concurrency="replace")
    with engine.begin() as conn:
        jobs.run_now(conn, "nightly")
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        distribution.claim(conn, job_id, OWNER, ttl=30)
    _due_once(engine, job_id)
    fired = _fire(engine)
    assert fired is not None and fired.run_id is not None
    first, second = _runs(engine, job_id)
    assert first["state"] == "replaced" and first["ended_at"] is not None
    assert second["state"] == "pending"
    with engine.connect() as conn:
        generation = conn.execute(
            sa.select(tables.jobs.c.generation).where(tables.jobs.c.id == job_id)
        ).scalar_one()
        assert (
            conn.execute(
                sa.text("SELECT generation FROM runs WHERE run_id = :r"), {"r": second["run_id"]}
            ).scalar_one()
            == generation
        )


def test_the_old_runs_crash_after_a_replace_is_not_the_new_runs(engine: sa.Engine) -> None:
    """M4 of safety review 3: a ``--concurrency replace`` fire (or a ``job restart``)
    while the old run's driver runs; that driver crashes before the stop reaches it.
    The crash was recorded on the new run's row (``retrying``, the old exit code and
    error), a run that had not started. The new run stays ``pending``, its own."""
    job_id = factories.scheduled_job(engine, spec="@hourly", concurrency="replace")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET max_restarts = 2 WHERE id = :j"), {"j": job_id})
        jobs.run_now(conn, "nightly")
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, OWNER, ttl=30)
        distribution.mark_running(conn, job_id, OWNER, claim.epoch, pid=1)
    _due_once(engine, job_id)
    assert _fire(engine) is not None  # the replace: the old run is recorded replaced
    with engine.begin() as conn:  # its driver crashed before the stop reached it
        distribution.record_crash(
            conn, job_id, OWNER, claim.epoch, "driver exited with exit code 3: boom",
            retry=True, backoff_base=0, backoff_max=0,
        )  # fmt: skip
    old, new = _runs(engine, job_id)
    assert old["state"] == "replaced"
    assert (new["state"], new["exit_code"], new["reason"], new["attempts"]) == (
        "pending", None, None, 0,
    ), new  # fmt: skip


def test_misfire_run_once_runs_the_latest_missed_fire_and_records_the_rest(
    engine: sa.Engine,
) -> None:
    job_id = factories.scheduled_job(engine)
    _due(engine, job_id, 5 * 60 + 30)
    fired = _fire(engine)
    assert fired is not None and fired.run_id is not None
    states = [r["state"] for r in _runs(engine, job_id)]
    assert states[-1] == "pending"
    assert states[:-1] == ["skipped"] * (len(states) - 1) and len(states) in (5, 6)
    assert {r["reason"] for r in _runs(engine, job_id)[:-1]} == {"misfire"}


def test_misfire_skip_records_every_missed_fire(engine: sa.Engine) -> None:
    job_id = factories.scheduled_job(engine, misfire="skip")
    _due(engine, job_id, 5 * 60 + 30)
    fired = _fire(engine)
    assert fired is not None
    if fired.late is None:  # the latest fire may be on time (the minute just began)
        assert {r["state"] for r in _runs(engine, job_id)} == {"skipped"}
    assert _state(engine, job_id) in ("stopped", "pending")


def test_stop_switches_the_schedule_off_and_stops_the_run(engine: sa.Engine) -> None:
    job_id = factories.scheduled_job(engine, spec="@hourly")
    _due_once(engine, job_id)
    _fire(engine)
    with engine.begin() as conn:
        assert jobs.stop(conn, "nightly") == "stopped"
    (run,) = _runs(engine, job_id)
    assert run["state"] == "stopped"
    with engine.connect() as conn:
        assert job_views.show(conn, "nightly").as_json()["schedule"]["active"] is False
    assert _fire(engine) is None


def test_a_manual_run_and_a_start_of_an_unscheduled_batch_job_have_run_rows(
    engine: sa.Engine,
) -> None:
    job_id = factories.job(engine, "adhoc", kind=JobKind.BATCH)
    (run,) = _runs(engine, job_id)
    assert (run["trigger"], run["state"], run["scheduled_time"]) == ("manual", "pending", None)
    with engine.begin() as conn, pytest.raises(job_spec.JobConflict, match="run in progress"):
        jobs.run_now(conn, "adhoc")
    with engine.begin() as conn:
        jobs.stop(conn, "adhoc")
        run_id = jobs.run_now(conn, "adhoc")
    assert [r["run_id"] for r in _runs(engine, job_id)][-1] == run_id


def test_a_schedule_on_a_streaming_job_is_refused(engine: sa.Engine) -> None:
    with engine.begin() as conn, pytest.raises(job_spec.JobError, match="for batch jobs"):
        jobs.create(
            conn,
            job_spec.JobSpec(
                name="stream",
                kind=JobKind.STREAMING,
                resource_id=factories.resource(conn),
                schedule=schedule.parse("@daily").as_dict(),
            ),
        )


def test_a_schedule_change_is_a_revision_and_reschedules(engine: sa.Engine) -> None:
    factories.scheduled_job(engine)
    with engine.begin() as conn:
        revised = job_revisions.update(
            conn, "nightly", job_spec.Change(schedule=schedule.parse("@every 5s").as_dict())
        )
        assert revised.changed == ("schedule",)
        shown = job_views.show(conn, "nightly").as_json()
        assert shown["schedule"]["spec"] == "@every 5s" and shown["schedule"]["active"]
        job_revisions.update(conn, "nightly", job_spec.Change(clear_schedule=True))
        assert job_views.show(conn, "nightly").as_json()["schedule"] is None


def test_backfill_queues_fire_times_once_and_runs_them_oldest_first(engine: sa.Engine) -> None:
    job_id, start, end = _stopped_hourly_job(engine)
    with engine.begin() as conn:
        would, _ = fires.backfill(conn, job_id, start, end, dry_run=True)
        assert len(would) == 3 and _runs(engine, job_id) == []
        queued, taken = fires.backfill(conn, job_id, start, end, dry_run=False)
        assert (len(queued), taken) == (3, [])
        again, taken = fires.backfill(conn, job_id, start, end, dry_run=False)
        assert (again, len(taken)) == ([], 3)
    with engine.begin() as conn:
        assert fires.start_queued(conn, "s1") is not None
    with engine.begin() as conn:
        assert fires.start_queued(conn, "s1") is None  # one at a time
    backfilled = _runs(engine, job_id)
    assert [r["state"] for r in backfilled] == ["pending", "queued", "queued"]
    assert backfilled[0]["scheduled_time"] == schedule.iso(start)


def _pg_now(engine: sa.Engine) -> datetime:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT now()")).scalar_one()


@pytest.mark.parametrize("behind_s", [61, 119])
def test_many_firers_fire_each_slot_once(engine: sa.Engine, behind_s: float) -> None:
    """Four firers loop over twenty due jobs at once: each job gets exactly one run."""
    ids = [factories.scheduled_job(engine, name=f"j{i}") for i in range(20)]
    for job_id in ids:
        _due(engine, job_id, behind_s)
    errors: list[BaseException] = []

    def firer() -> None:
        try:
            while _fire(engine) is not None:
                pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=firer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    for job_id in ids:
        # 61 s of an @every 1m schedule hold two fire times about once a minute (119 s:
        # nearly always): the older one is a misfire, recorded skipped. One run, each
        # fire time once.
        rows = _runs(engine, job_id)
        ran = [r for r in rows if r["state"] != "skipped"]
        assert [r["trigger"] for r in ran] == ["schedule"], rows
        assert len({r["scheduled_time"] for r in rows}) == len(rows), rows
        assert all(r["reason"] for r in rows if r["state"] == "skipped"), rows


def test_a_job_whose_fire_fails_every_time_holds_up_no_other_schedule(
    engine: sa.Engine,
) -> None:
    """The loop took the due job with the oldest next fire and, when handling it
    raised, ended its pass: a job whose fire fails every time (here: a zone this
    server's tzdata lacks, as in a rolling upgrade; before: a backfilled fire time)
    stopped every other schedule of the cluster, on every server. Its transaction rolls
    back and the pass goes on with the other due jobs."""
    bad = factories.scheduled_job(engine, name="bad")
    good = factories.scheduled_job(engine, name="good")
    _due(engine, good, 61)
    _due(engine, bad, 61)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET schedule = jsonb_set(schedule, '{timezone}', "
                "'\"Mars/Olympus_Mons\"'), next_fire_at = now() - interval '1 minute' "
                "WHERE id = :j"
            ),
            {"j": bad},
        )
    loop = fires.FiringLoop(engine, "s1", interval=1.0)
    loop.run_pass()
    assert [r["trigger"] for r in _runs(engine, good) if r["state"] != "skipped"] == ["schedule"]
    assert _runs(engine, bad) == []  # rolled back, due again at the next pass
    with engine.connect() as conn:
        (left,) = conn.execute(
            sa.text("SELECT next_fire_at <= now() FROM jobs WHERE id = :j"), {"j": bad}
        ).one()
    assert left
    assert loop.run_pass() == 0  # and it fails again without counting as done


def test_a_backfill_queues_no_fire_time_the_schedule_has_not_handled(engine: sa.Engine) -> None:
    """A backfill's range reaching past now queued future fire times of the active
    schedule; the fire of such a time then matched the queued row, rolled back, and
    was due again at every pass: the job never fired again. A backfill now covers only
    fire times the schedule already handled (active) or that passed (off)."""
    job_id = factories.scheduled_job(engine, spec="@every 1m")
    now = _pg_now(engine)
    with engine.begin() as conn:
        queued, _ = fires.backfill(
            conn, job_id, now - timedelta(minutes=3), now + timedelta(minutes=3), dry_run=False
        )
        checked = conn.execute(
            sa.text("SELECT fires_checked_until FROM jobs WHERE id = :j"), {"j": job_id}
        ).scalar_one()
    assert len(queued) == 3 and all(at <= checked for at in queued), queued
    with engine.begin() as conn:
        jobs.stop(conn, "nightly")
    with engine.begin() as conn:
        later, taken = fires.backfill(
            conn, job_id, now - timedelta(minutes=3), now + timedelta(minutes=3), dry_run=True
        )
    # Off: up to now. The three were queued, then dropped by the stop (recorded
    # skipped): they never ran, so a backfill queues them again.
    assert taken == [] and set(queued) <= set(later), (later, queued)
    assert all(at <= _pg_now(engine) for at in later), later


@pytest.mark.parametrize("misfire", ["run-once", "skip"])
def test_fires_while_switched_off_are_handled_by_the_misfire_policy(
    engine: sa.Engine, misfire: str
) -> None:
    """``job stop`` then ``job start`` of a scheduled job: the fire times in between
    were neither run nor recorded (switch_on started from now). They are misfires now,
    handled at once by the schedule's misfire policy: under run-once the latest runs
    (it is on time here), under skip none; every other one recorded ``misfire``."""
    job_id = factories.scheduled_job(engine, misfire=misfire)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET fires_checked_until = now() - interval '210 seconds' WHERE id = :j"
            ),
            {"j": job_id},
        )  # it had handled its fires until 3.5 minutes ago, then:
        jobs.stop(conn, "nightly")
    with engine.begin() as conn:
        jobs.start(conn, "nightly")
    fired = _fire(engine)
    assert fired is not None, "the fire times while off were dropped unrecorded"
    rows = _runs(engine, job_id)
    assert len(rows) in (3, 4) and len({r["scheduled_time"] for r in rows}) == len(rows)
    ran = [r for r in rows if r["state"] != "skipped"]
    assert {r["reason"] for r in rows if r["state"] == "skipped"} == {"misfire"}
    if misfire == "run-once" or fired.run_id is not None:
        # Under skip, too, the latest runs when it is on time (the minute just began).
        assert [r["scheduled_time"] for r in ran] == [rows[-1]["scheduled_time"]]
        assert misfire == "run-once" or (fired.late or 0) <= schedule.ON_TIME_S
    else:
        assert ran == []
    assert _fire(engine) is None


def test_a_backfill_runs_the_fire_times_recorded_skipped_once(engine: sa.Engine) -> None:
    """A fire recorded ``skipped`` (a misfire under ``--misfire skip``, a fire while the
    previous run ran, a queued backfill dropped by a stop) never ran. A backfill over it
    left it out as "already recorded": the operator who chose ``skip`` through an outage
    could not run the missed times afterwards. It now queues such a time on its own row
    (trigger ``backfill``, the skip kept in the reason), which runs once; a time that
    has a run (or a queued one) is still left out."""
    job_id = factories.scheduled_job(engine, misfire="skip")
    _due(engine, job_id, 5 * 60 + 30)
    assert _fire(engine) is not None
    with engine.begin() as conn:
        jobs.stop(conn, "nightly")
    before = _runs(engine, job_id)
    skipped = [r["scheduled_time"] for r in before if r["state"] == "skipped"]
    others = [r["scheduled_time"] for r in before if r["state"] != "skipped"]
    assert len(skipped) >= 4, before
    start = datetime.fromisoformat(before[0]["scheduled_time"])
    end = datetime.fromisoformat(before[-1]["scheduled_time"])
    with engine.begin() as conn:
        would, _ = fires.backfill(conn, job_id, start, end, dry_run=True)
        assert [schedule.iso(at) for at in would] == skipped
        assert _runs(engine, job_id) == before  # a dry run writes nothing
        queued, taken = fires.backfill(conn, job_id, start, end, dry_run=False)
    assert [schedule.iso(at) for at in queued] == skipped
    assert [schedule.iso(at) for at in taken] == others
    after = _runs(engine, job_id)
    assert len(after) == len(before)  # the same rows: one per fire time
    requeued = [r for r in after if r["scheduled_time"] in skipped]
    assert {(r["state"], r["trigger"]) for r in requeued} == {("queued", "backfill")}
    assert all("misfire" in r["reason"] for r in requeued), requeued
    with engine.begin() as conn:
        again, taken = fires.backfill(conn, job_id, start, end, dry_run=False)
    assert again == [] and len(taken) == len(before)
    with engine.begin() as conn:
        run_id = fires.start_queued(conn, "s1")
    first = next(r for r in _runs(engine, job_id) if r["run_id"] == run_id)
    assert (first["state"], first["scheduled_time"]) == ("pending", skipped[0])


def _pass_at(engine: sa.Engine, job_id: int, now: datetime) -> fires.Fired:
    """One firing pass over the job (``fires.fire``, as the loop runs it) as if
    PostgreSQL's ``now()`` were ``now``: a pass on a day of a DST change, without
    waiting for one."""
    with engine.begin() as conn:
        job = conn.execute(
            sa.text(
                "SELECT id, name, schedule, fires_checked_until, "
                "CAST(:now AS timestamptz) AS now FROM jobs WHERE id = :j FOR UPDATE"
            ),
            {"j": job_id, "now": now},
        ).one()
        return fires.fire(conn, job, "s1")


def _gap_rows(engine: sa.Engine, job_id: int) -> list[dict]:
    return [r for r in _runs(engine, job_id) if (r["reason"] or "").startswith("dst-gap")]


def test_a_dst_gap_fire_time_is_recorded_skipped_once_by_the_pass_after_the_jump(
    engine: sa.Engine,
) -> None:
    """``30 2 * * *`` in Europe/Berlin: 02:30 on 2026-03-29 does not exist (02:00 CET
    jumps to 03:00 CEST at 01:00Z). It was recorded ``skipped`` twice: by the pass of
    the 28th's fire, a day before the jump, and again by the 30th's, both rows with no
    scheduled time, so the unique (job, scheduled time) did not fence the second, and
    each raised its own ``schedule_skipped`` delivery. It is now recorded once, by the
    first pass after the jump, with an instant of the transition as its scheduled
    time; a pass that handled it again would match the unique constraint."""
    job_id = factories.scheduled_job(engine, spec="30 2 * * *", timezone="Europe/Berlin")
    with engine.begin() as conn:
        alerts.create(
            conn,
            "sched",
            "http://127.0.0.1:9/hook",
            kinds="schedule_skipped",
            allow_networks=factories.LOOPBACK,
        )
    _checked_until(engine, job_id, "CAST(:t AS timestamptz)", t=datetime(2026, 3, 28, tzinfo=UTC))
    first = _pass_at(engine, job_id, datetime(2026, 3, 28, 1, 30, 0, 400000, tzinfo=UTC))
    assert first.scheduled_time == datetime(2026, 3, 28, 1, 30, tzinfo=UTC)
    assert _gap_rows(engine, job_id) == [], "recorded a day before the jump"
    _pass_at(engine, job_id, datetime(2026, 3, 30, 0, 30, 0, 400000, tzinfo=UTC))
    (gap,) = _gap_rows(engine, job_id)
    assert gap["state"] == "skipped"
    assert gap["reason"] == "dst-gap: 2026-03-29 02:30:00 does not exist in Europe/Berlin"
    jump = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    assert gap["scheduled_time"] is not None
    at = datetime.fromisoformat(gap["scheduled_time"])
    assert jump - timedelta(seconds=1) < at < jump
    with engine.connect() as conn:
        reasons = conn.execute(
            sa.text("SELECT detail->>'reason' FROM alert_deliveries WHERE job_id = :j"),
            {"j": job_id},
        ).scalars()
        assert [r for r in reasons if r.startswith("dst-gap")] == [gap["reason"]]
    # The same window handled again (a pass whose commit was not seen): fenced.
    _checked_until(engine, job_id, "CAST(:t AS timestamptz)", t=datetime(2026, 3, 29, tzinfo=UTC))
    with pytest.raises(runs.RunConflict):
        _pass_at(engine, job_id, datetime(2026, 3, 29, 12, 0, tzinfo=UTC))
    assert len(_gap_rows(engine, job_id)) == 1


def _times(rows: list[dict]) -> list[datetime]:
    return [datetime.fromisoformat(r["scheduled_time"]) for r in rows]


@pytest.mark.parametrize("change", ["@every 2m", "--no-schedule", "--misfire skip"])
def test_a_schedule_change_handles_the_fire_times_due_before_it_once(
    engine: sa.Engine, change: str
) -> None:
    """``job update --schedule`` (and ``--no-schedule``, or a policy of the schedule)
    moved the schedule's cursor to now: the fire times of the schedule as it was that
    were due but not yet handled (every server down for a restart, or the update in
    the second after a fire time) got no run and no ``skipped`` row. The update now
    handles them first, in its own transaction, as the firing loop's pass would have:
    by the old schedule's policies (here ``run-once``: the latest runs late, within
    the grace; every earlier one is recorded ``misfire``). None is handled again."""
    old = schedule.parse("@every 1m")
    job_id = factories.scheduled_job(engine, spec=old.spec)
    _due(engine, job_id, 4 * 60 + 30)  # every server down for four and a half minutes
    if change == "--no-schedule":
        update = job_spec.Change(clear_schedule=True)
    elif change == "--misfire skip":
        update = job_spec.Change(schedule=schedule.parse(old.spec, misfire="skip").as_dict())
    else:
        update = job_spec.Change(schedule=schedule.parse(change).as_dict())
    with engine.begin() as conn:
        now, checked = conn.execute(
            sa.text("SELECT now(), fires_checked_until FROM jobs WHERE id = :j"), {"j": job_id}
        ).one()
        job_revisions.update(conn, "nightly", update)
    due = [slot.at for slot in schedule.due(old, checked, now).slots]
    assert len(due) >= 4
    rows = _runs(engine, job_id)
    assert _times(rows) == due, "fire times due before the update were dropped unrecorded"
    assert [r["state"] for r in rows] == ["skipped"] * (len(due) - 1) + ["pending"]
    assert {r["reason"] for r in rows[:-1]} == {"misfire"}
    assert _fire(engine) is None  # none of them is due again
    assert len(_runs(engine, job_id)) == len(due)


def test_a_schedule_changed_while_stopped_records_the_old_times_and_starts_from_the_change(
    engine: sa.Engine,
) -> None:
    """M5 of safety review 3: ``job update --schedule`` of a stopped job kept the cursor
    where the stop left it, so ``job start`` handled every fire time of the *new*
    schedule since the stop as a misfire (times it did not have then; under ``run-once``
    a run for one of them). The change now records the old schedule's fire times of the
    off period (``skipped``, ``misfire``: none runs, the job is stopped) and moves the
    cursor to the change: the start handles the new schedule's times from there only."""
    old = schedule.parse("@every 1m")
    job_id = factories.scheduled_job(engine, spec=old.spec)
    with engine.begin() as conn:
        jobs.stop(conn, "nightly")
    _due(engine, job_id, 5 * 60 + 30)  # stopped five and a half minutes ago
    with engine.begin() as conn:
        now, checked = conn.execute(
            sa.text("SELECT now(), fires_checked_until FROM jobs WHERE id = :j"), {"j": job_id}
        ).one()
        job_revisions.update(
            conn, "nightly", job_spec.Change(schedule=schedule.parse("@every 7s").as_dict())
        )
    due = [slot.at for slot in schedule.due(old, checked, now).slots]
    rows = _runs(engine, job_id)
    assert _times(rows) == due and len(due) >= 5, "the off period's fire times went unrecorded"
    assert {(r["state"], r["reason"]) for r in rows} == {("skipped", "misfire")}
    with engine.begin() as conn:
        cursor = conn.execute(
            sa.text("SELECT fires_checked_until FROM jobs WHERE id = :j"), {"j": job_id}
        ).scalar_one()
        assert cursor >= now
        jobs.start(conn, "nightly")
    _fire(engine)
    # The new schedule's times since the change only: a second or two of @every 7s, not
    # five and a half minutes of them.
    assert len(_runs(engine, job_id)) <= len(due) + 1, _runs(engine, job_id)


def test_a_schedule_change_waiting_for_a_fire_never_moves_the_cursor_back(
    engine: sa.Engine,
) -> None:
    """An update whose transaction began before a firing pass, and that waited for the
    job row that pass held, moved ``fires_checked_until`` back to its own (earlier)
    ``now()``. A fire time the pass had handled was then due again: when the new
    schedule has it too, its insert matched the pass's row and rolled back at every
    pass, and the schedule never fired again. The cursor now only moves forward."""
    job_id = factories.scheduled_job(engine, spec="@every 1s")
    update = engine.connect()
    transaction = update.begin()
    try:
        began = update.execute(sa.text("SELECT now()")).scalar_one()  # the update's now()
        _checked_until(engine, job_id, "CAST(:t AS timestamptz)", t=began)
        time.sleep(1.2)  # a fire time of both schedules passes
        assert _fire(engine) is not None  # the pass the update waited for
        handled = _runs(engine, job_id)
        job_revisions.update(
            update,
            "nightly",
            job_spec.Change(schedule=schedule.parse("@every 1s", misfire="skip").as_dict()),
        )
        transaction.commit()
    finally:
        update.close()
    _fire(engine)  # RunConflict, at every pass, when a handled fire time is due again
    with engine.connect() as conn:
        checked = conn.execute(
            sa.text("SELECT fires_checked_until FROM jobs WHERE id = :j"), {"j": job_id}
        ).scalar_one()
    assert checked >= max(_times(handled))
    rows = _runs(engine, job_id)
    assert len(set(_times(rows))) == len(rows)


def test_a_schedule_the_firer_cannot_use_can_still_be_changed(engine: sa.Engine) -> None:
    """A schedule whose fire fails every time (a zone this server's tzdata lacks) is
    fixed with ``job update``: its due fire times cannot be known, so the change goes
    through without them, as before, and the new schedule fires."""
    job_id = factories.scheduled_job(engine)
    _due(engine, job_id, 61)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE jobs SET schedule = jsonb_set(schedule, '{timezone}', "
                "'\"Mars/Olympus_Mons\"') WHERE id = :j"
            ),
            {"j": job_id},
        )
    with engine.begin() as conn:
        revised = job_revisions.update(
            conn, "nightly", job_spec.Change(schedule=schedule.parse("@every 1m").as_dict())
        )
    assert revised.changed == ("schedule",)
    assert _runs(engine, job_id) == []
    with engine.connect() as conn:
        assert job_views.show(conn, "nightly").as_json()["schedule"]["timezone"] == "UTC"
