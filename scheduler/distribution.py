"""Lease and fencing operations on the distribution table.

Every operation here is one guarded SQL statement (an ``UPDATE`` whose ``WHERE`` names
the caller, its epoch and the legal source states from ``sql/states.py``) that
also appends its event to ``job_events`` in the same statement. Zero rows matched means
the caller no longer holds the job at that epoch, or the transition is illegal: it
raises :class:`FencedError`, never passes silently.

Time comes only from PostgreSQL (``now()``): it is the one clock compared across
machines. A lease is ``lease_until = now() + ttl``; a claim succeeds only on a row
targeted at the caller whose lease is free or expired, and it increments ``epoch``, so
every later write of a previous owner (which carries the old epoch) matches no row.

An owner is one *incarnation* of a server (:class:`Owner`): its id and a token drawn
when the process starts. Claims record both; renewals and every owner write match both,
so two processes with one server id (a restart before the old ZooKeeper session
expired, two hosts with one name) never renew or write each other's leases.

A run's watchdog (``server/watchdog.py``) records how its driver ended itself, for
when its server is stalled or dead at that moment: :func:`finish_by_watchdog`,
:func:`record_crash_by_watchdog` and :func:`defer_by_watchdog` are the same writes,
fenced on the *run* (server and epoch) instead of the owner's incarnation (see
:func:`finish_by_watchdog` for why that is exact).

Lock order: a statement that reads the job's ``desired`` or ``generation`` to decide a
row's next state locks the job row first (``FOR SHARE``), as every operator command in
``scheduler/jobs.py`` does (``FOR UPDATE``) before it touches the distribution row. So
an owner ending a run and a concurrent ``job start``/``restart`` serialize: the release
sees the command, or the command sees the release, never neither (a job is never left
``stopped`` or ``finished`` while a newer start or restart wants it running).

Callers pass a ``sqlalchemy.Connection`` inside a transaction (``engine.begin()``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa

from sql import states
from sql.states import EventKind, RunState


class FencedError(Exception):
    """A write matched no row: the caller's epoch is stale or the transition illegal."""


class NotClaimable(Exception):
    """The job is not free for this server to claim (not targeted here, leased, backoff)."""


@dataclass(frozen=True)
class Owner:
    """One incarnation of a server: who holds a lease."""

    server: str  # the server id (ZooKeeper member name, the row's ``owner``)
    incarnation: str  # drawn once per process start (``owner_incarnation``)

    def params(self) -> dict[str, str]:
        return {"server": self.server, "incarnation": self.incarnation}


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


@dataclass(frozen=True)
class Row:
    """One job as a server sees it when it polls the distribution table."""

    job_id: int
    name: str
    kind: str
    desired: str
    job_generation: int
    max_restarts: int
    target: str | None
    owner: str | None
    owner_incarnation: str | None
    epoch: int
    state: RunState
    generation: int
    restarts: int
    lease_expired: bool
    claimable_now: bool
    # Seconds until the job may become claimable by time alone (another owner's lease
    # expires, or a backoff ends); None when no such time applies.
    due_in: float | None = None
    # The job's current revision and the one its run was claimed with.
    job_revision: int | None = None
    revision: int | None = None
    # The run's attempt (a claim makes it attempt + 1, with epoch + 1).
    attempt: int = 0
    # Warm hand-off (docs/distribution.md): the epoch whose owner offered its target a
    # warm hand-off as it began a planned stop, and the epoch whose hand-off the
    # target's warm driver is ready for (its SparkSession is built). Each names an
    # epoch, so a claim (epoch + 1) makes both stale without a write.
    handoff_epoch: int | None = None
    warm_ready_epoch: int | None = None
    # The job's conf neither opts out (sparkring.handoff.warm=false) nor sets a hook that
    # runs its code before the go signal (PRE_GO_HOOK_CONFS, a -javaagent).
    warm_allowed: bool = True


