"""Runs of batch jobs: one ``runs`` row per run (a fire, a manual start, a backfilled
fire time), and the statement that makes a job's next run pending.

A run row is written in the transaction that makes its run pending (:func:`begin`):
the job becomes pending with a new generation and the row names that generation, so
the row exists exactly when the run does. Unique on (job_id, scheduled_time): a fire
time is written once; a second write of it matches the constraint and the whole
transaction rolls back (:class:`RunConflict`), so it cannot run twice.

From then on the trigger ``distribution_runs_follow`` (migration 0011) moves the row
with the job's distribution row, in the same transaction as each of its changes:

    skipped  -> queued      a backfill over a fire time that was skipped (requeue_skipped)
    queued   -> pending     a backfilled fire time's turn came (scheduler/fires.py)
    pending  -> starting    a claim (attempts + 1, server, epoch, started_at)
    starting -> running     the driver was spawned
    running  -> retrying    its driver failed, a retry is left (backoff), -> starting
    running  -> finished | failed | stopped    (ended_at, exit_code)
    any unended -> replaced a newer run replaced it (concurrency replace, restart)
    (a fire not run is written ``skipped`` with its reason; only a backfill moves it)

Callers pass a ``sqlalchemy.Connection`` inside a transaction, with the job row locked.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from sql import states, tables

ENDED = frozenset({"finished", "failed", "stopped", "replaced", "skipped"})
STATES = tables.RUN_STATES_OF_RUNS


class RunConflict(Exception):
    """A run row could not be written: its fire time (or generation) is already taken."""


_RERUN = sa.text(
    """
    WITH d AS (
        UPDATE distribution
           SET state = 'pending', restarts = 0, crash_times = '{}', last_error = NULL,
               not_before = NULL,
               updated_at = now()
         WHERE job_id = :job_id AND owner IS NULL AND state = ANY(:terminal)
        RETURNING job_id
    )
    UPDATE jobs SET desired = 'running', generation = generation + 1, updated_at = now()
      FROM d
     WHERE jobs.id = d.job_id
    RETURNING jobs.generation
    """
)


def rerun(conn: sa.Connection, job_id: int) -> int | None:
    """Terminal (stopped, finished, failed) and unowned -> pending with a new generation.
    Returns the new generation, or None when a run is still in progress."""
    return conn.execute(
        _RERUN, {"job_id": job_id, "terminal": sorted(states.TERMINAL)}
    ).scalar_one_or_none()


def in_progress(conn: sa.Connection, job_id: int) -> bool:
    """Whether the job has a run in progress: owned, or not at rest."""
    owner, state = conn.execute(
        sa.select(tables.distribution.c.owner, tables.distribution.c.state).where(
            tables.distribution.c.job_id == job_id
        )
    ).one()
    return owner is not None or state not in states.TERMINAL


_INSERT = sa.text(
    """
    INSERT INTO runs (job_id, generation, scheduled_time, trigger, state, reason)
    VALUES (:job_id, :generation, :scheduled_time, :trigger, :state, :reason)
    ON CONFLICT DO NOTHING
    RETURNING run_id
    """
)


def _insert(
    conn: sa.Connection,
    job_id: int,
    *,
    generation: int | None,
    scheduled_time: datetime | None,
    trigger: str,
    state: str,
    reason: str | None = None,
) -> int:
    run_id = conn.execute(
        _INSERT,
        {
            "job_id": job_id,
            "generation": generation,
            "scheduled_time": scheduled_time,
            "trigger": trigger,
            "state": state,
            "reason": reason,
        },
    ).scalar_one_or_none()
    if run_id is None:
        what = f"fire time {scheduled_time.isoformat()}" if scheduled_time else "generation"
        raise RunConflict(f"job {job_id}: a run of {what} is already recorded")
    return run_id


def open_run(
    conn: sa.Connection,
    job_id: int,
    generation: int,
    trigger: str,
    scheduled_time: datetime | None = None,
) -> int:
    """The row of a run just made pending (generation ``generation``); its run id."""
    return _insert(
        conn,
        job_id,
        generation=generation,
        scheduled_time=scheduled_time,
        trigger=trigger,
        state="pending",
    )


def record_skipped(conn: sa.Connection, job_id: int, scheduled_time: datetime, reason: str) -> int:
    """A fire not run, with why; a DST gap slot's ``scheduled_time`` is its instant
    of the jump (``schedule.gap_instant``), so the unique constraint holds it once."""
    return _insert(
        conn,
        job_id,
        generation=None,
        scheduled_time=scheduled_time,
        trigger="schedule",
        state="skipped",
        reason=reason,
    )


def queue(conn: sa.Connection, job_id: int, scheduled_time: datetime) -> int | None:
    """A backfilled fire time, waiting for its turn; None if the time already has a run."""
    try:
        with conn.begin_nested():
            return _insert(
                conn,
                job_id,
                generation=None,
                scheduled_time=scheduled_time,
                trigger="backfill",
                state="queued",
            )
    except (RunConflict, IntegrityError):
        return None


BACKFILLED_AFTER_SKIP = "backfilled after a skip: "


def requeue_skipped(conn: sa.Connection, job_id: int, times: list[datetime]) -> list[datetime]:
    """Those of ``times`` recorded ``skipped`` become queued backfill runs on their own
    rows (a skipped fire never ran; the row stays the fire time's one row), the skip's
    reason kept after :data:`BACKFILLED_AFTER_SKIP`. Returns the times requeued."""
    rows = conn.execute(
        sa.text(
            "UPDATE runs SET state = 'queued', trigger = 'backfill', "
            "reason = :prefix || reason "
            "WHERE job_id = :job_id AND state = 'skipped' AND scheduled_time = ANY(:times) "
            "RETURNING scheduled_time"
        ),
        {"job_id": job_id, "times": times, "prefix": BACKFILLED_AFTER_SKIP},
    )
    return sorted(row.scheduled_time for row in rows)


_START_QUEUED = sa.text(
    """
    UPDATE runs SET generation = :generation, state = 'pending'
     WHERE run_id = (SELECT run_id FROM runs WHERE job_id = :job_id AND state = 'queued'
                      ORDER BY scheduled_time LIMIT 1)
       AND state = 'queued'
    RETURNING run_id, scheduled_time
    """
)


def start_queued(conn: sa.Connection, job_id: int, generation: int) -> tuple[int, datetime]:
    """The oldest queued run of the job becomes the pending run of ``generation``."""
    row = conn.execute(_START_QUEUED, {"job_id": job_id, "generation": generation}).one_or_none()
    if row is None:
        raise RunConflict(f"job {job_id}: no queued run to start")
    return row.run_id, row.scheduled_time


def replace_unended(conn: sa.Connection, job_id: int) -> list[int]:
    """Mark the job's unended runs (not queued) replaced: a newer run takes over."""
    rows = conn.execute(
        sa.text(
            """
            UPDATE runs SET state = 'replaced', ended_at = now(),
                            reason = coalesce(reason, 'replaced by a newer run')
             WHERE job_id = :job_id AND generation IS NOT NULL AND NOT (state = ANY(:ended))
            RETURNING run_id
            """
        ),
        {"job_id": job_id, "ended": sorted(ENDED)},
    )
    return [row.run_id for row in rows]


def fresh_retries(conn: sa.Connection, job_id: int) -> bool:
    """A new run of a batch job (``job restart``, a ``--concurrency replace`` fire) gets
    retries of its own ("for that fire only": docs/schedules.md) when no driver of the
    old run may still end: the row is unowned, waiting in backoff or pending. A run
    still owned keeps the count until it ends: its crash, if it comes, is the old run's
    (M4 of safety review 3). Returns whether the count was set back to 0."""
    return (
        conn.execute(
            sa.text(
                "UPDATE distribution SET restarts = 0, crash_times = '{}', updated_at = now() "
                "WHERE job_id = :job_id AND owner IS NULL AND state IN ('backoff', 'pending') "
                "AND (restarts > 0 OR cardinality(crash_times) > 0)"
            ),
            {"job_id": job_id},
        ).rowcount
        == 1
    )


def cancel_queued(conn: sa.Connection, job_id: int) -> int:
    """Queued backfill runs are dropped by a stop: recorded skipped ('stopped')."""
    return conn.execute(
        sa.text(
            "UPDATE runs SET state = 'skipped', reason = 'job stopped before its turn' "
            "WHERE job_id = :job_id AND state = 'queued'"
        ),
        {"job_id": job_id},
    ).rowcount


_COLUMNS = """
    r.run_id, r.scheduled_time, r.trigger, r.state, r.reason, r.created_at, r.started_at,
    r.ended_at, r.exit_code, r.server, r.epoch, r.attempts, r.generation
"""


def view(row: sa.Row) -> dict[str, Any]:
    """A run as ``job runs --json`` and the API show it (times: ISO-8601 UTC with Z)."""
    return {
        "run_id": row.run_id,
        "scheduled_time": _iso(row.scheduled_time),
        "trigger": row.trigger,
        "state": row.state,
        "reason": row.reason,
        "created_at": _iso(row.created_at),
        "started_at": _iso(row.started_at),
        "ended_at": _iso(row.ended_at),
        "exit_code": row.exit_code,
        "server": row.server,
        "epoch": row.epoch,
        "attempts": row.attempts,
    }


def _iso(at: datetime | None) -> str | None:
    """ISO-8601 UTC with Z, as ``schedule.iso`` (not imported: croniter is not needed)."""
    if at is None:
        return None
    return at.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


def list_runs(
    conn: sa.Connection, job_id: int, *, limit: int = 20, state: str | None = None
) -> list[dict[str, Any]]:
    """The job's runs, newest first (by run id); ``state``: only those in it."""
    where = "AND r.state = :state" if state else ""
    rows = conn.execute(
        sa.text(
            f"SELECT {_COLUMNS} FROM runs r WHERE r.job_id = :job_id {where} "
            "ORDER BY r.run_id DESC LIMIT :limit"
        ),
        {"job_id": job_id, "state": state, "limit": limit},
    )
    return [view(row) for row in rows]


def get(conn: sa.Connection, run_id: int) -> dict[str, Any] | None:
    row = conn.execute(
        sa.text(f"SELECT {_COLUMNS} FROM runs r WHERE r.run_id = :run_id"), {"run_id": run_id}
    ).one_or_none()
    return None if row is None else view(row)


def of_claim(conn: sa.Connection, job_id: int, epoch: int) -> dict[str, Any] | None:
    """The run a claim at ``epoch`` started (the trigger wrote the epoch with the claim)."""
    row = conn.execute(
        sa.text(f"SELECT {_COLUMNS} FROM runs r WHERE r.job_id = :job_id AND r.epoch = :epoch"),
        {"job_id": job_id, "epoch": epoch},
    ).one_or_none()
    return None if row is None else view(row)


def of_job(conn: sa.Connection, job_id: int, run_id: int) -> dict[str, Any] | None:
    """The job's run ``run_id``, None if the job has none of that id (another job's, or
    pruned by history retention)."""
    row = conn.execute(
        sa.text(f"SELECT {_COLUMNS} FROM runs r WHERE r.run_id = :run_id AND r.job_id = :job_id"),
        {"run_id": run_id, "job_id": job_id},
    ).one_or_none()
    return None if row is None else view(row)


def last(conn: sa.Connection, job_id: int) -> dict[str, Any] | None:
    """The job's newest run that was not skipped (its outcome for ``job show``)."""
    row = conn.execute(
        sa.text(
            f"SELECT {_COLUMNS} FROM runs r WHERE r.job_id = :job_id AND r.state <> 'skipped' "
            "ORDER BY r.run_id DESC LIMIT 1"
        ),
        {"job_id": job_id},
    ).one_or_none()
    return None if row is None else view(row)
