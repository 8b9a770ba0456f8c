"""The coordinator: decides job targets and writes the ones that changed.

One server at a time is coordinator, elected through ZooKeeper with a *term* that only
grows (``registry``). Before its first write it records that term in the one-row
``coordinator`` table (:func:`become`); every rebalance locks that row and checks the
term, so a deposed coordinator (a newer term was recorded) writes nothing: PostgreSQL
rejects it with :class:`DeposedError`.

A rebalance is idempotent and resumable: it reads every job's current target and owner,
computes a *sticky* placement (``placement.stick``: a job stays where it is unless its
server left, drains or lost capacity, or a server joined and the streaming job belongs
to it) and writes only the rows whose target or pending reason differ, in one
transaction with a new ring generation. A coordinator that dies halfway commits
nothing; the next one recomputes the same answer. Targets are the only thing it writes
about jobs (plus reaping departed owners' expired leases): owners and epochs belong to
the servers.

Membership memory lives in PostgreSQL (``ring_members``), so a new coordinator after a
failover tells joiners from known servers exactly as the old one did:

    unknown -> member (settling)   first seen placeable; joined_at = now()
    settling -> joining            joined_at + settle window passed: the streaming jobs
                                   whose ideal target it is move to it, gently (below)
    joining -> settled             the last move of its join was made
    member -> left                 no longer placeable (left, drained, capacity 0):
                                   left_at = now(); its jobs are placed elsewhere at once
    left -> member (unchanged)     back within the settle window or the hold: a blip or
                                   an adopting restart, nothing moves to it
    left -> member (settled)       back later, after any fault: a return, never a join;
                                   it takes back no running job (one fault, one restart)
    drained -> member (settling)   an operator's undrain is a join again

A join is gentle (``scheduler/residency.py``, with ``residency`` set): it moves only
jobs that ran healthily on their server for the minimum residency, at most one move per
server at a time; a move it defers keeps the join open (``settled`` false) and a later
rebalance makes it. The coordinator wakes when the first deferred job matures.

A live server may still fail its jobs: cut off from PostgreSQL only, it stays in
ZooKeeper, its leases lapse and its watchdogs kill its drivers, but its targets would
stay (H7). So a job whose *live* owner's lease has been expired for longer than the
``lapse`` grace is placed elsewhere (:func:`lapsed`; the new target claims over the
expired lease), and a live server whose every lease lapsed that long is not placeable
at all (:func:`not_renewing`) until it renews again. The grace only counts while the
coordinator itself has reached PostgreSQL for that long (``server/coordinator_loop.py``):
after an outage of PostgreSQL itself every lease has lapsed, and every owner re-claims
its own jobs at its next poll. In the same way a server that deferred a job
``defer_streak`` times with no driver started since (:func:`deferring`: a full work
dir, a broken spark-submit; it would claim and defer it for ever) is avoided for that
job for ``defer_window`` seconds.

While any member is settling, *new* jobs wait (orphaned jobs never wait), so that
servers starting seconds apart do not make a job hop. ``sparkring ring rebalance`` sets
``coordinator.rebalance_requested_at``; the next rebalance moves every streaming job to
a freshly balanced target and clears it.

The server's coordinator loop (``server/coordinator_loop.py``) runs rebalances with a
:class:`RebalancePolicy` on a named thread, woken by membership or job changes
(debounced), when a settle window ends, and by a periodic timer as a fallback.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa

from scheduler import distribution, notify, placement, residency
from sql import states

log = logging.getLogger(__name__)


class DeposedError(Exception):
    """A newer coordinator term is recorded: this coordinator must write nothing."""


def become(conn: sa.Connection, term: int, server: str) -> None:
    """Record ``term`` as the current coordinator term.

    It must be newer than the recorded one, or the same term of the same server: a
    coordinator that stepped down during a short ZooKeeper disconnection and is elected
    again with the same election node (same term) resumes its term."""
    recorded = conn.execute(
        sa.text(
            """
            UPDATE coordinator SET term = :term, server = :server, updated_at = now()
             WHERE id = 1 AND (term < :term OR (term = :term AND server = :server))
            RETURNING term
            """
        ),
        {"term": term, "server": server},
    ).scalar_one_or_none()
    if recorded is None:
        raise DeposedError(f"term {term} of {server} is not newer than the recorded term")


def take_over(conn: sa.Connection, term: int, server: str) -> tuple[int, str | None]:
    """Record ``term`` although a larger one is recorded: only after ZooKeeper lost its
    history (a wiped ensemble restarts its zxids, so every new term is smaller than the
    recorded one and :func:`become` would refuse every coordinator forever).

    The caller must have just confirmed with ZooKeeper that it is the leader: within one
    ZooKeeper history the leader's term is larger than any term ever recorded (the
    module ``registry/election.py`` says why), so a larger recorded term can only come
    from a lost history. Fencing stays exact: any coordinator still holding the old
    term fails its next :func:`_fence` (terms are compared for equality). Returns the
    term and server that were recorded."""
    before = conn.execute(
        sa.text("SELECT term, server FROM coordinator WHERE id = 1 FOR UPDATE")
    ).one()
    conn.execute(
        sa.text(
            "UPDATE coordinator SET term = :term, server = :server, updated_at = now() WHERE id = 1"
        ),
        {"term": term, "server": server},
    )
    return before.term, before.server


def _fence(conn: sa.Connection, term: int) -> None:
    """Lock the coordinator row and check the term (a newer ``become`` waits for us)."""
    current = conn.execute(
        sa.text("SELECT term FROM coordinator WHERE id = 1 FOR UPDATE")
    ).scalar_one()
    if current != term:
        raise DeposedError(f"coordinator term {term} was superseded by term {current}")


def reap(
    conn: sa.Connection, term: int, live: Iterable[str], server: str, hold: float
) -> list[tuple[int, str, int]]:
    """Reap the departed owners' expired leases (:func:`distribution.reap`) while
    ``term`` is still the recorded one."""
    _fence(conn, term)
    return distribution.reap(conn, live, server, hold=hold)


def job_rows(conn: sa.Connection) -> list[sa.Row]:
    """Every job with what placement needs: name, kind, desired, state, target, owner,
    its start request time (``jobs.updated_at``, set by the start command) for FIFO, and
    for the residency rules the age of its current run (since its claim) and whether the
    health monitor flags that run."""
    return conn.execute(
        sa.text(
            """
            SELECT d.job_id, j.name, j.kind, j.desired, d.state, d.target, d.owner,
                   d.epoch, d.pending_reason,
                   CAST(EXTRACT(EPOCH FROM d.lease_until - now()) AS double precision)
                       AS lease_left,
                   CAST(EXTRACT(EPOCH FROM j.updated_at) AS double precision) AS queued_at,
                   CAST(EXTRACT(EPOCH FROM now() - d.started_at) AS double precision)
                       AS run_age,
                   EXISTS (SELECT 1 FROM run_health h
                            WHERE h.job_id = d.job_id AND h.epoch = d.epoch
                              AND h.flag IS NOT NULL) AS flagged
              FROM distribution d JOIN jobs j ON j.id = d.job_id
            """
        )
    ).all()


def active_jobs(rows: Iterable[sa.Row]) -> list[str]:
    """Names of the jobs that need a target: wanted running, not finished or failed."""
    done = {states.RunState.FINISHED.value, states.RunState.FAILED.value}
    return [r.name for r in rows if r.desired == "running" and r.state not in done]


def drained(conn: sa.Connection) -> set[str]:
    """The servers an operator asked to drain (``sparkring server drain``, until undone)."""
    return set(conn.execute(sa.text("SELECT server FROM drains")).scalars())


def placeable(conn: sa.Connection, servers: Mapping[str, int]) -> dict[str, int]:
    """The live servers that may take jobs: capacity above zero and not being drained."""
    draining = drained(conn)
    return {sid: cap for sid, cap in servers.items() if cap > 0 and sid not in draining}


def current(row: sa.Row, usable: Mapping[str, int]) -> str | None:
    """Where a job is now: its target while that is placeable (a move already decided
    stands), else its owner while that is placeable (it still runs there), else the
    target or owner it had (gone: the job is orphaned), else None (a new job)."""
    for server in (row.target, row.owner):
        if server is not None and server in usable:
            return server
    return row.target or row.owner


def held(
    rows: Iterable[sa.Row], live: Iterable[str], departed: Mapping[str, float], hold: float
) -> dict[str, float]:
    """Jobs kept on a departed owner: job -> seconds until the hold ends.

    A job is held while its owner left the registry less than ``hold`` seconds ago
    (``departed``: server -> seconds since it left, from ``ring_members``) and still
    holds a live lease on it. Such an owner is usually a server restarting on its host,
    whose successor adopts the running drivers and renews their leases
    (``server/runner.py``): retargeting its jobs when its old ZooKeeper session expires
    would make the successor migrate drivers it has just adopted, and nobody else could
    claim them before the lease expires anyway. The hold is bounded so that a server
    cut off from ZooKeeper but not from PostgreSQL (it keeps renewing) still hands its
    jobs over: after ``hold`` seconds they are placed elsewhere and it stops them."""
    alive = set(live)
    kept = {}
    for r in rows:
        if r.owner is None or r.owner in alive or r.state not in states.OWNED:
            continue
        age = departed.get(r.owner)
        if age is None or r.lease_left is None or r.lease_left <= 0 or age >= hold:
            continue
        kept[r.name] = min(r.lease_left, hold - age)
    return kept


def lapsed(rows: Iterable[sa.Row], live: Iterable[str], lapse: float) -> dict[str, str]:
    """Jobs whose live owner let the lease expire more than ``lapse`` seconds ago: job ->
    that owner.

    A live owner whose lease expired re-claims the job (still targeted at it) or
    releases it at its next poll, within seconds. One that has done neither for
    ``lapse`` seconds cannot reach PostgreSQL (or is wedged): its driver is dead (its
    watchdog's deadline passed) and, left alone, the job would stay targeted at it for
    the whole fault, since nobody else may claim a row targeted elsewhere and the
    reaper skips live owners."""
    alive = set(live)
    return {
        r.name: r.owner
        for r in rows
        if r.owner in alive
        and r.state in states.OWNED
        and r.lease_left is not None
        and r.lease_left < -lapse
    }


def not_renewing(rows: Iterable[sa.Row], lapsed_owners: Iterable[str]) -> set[str]:
    """Of the owners of lapsed leases, those that hold no live lease at all: their
    renewals fail (a server that renews extends the leases of all its runs in one
    statement), so they must not be given any job until one of their leases is live
    again (they claim, or re-claim)."""
    suspects = set(lapsed_owners)
    renewing = {r.owner for r in rows if r.owner in suspects and (r.lease_left or 0) > 0}
    return suspects - renewing


_DEFERRING = sa.text(
    f"""
    SELECT j.name, e.server
      FROM distribution d
      JOIN jobs j ON j.id = d.job_id
     CROSS JOIN LATERAL (
           SELECT e.server FROM job_events e
            WHERE e.job_id = d.job_id
              AND e.kind = '{states.EventKind.DEFERRED}'
              -- a Spark master outage is no fault of the server's: moving the job
              -- to another server would not help it
              AND e.detail->>'cause' IS DISTINCT FROM '{states.DeferCause.SPARK_MASTER_UNREACHABLE}'
              AND e.at > now() - make_interval(secs => :window)
              AND e.id > COALESCE((
                      SELECT s.id FROM job_events s
                       WHERE s.job_id = d.job_id AND s.kind = '{states.EventKind.DRIVER_STARTED}'
                       ORDER BY s.id DESC LIMIT 1), 0)
           ) e
     WHERE d.state IN ('pending', 'backoff', 'starting')
       AND d.last_error IS NOT NULL
       AND e.server IS NOT NULL
     GROUP BY j.name, e.server
    HAVING count(*) >= :streak
    """
)


def deferring(conn: sa.Connection, streak: int, window: float) -> dict[str, frozenset[str]]:
    """Jobs not running that a server deferred at least ``streak`` times within the last
    ``window`` seconds with no driver of the job started (anywhere) since: job -> those
    servers.

    A deferral is a start that failed for a reason that may pass (its event records the
    error); the server claims the job again after a short backoff, so a cause local to
    it that does not pass (a full work dir, a broken spark-submit) would keep the job
    down for ever. Only jobs with a ``last_error`` (every deferral sets it) are read,
    through the events' (job, id) index."""
    found: dict[str, set[str]] = {}
    for name, server in conn.execute(_DEFERRING, {"streak": streak, "window": window}):
        found.setdefault(name, set()).add(server)
    return {name: frozenset(servers) for name, servers in found.items()}


def departures(conn: sa.Connection) -> dict[str, float]:
    """Servers that left the ring (``ring_members.left_at``): seconds since each left."""
    rows = conn.execute(
        sa.text(
            "SELECT server, CAST(EXTRACT(EPOCH FROM now() - left_at) AS double precision) "
            "FROM ring_members WHERE left_at IS NOT NULL"
        )
    ).all()
    return {server: max(0.0, age) for server, age in rows}


@dataclass(frozen=True)
class Members:
    """The coordinator's view of membership for one rebalance."""

    joined: tuple[str, ...]  # settle window over, join not yet acted on: take jobs now
    settling: tuple[str, ...]  # joined less than a settle window ago
    due_in: float | None  # seconds until the first settling member's window ends


def members(
    conn: sa.Connection, usable: Iterable[str], settle: float, hold: float = 0.0
) -> Members:
    """Record arrivals and departures of placeable servers in ``ring_members``.

    A server seen for the first time is a *join*. A known server back after leaving is
    a *return*, never a join, however long it was away: it takes no job from the
    others, only new and orphaned ones (one fault, one restart: its jobs failed over,
    or were held for its successor, and moving them back would restart each a second
    time). Back within ``max(settle, hold)`` seconds it keeps the membership it had (a
    ZooKeeper blip, or a restart whose successor adopted its drivers: a member still
    settling goes on settling); back later, its join counts as done (``settled``).
    An operator's undrain (:func:`undrained`) is a join again.

    Must run after :func:`_fence` (the coordinator row lock serialises coordinators).
    """
    live = sorted(set(usable))
    params = {"live": live, "settle": settle, "flap": max(settle, hold)}
    conn.execute(
        sa.text(
            "UPDATE ring_members SET left_at = now() "
            "WHERE left_at IS NULL AND NOT (server = ANY(:live))"
        ),
        params,
    )
    conn.execute(
        sa.text(
            """
            INSERT INTO ring_members (server)
            SELECT unnest(CAST(:live AS text[]))
            ON CONFLICT (server) DO UPDATE
               SET settled = ring_members.settled OR
                       ring_members.left_at < now() - make_interval(secs => :flap),
                   left_at = NULL
             WHERE ring_members.left_at IS NOT NULL
            """
        ),
        params,
    )
    rows = conn.execute(
        sa.text(
            """
            SELECT server, CAST(EXTRACT(EPOCH FROM joined_at
                       + make_interval(secs => :settle) - now()) AS double precision) AS due_in
              FROM ring_members
             WHERE server = ANY(:live) AND NOT settled
             ORDER BY server
            """
        ),
        params,
    ).all()
    joined = tuple(r.server for r in rows if r.due_in <= 0)
    settling = tuple(r.server for r in rows if r.due_in > 0)
    due = min((r.due_in for r in rows if r.due_in > 0), default=None)
    return Members(joined=joined, settling=settling, due_in=due)


def undrained(conn: sa.Connection, server: str) -> None:
    """An operator undid a drain: the server is a joiner again, however short the drain
    was (the flap rule of :func:`members` is for ZooKeeper blips, not for an operator's
    decision), so it takes streaming jobs once the settle window has passed."""
    conn.execute(
        sa.text(
            "UPDATE ring_members SET joined_at = now(), settled = false, left_at = NULL "
            "WHERE server = :server"
        ),
        {"server": server},
    )


def settling_reason(settling: Iterable[str], settle: float) -> str:
    names = sorted(settling)
    return (
        f"membership settling: new jobs wait until {', '.join(names)} "
        f"{'has' if len(names) == 1 else 'have'} been up for the settle window ({settle:g} s)"
    )


@dataclass(frozen=True)
class RebalancePolicy:
    """How the coordinator places jobs and when it looks again: the knobs of
    :func:`rebalance` and of the server's coordinator loop, set once from the settings."""

    epsilon: float  # bounded-load slack of a fresh placement (``placement``)
    vnodes: int  # ring points per server
    debounce: float  # seconds a burst of membership or job changes settles into one pass
    interval: float  # seconds between two passes at most (the periodic fallback)
    settle: float = 0.0  # the settle window: new jobs wait while a member settles
    hold: float = 0.0  # how long a departed owner's jobs keep their targets (:func:`held`)
    lapse: float | None = None  # grace of a live owner's expired lease (:func:`lapsed`)
    defer_streak: int = 0  # deferrals that make a server avoided for a job (0: never)
    defer_window: float = 0.0  # how long such a server is avoided (:func:`deferring`)
    residency: float | None = None  # minimum residency of a gentle join (None: at once)
    reap_hold: float = 0.0  # how long after an outage nothing is reaped (:func:`reap`)


@dataclass(frozen=True)
class Plan:
    rows: list[sa.Row]  # the jobs placed (those held by a departed owner left out)
    placement: placement.Sticky
    held: dict[str, float]  # job -> seconds until its departed owner's lease expires
    lapsed: dict[str, str] = dataclasses.field(default_factory=dict)  # job -> live owner
    not_renewing: frozenset[str] = frozenset()  # live servers given no job (lapsed leases)
    deferring: dict[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    join_due: float | None = None  # seconds until a deferred join move may be made


@dataclass(frozen=True)
class Rebalance:
    ring_generation: int | None  # None when nothing changed
    changed: int
    active: int
    pending: int
    seconds: float
    moved: int = 0  # jobs whose target changed from one server to another
    settle_due: float | None = None  # seconds until a settling member's window ends
    held_due: float | None = None  # seconds until a departed owner's live lease expires
    lapsed: int = 0  # jobs whose live owner's lease lapsed past the grace (H7)
    not_renewing: tuple[str, ...] = ()  # live servers given no job: their leases all lapsed
    deferred: int = 0  # join moves deferred by the residency rules (made later)
    join_due: float | None = None  # seconds until the first deferred move's job matures


# A target is written only on the row the plan was made from: a claim, a release or a
# reap that committed since the read (servers write the table concurrently; the read is
# not a lock) leaves the row as it is, and the next cycle plans from it. Without the
# guard a plan made just before a claim moved the job right after it started: two
# starts for one fault.
_UPDATE_TARGETS = sa.text(
    """
    UPDATE distribution d
       SET target = v.target, pending_reason = v.reason, ring_generation = :generation,
           updated_at = now()
      FROM unnest(CAST(:job_ids AS bigint[]), CAST(:targets AS text[]),
                  CAST(:reasons AS text[]), CAST(:epochs AS bigint[]),
                  CAST(:states AS text[]), CAST(:owners AS text[]))
           AS v(job_id, target, reason, epoch, state, owner)
     WHERE d.job_id = v.job_id AND d.epoch = v.epoch AND d.state = v.state
       AND d.owner IS NOT DISTINCT FROM v.owner
    RETURNING d.job_id
    """
)
_RETARGET_EVENTS = sa.text(
    f"""
    INSERT INTO job_events (job_id, job_name, kind, server, detail)
    SELECT v.job_id, v.name, '{states.EventKind.RETARGETED}', :server,
           jsonb_build_object('from', v.old, 'to', v.new, 'ring_generation', :generation,
                              'why', v.why)
      FROM unnest(CAST(:job_ids AS bigint[]), CAST(:names AS text[]),
                  CAST(:olds AS text[]), CAST(:news AS text[]), CAST(:whys AS text[]))
           AS v(job_id, name, old, new, why)
    """
)


def plan(
    conn: sa.Connection,
    servers: Mapping[str, int],
    *,
    epsilon: float,
    vnodes: int,
    joined: Iterable[str] = (),
    hold_new: str | None = None,
    full: bool = False,
    hold: float = 0.0,
    lapse: float | None = None,
    defer_streak: int = 0,
    defer_window: float = 0.0,
    min_residency: float | None = None,
) -> Plan:
    """The job rows and their sticky placement on the live ``servers``; reads only.

    ``full`` is the operator's explicit rebalance (every streaming job placed afresh).
    ``sparkring ring rebalance --dry-run`` and ``ring explain`` call this too. Jobs
    :func:`held` by a departed owner's live lease, for up to ``hold`` seconds after it
    left, are left out (their targets stay). With ``lapse`` (seconds), a job whose live
    owner's lease expired longer ago than that is placed on another server, and a live
    server with only such leases gets no job (:func:`lapsed`, :func:`not_renewing`);
    None: never (the coordinator has not reached PostgreSQL for that long itself).
    With ``defer_streak`` above 0, a job is not placed on a server that deferred it that
    many times within ``defer_window`` seconds (:func:`deferring`). With
    ``min_residency`` (seconds), a join is gentle (``scheduler/residency.py``); None:
    every move of a join at once.
    """
    usable = placeable(conn, servers)
    rows = job_rows(conn)
    keep = held(rows, servers, departures(conn) if hold > 0 else {}, hold)
    rows = [r for r in rows if r.name not in keep]
    lapsed_at = lapsed(rows, servers, lapse) if lapse is not None else {}
    failing = not_renewing(rows, lapsed_at.values())
    usable = {sid: cap for sid, cap in usable.items() if sid not in failing}
    avoid: dict[str, set[str]] = {}
    for name, owner in lapsed_at.items():
        avoid.setdefault(name, set()).add(owner)
    stuck = deferring(conn, defer_streak, defer_window) if defer_streak > 0 else {}
    for name, deferred_by in stuck.items():
        avoid.setdefault(name, set()).update(deferred_by)
    wanted = set(active_jobs(rows))
    jobs = {
        r.name: placement.Job(
            current=current(r, usable),
            streaming=r.kind == states.JobKind.STREAMING,
            queued_at=r.queued_at,
            avoid=_avoidable(avoid.get(r.name, set()), usable),
        )
        for r in rows
        if r.name in wanted
    }
    pace, join_due = None, None
    if min_residency is not None and joined and not full:
        runs = {
            r.name: residency.Run(
                state=r.state, owner=r.owner, target=r.target, age=r.run_age, flagged=r.flagged
            )
            for r in rows
        }
        pace, join_due = residency.pace(runs, min_residency)
    result = placement.stick(
        jobs,
        usable,
        joined=joined,
        hold_new=hold_new,
        rebalance=full,
        pace=pace,
        epsilon=epsilon,
        vnodes=vnodes,
    )
    if not result.deferred:
        join_due = None
    # A job placed again because its *live* server is drained moves by an operator's
    # decision, not because a server was lost: its ``retargeted`` event and ``ring
    # explain`` say ``drained``. A drained server that is gone too (not in ``servers``)
    # lost its jobs: ``orphaned``, the new owner claims over an expired lease.
    draining = drained(conn) & set(servers)
    off = {
        name: placement.Why.DRAINED
        for name, why in result.why.items()
        if why == placement.Why.ORPHANED and jobs[name].current in draining
    }
    if off:
        result = dataclasses.replace(result, why={**result.why, **off})
    return Plan(rows, result, keep, lapsed_at, frozenset(failing), stuck, join_due)


def _avoidable(avoid: set[str], usable: Mapping[str, int]) -> frozenset[str]:
    """The servers a job avoids, unless that leaves it nowhere to go: then it stays
    (a single server, or every server failing it, is still the best there is)."""
    if not avoid or not set(usable) - avoid:
        return frozenset()
    return frozenset(avoid & set(usable))


def rebalance(
    conn: sa.Connection,
    term: int,
    server: str,
    servers: Mapping[str, int],
    *,
    epsilon: float,
    vnodes: int,
    settle: float = 0.0,
    hold: float = 0.0,
    lapse: float | None = None,
    defer_streak: int = 0,
    defer_window: float = 0.0,
    residency: float | None = None,
) -> Rebalance:
    """Decide every target for the live ``servers`` (id -> capacity) and write changes.

    Jobs wanted running and not finished or failed are placed (sticky: see the module
    docstring); the others get no target. ``settle`` is the settle window in seconds,
    ``hold`` how long a departed owner's jobs keep their targets (:func:`held`),
    ``lapse`` how long a live owner's lease may stay expired (:func:`lapsed`; None: no
    limit), ``defer_streak`` and ``defer_window`` when a server steps back from a job
    it keeps deferring (:func:`deferring`; 0: never), ``residency`` the minimum
    residency of a gentle join (seconds; None: a join moves everything at once).
    Must run inside a transaction; raises :class:`DeposedError` when ``term`` is no
    longer the recorded one.
    """
    started = time.perf_counter()
    _fence(conn, term)
    view = members(conn, placeable(conn, servers), settle, hold)
    full = conn.execute(
        sa.text("SELECT rebalance_requested_at IS NOT NULL FROM coordinator WHERE id = 1")
    ).scalar_one()
    planned = plan(
        conn,
        servers,
        epsilon=epsilon,
        vnodes=vnodes,
        joined=view.joined,
        hold_new=settling_reason(view.settling, settle) if view.settling else None,
        full=full,
        hold=hold,
        lapse=lapse,
        defer_streak=defer_streak,
        defer_window=defer_window,
        min_residency=residency,
    )
    rows, result = planned.rows, planned.placement
    changes = []
    for r in rows:
        target = result.targets.get(r.name)
        reason = result.pending.get(r.name)
        if (target, reason) != (r.target, r.pending_reason):
            changes.append((r, target, reason))
    # A join is done once no move to the joiner waits (a gentle join: residency).
    done = [server for server in view.joined if not result.deferred.get(server)]
    if done:
        conn.execute(
            sa.text("UPDATE ring_members SET settled = true WHERE server = ANY(:joined)"),
            {"joined": done},
        )
    if full:
        conn.execute(sa.text("UPDATE coordinator SET rebalance_requested_at = NULL WHERE id = 1"))
    generation, changes = _write_targets(conn, changes) if changes else (None, [])
    moved = [(r, t) for r, t, _ in changes if t != r.target]
    if changes:
        if moved:
            conn.execute(
                _RETARGET_EVENTS,
                {
                    "server": server,
                    "generation": generation,
                    "job_ids": [r.job_id for r, _ in moved],
                    "names": [r.name for r, _ in moved],
                    "olds": [r.target for r, _ in moved],
                    "news": [t for _, t in moved],
                    "whys": [str(result.why.get(r.name, "not wanted running")) for r, _ in moved],
                },
            )
        notify.notify(conn, notify.TARGETS_CHANNEL, str(generation))
    return Rebalance(
        ring_generation=generation,
        changed=len(changes),
        active=len(result.targets) + len(result.pending),
        pending=len(result.pending),
        seconds=time.perf_counter() - started,
        moved=sum(1 for r, t in moved if r.target is not None and t is not None),
        settle_due=view.due_in,
        held_due=min(planned.held.values(), default=None),
        lapsed=len(planned.lapsed),
        not_renewing=tuple(sorted(planned.not_renewing)),
        deferred=sum(result.deferred.values()),
        join_due=planned.join_due,
    )


def _write_targets(
    conn: sa.Connection, changes: list[tuple[sa.Row, str | None, str | None]]
) -> tuple[int | None, list[tuple[sa.Row, str | None, str | None]]]:
    """Write the planned ``(row, target, reason)`` changes under the next ring generation;
    return it and the changes written (:data:`_UPDATE_TARGETS` skips a row that changed
    since the plan's read). The generation is taken under the coordinator row's lock
    and kept only if a target was written: a plan whose rows all changed under it
    leaves the ring as it was (None, [])."""
    generation = conn.execute(
        sa.text("SELECT ring_generation + 1 FROM coordinator WHERE id = 1 FOR UPDATE")
    ).scalar_one()
    written = set(
        conn.execute(
            _UPDATE_TARGETS,
            {
                "generation": generation,
                "job_ids": [r.job_id for r, _, _ in changes],
                "targets": [t for _, t, _ in changes],
                "reasons": [reason for _, _, reason in changes],
                "epochs": [r.epoch for r, _, _ in changes],
                "states": [r.state for r, _, _ in changes],
                "owners": [r.owner for r, _, _ in changes],
            },
        ).scalars()
    )
    if not written:
        return None, []
    conn.execute(
        sa.text(
            "UPDATE coordinator SET ring_generation = :generation, updated_at = now() WHERE id = 1"
        ),
        {"generation": generation},
    )
    return generation, [c for c in changes if c[0].job_id in written]


def request_rebalance(conn: sa.Connection) -> None:
    """Ask the coordinator for a full rebalance (``sparkring ring rebalance``)."""
    conn.execute(sa.text("UPDATE coordinator SET rebalance_requested_at = now() WHERE id = 1"))
    notify.notify(conn, notify.JOBS_CHANNEL, "rebalance")


def rebalance_pending(conn: sa.Connection) -> bool:
    """Whether a requested full rebalance has not been carried out yet."""
    return bool(
        conn.execute(
            sa.text("SELECT rebalance_requested_at IS NOT NULL FROM coordinator WHERE id = 1")
        ).scalar_one()
    )