def _event_cte(kind: str, kind_sql: str | None = None) -> str:
    """SQL that appends one job_events row per row of the ``changed`` CTE; its kind is
    ``kind``, or the SQL expression ``kind_sql`` over ``changed`` when it depends on
    the state written."""
    kind_value = kind_sql or f"'{kind}'"
    return f"""
        , event AS (
            INSERT INTO job_events (job_id, job_name, kind, server, epoch, detail)
            SELECT job_id, name, {kind_value}, :server, epoch, detail FROM changed
        )
    """


# Another server's expired lease is claimed over (:func:`claim`) or reaped (:func:`reap`)
# only ``:hold`` seconds after the later of PostgreSQL's start and the end of the
# cluster's last outage (``cluster_clock``, stamped by every renewal: :func:`renew_leases`).
# Right after either every lease has expired, and its owner, back a moment later, may
# hold the only word on how its driver ended (a batch exit 0, a failure that spends the
# budget: holes H5 and W1). A crash-restart of PostgreSQL, a failover to a standby and
# a network cut of every server do not move the postmaster's start; the clock does.
HELD_OVER = """GREATEST(pg_postmaster_start_time(),
                    COALESCE((SELECT outage_ended_at FROM cluster_clock WHERE id = 1),
                             '-infinity'))
           < now() - make_interval(secs => :hold)"""

# The stamp of every renewal: when the cluster last reached PostgreSQL; a stamp older
# than a lease (``:ttl``) means nobody renewed for that long, so this renewal ends an
# outage. GREATEST: a renewal that began earlier may commit later.
_STAMP_CLOCK = """
    clock AS (
        UPDATE cluster_clock
           SET outage_ended_at = CASE
                   WHEN renewed_at < now() - make_interval(secs => :ttl) THEN now()
                   ELSE outage_ended_at END,
               renewed_at = GREATEST(renewed_at, now())
         WHERE id = 1
    )"""

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
        + _event_cte(EventKind.CLAIMED)
        + "SELECT job_id, name, epoch, attempt, generation, revision FROM changed"
    ).replace("{HELD_OVER}", HELD_OVER)
)


