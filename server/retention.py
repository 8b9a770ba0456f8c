"""History retention: deleting old job events and shipped driver logs.

What is deleted (``prune``), for a cutoff time (:func:`cutoff`: PostgreSQL's ``now()``
minus the retention, never this host's clock, which events' ``at`` was not written
with: a server clock ahead would delete recent history):

- ``job_events`` rows with ``at`` before the cutoff, except the newest event of each job
  that still exists (``jobs.id = job_events.job_id``), so ``sparkring job events`` never
  shows nothing for a live job. Events of deleted jobs go by age alone.
- ``runs`` rows (scheduler/runs.py) that ended (finished, failed, stopped, replaced,
  skipped) before the cutoff, except the newest run of each job (its last outcome).
  A fire time whose row is gone is history: ``fires_checked_until`` has long passed
  it, so no fire handles it again (a backfill of it would run it again).
- shipped driver logs, the objects under ``logs/`` in the bucket
  (``log_shipping.log_key``: ``logs/<name>/<job id>/<epoch>.log``; the older code's
  ``log_shipping.legacy_log_key``: ``logs/<name>/<epoch>.log``) whose LastModified is before
  the cutoff, except the newest log (highest epoch) of each job that still exists, so
  ``sparkring job logs`` still shows its last run. A job exists when its name and id
  do: the logs of a deleted namesake (same name, another id) go by age alone. Older
  code's logs are kept by name (they carry no id).

Events go in batches of ``batch_size`` rows, each batch one short transaction (a
``DELETE ... WHERE id = ANY(ARRAY(SELECT ... ORDER BY id LIMIT n))``): no long transaction, no
lock held between batches. Deleting events takes row locks on ``job_events`` only,
which nothing else updates, so it never blocks a lease renewal or a claim.

A server runs a pass every ``HISTORY_PRUNE_INTERVAL_S`` on a side thread
(:class:`Pruner`) with a connection of its own; the pass holds a PostgreSQL advisory
lock (:data:`LOCK_KEY`), so one server prunes at a time and the others skip that
pass. A failure (PostgreSQL or S3 away) is logged and retried at the next interval:
pruning is housekeeping and never stops a server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from scheduler import loop

if TYPE_CHECKING:
    from resource_center import store

log = logging.getLogger(__name__)

# Shipped driver logs live under this prefix of the bucket (server/log_shipping.log_key).
LOG_PREFIX = "logs/"
# Advisory lock of the retention pass: "retentio" as 8 bytes (sql/migrate.py has its own).
LOCK_KEY = 0x726574656E74696F

# An event may go if it is old and is not the newest event of a job that still exists.
# The NOT EXISTS probes use ix_job_events_job_id_id; ``id > :after`` resumes each batch
# where the last one ended, so the newest events kept at the front are not scanned again.
_PRUNABLE = """
    e.at < :cutoff AND e.id > :after
    AND (
        NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = e.job_id)
        OR EXISTS (SELECT 1 FROM job_events newer
                    WHERE newer.job_id = e.job_id AND newer.id > e.id)
    )
"""
# ``id = ANY(ARRAY(...))``, not ``id IN (...)``: the batch's ids are computed once and
# deleted through the primary key. With IN, PostgreSQL may hash-join the batch against a
# sequential scan of the whole table, for every batch (benchmarks/history_prune.py).
_DELETE_BATCH = sa.text(
    f"""
    DELETE FROM job_events WHERE id = ANY(ARRAY(
        SELECT e.id FROM job_events e WHERE {_PRUNABLE} ORDER BY e.id LIMIT :n
    ))
    RETURNING id
    """
)
_COUNT = sa.text(f"SELECT count(*) FROM job_events e WHERE {_PRUNABLE}")

# A run may go once it ended before the cutoff, unless it is its job's newest.
_RUNS_PRUNABLE = """
    coalesce(r.ended_at, r.created_at) < :cutoff
    AND r.state IN ('finished', 'failed', 'stopped', 'replaced', 'skipped')
    AND EXISTS (SELECT 1 FROM runs newer WHERE newer.job_id = r.job_id
                                             AND newer.run_id > r.run_id)
