"""Auto-rollback: an update watched until its revision proves healthy, else undone.

An update (``job update``, ``sparkring apply``, the API) of a streaming job whose
auto-rollback setting is on (``jobs.auto_rollback``) and that rolls the job starts a
*watch*, in the same statement as the revision (``scheduler/job_revisions.py`` ``_REVISE``): the
job row records the new revision, the one it replaced (the *fallback*), and a deadline
``healthy_within_s`` after the update, by PostgreSQL's clock. The watch lives in the job
row, so it survives the server that started it.

Healthy means: by the deadline, the job's run is of the watched revision and running,
and it completed at least one micro-batch (its ``run_health`` row, of that run's epoch,
names a batch). The watch is judged by :func:`decide`, a pure function of
:class:`Facts`:

    watching -> ended (healthy)       the deadline passed and the run is healthy
    watching -> rolled back (crashed)  a run of the watched revision crashed (event
                                       crashed or failed of an epoch claimed with it)
    watching -> rolled back (stalled)  its run is flagged stalled (server/health.py)
    watching -> rolled back (not healthy within D)   the deadline passed, not healthy
    watching -> watching, deadline moved  the deadline passed while the watched
                                      revision's run waits on a deferral (no Spark master,
                                      S3 or PostgreSQL away: a cause outside the job, no
                                      budget spent): health is judged only over time it
                                      could run, so the deadline moves to now + D
    watching -> ended (unjudged)      the job's revision moved on (another update or
                                      rollback) or it is no longer wanted running

A rollback is ``job_revisions.rollback`` to the fallback (the same fenced roll as ``job
rollback``: stop, then a claim from the same checkpoint; a new revision made by
``auto-rollback``), plus an event ``rolled_back`` whose detail says why. A job the new
revision left FAILED is started again. A rollback is never watched itself, so a bad
fallback is not rolled back in turn (no loop).

Any server may judge any watch (:class:`WatchLoop` runs on every server): each watch is
judged in one transaction holding its job row (``FOR UPDATE SKIP LOCKED``: a row another
server is judging is skipped), and the rollback is conditional on the watched revision
still being the job's current one (``job_revisions._revise`` checks ``revision = previous``). So
two servers never both roll a watch back, and a server that dies halfway commits
nothing: the next pass judges the watch again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum

import sqlalchemy as sa

from scheduler import job_revisions, job_spec, jobs, loop, notify
from scheduler.schedule import format_duration
from sql import tables
from sql.states import Desired, EventKind, HealthFlag, JobKind, RunState

log = logging.getLogger(__name__)

# Who a rollback's revision and event name as their author (``by``).
ACTOR = "auto-rollback"


class Verdict(StrEnum):
    WATCH = "watch"  # nothing decided yet
    EXTEND = "extend"  # past the deadline while deferred for an outside cause: watch on
    HEALTHY = "healthy"  # the revision proved itself: the watch ends
    ROLL_BACK = "roll back"  # back to the fallback revision
    ABANDON = "abandon"  # the watch no longer applies: it ends, nothing is judged


class Cause(StrEnum):
    """Why a watched revision was rolled back (the ``rolled_back`` event's ``cause``)."""

    CRASHED = "crashed"  # a run of it crashed (or failed) before it was healthy
    STALLED = "stalled"  # its run was flagged stalled
    UNHEALTHY = "not_healthy"  # not healthy by the deadline


@dataclass(frozen=True)
class Facts:
    """What PostgreSQL says of one watched job (:data:`_FACTS`)."""

    kind: str
    desired: str
    revision: int  # the job's current revision
    watched: int  # the revision under watch
    healthy_within_s: float
    past_deadline: bool  # now() >= watch_until, PostgreSQL's clock
    crashed: bool  # a run claimed with the watched revision crashed since the watch began
    stalled: bool  # the present run (of the watched revision) is flagged stalled
    running: bool  # the present run is of the watched revision, its driver running
    batch_done: bool  # ... and it completed a micro-batch
    # The present run is of the watched revision and waits on a deferral (its latest
    # run event is ``deferred``: a cause outside the job, S9).
    deferred: bool = False


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    cause: Cause | None = None
    reason: str = ""  # one line, for the event and the log


def decide(facts: Facts) -> Decision:
    """The verdict on one watch (see the module docstring). Crash and stall are judged
    at once; health only at the deadline: up that long, and a batch done."""
    if facts.revision != facts.watched:
        return Decision(Verdict.ABANDON, reason=f"revision {facts.revision} superseded it")
    if facts.desired != Desired.RUNNING:
        return Decision(Verdict.ABANDON, reason="the job is no longer wanted running")
    if facts.crashed:
        return Decision(Verdict.ROLL_BACK, Cause.CRASHED, "crashed")
    if facts.stalled:
        return Decision(Verdict.ROLL_BACK, Cause.STALLED, "stalled")
    if not facts.past_deadline:
        return Decision(Verdict.WATCH)
    if facts.running and (facts.kind != JobKind.STREAMING or facts.batch_done):
        return Decision(Verdict.HEALTHY, reason="healthy")
    if facts.deferred:
        within = format_duration(facts.healthy_within_s)
        return Decision(Verdict.EXTEND, reason=f"deferred for a cause outside it: {within} more")
    within = format_duration(facts.healthy_within_s)
    return Decision(Verdict.ROLL_BACK, Cause.UNHEALTHY, f"not healthy within {within}")


# One watched job, its row locked. A crash counts when its epoch was claimed with the
# watched revision after the watch began (a crash of the old revision's run while it
# stops does not); a stall or a batch only when the health row is of the present run.
_FACTS = sa.text(
    f"""
    SELECT j.id, j.name, j.kind, j.desired, j.revision, j.watch_revision AS watched,
           j.watch_fallback AS fallback, j.healthy_within_s,
           now() >= j.watch_until AS past_deadline,
           EXISTS (
               SELECT 1 FROM job_events e JOIN job_events c
                   ON c.job_id = e.job_id AND c.epoch = e.epoch AND c.kind = 'claimed'
                WHERE e.job_id = j.id AND e.kind IN ('crashed', 'failed')
                  AND e.at >= j.watch_since AND c.at >= j.watch_since
                  AND (c.detail ->> 'revision')::int = j.watch_revision
           ) AS crashed,
           COALESCE(d.revision = j.watch_revision AND rh.epoch = d.epoch
                    AND rh.flag = '{HealthFlag.STALLED.value}', false) AS stalled,
           COALESCE(d.revision = j.watch_revision
                    AND d.state = '{RunState.RUNNING.value}', false) AS running,
           COALESCE(d.revision = j.watch_revision AND rh.epoch = d.epoch
                    AND rh.last_batch_id IS NOT NULL, false) AS batch_done,
           COALESCE(d.revision = j.watch_revision
                    AND d.state IN ('{RunState.BACKOFF.value}', '{RunState.PENDING.value}')
                    AND (SELECT e.kind FROM job_events e
                          WHERE e.job_id = j.id
                            AND e.kind IN ('claimed', 'started', 'deferred', 'crashed',
                                           'failed', 'reaped', 'stopped')
                          ORDER BY e.id DESC LIMIT 1) = 'deferred', false) AS deferred
      FROM jobs j
      JOIN distribution d ON d.job_id = j.id
      LEFT JOIN run_health rh ON rh.job_id = j.id
     WHERE j.id = :job_id AND j.watch_revision IS NOT NULL
       FOR UPDATE OF j SKIP LOCKED
    """
)


@dataclass(frozen=True)
class Applied:
    """A verdict carried out (:func:`check_one`)."""

    job_id: int
    name: str
    decision: Decision
    revision: int | None = None  # the rollback's new revision


def _end_watch(conn: sa.Connection, job_id: int, watched: int) -> None:
    j = tables.jobs
    ended = conn.execute(
        sa.update(j)
        .where(j.c.id == job_id, j.c.watch_revision == watched)
        .values(watch_revision=None, watch_fallback=None, watch_since=None, watch_until=None)
    ).rowcount
    if ended != 1:
        raise job_spec.JobConflict(f"job {job_id}: the watch of revision {watched} ended meanwhile")


def _extend_watch(conn: sa.Connection, job_id: int, watched: int, within_s: float) -> None:
    """The watch's deadline moves to now + ``within_s`` (PostgreSQL's clock)."""
    conn.execute(
        sa.text(
            "UPDATE jobs SET watch_until = now() + make_interval(secs => :within) "
            "WHERE id = :job_id AND watch_revision = :watched"
        ),
        {"within": within_s, "job_id": job_id, "watched": watched},
    )


def check_one(conn: sa.Connection, job_id: int, *, server: str) -> Applied | None:
    """Judge the watch of one job and carry the verdict out, in the caller's
    transaction; None when there is nothing to do (no watch, its row is being judged
    elsewhere, or the verdict is to keep watching)."""
    row = conn.execute(_FACTS, {"job_id": job_id}).one_or_none()
    if row is None:
        return None
    facts = Facts(
        kind=row.kind,
        desired=row.desired,
        revision=row.revision,
        watched=row.watched,
        healthy_within_s=row.healthy_within_s,
        past_deadline=row.past_deadline,
        crashed=row.crashed,
        stalled=row.stalled,
        running=row.running,
        batch_done=row.batch_done,
        deferred=row.deferred,
    )
    decision = decide(facts)
    if decision.verdict is Verdict.WATCH:
        return None
    if decision.verdict is Verdict.EXTEND:
        _extend_watch(conn, job_id, row.watched, row.healthy_within_s)
        log.info(
            "job %s: revision %d %s",
            row.name,
            row.watched,
            decision.reason,
            extra={"action": "auto_rollback_extend", "job": row.name},
        )
        return Applied(job_id, row.name, decision)
    if decision.verdict is not Verdict.ROLL_BACK:
        _end_watch(conn, job_id, row.watched)
        log.info(
            "job %s: revision %d %s; watch ended",
            row.name,
            row.watched,
            decision.reason,
            extra={"action": "auto_rollback_" + decision.verdict.value, "job": row.name},
        )
        return Applied(job_id, row.name, decision)
    # The roll ends the watch (job_revisions._revise) and is never watched itself.
    revised = job_revisions.rollback(conn, row.name, row.fallback, actor=ACTOR)
    state = conn.execute(
        sa.select(tables.distribution.c.state).where(tables.distribution.c.job_id == job_id)
    ).scalar_one()
    if state == RunState.FAILED:
        # The new revision spent the budget: start afresh, recorded as a start (by
        # auto-rollback) so the history says why a FAILED job ran again (S4).
        jobs.start(conn, row.name, actor=ACTOR)
    assert decision.cause is not None
    conn.execute(
        sa.insert(tables.job_events).values(
            job_id=job_id,
            job_name=row.name,
            kind=EventKind.ROLLED_BACK,
            server=server,
            detail={
                "cause": decision.cause.value,
                "reason": decision.reason,
                "revision": row.watched,
                "to": row.fallback,
                "as_revision": revised.revision,
                "by": ACTOR,
            },
        )
    )
    notify.notify(conn, notify.JOBS_CHANNEL, row.name)
    log.warning(
        "job %s rolled back from revision %d to %d (as revision %d): %s",
        row.name,
        row.watched,
        row.fallback,
        revised.revision,
        decision.reason,
        extra={"action": "rolled_back", "job": row.name, "cause": decision.cause.value},
    )
    return Applied(job_id, row.name, decision, revised.revision)


def watched(conn: sa.Connection) -> list[int]:
    """The jobs with a watch in progress."""
    j = tables.jobs
    return list(
        conn.execute(sa.select(j.c.id).where(j.c.watch_revision.is_not(None)).order_by(j.c.id))
        .scalars()
        .all()
    )


def check_all(engine: sa.Engine, *, server: str) -> list[Applied]:
    """Judge every watch, each in its own transaction (one that fails is logged and
    judged again at the next pass); the verdicts carried out."""
    with engine.connect() as conn:
        job_ids = watched(conn)
    done = []
    for job_id in job_ids:
        try:
            with engine.begin() as conn:
                applied = check_one(conn, job_id, server=server)
        except (job_spec.JobError, sa.exc.DBAPIError) as exc:
            log.warning(
                "job %d: auto-rollback watch not judged: %s; next pass tries again",
                job_id,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                extra={"action": "auto_rollback_retry", "job_id": job_id},
            )
            continue
        if applied is not None:
            done.append(applied)
    return done


class WatchLoop(loop.Loop):
    """The side thread of a server that judges watches every ``interval`` seconds.
    Every server runs one (:func:`check_one` makes that safe); a failed pass is logged
    and the next one runs. :meth:`stop` is idempotent."""

    def __init__(self, engine: sa.Engine, server: str, *, interval: float) -> None:
        self._engine = engine
        self._server = server
        super().__init__("auto-rollback", join_timeout=10.0, interval=interval, first_wait=interval)

    def step(self) -> None:
        try:
            check_all(self._engine, server=self._server)
        except Exception as exc:  # one bad pass (PostgreSQL away) must not end the loop
            log.warning(
                "auto-rollback pass failed; next in %.1f s: %s",
                self.interval,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                extra={"action": "auto_rollback_pass_failed"},
            )
