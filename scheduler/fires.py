"""Firing schedules: each fire time of an active schedule handled exactly once.

Every server runs a :class:`FiringLoop`; any of them may handle a due job, and only
one does at a time: :func:`fire_one` locks one due job row (``FOR UPDATE SKIP
LOCKED``: the others take the next one, nobody waits) and in that one transaction

    1. reads PostgreSQL's ``now()`` (the only clock: a server's wall clock never
       decides a fire),
    2. takes the slots after ``fires_checked_until`` up to ``now``
       (``schedule.due``) and decides each (``schedule.decide``): run, replace, or
       skip with a reason,
    3. writes them: a run makes the job pending with a new generation and inserts its
       ``runs`` row (``runs.open_run``); a skip inserts a ``skipped`` row,
    4. moves ``fires_checked_until`` to ``now`` and ``next_fire_at`` to the next fire.

The fence is the unique (job_id, scheduled_time) row committed together with the job
becoming pending: a commit that is lost (the connection dropped, the server was
killed, PostgreSQL restarted) wrote nothing, and the next pass, on any server, does it
again; a commit that happened moved ``fires_checked_until``, so no pass sees those
slots again; and were two passes ever to handle one slot, the second insert would
match the constraint and roll its whole transaction back (:class:`runs.RunConflict`).

Schedule switching (``job start`` / ``job stop`` of a scheduled job) is
:func:`switch_on` (the next fire is computed from ``now``) and :func:`switch_off`. A
schedule change handles the due fire times of the schedule as it was
(:func:`fire_before_change`), then takes the next fire from the new one
(:func:`reschedule`), in the change's transaction.
Backfill (:func:`backfill`) queues fire times; a queued run starts when the job has no
run in progress (:func:`start_queued`), oldest first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from scheduler import loop, notify, runs, schedule
from sql import states, tables

log = logging.getLogger(__name__)

# The shortest sleep between two passes, seconds: a due job another server holds (SKIP
# LOCKED) must not make this loop spin.
MIN_WAIT_S = 0.02


class ScheduleMissing(Exception):
    """The job has no schedule (or is not one this operation applies to)."""


class BackfillTooOld(ValueError):
    """A backfill reaches fire times whose run rows history retention deleted."""


def _now(conn: sa.Connection) -> datetime:
    return conn.execute(sa.text("SELECT now()")).scalar_one()


def switch_on(conn: sa.Connection, job_id: int) -> datetime | None:
    """Switch the job's schedule on. Returns the next fire time after PostgreSQL's now;
    None if it was on already (left alone).

    Switched on for the first time, nothing runs before the next fire. Switched on again
    after a ``job stop``, the fire times from where it stopped (``fires_checked_until``,
    kept by :func:`switch_off`) to now are due at once and handled like any missed
    fires, by the misfire policy (``schedule.decide``): recorded ``misfire``, and under
    ``run-once`` the latest runs if it is within the grace; never dropped unrecorded."""
    row = conn.execute(
        sa.select(
            tables.jobs.c.schedule,
            tables.jobs.c.schedule_active,
            tables.jobs.c.fires_checked_until,
        )
        .where(tables.jobs.c.id == job_id)
        .with_for_update()
    ).one()
    if row.schedule is None:
        raise ScheduleMissing(f"job {job_id} has no schedule")
    if row.schedule_active:
        return None
    now = _now(conn)
    the_schedule = schedule.Schedule.from_dict(row.schedule)
    next_fire = schedule.next_fire(the_schedule, now)
    checked = row.fires_checked_until or now
    changed = conn.execute(
        sa.update(tables.jobs)
        .where(tables.jobs.c.id == job_id, tables.jobs.c.schedule_active.is_(False))
        .values(
            schedule_active=True,
            fires_checked_until=checked,
            next_fire_at=min(next_fire, schedule.next_fire(the_schedule, checked)),
            updated_at=sa.func.now(),
        )
    ).rowcount
    if changed != 1:
        raise AssertionError(f"job {job_id}: the schedule switch matched {changed} rows")
    return next_fire


def switch_off(conn: sa.Connection, job_id: int) -> bool:
    """Switch the job's schedule off; queued backfill runs are dropped (recorded).
    ``fires_checked_until`` is kept: :func:`switch_on` handles the fire times from
    there. Returns whether it was on."""
    runs.cancel_queued(conn, job_id)
    return bool(
        conn.execute(
            sa.update(tables.jobs)
            .where(tables.jobs.c.id == job_id, tables.jobs.c.schedule_active.is_(True))
            .values(schedule_active=False, next_fire_at=None, updated_at=sa.func.now())
        ).rowcount
    )


# The job row locked, with the pass's ``now``: PostgreSQL's, or the cursor when a pass
# that began later committed first (the cursor never moves back: a fire time it passed
# would be due again, and its insert would match the row the pass wrote).
_ACTIVE = sa.text(
    """
    SELECT j.id, j.name, j.schedule, j.fires_checked_until,
           GREATEST(now(), j.fires_checked_until) AS now
      FROM jobs j
     WHERE j.id = :job_id AND j.schedule_active
       FOR UPDATE
    """
)


# A stopped job's schedule, its row locked, with the change's ``now`` (never before the
# cursor, as _ACTIVE).
_STOPPED = sa.text(
    """
    SELECT j.id, j.name, j.schedule, j.fires_checked_until,
           GREATEST(now(), j.fires_checked_until) AS now
      FROM jobs j
     WHERE j.id = :job_id AND NOT j.schedule_active AND j.schedule IS NOT NULL
       AND j.fires_checked_until IS NOT NULL
       FOR UPDATE
    """
)


def close_off_period(conn: sa.Connection, job_id: int) -> int | None:
    """Before a change of a stopped job's schedule: the fire times the schedule as it is
    had since the stop (up to the change) are recorded ``skipped`` (``misfire``; none
    runs: the job is stopped, and a start handles only what comes after), except those a
    backfill queued, and the cursor moves to the change. Without it ``job start`` took
    the *new* schedule's fire times since the stop for missed ones (M5 of safety review
    3). Returns how many were recorded; None if the schedule is on, never switched on,
    or cannot be read (a zone this host's tzdata lacks)."""
    job = conn.execute(_STOPPED, {"job_id": job_id}).one_or_none()
    if job is None:
        return None
    try:
        the_schedule = schedule.Schedule.from_dict(job.schedule)
        due = schedule.due(the_schedule, job.fires_checked_until, job.now)
    except schedule.ScheduleError as exc:
        log.warning(
            f"the stopped schedule's fire times were not recorded before its change: {exc}",
            extra={"action": "fire_failed", "job": job.name},
        )
        return None
    backfilled = _backfilled(conn, job.id, [slot.at for slot in due.slots if not slot.gap])
    recorded = 0
    for slot in due.slots:
        if slot.at in backfilled:
            continue
        reason = schedule.gap_reason(slot, the_schedule.timezone) if slot.gap else "misfire"
        try:
            with conn.begin_nested():
                runs.record_skipped(conn, job.id, slot.at, reason)
        except runs.RunConflict:
            continue  # recorded already
        recorded += 1
    conn.execute(
        sa.update(tables.jobs).where(tables.jobs.c.id == job.id).values(fires_checked_until=job.now)
    )
    return recorded


def fire_before_change(conn: sa.Connection, job_id: int) -> Fired | None:
    """Before a change of an active schedule (``job update --schedule``, a policy,
    ``--no-schedule``; ``apply``, ``rollback``), in the change's transaction: the fire
    times of the schedule as it is that are due and not yet handled are handled as the
    firing loop's pass would have handled them (:func:`fire`: run, or recorded skipped
    by its misfire and concurrency policies), so that none is dropped when the change
    moves the cursor (:func:`reschedule`). None if the schedule is not on (the fire
    times since it was switched off are :func:`switch_on`'s), or if the firing loop
    cannot handle them either (a zone this host's tzdata lacks, a fire time recorded
    already): the change that fixes such a schedule must not fail with it."""
    job = conn.execute(_ACTIVE, {"job_id": job_id}).one_or_none()
    if job is None:
        return None
    try:
        with conn.begin_nested():
            return fire(conn, job, None)
    except (schedule.ScheduleError, runs.RunConflict) as exc:
        log.warning(
            f"the schedule's due fire times were not handled before its change: {exc}",
            extra={"action": "fire_failed", "job": job.name},
        )
        return None


def reschedule(conn: sa.Connection, job_id: int) -> datetime | None:
    """After a schedule change of an active job: the next fire under the new schedule,
    from now. The fire times of the old schedule up to now were handled first
    (:func:`fire_before_change`); its later ones are dropped. None if inactive or the
    schedule was removed (then switched off)."""
    row = conn.execute(_ACTIVE, {"job_id": job_id}).one_or_none()
    if row is None:
        return None
    if row.schedule is None:
        switch_off(conn, job_id)
        return None
    next_fire = schedule.next_fire(schedule.Schedule.from_dict(row.schedule), row.now)
    conn.execute(
        sa.update(tables.jobs)
        .where(tables.jobs.c.id == job_id)
        .values(fires_checked_until=row.now, next_fire_at=next_fire)
    )
    return next_fire


@dataclass(frozen=True)
class Fired:
    """What one pass did to one job."""

    job_id: int
    name: str
    run_id: int | None  # the run started (None: every slot skipped)
    scheduled_time: datetime | None
    skipped: int  # slots recorded skipped
    next_fire: datetime
    late: float | None  # seconds between the started fire's time and now


_DUE = sa.text(
    """
    SELECT j.id, j.name, j.schedule, j.fires_checked_until, now() AS now
      FROM jobs j
     WHERE j.schedule_active AND j.next_fire_at <= now()
       AND j.id <> ALL(:passed_over)
     ORDER BY j.next_fire_at
     LIMIT 1
       FOR UPDATE OF j SKIP LOCKED
    """
)


def _event(
    conn: sa.Connection,
    job_id: int,
    name: str,
    server: str | None,
    detail: dict,
    kind: str = "start_requested",
) -> None:
    """A fire's run is a start asked by the schedule (``start_requested`` with the new
    generation, as ``job start`` of a job at rest); a replacing fire is a restart of the
    live run (``restart_requested``, ``rerun`` false: its restart count is kept).
    ``server``: the firer; None when a command handled the fire (fire_before_change)."""
    conn.execute(
        sa.insert(tables.job_events).values(
            job_id=job_id, job_name=name, kind=kind, server=server, detail=detail
        )
    )


def lock_due(conn: sa.Connection, passed_over: Collection[int] = ()) -> sa.Row | None:
    """Lock the due job with the oldest next fire that no other pass holds and that is
    not in ``passed_over`` (jobs whose fire failed in this pass); None if none is."""
    return conn.execute(_DUE, {"passed_over": sorted(passed_over)}).one_or_none()


def fire_one(conn: sa.Connection, server: str) -> Fired | None:
    """Handle the due slots of one due job (module docstring); None if none is due.
    ``server`` (the firer) is recorded in the start's event."""
    job = lock_due(conn)
    return None if job is None else fire(conn, job, server)


def fire(conn: sa.Connection, job: sa.Row, server: str | None) -> Fired:
    """Handle the due slots of ``job``, locked by :func:`lock_due` (or by
    :func:`fire_before_change`)."""
    the_schedule = schedule.Schedule.from_dict(job.schedule)
    due = schedule.due(the_schedule, job.fires_checked_until, job.now)
    backfilled = _backfilled(conn, job.id, [slot.at for slot in due.slots if not slot.gap])
    if backfilled:
        # Fire times of the off period that a backfill queued before the schedule was
        # switched on again: each runs once, as its backfilled run.
        due = schedule.Due(
            tuple(slot for slot in due.slots if slot.gap or slot.at not in backfilled),
            due.next_fire,
            due.truncated,
        )
    if due.truncated:
        log.warning(
            "a long outage: only the latest fires are recorded",
            extra={"action": "fires_truncated", "job": job.name, "kept": len(due.slots)},
        )
    decisions = schedule.decide(
        the_schedule, due.slots, job.now, previous_running=runs.in_progress(conn, job.id)
    )
    run_id, fired_at, skipped = None, None, 0
    for decision in decisions:
        at = decision.slot.at
        if decision.action is schedule.Action.SKIP:
            runs.record_skipped(conn, job.id, at, decision.reason or "skipped")
            skipped += 1
            continue
        reset = False
        if decision.action is schedule.Action.REPLACE:
            runs.replace_unended(conn, job.id)
            reset = runs.fresh_retries(conn, job.id)
            generation = _bump_generation(conn, job.id)
        else:
            generation = runs.rerun(conn, job.id)
            if generation is None:
                raise runs.RunConflict(f"job {job.name}: a run is in progress; none started")
        run_id, fired_at = runs.open_run(conn, job.id, generation, "schedule", at), at
        detail = {"trigger": "schedule", "run_id": run_id, "generation": generation}
        detail["scheduled_time"] = schedule.iso(at)
        if decision.action is schedule.Action.REPLACE:
            if reset:
                detail["retries_reset"] = True
            _event(conn, job.id, job.name, server, {**detail, "rerun": False}, "restart_requested")
        else:
            _event(conn, job.id, job.name, server, detail)
    changed = conn.execute(
        sa.update(tables.jobs)
        .where(tables.jobs.c.id == job.id, tables.jobs.c.schedule_active.is_(True))
        .values(fires_checked_until=job.now, next_fire_at=due.next_fire)
    ).rowcount
    if changed != 1:
        raise AssertionError(f"job {job.name}: the fire's bookkeeping matched {changed} rows")
    if run_id is not None:
        notify.notify(conn, notify.JOBS_CHANNEL, job.name)
    late = (job.now - fired_at).total_seconds() if fired_at else None
    return Fired(job.id, job.name, run_id, fired_at, skipped, due.next_fire, late)


def _backfilled(conn: sa.Connection, job_id: int, times: list[datetime]) -> set[datetime]:
    """Those of ``times`` that a backfill recorded (queued, or run already)."""
    if not times:
        return set()
    return set(
        conn.execute(
            sa.text(
                "SELECT scheduled_time FROM runs WHERE job_id = :job_id "
                "AND trigger = 'backfill' AND scheduled_time = ANY(:times)"
            ),
            {"job_id": job_id, "times": times},
        ).scalars()
    )


def _bump_generation(conn: sa.Connection, job_id: int) -> int:
    """A new generation of a job with a run in progress: its owner stops the driver and
    the job is claimed again (the same fenced stop-then-start as ``job restart``)."""
    return conn.execute(
        sa.update(tables.jobs)
        .where(tables.jobs.c.id == job_id)
        .values(
            desired="running", generation=tables.jobs.c.generation + 1, updated_at=sa.func.now()
        )
        .returning(tables.jobs.c.generation)
    ).scalar_one()


_QUEUED = sa.text(
    """
    SELECT j.id, j.name
      FROM jobs j JOIN distribution d ON d.job_id = j.id
     WHERE d.owner IS NULL AND d.state = ANY(:terminal)
       AND EXISTS (SELECT 1 FROM runs r WHERE r.job_id = j.id AND r.state = 'queued')
       AND j.id <> ALL(:passed_over)
     LIMIT 1
       FOR UPDATE OF j SKIP LOCKED
    """
)


def lock_queued(conn: sa.Connection, passed_over: Collection[int] = ()) -> sa.Row | None:
    """Lock one job with a queued run and no run in progress, not in ``passed_over``."""
    return conn.execute(
        _QUEUED, {"terminal": sorted(states.TERMINAL), "passed_over": sorted(passed_over)}
    ).one_or_none()


def start_queued(conn: sa.Connection, server: str) -> int | None:
    """Start the oldest queued (backfilled) run of one job that has no run in
    progress; its run id, or None if there is none to start."""
    job = lock_queued(conn)
    return None if job is None else start_queued_of(conn, job, server)


def start_queued_of(conn: sa.Connection, job: sa.Row, server: str) -> int:
    """Start the oldest queued run of ``job``, locked by :func:`lock_queued`."""
    generation = runs.rerun(conn, job.id)
    if generation is None:
        raise runs.RunConflict(f"job {job.name}: a run is in progress; the queued one waits")
    run_id, at = runs.start_queued(conn, job.id, generation)
    detail = {"trigger": "backfill", "run_id": run_id, "generation": generation}
    _event(conn, job.id, job.name, server, {**detail, "scheduled_time": schedule.iso(at)})
    notify.notify(conn, notify.JOBS_CHANNEL, job.name)
    return run_id


def backfill(
    conn: sa.Connection, job_id: int, start: datetime, end: datetime, *, dry_run: bool
) -> tuple[list[datetime], list[datetime]]:
    """Queue every fire time of the job's schedule in [start, end] that never ran,
    oldest first: those with no run row, and those recorded ``skipped`` (requeued on
    their row, :func:`runs.requeue_skipped`). Returns (queued, those that have a run);
    with ``dry_run`` nothing is written and the first list holds the times that would
    be queued.

    Only fire times the schedule is done with are queued: up to ``fires_checked_until``
    while it is on, up to now while it is off. A later one is the schedule's to fire:
    queued too, its fire would match the queued row and roll back at every pass."""
    row = conn.execute(
        sa.select(
            tables.jobs.c.schedule,
            tables.jobs.c.schedule_active,
            tables.jobs.c.fires_checked_until,
            tables.jobs.c.fires_pruned_until,
            sa.func.now().label("now"),
        )
        .where(tables.jobs.c.id == job_id)
        .with_for_update()
    ).one()
    if row.schedule is None:
        raise ScheduleMissing(f"job {job_id} has no schedule")
    pruned = row.fires_pruned_until
    if pruned is not None and start <= pruned:
        # Whether those times ran is gone with their run rows: never run one again
        # on a guess (hole W2 of safety review 3).
        raise BackfillTooOld(
            f"fire times up to {schedule.iso(pruned)} cannot be backfilled: history "
            "retention deleted their runs, so whether each ran is unknown; backfill "
            f"from after {schedule.iso(pruned)}"
        )
    end = min(end, row.fires_checked_until if row.schedule_active else row.now)
    the_schedule = schedule.Schedule.from_dict(row.schedule)
    times: list[datetime] = []
    for slot in schedule.slots(the_schedule, start):
        if slot.gap:
            continue
        if slot.at > end:
            break
        times.append(slot.at)
        if len(times) > schedule.MAX_DUE_SLOTS:
            raise ValueError(
                f"the range holds more than {schedule.MAX_DUE_SLOTS} fire times: backfill "
                "a shorter one"
            )
    recorded = {
        r.scheduled_time: r.state
        for r in conn.execute(
            sa.text(
                "SELECT scheduled_time, state FROM runs WHERE job_id = :job_id "
                "AND scheduled_time = ANY(:times)"
            ),
            {"job_id": job_id, "times": times},
        )
    }
    fresh = [at for at in times if at not in recorded]
    skipped = sorted(at for at, state in recorded.items() if state == "skipped")
    taken = sorted(at for at, state in recorded.items() if state != "skipped")
    if not dry_run:
        for at in fresh:
            if runs.queue(conn, job_id, at) is None:
                raise runs.RunConflict(f"job {job_id}: fire time {at} was recorded meanwhile")
        if runs.requeue_skipped(conn, job_id, skipped) != skipped:
            raise runs.RunConflict(f"job {job_id}: a skipped fire time changed meanwhile")
        notify.notify(conn, notify.JOBS_CHANNEL, str(job_id))
    return sorted(fresh + skipped), taken


def seconds_to_next_fire(conn: sa.Connection, passed_over: Collection[int] = ()) -> float | None:
    """Seconds until the earliest next fire of any active schedule (PostgreSQL's clock),
    leaving out ``passed_over`` (jobs whose fire failed: still due, retried later)."""
    value = conn.execute(
        sa.text(
            "SELECT EXTRACT(EPOCH FROM min(next_fire_at) - now()) FROM jobs "
            "WHERE schedule_active AND id <> ALL(:passed_over)"
        ),
        {"passed_over": sorted(passed_over)},
    ).scalar_one_or_none()
    return None if value is None else float(value)


class FiringLoop(loop.Loop):
    """The side thread of a server that fires due schedules (:func:`fire_one`) and
    starts queued backfill runs (:func:`start_queued`), each in its own transaction;
    it sleeps until the next fire time (at most ``interval``) or a :meth:`wake`.
    A failure (PostgreSQL away) is logged and retried; the thread never ends before
    :meth:`stop`."""

    def __init__(
        self,
        engine: sa.Engine,
        server: str,
        *,
        interval: float,
        on_fired: Callable[[Fired], None] | None = None,
    ) -> None:
        self._engine = engine
        self._server = server
        self._on_fired = on_fired
        # Due jobs whose fire failed in the last pass (``run_pass``).
        self._passed_over: set[int] = set()
        super().__init__("schedule-firer", join_timeout=10.0, interval=interval)

    def run_pass(self, limit: int = 100) -> int:
        """Fire due jobs and start queued runs, up to ``limit`` of each; how many.

        A job whose fire (or queued start) fails is passed over for the rest of the
        pass, its transaction rolled back: one job that fails every time (a zone this
        server's tzdata lacks, a row in the way) must not stop every other schedule.
        It is tried again at the next pass, at most ``interval`` later (the loop's wait
        leaves it out). A failure to lock a job at all (PostgreSQL away) ends the pass."""
        done = 0
        self._passed_over = set()
        for lock, step in ((lock_due, fire), (lock_queued, start_queued_of)):
            passed_over: set[int] = self._passed_over if lock is lock_due else set()
            for _ in range(limit):
                if self.stopping.is_set():
                    break
                outcome = self._one(lock, step, passed_over)
                if outcome is None:
                    break
                done += outcome
        return done

    def _one(
        self,
        lock: Callable[[sa.Connection, Collection[int]], sa.Row | None],
        step: Callable[[sa.Connection, sa.Row, str], object],
        passed_over: set[int],
    ) -> int | None:
        """One job in one transaction: 1 if done, 0 if it failed (passed over), None if
        there is none to do."""
        job = None
        try:
            with self._engine.begin() as conn:
                job = lock(conn, passed_over)
                if job is None:
                    return None
                done = step(conn, job, self._server)
        except Exception as exc:
            if job is None:
                raise
            passed_over.add(job.id)
            log.warning(
                f"schedule firing failed for one job, the others go on: {exc}",
                exc_info=not isinstance(exc, DBAPIError | runs.RunConflict),
                extra={"action": "fire_failed", "job": job.name, "server": self._server},
            )
            return 0
        if isinstance(done, Fired):
            self._fired(done)  # committed
        return 1

    def _fired(self, fired: Fired) -> None:
        log.info(
            "schedule fired",
            extra={
                "action": "fired",
                "job": fired.name,
                "run_id": fired.run_id,
                "skipped": fired.skipped,
                "late_s": fired.late,
            },
        )
        if self._on_fired is not None:
            self._on_fired(fired)

    def step(self) -> float:
        """One pass, and the wait before the next: until the next fire time, at most
        ``interval``."""
        wait = self.interval
        try:
            self.run_pass()
            with self._engine.connect() as conn:
                left = seconds_to_next_fire(conn, self._passed_over)
            if left is not None:
                wait = max(MIN_WAIT_S, min(wait, left))
        except (DBAPIError, runs.RunConflict) as exc:
            log.warning(
                f"schedule firing failed, retrying: {type(exc).__name__}",
                extra={"action": "fire_failed", "server": self._server},
            )
        except Exception:
            log.exception("schedule firing failed", extra={"action": "fire_failed"})
        return wait