"""
# The deleted runs' latest fire time is kept on their job (``fires_pruned_until``): a
# backfill must not take a fire time whose run row is gone for one that never ran.
_DELETE_RUNS = sa.text(
    f"""
    WITH gone AS (
        DELETE FROM runs WHERE run_id = ANY(ARRAY(
            SELECT r.run_id FROM runs r WHERE {_RUNS_PRUNABLE} ORDER BY r.run_id LIMIT :n
        ))
        RETURNING job_id, scheduled_time
    ), marked AS (
        UPDATE jobs j
           SET fires_pruned_until = GREATEST(j.fires_pruned_until, g.latest)
          FROM (SELECT job_id, max(scheduled_time) AS latest FROM gone
                 WHERE scheduled_time IS NOT NULL GROUP BY job_id) g
         WHERE j.id = g.job_id
    )
    SELECT job_id FROM gone
    """
)
_COUNT_RUNS = sa.text(f"SELECT count(*) FROM runs r WHERE {_RUNS_PRUNABLE}")

# An alert delivery may go once it was sent (or given up) and written before the
# cutoff; a pending one stays (it gives up by itself after 24 h: docs/alerts.md).
_DELIVERIES_PRUNABLE = "d.created_at < :cutoff AND d.status IN ('delivered', 'failed')"
_DELETE_DELIVERIES = sa.text(
    f"""
    DELETE FROM alert_deliveries WHERE id = ANY(ARRAY(
        SELECT d.id FROM alert_deliveries d WHERE {_DELIVERIES_PRUNABLE} LIMIT :n
    ))
    """
)
_COUNT_DELIVERIES = sa.text(f"SELECT count(*) FROM alert_deliveries d WHERE {_DELIVERIES_PRUNABLE}")


@dataclass(frozen=True)
class Pruned:
    """What one prune deleted (or, with ``dry_run``, would delete)."""

    cutoff: datetime
    dry_run: bool
    events: int  # job events deleted
    event_batches: int  # transactions that deleted events (dry run: that would)
    longest_batch_s: float  # the longest of those transactions, commit included
    logs: int | None  # driver logs deleted; None when the bucket was not touched
    runs: int = 0  # runs rows deleted
    deliveries: int = 0  # alert deliveries deleted (sent or given up)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cutoff(conn: sa.Connection, older_than: float) -> datetime:
    """The time before which history goes: PostgreSQL's ``now()`` minus ``older_than``
    seconds (the clock every event's ``at`` was written with). Leaves ``conn`` outside
    a transaction, as :func:`prune` needs it."""
    before = conn.execute(
        sa.text("SELECT now() - make_interval(secs => :older_than)"), {"older_than": older_than}
    ).scalar_one()
    conn.rollback()
    return before.astimezone(UTC)


def _always() -> bool:
    return True


def prune_events(
    conn: sa.Connection,
    before: datetime,
    *,
    batch_size: int,
    dry_run: bool = False,
    keep_going: Callable[[], bool] = _always,
) -> tuple[int, int, float]:
    """Delete prunable events in batches, committing each: (deleted, batches, longest
    batch in seconds). Stops early, between two batches, once ``keep_going()`` is
    false. ``conn`` must not be inside a transaction."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if dry_run:
        count = conn.execute(_COUNT, {"cutoff": before, "after": 0}).scalar_one()
        conn.rollback()
        return count, -(-count // batch_size), 0.0
    deleted = batches = 0
    longest = 0.0
    after = 0
    while keep_going():
        started = time.monotonic()
        with conn.begin():
            ids = conn.execute(
                _DELETE_BATCH, {"cutoff": before, "after": after, "n": batch_size}
            ).scalars()
            ids = list(ids)
        if not ids:
            return deleted, batches, longest
        longest = max(longest, time.monotonic() - started)
        deleted += len(ids)
        batches += 1
        after = max(ids)
        if len(ids) < batch_size:
            break
    return deleted, batches, longest


def _prune_rows(
    conn: sa.Connection,
    delete: sa.TextClause,
    count: sa.TextClause,
    before: datetime,
    *,
    batch_size: int,
    dry_run: bool,
    keep_going: Callable[[], bool],
) -> int:
    """Run ``delete`` in batches, each committed, until fewer than a batch went (or
    ``count`` once, for a dry run); how many rows. ``conn`` outside a transaction."""
    if dry_run:
        counted = conn.execute(count, {"cutoff": before}).scalar_one()
        conn.rollback()
        return int(counted)
    deleted = 0
    while keep_going():
        with conn.begin():
            rows = conn.execute(delete, {"cutoff": before, "n": batch_size}).rowcount
        deleted += rows
        if rows < batch_size:
            break
    return deleted


def prune_runs(
    conn: sa.Connection,
    before: datetime,
    *,
    batch_size: int,
    dry_run: bool = False,
    keep_going: Callable[[], bool] = _always,
) -> int:
    """Delete ended runs older than ``before`` (not a job's newest), in batches, each
    committed; how many. ``conn`` must not be inside a transaction."""
    return _prune_rows(
        conn, _DELETE_RUNS, _COUNT_RUNS, before,
        batch_size=batch_size, dry_run=dry_run, keep_going=keep_going,
    )  # fmt: skip


def prune_deliveries(
    conn: sa.Connection,
    before: datetime,
    *,
    batch_size: int,
    dry_run: bool = False,
    keep_going: Callable[[], bool] = _always,
) -> int:
    """Delete alert deliveries sent or given up and written before ``before``, in
    batches, each committed; how many. ``conn`` must not be inside a transaction."""
    return _prune_rows(
        conn, _DELETE_DELIVERIES, _COUNT_DELIVERIES, before,
        batch_size=batch_size, dry_run=dry_run, keep_going=keep_going,
    )  # fmt: skip


def prunable_logs(
    listed: Collection[tuple[str, datetime]], before: datetime, existing_jobs: Collection[str]
) -> list[str]:
    """The keys among ``listed`` (key, LastModified) under ``logs/`` that may go: older
    than ``before`` and not the newest log of a job in ``existing_jobs`` (the part of a
    key between ``logs/`` and the epoch: ``<name>/<job id>``, or ``<name>`` for the
    older code's keys; :func:`log_owners`)."""
    newest: dict[str, str] = {}
    for key, _ in listed:
        job = key.removeprefix(LOG_PREFIX).rpartition("/")[0]
        # Epochs are zero-padded (log_shipping.log_key): the largest key is the newest run.
        if job in existing_jobs and key > newest.get(job, ""):
            newest[job] = key
    kept = set(newest.values())
    return sorted(key for key, modified in listed if modified < before and key not in kept)


def log_owners(jobs: Iterable[tuple[str, int]]) -> set[str]:
    """How the shipped logs of existing jobs (name, id) are grouped in their keys: by
    ``<name>/<id>`` (``log_shipping.log_key``) and, for the older code's, by ``<name>``."""
    return {owner for name, job_id in jobs for owner in (name, f"{name}/{job_id}")}


def prune(
    conn: sa.Connection,
    bucket: store.Store | None,
    before: datetime,
    *,
    batch_size: int,
    dry_run: bool = False,
    keep_going: Callable[[], bool] = _always,
) -> Pruned:
    """Prune events, then (when ``bucket`` is given) shipped driver logs, older than
    ``before``. ``conn`` must not be inside a transaction."""
    events, batches, longest = prune_events(
        conn, before, batch_size=batch_size, dry_run=dry_run, keep_going=keep_going
    )
    runs = prune_runs(conn, before, batch_size=batch_size, dry_run=dry_run, keep_going=keep_going)
    deliveries = prune_deliveries(
        conn, before, batch_size=batch_size, dry_run=dry_run, keep_going=keep_going
    )
    logs = None
    if bucket is not None and keep_going():
        existing = log_owners(
            (row.name, row.id) for row in conn.execute(sa.text("SELECT name, id FROM jobs"))
        )
        conn.rollback()
        doomed = prunable_logs(bucket.listed(LOG_PREFIX), before, existing)
        if not dry_run:
            bucket.remove_many(doomed)
        logs = len(doomed)
    return Pruned(before, dry_run, events, batches, round(longest, 6), logs, runs, deliveries)


def run_pass(
    engine: sa.Engine,
    bucket: store.Store | None,
    retention: float,
    *,
    batch_size: int,
    keep_going: Callable[[], bool] = _always,
) -> Pruned | None:
    """One server's retention pass: prune history older than ``retention`` seconds
    while holding :data:`LOCK_KEY`. None when another server holds the lock (it is
    pruning) or retention is 0 (keep forever)."""
    if retention <= 0:
        return None
    with engine.connect() as conn:
        locked = conn.execute(sa.select(sa.func.pg_try_advisory_lock(LOCK_KEY))).scalar_one()
        conn.commit()
        if not locked:
            return None
        try:
            return prune(
                conn,
                bucket,
                cutoff(conn, retention),
                batch_size=batch_size,
                keep_going=keep_going,
            )
        finally:
            conn.rollback()
            conn.execute(sa.select(sa.func.pg_advisory_unlock(LOCK_KEY)))
            conn.commit()


class Pruner(loop.Loop):
    """The side thread of a server that runs a pass (:func:`run_pass`) every
    ``interval`` seconds, the first after ``first_delay``. The pass is given a
    ``keep_going`` callable that turns false on :meth:`stop`, so a long prune ends at
    its next batch. Every failure of a pass is logged and the next pass tries again:
    the thread never ends before :meth:`stop`."""

    def __init__(
        self,
        pass_: Callable[[Callable[[], bool]], Pruned | None],
        *,
        interval: float,
        first_delay: float,
        server: str,
    ) -> None:
        self._pass = pass_
        self._server = server
        super().__init__(
            "history-pruner", join_timeout=10.0, interval=interval, first_wait=first_delay
        )

    def step(self) -> None:
        try:
            pruned = self._pass(lambda: not self.stopping.is_set())
        except Exception as exc:  # PostgreSQL or S3 away: housekeeping waits
            log.warning(
                f"history prune failed, next try in {self.interval:.0f} s: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                extra={"action": "prune_failed", "server": self._server},
            )
            return
        if pruned is not None:
            log.info(
                "history pruned",
                extra={
                    "action": "pruned",
                    "server": self._server,
                    "events": pruned.events,
                    "batches": pruned.event_batches,
                    "logs": pruned.logs,
                    "longest_batch_s": pruned.longest_batch_s,
                },
            )