def claim(
    conn: sa.Connection,
    job_id: int,
    owner: Owner,
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
    started and after the cluster's last outage ended (:data:`HELD_OVER`), for the
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
        raise NotClaimable(f"job {job_id} is not claimable by {owner.server}")
    return Claim(row.job_id, row.name, row.epoch, row.attempt, row.generation, row.revision)


def _renew_statement(only_jobs: bool) -> sa.TextClause:
    """Extend the unexpired leases of one incarnation of a server; ``only_jobs``: of
    the jobs in ``:job_ids`` only (a server's local runs). Stamps the cluster's clock
    (:data:`HELD_OVER`) too, with or without a lease to extend."""
    only = "AND job_id = ANY(:job_ids)" if only_jobs else ""
    return sa.text(
        f"""
        WITH {_STAMP_CLOCK}
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


# What a run's watchdog leaves a job in when it records its driver's end.
ENDED_BY_WATCHDOG = frozenset({RunState.FINISHED, RunState.BACKOFF, RunState.FAILED})


def ended_at(conn: sa.Connection, epochs: Mapping[int, int]) -> set[int]:
    """Of ``epochs`` (job id -> epoch of a local run that is still running), the jobs
    whose run at that epoch is recorded ended and unowned (:data:`ENDED_BY_WATCHDOG`):
    its watchdog recorded the driver's exit (0: finished; else a crash)."""
    if not epochs:
        return set()
    rows = conn.execute(
        sa.text(
            "SELECT job_id, epoch FROM distribution "
            "WHERE job_id = ANY(:ids) AND state = ANY(:ended) AND owner IS NULL"
        ),
        {"ids": sorted(epochs), "ended": sorted(ENDED_BY_WATCHDOG)},
    )
    return {r.job_id for r in rows if epochs.get(r.job_id) == r.epoch}


def renew_leases(
    conn: sa.Connection, owner: Owner, ttl: float, job_ids: Iterable[int] | None = None
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


# The state an ended run leaves the job in when a restart was requested meanwhile (the
# job's generation moved past the run's): pending, so the new generation runs.
_RESTART_WINS = "CASE WHEN j.desired = 'running' AND j.generation <> d.generation THEN 'pending' "
# A run that ends while its job is wanted stopped ends 'stopped' (a crash counted first).
_STOP_WINS = "CASE WHEN j.desired = 'stopped' THEN 'stopped' "


def _transition(
    kind: str,
    target: RunState,
    set_clause: str,
    *,
    release: bool,
    detail: str = "jsonb_build_object()",
    guard: str = "",
    state: str | None = None,
    by_watchdog: bool = False,
    after_reap: bool = False,
    kind_sql: str | None = None,
) -> sa.TextClause:
    """One fenced owner write: ``owner``, ``owner_incarnation`` and ``epoch`` must match
    (with ``by_watchdog``: ``owner`` and ``epoch``, the run; :func:`finish_by_watchdog`).

    ``after_reap``: also taken from the owner the coordinator reaped the row from, at
    the same epoch, while nobody has claimed it since (``reaped_from``, migration 0016;
    a claim clears it and bumps the epoch): the outcome of a run whose record its
    owner could not write before its lease expired (:func:`finish`).

    ``state``: an SQL expression for the new state when it depends on the job row
    (default: ``target``). The job row is locked first (see the module docstring)."""
    owner_reset = "owner = NULL, owner_incarnation = NULL, lease_until = NULL," if release else ""
    new_state = state or f"'{target.value}'"
    incarnation = "" if by_watchdog else "AND d.owner_incarnation = :incarnation"
    fence = f"d.owner = :server {incarnation} AND d.state = ANY(:sources)"
    if after_reap:
        fence = (
            f"(({fence}) OR (d.owner IS NULL AND d.reaped_from = :server"
            " AND d.state IN ('pending', 'stopped')))"
        )
    return sa.text(
        f"""
        WITH j AS (
            SELECT id, name, kind, desired, generation, max_restarts, restart_window_s
              FROM jobs WHERE id = :job_id FOR SHARE
        ), changed AS (
            UPDATE distribution d
               SET {owner_reset}
                   state = {new_state},
                   {set_clause}
                   updated_at = now()
              FROM j
             WHERE d.job_id = j.id
               AND d.epoch = :epoch
               AND {fence}
               {guard}
            RETURNING d.job_id, j.name, d.epoch, d.state, d.restarts, {detail} AS detail
        )
        """
        + _event_cte(kind, kind_sql)
        + "SELECT job_id, state, restarts FROM changed"
    )


def _fenced(
    conn: sa.Connection,
    statement: sa.TextClause,
    target: RunState,
    job_id: int,
    fence: Mapping[str, str],
    epoch: int,
    sources: Iterable[RunState] | None = None,
    **params: object,
) -> sa.Row:
    """Run a :func:`_transition`; ``fence``: ``Owner.params()``, or ``{"server": ...}``
    for a statement made ``by_watchdog``."""
    row = conn.execute(
        statement,
        {
            "job_id": job_id,
            **fence,
            "epoch": epoch,
            "sources": sorted(sources) if sources is not None else list(states.sources(target)),
            **params,
        },
    ).one_or_none()
    if row is None:
        raise FencedError(
            f"job {job_id}: {fence['server']} at epoch {epoch} may not move it to {target.value}"
        )
    return row


_MARK_RUNNING = _transition(
    EventKind.DRIVER_STARTED,
    RunState.RUNNING,
    "",
    release=False,
    detail="jsonb_build_object('pid', CAST(:pid AS integer))",
)


def mark_running(conn: sa.Connection, job_id: int, owner: Owner, epoch: int, pid: int) -> None:
    """The owner spawned the driver (its watchdog's pid is recorded in the event)."""
    _fenced(conn, _MARK_RUNNING, RunState.RUNNING, job_id, owner.params(), epoch, pid=pid)


_BEGIN_STOP = _transition(
    EventKind.STOPPING,
    RunState.STOPPING,
    "handoff_epoch = CASE WHEN CAST(:warm AS boolean) THEN d.epoch ELSE NULL END,",
    release=False,
    detail="jsonb_build_object('reason', CAST(:reason AS text))"
    " || CASE WHEN CAST(:warm AS boolean) THEN jsonb_build_object('warm', true)"
    " ELSE '{}'::jsonb END",
)


def begin_stop(
    conn: sa.Connection, job_id: int, owner: Owner, epoch: int, reason: str, *, warm: bool = False
) -> None:
    """The owner starts stopping its driver (migration, stop or restart command).
    ``warm``: a planned move that offers its target a warm hand-off at this epoch
    (``handoff_epoch``; docs/drivers.md, "Warm hand-off")."""
    _fenced(
        conn,
        _BEGIN_STOP,
        RunState.STOPPING,
        job_id,
        owner.params(),
        epoch,
        reason=reason,
        warm=warm,
    )


_MARK_WARM_READY = sa.text(
    """
    UPDATE distribution
       SET warm_ready_epoch = epoch, updated_at = now()
     WHERE job_id = :job_id
       AND target = :server
       AND epoch = :epoch
       AND handoff_epoch = :epoch
       AND state = 'stopping'
    RETURNING job_id
    """
)


def mark_warm_ready(conn: sa.Connection, job_id: int, server: str, epoch: int) -> None:
    """The target's warm driver for the hand-off of the run at ``epoch`` has built its
    SparkSession, or will not (it could not be launched): its old owner may stop now.
    Only the target of a standing offer may say so; it changes no lease and no state
    (the old owner still holds the epoch)."""
    if conn.execute(_MARK_WARM_READY, {"job_id": job_id, "server": server, "epoch": epoch}).first():
        return
    raise FencedError(f"job {job_id}: no warm hand-off of epoch {epoch} offered to {server}")


_RELEASE = _transition(
    EventKind.RELEASED,
    RunState.PENDING,
    "",
    release=True,
    state="CASE WHEN j.desired = 'running' THEN 'pending' ELSE 'stopped' END",
    detail="jsonb_build_object('state', CASE WHEN j.desired = 'running' "
    "THEN 'pending' ELSE 'stopped' END)",
)


def release(conn: sa.Connection, job_id: int, owner: Owner, epoch: int) -> RunState:
    """Give the job up after its driver ended: ``pending`` if it is still wanted running
    (handoff, restart, lost lease), else ``stopped``. Decided in SQL from the job's
    desired state, read under the job row's lock, so a start racing with a stop is
    never lost."""
    row = conn.execute(
        _RELEASE,
        {
            "job_id": job_id,
            **owner.params(),
            "epoch": epoch,
            "sources": sorted(states.OWNED),
        },
    ).one_or_none()
    if row is None:
        raise FencedError(f"job {job_id}: {owner.server} at epoch {epoch} may not release it")
    return RunState(row.state)


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
    + _event_cte(EventKind.ADOPTED)
    + "SELECT job_id, state FROM changed"
)


def adopt(
    conn: sa.Connection, job_id: int, previous: Owner, successor: Owner, epoch: int, ttl: float
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
        raise FencedError(
            f"job {job_id}: the lease at epoch {epoch} is no longer {previous.server}'s "
            f"incarnation {previous.incarnation} (expired or taken)"
        )
    return RunState(row.state)


def _defer_statement(*, by_watchdog: bool) -> sa.TextClause:
    return _transition(
        EventKind.DEFERRED,
        RunState.BACKOFF,
        """last_error = :error,
           not_before = now() + make_interval(secs => :delay),""",
        release=True,
        detail="jsonb_strip_nulls(jsonb_build_object("
        "'error', CAST(:error AS text), 'cause', CAST(:cause AS text)))",
        # A stop asked while the start was prepared wins: backoff would wait to run a
        # job nobody wants running, unowned and never claimed again, for ever.
        state=_STOP_WINS + "ELSE 'backoff' END",
        by_watchdog=by_watchdog,
        after_reap=True,
    )


_DEFER = _defer_statement(by_watchdog=False)
_DEFER_BY_WATCHDOG = _defer_statement(by_watchdog=True)


def defer(
    conn: sa.Connection,
    job_id: int,
    owner: Owner,
    epoch: int,
    error: str,
    delay: float,
    *,
    cause: str | None = None,
) -> None:
    """The driver could not be started for a passing reason (S3 unreachable, PostgreSQL
    restarting, no memory for a process, no Spark master answering): release the job
    for ``delay`` seconds without counting a restart. Never FAILED for this. ``cause``
    (e.g. ``spark-master-unreachable``) goes into the event's detail: a cause outside
    this server is not held against it (``coordinator.deferring``)."""
    _fenced(
        conn,
        _DEFER,
        RunState.BACKOFF,
        job_id,
        owner.params(),
        epoch,
        error=error[-2000:],
        delay=delay,
        cause=cause,
    )


def defer_by_watchdog(
    conn: sa.Connection,
    job_id: int,
    server: str,
    epoch: int,
    error: str,
    delay: float,
    *,
    cause: str,
) -> RunState:
    """:func:`defer`, written by the run's watchdog when its driver exited before it
    could register with a Spark master and no master answers (an outage of the cluster
    manager is not the job's failure): fenced on the run (``server`` and ``epoch``) as
    :func:`finish_by_watchdog` is, and for the same reason. No restart is counted."""
    row = _fenced(
        conn,
        _DEFER_BY_WATCHDOG,
        RunState.BACKOFF,
        job_id,
        {"server": server},
        epoch,
        error=error[-2000:],
        delay=delay,
        cause=cause,
    )
    return RunState(row.state)


def _finish_statement(*, by_watchdog: bool) -> sa.TextClause:
    return _transition(
        EventKind.FINISHED,
        RunState.FINISHED,
        "last_error = NULL,",
        release=True,
        state=_RESTART_WINS + "ELSE 'finished' END",
        detail="jsonb_build_object('exit_code', 0)",
        by_watchdog=by_watchdog,
        after_reap=True,
    )


_FINISH = _finish_statement(by_watchdog=False)
_FINISH_BY_WATCHDOG = _finish_statement(by_watchdog=True)


def finish(conn: sa.Connection, job_id: int, owner: Owner, epoch: int) -> RunState:
    """A batch driver exited 0: the job is done and is never run again by failover.

    Returns ``finished``, or ``pending`` when a restart was requested while the driver
    ran (the restart's new generation runs)."""
    state = _fenced(conn, _FINISH, RunState.FINISHED, job_id, owner.params(), epoch).state
    return RunState(state)


def finish_by_watchdog(conn: sa.Connection, job_id: int, server: str, epoch: int) -> RunState:
    """:func:`finish`, written by the run's watchdog: fenced on the run (``server`` and
    ``epoch``), not on an incarnation of the server.

    Why that is exact. A watchdog speaks for one run: the driver launched for the claim
    that gave the row ``epoch`` (a claim launches one driver; adoption launches none).
    Every claim increments the epoch. The one write that changes the owner of a lease
    without ending it, :func:`adopt`, keeps the server and the epoch and replaces only
    the incarnation, and a server adopts only the run whose watchdog it found alive in
    its work dir: this very run. So a row owned by ``server`` at ``epoch`` in an owned
    state is still this run's lease, whichever incarnation supervises it now; once the
    run's end is recorded (by its server or by its watchdog), or the lease is released,
    reaped or claimed anew, no row matches and nothing is written. Fenced on the
    incarnation that launched the run, as before, the write of every adopted run was
    refused, and a batch run adopted by a restart whose server then stalled or died as
    it exited 0 ran again (hole H2 of the safety review). The incarnation fence keeps
    two *processes* with one server id from writing each other's leases; a watchdog is
    neither of them, and the end of its driver is a fact whichever of them holds the
    lease."""
    state = _fenced(
        conn, _FINISH_BY_WATCHDOG, RunState.FINISHED, job_id, {"server": server}, epoch
    ).state
    return RunState(state)


# The crashes that count against a job's budget (``j``: its jobs row, ``d``: its
# distribution row): those inside its restart window, by PostgreSQL's clock, for a
# streaming job with a window; else every one since the count was last reset (a
# batch run's retries, a window of 0). ``_KEPT`` is the window's crashes, to which
# the new one is appended. See docs/drivers.md, "The restart window".
_WINDOWED = "j.kind = 'streaming' AND j.restart_window_s > 0"
_KEPT = f"""(CASE WHEN {_WINDOWED}
    THEN ARRAY(SELECT c.at FROM unnest(d.crash_times) AS c(at)
                WHERE c.at > now() - make_interval(secs => j.restart_window_s) ORDER BY c.at)
    ELSE d.crash_times END)"""
IN_WINDOW = f"(CASE WHEN {_WINDOWED} THEN cardinality({_KEPT}) ELSE d.restarts END)"
# A crash counted: ``restarts`` is the count with it, ``crash_times`` the window with it.
SPEND = f"restarts = {IN_WINDOW} + 1, crash_times = {_KEPT} || now(),"


def _crash_statements(*, by_watchdog: bool) -> tuple[sa.TextClause, sa.TextClause]:
    """The crash writes: to backoff (a restart left), and to failed."""
    backoff = _transition(
        EventKind.CRASHED,
        RunState.BACKOFF,
        f"""{SPEND}
           last_error = :error,
           not_before = now() + make_interval(
               secs => least(:backoff_max, :backoff_base * power(2, {IN_WINDOW}))),""",
        release=True,
        # next: backoff, or stopped when its operator stopped it meanwhile.
        detail="jsonb_build_object('error', CAST(:error AS text), 'next', d.state)",
        guard=f"AND {IN_WINDOW} < j.max_restarts",
        # The failure counts; a job its operator stopped meanwhile stays stopped.
        state=_STOP_WINS + "ELSE 'backoff' END",
        by_watchdog=by_watchdog,
        after_reap=True,
    )
    failed = _transition(
        EventKind.FAILED,
        RunState.FAILED,
        "last_error = :error,",
        release=True,
        state=_RESTART_WINS + "WHEN j.desired = 'stopped' THEN 'stopped' ELSE 'failed' END",
        detail="jsonb_build_object('error', CAST(:error AS text), 'cause', CAST(:cause AS text),"
        " 'next', d.state)",
        by_watchdog=by_watchdog,
        after_reap=True,
        # ``failed`` only when the job ends FAILED; a restart or a stop asked meanwhile
        # wins (pending, stopped): the run crashed, the job did not fail.
        kind_sql=f"CASE WHEN state = 'failed' THEN '{EventKind.FAILED.value}' "
        f"ELSE '{EventKind.CRASHED.value}' END",
    )
    return backoff, failed


_CRASH = _crash_statements(by_watchdog=False)
_CRASH_BY_WATCHDOG = _crash_statements(by_watchdog=True)


def record_crash(
    conn: sa.Connection,
    job_id: int,
    owner: Owner,
    epoch: int,
    error: str,
    *,
    retry: bool,
    backoff_base: float,
    backoff_max: float,
    cause: str = "driver",
) -> RunState:
    """A driver exited abnormally, or the job cannot be started (``cause`` says which:
    ``driver`` or ``invalid``); release the job.

    With ``retry`` and restarts left (fewer than ``max_restarts`` crashes counted:
    :data:`IN_WINDOW`) the job goes to ``backoff`` for
    ``min(backoff_max, backoff_base * 2**counted)`` seconds, else to
    ``failed`` with ``last_error`` (``pending`` if a restart was requested meanwhile).
    The choice is made in SQL from the row itself.
    """
    return _record_crash(
        conn,
        _CRASH,
        job_id,
        owner.params(),
        epoch,
        error,
        retry=retry,
        backoff_base=backoff_base,
        backoff_max=backoff_max,
        cause=cause,
    )


def record_crash_by_watchdog(
    conn: sa.Connection,
    job_id: int,
    server: str,
    epoch: int,
    error: str,
    *,
    backoff_base: float,
    backoff_max: float,
) -> RunState:
    """:func:`record_crash` of a driver that exited nonzero (``retry``, ``cause``
    ``driver``), written by the run's watchdog: fenced on the run (``server`` and
    ``epoch``) as :func:`finish_by_watchdog` is, and for the same reason. Once either
    this or the server's own :func:`record_crash` is committed the job is unowned, so
    the other matches no row: a crash is counted once (hole H5 of the safety review:
    a failure while the server was stalled or dead used to be counted by nobody, and
    the job ran again past its budget)."""
    return _record_crash(
        conn,
        _CRASH_BY_WATCHDOG,
        job_id,
        {"server": server},
        epoch,
        error,
        retry=True,
        backoff_base=backoff_base,
        backoff_max=backoff_max,
        cause="driver",
    )


def _record_crash(
    conn: sa.Connection,
    statements: tuple[sa.TextClause, sa.TextClause],
    job_id: int,
    fence: Mapping[str, str],
    epoch: int,
    error: str,
    *,
    retry: bool,
    backoff_base: float,
    backoff_max: float,
    cause: str,
) -> RunState:
    to_backoff, to_failed = statements
    params = {"error": error[-2000:], "backoff_base": backoff_base, "backoff_max": backoff_max}
    if retry:
        try:
            conn.execute(sa.text("SAVEPOINT crash"))
            _fenced(
                conn,
                to_backoff,
                RunState.BACKOFF,
                job_id,
                fence,
                epoch,
                sources=states.CRASH_SOURCES,
                **params,
            )
            conn.execute(sa.text("RELEASE SAVEPOINT crash"))
            return RunState.BACKOFF
        except FencedError:
            conn.execute(sa.text("ROLLBACK TO SAVEPOINT crash"))
    row = _fenced(
        conn,
        to_failed,
        RunState.FAILED,
        job_id,
        fence,
        epoch,
        sources=states.CRASH_SOURCES,
        error=params["error"],
        cause=cause,
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
        + _event_cte(EventKind.REAPED)
        + "SELECT job_id, owner, epoch FROM changed"
    ).replace("{HELD_OVER}", HELD_OVER)
)


def reap(
    conn: sa.Connection, live: Iterable[str], server: str, *, hold: float = 0.0
) -> list[tuple[int, str, int]]:
    """Clear the owner of jobs whose owner left the registry and whose lease expired.

    ``server`` is the reaper (the coordinator), recorded in the events. Returns
    (job id, former owner, epoch) of every row reaped. The job rows are locked first
    (module docstring), so a command committed meanwhile decides pending or stopped.

    Nothing is reaped until ``hold`` seconds after PostgreSQL started and after the
    cluster's last outage ended (:data:`HELD_OVER`). Through an outage of PostgreSQL
    (or of the network to it) past the lease every lease expires and every server withdraws
    from ZooKeeper, so right after it every owner looks lost; but the owners are alive,
    and one may hold the only word on how its driver ended meanwhile (a batch driver
    that exited 1 while nothing could be recorded). Reaped first, that run would run
    again past its budget (hole H5). In ``hold`` every live owner renews, registers
    again and records what it knows; the reap then takes only what the dead held.
    """
    rows = conn.execute(_REAP, {"live": sorted(set(live)), "server": server, "hold": hold})
    return [(row.job_id, row.owner, row.epoch) for row in rows]


# Spark confs that run the job's own code while the driver's session is built, that is
# before a warm driver's go signal (docs/drivers.md, "Warm hand-off"): a job that sets one
# moves cold. So does one whose driver's JVM options load a Java agent.
PRE_GO_HOOK_CONFS = (
    "spark.plugins",
    "spark.driver.plugins",
    "spark.extraListeners",
    "spark.sql.queryExecutionListeners",
    "spark.sql.streaming.streamingQueryListeners",
)
_HOOKS = ", ".join(f"'{name}'" for name in PRE_GO_HOOK_CONFS)
WARM_ALLOWED = f"""(COALESCE(j.conf ->> 'sparkring.handoff.warm', 'true') <> 'false'
           AND NOT jsonb_exists_any(j.conf, ARRAY[{_HOOKS}])
           AND strpos(COALESCE(j.conf ->> 'spark.driver.extraJavaOptions', ''),
                      '-javaagent') = 0)"""

# This server's rows first (both indexes), then their jobs by primary key: a plain join
# made the planner scan every job (15 ms -> 3 ms at 100,000 jobs, docs/benchmarks.md).
_POLL = sa.text(
    f"""
    WITH mine AS MATERIALIZED (
        SELECT * FROM distribution
         WHERE target = :server OR owner = :server OR job_id = ANY(:also)
    )
    SELECT d.job_id, j.name, j.kind, j.desired, j.generation AS job_generation,
           j.max_restarts, d.target, d.owner, d.owner_incarnation, d.epoch, d.state,
           d.generation, j.revision AS job_revision, d.revision,
           d.restarts, d.attempt, d.handoff_epoch, d.warm_ready_epoch,
           {WARM_ALLOWED} AS warm_allowed,
           (d.lease_until IS NOT NULL AND d.lease_until < now()) AS lease_expired,
           (d.not_before IS NULL OR d.not_before <= now()) AS claimable_now,
           CAST(EXTRACT(EPOCH FROM CASE
               WHEN d.owner IS NOT NULL
                    AND (d.owner <> :server OR d.owner_incarnation <> :incarnation)
                   THEN d.lease_until - now()
               WHEN d.owner IS NULL THEN d.not_before - now()
           END) AS double precision) AS due_in
      FROM mine d
      JOIN jobs j ON j.id = d.job_id
     WHERE j.id = ANY(ARRAY(SELECT job_id FROM mine))
     ORDER BY d.job_id
    """
)


def poll(conn: sa.Connection, owner: Owner, also: Iterable[int] = ()) -> list[Row]:
    """Every job targeted at or owned by the server (any incarnation of it), and the
    jobs ``also`` (its local runs: a run's row that moved on is read, not missing):
    what its poll loop acts on. ``due_in`` counts down another owner's lease, a previous
    incarnation's included."""
    return [
        Row(
            job_id=r.job_id,
            name=r.name,
            kind=r.kind,
            desired=r.desired,
            job_generation=r.job_generation,
            max_restarts=r.max_restarts,
            target=r.target,
            owner=r.owner,
            owner_incarnation=r.owner_incarnation,
            epoch=r.epoch,
            state=RunState(r.state),
            generation=r.generation,
            restarts=r.restarts,
            lease_expired=r.lease_expired,
            claimable_now=r.claimable_now,
            due_in=r.due_in,
            job_revision=r.job_revision,
            revision=r.revision,
            attempt=r.attempt,
            handoff_epoch=r.handoff_epoch,
            warm_ready_epoch=r.warm_ready_epoch,
            warm_allowed=r.warm_allowed,
        )
        for r in conn.execute(_POLL, {**owner.params(), "also": sorted(also)})
    ]


def holds(conn: sa.Connection, job_id: int, owner: Owner, epoch: int) -> bool:
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
