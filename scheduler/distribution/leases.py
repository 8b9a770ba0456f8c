"""Taking and keeping a lease on a job's run: claim, driver started, renew, adopt, reap.

A lease is ``lease_until = now() + ttl`` by PostgreSQL's clock. A claim succeeds only on
a row targeted at the caller whose lease is free or expired, and it increments
``epoch``, so every later write of a previous owner (which carries the old epoch) matches
no row. Renewals extend only the unexpired leases of one incarnation; an adoption hands a
live lease to the next incarnation of the same server; the coordinator reaps the expired
leases of servers that left. Claims over another server's lease and reaps wait for the
cluster clock hold (``clock.HELD_OVER``). Also the reads of one lease: :func:`holds`,
:func:`lease_remaining`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa

from scheduler.distribution import clock, fencing
from sql import states
from sql.states import EventKind, RunState


@dataclass(frozen=True)
class Claim:
    job_id: int
    name: str
    epoch: int
    attempt: int
    generation: int
    # The job revision this run starts from (scheduler/jobs.py): the current one, except
    # that a batch job re-run in the generation it ran in keeps that run's revision.
    revision: int | None = None


_CLAIM = sa.text(
    (
        """
    WITH j AS (
        SELECT id, name, kind, desired, generation, revision, max_restarts
          FROM jobs WHERE id = :job_id FOR SHARE
    ), changed AS (
        UPDATE distribution d
           SET owner = :server,
               owner_incarnation = :incarnation,
               epoch = d.epoch + 1,
               lease_until = now() + make_interval(secs => :ttl),
               state = 'starting',
               attempt = d.attempt + 1,
               generation = j.generation,
               revision = CASE
                   WHEN j.kind = 'batch' AND d.generation = j.generation
                        AND d.revision IS NOT NULL THEN d.revision
                   ELSE j.revision END,
               started_at = now(),
               not_before = NULL,
               reaped_from = NULL,
               updated_at = now()
          FROM j, (SELECT owner AS prior_owner FROM distribution WHERE job_id = :job_id) o
         WHERE d.job_id = j.id
           AND d.target = :server
           AND j.desired = 'running'
           AND d.state = ANY(:sources)
           AND (
                (d.owner IS NULL AND d.state = ANY(:claimable)
                 AND (d.not_before IS NULL OR d.not_before <= now()))
             OR (d.owner IS NOT NULL AND d.lease_until < now()
                 AND (d.owner = :server OR {HELD_OVER}))
           )
        RETURNING d.job_id, j.name, d.epoch, d.attempt, d.generation, d.revision,
                  jsonb_build_object('attempt', d.attempt, 'revision', d.revision)
                  -- Another server's expired lease taken over: its owner was lost (an
                  -- alert's failed_over, migration 0013). Informative only.
                  || CASE WHEN o.prior_owner <> :server
                          THEN jsonb_build_object('taken_over_from', o.prior_owner)
                          ELSE '{}'::jsonb END
                  -- A warm driver takes the run (docs/drivers.md, "Warm hand-off").
                  || CASE WHEN CAST(:warm AS boolean)
                          THEN jsonb_build_object('warm', true)
                          ELSE '{}'::jsonb END AS detail
    )
    """
        + fencing.event_cte(EventKind.CLAIMED)
        + "SELECT job_id, name, epoch, attempt, generation, revision FROM changed"
    ).replace("{HELD_OVER}", clock.HELD_OVER)
)


def claim(
    conn: sa.Connection,
    job_id: int,
    owner: fencing.Owner,
    ttl: float,
    *,
    hold: float = 0.0,
    warm: bool = False,
) -> Claim:
    """Take the job: ``epoch + 1`` and a lease from PostgreSQL's clock.

    Succeeds only when the job is targeted at ``server``, desired running, and either
    unowned and claimable (pending, or backoff past ``not_before``) or owned under an
    expired lease (the previous owner was lost: a batch job runs again, attempt + 1).
    Records the revision the run starts from (:attr:`Claim.revision`).

    Another server's expired lease is taken over only ``hold`` seconds after PostgreSQL
    started and after the cluster's last outage ended (:data:`clock.HELD_OVER`), for the
    reason :func:`reap` waits: right after an outage every lease has expired, and its
    live owner may hold the only record of how its driver ended.

    ``warm``: a warm driver waits here for this claim; said in the ``claimed`` event.
    """
    row = conn.execute(
        _CLAIM,
        {
            "job_id": job_id,
            **owner.params(),
            "ttl": ttl,
            "hold": hold,
            "warm": warm,
            "sources": list(states.sources(RunState.STARTING)),
            "claimable": sorted(states.CLAIMABLE),
        },
    ).one_or_none()
    if row is None:
        raise fencing.NotClaimable(f"job {job_id} is not claimable by {owner.server}")
    return Claim(row.job_id, row.name, row.epoch, row.attempt, row.generation, row.revision)


def _renew_statement(only_jobs: bool) -> sa.TextClause:
    """Extend the unexpired leases of one incarnation of a server; ``only_jobs``: of
    the jobs in ``:job_ids`` only (a server's local runs). Stamps the cluster's clock
    (:data:`clock.HELD_OVER`) too, with or without a lease to extend."""
    only = "AND job_id = ANY(:job_ids)" if only_jobs else ""
    return sa.text(
        f"""
        WITH {clock.STAMP_CLOCK}
        UPDATE distribution
           SET lease_until = now() + make_interval(secs => :ttl)
         WHERE owner = :server
           AND owner_incarnation = :incarnation
           AND lease_until > now()
           {only}
        RETURNING job_id, epoch
        """
    )


_RENEW = _renew_statement(only_jobs=False)
_RENEW_JOBS = _renew_statement(only_jobs=True)


def renew_leases(
    conn: sa.Connection, owner: fencing.Owner, ttl: float, job_ids: Iterable[int] | None = None
) -> dict[int, int]:
    """Extend every unexpired lease of this incarnation of a server in one statement;
    with ``job_ids``, only the leases of those jobs.

    Returns job id -> epoch of the leases renewed. A lease that had already expired is
    not renewed: another server may claim it, and the local watchdog has killed (or is
    about to kill) its driver. The runner renews the leases of its local runs only: a
    lease it holds without knowing it (a claim whose commit outcome was lost with the
    connection) must expire, not be held for ever with no driver behind it.
    """
    if job_ids is None:
        rows = conn.execute(_RENEW, {**owner.params(), "ttl": ttl})
    else:
        rows = conn.execute(_RENEW_JOBS, {**owner.params(), "ttl": ttl, "job_ids": sorted(job_ids)})
    return {row.job_id: row.epoch for row in rows}


_MARK_RUNNING = fencing.transition(
    EventKind.DRIVER_STARTED,
    RunState.RUNNING,
    "",
    release=False,
    detail="jsonb_build_object('pid', CAST(:pid AS integer))",
)


def mark_running(
    conn: sa.Connection, job_id: int, owner: fencing.Owner, epoch: int, pid: int
) -> None:
    """The owner spawned the driver (its watchdog's pid is recorded in the event)."""
    fencing.fenced(conn, _MARK_RUNNING, RunState.RUNNING, job_id, owner.params(), epoch, pid=pid)


_ADOPT = sa.text(
    """
    WITH j AS (
        SELECT id, name FROM jobs WHERE id = :job_id FOR SHARE
    ), changed AS (
        UPDATE distribution d
           SET owner_incarnation = :new_incarnation,
               lease_until = now() + make_interval(secs => :ttl),
               updated_at = now()
          FROM j
         WHERE d.job_id = j.id
           AND d.owner = :server
           AND d.owner_incarnation = :incarnation
           AND d.epoch = :epoch
           AND d.lease_until > now()
           AND d.state = ANY(:sources)
        RETURNING d.job_id, j.name, d.epoch, d.state,
                  jsonb_build_object('from_incarnation', CAST(:incarnation AS text)) AS detail
    )
    """
    + fencing.event_cte(EventKind.ADOPTED)
    + "SELECT job_id, state FROM changed"
)


def adopt(
    conn: sa.Connection,
    job_id: int,
    previous: fencing.Owner,
    successor: fencing.Owner,
    epoch: int,
    ttl: float,
) -> RunState:
    """Hand a live lease of ``previous`` to ``successor``, another incarnation of the same
    server (a restart on the same host that found the run's watchdog alive): the driver
    keeps running, nothing is claimed again, the epoch stays. Only a lease still held by
    ``previous`` at ``epoch`` and not expired can be adopted: an expired lease may have
    been claimed elsewhere, and its driver is dead by then (its watchdog's deadline).
    Returns the job's state (``starting``, ``running`` or ``stopping``)."""
    if previous.server != successor.server:
        raise ValueError("a lease is adopted only by another incarnation of the same server")
    row = conn.execute(
        _ADOPT,
        {
            "job_id": job_id,
            **previous.params(),
            "new_incarnation": successor.incarnation,
            "epoch": epoch,
            "ttl": ttl,
            "sources": sorted(states.OWNED),
        },
    ).one_or_none()
    if row is None:
        raise fencing.FencedError(
            f"job {job_id}: the lease at epoch {epoch} is no longer {previous.server}'s "
            f"incarnation {previous.incarnation} (expired or taken)"
        )
    return RunState(row.state)


_REAP = sa.text(
    (
        """
    WITH lost AS (
        SELECT job_id, owner FROM distribution
         WHERE owner IS NOT NULL AND NOT (owner = ANY(:live)) AND lease_until < now()
           AND {HELD_OVER}
    ), j AS (
        SELECT id, name, desired FROM jobs
         WHERE id IN (SELECT job_id FROM lost) ORDER BY id FOR SHARE
    ), changed AS (
        UPDATE distribution d
           SET owner = NULL,
               owner_incarnation = NULL,
               lease_until = NULL,
               reaped_from = lost.owner,
               state = CASE WHEN j.desired = 'running' THEN 'pending' ELSE 'stopped' END,
               updated_at = now()
          FROM j, lost
         WHERE j.id = d.job_id
           AND d.job_id = lost.job_id
           AND d.owner = lost.owner
           AND d.lease_until < now()
        RETURNING d.job_id, j.name, d.epoch, lost.owner,
                  jsonb_build_object('owner', lost.owner) AS detail
    )
    """
        + fencing.event_cte(EventKind.REAPED)
        + "SELECT job_id, owner, epoch FROM changed"
    ).replace("{HELD_OVER}", clock.HELD_OVER)
)


def reap(
    conn: sa.Connection, live: Iterable[str], server: str, *, hold: float = 0.0
) -> list[tuple[int, str, int]]:
    """Clear the owner of jobs whose owner left the registry and whose lease expired.

    ``server`` is the reaper (the coordinator), recorded in the events. Returns
    (job id, former owner, epoch) of every row reaped. The job rows are locked first
    (the package docstring's lock order), so a command committed meanwhile decides
    pending or stopped.

    Nothing is reaped until ``hold`` seconds after PostgreSQL started and after the
    cluster's last outage ended (:data:`clock.HELD_OVER`). Through an outage of PostgreSQL
    (or of the network to it) past the lease every lease expires and every server withdraws
    from ZooKeeper, so right after it every owner looks lost; but the owners are alive,
    and one may hold the only word on how its driver ended meanwhile (a batch driver
    that exited 1 while nothing could be recorded). Reaped first, that run would run
    again past its budget (hole H5). In ``hold`` every live owner renews, registers
    again and records what it knows; the reap then takes only what the dead held.
    """
    rows = conn.execute(_REAP, {"live": sorted(set(live)), "server": server, "hold": hold})
    return [(row.job_id, row.owner, row.epoch) for row in rows]


def holds(conn: sa.Connection, job_id: int, owner: fencing.Owner, epoch: int) -> bool:
    """Whether ``owner`` holds the job's run at ``epoch``, starting or running (a read: the
    answer may change right after; writes stay fenced on their own)."""
    return (
        conn.execute(
            sa.text(
                "SELECT 1 FROM distribution WHERE job_id = :job_id AND owner = :server"
                " AND owner_incarnation = :incarnation AND epoch = :epoch"
                " AND state IN ('starting', 'running')"
            ),
            {"job_id": job_id, "epoch": epoch, **owner.params()},
        ).first()
        is not None
    )


def lease_remaining(conn: sa.Connection, job_id: int) -> float | None:
    """Seconds left on the job's lease by PostgreSQL's clock (negative: expired)."""
    value = conn.execute(
        sa.text(
            "SELECT EXTRACT(EPOCH FROM lease_until - now()) FROM distribution WHERE job_id = :j"
        ),
        {"j": job_id},
    ).scalar_one_or_none()
    return None if value is None else float(value)
