"""Capacity-aware placement: consistent hashing with bounded loads.

This module owns the decision of which live server each job should run on (its
*target*), or why it has none (its *pending reason*). It is a pure function of the job
names, the live servers' capacities, ``epsilon`` and ``vnodes``: no I/O, no clock, no
global state, and the same answer for the same sets in any order on every machine.

The algorithm (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded
Loads", 2018), in the form ``docs/distribution.md`` explains at length:

1. Servers with capacity 0 take no jobs and are left off the ring; the others are put
   on a plain consistent-hash ring (``scheduler/ring.py``), each with ``vnodes`` points.
2. Each server gets a *bound*: ``min(capacity, level)``, where ``level`` is
   ``ceil((1 + epsilon) * K / N)`` for K jobs on N servers with capacity. When small
   capacities would leave jobs without a target although capacity is free elsewhere,
   ``level`` is raised (water-filling) to the smallest integer at which the bounds add
   up to ``(1 + epsilon) * K``, or to every server's full capacity if even that is
   short. With equal (or ample) capacities this is exactly the textbook bound.
3. Jobs are placed one (job, server) pair at a time in order of clockwise ring
   distance from the job to the server's vnode, ties broken by job name: a job first
   tries the server of the next vnode after its position; if that server is full it
   walks on to the next server with room. Because nearer jobs go first, a server is
   filled by the jobs of its own arcs before it accepts jobs that overflowed past
   other servers, which keeps overflow local and keeps the jobs that move on a join or
   leave close to the plain ring's minimum.
4. Once every bound is reached, the remaining jobs (those farthest from any server with
   room) get no target and a reason naming the total capacity.

The distance order makes the result a function of the inputs alone and is the unique
stable matching between jobs and servers that both prefer the nearest partner.
"""

from __future__ import annotations

import dataclasses
import fractions
import heapq
import math
from collections.abc import Iterable, Mapping
from enum import StrEnum

from scheduler import ring

# The epsilon of bounded loads: no server above ceil((1 + epsilon) * average) jobs.
DEFAULT_EPSILON = 0.05

NO_LIVE_SERVER = "no live server"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where every job should run. Dicts are sorted by job or server name."""

    targets: dict[str, str]  # job -> server
    pending: dict[str, str]  # job -> why it has no target, for users
    loads: dict[str, int]  # server -> jobs targeted; every given server, zero included
    bounds: dict[str, int]  # server -> most jobs it may take: min(capacity, level)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A server a job tried, in ring order, and its load when the job was placed."""

    server: str
    load: int  # jobs already targeted at it when this job was placed
    bound: int  # most jobs it may take


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Why a job has its target (or none): the answer to ``sparkring ring explain``."""

    job: str
    ring_position: int  # MD5 position of the job name on the ring
    candidates: tuple[Candidate, ...]  # ring order from the job's position, up to the target
    target: str | None
    overflowed: bool  # placed past its first candidate (its ring successor)
    reason: str


def place(
    jobs: Iterable[str],
    servers: Mapping[str, int],
    epsilon: float = DEFAULT_EPSILON,
    vnodes: int = ring.DEFAULT_VNODES,
) -> Placement:
    """Target of each job on the live ``servers`` (server id -> capacity, 0 = no jobs).

    ``jobs`` is a set of names (order and duplicates do not matter). Raises
    :class:`scheduler.ring.RingError` on bad input.
    """
    result, _, _ = _place(jobs, servers, epsilon, vnodes, watch=None)
    return result


def explain(
    job: str,
    jobs: Iterable[str],
    servers: Mapping[str, int],
    epsilon: float = DEFAULT_EPSILON,
    vnodes: int = ring.DEFAULT_VNODES,
) -> Explanation:
    """Why :func:`place` gives ``job`` its target: ring position, candidates, overflow.

    ``job`` must be one of ``jobs``: its target depends on every other job.
    """
    names = set(ring.name_set(jobs, "job"))
    if job not in names:
        raise ring.RingError(f"job {job!r} is not among the jobs being placed")
    result, the_ring, load_when_placed = _place(names, servers, epsilon, vnodes, watch=job)
    at = ring.position(job)
    target = result.targets.get(job)
    bounds = result.bounds
    candidates: list[Candidate] = []
    # Every server the walk passes before the target was full when the job was placed
    # (servers never regain room during a placement), so its load then was its bound.
    for server, _ in ring.walk(the_ring, at):
        if server == target:
            candidates.append(Candidate(server, load_when_placed, bounds[server]))
            break
        candidates.append(Candidate(server, bounds[server], bounds[server]))
    overflowed = target is not None and candidates[0].server != target
    if target is None:
        reason = result.pending[job]
    elif not overflowed:
        reason = (
            f"{target} owns the first vnode clockwise from the job's ring position and "
            f"had room ({load_when_placed} of its bound {bounds[target]})"
        )
    else:
        first = candidates[0]
        passed = len(candidates) - 1
        reason = (
            f"{first.server}, the job's ring successor, was full ({first.bound} of "
            f"{first.bound}: jobs nearer to it on the ring are placed first), so the job "
            f"walked the ring past {passed} full server{'s' if passed != 1 else ''} to "
            f"{target}, the first with room ({load_when_placed} of its bound "
            f"{bounds[target]})"
        )
    return Explanation(
        job=job,
        ring_position=at,
        candidates=tuple(candidates),
        target=target,
        overflowed=overflowed,
        reason=reason,
    )


def _place(
    jobs: Iterable[str],
    servers: Mapping[str, int],
    epsilon: float,
    vnodes: int,
    watch: str | None,
) -> tuple[Placement, ring.Ring, int]:
    """The placement, the ring it used, and ``watch``'s target's load before it joined."""
    names = ring.name_set(jobs, "job")
    capacities = _capacities(servers)
    level = _level(capacities.values(), len(names), _epsilon(epsilon))
    bound = {server: min(capacity, level) for server, capacity in capacities.items()}
    the_ring = ring.build([s for s, capacity in capacities.items() if capacity > 0], vnodes)
    room = dict(bound)
    targets, watched_load = _walk(names, the_ring, room, watch)
    pending_reason = _pending_reason(capacities)
    result = Placement(
        targets=dict(sorted(targets.items())),
        pending={name: pending_reason for name in names if name not in targets},
        loads={server: bound[server] - room[server] for server in capacities},
        bounds=bound,
    )
    return result, the_ring, watched_load


def _walk(
    names: Iterable[str], the_ring: ring.Ring, room: dict[str, int], watch: str | None = None
) -> tuple[dict[str, str], int]:
    """Bounded-load walk: each job to the nearest vnode clockwise whose server has room.

    ``room`` (server -> free slots) is consumed in place. Returns the targets of the
    jobs that found room and the load of ``watch``'s server just before it was placed.
    """
    left = sum(room.get(server, 0) for server in the_ring.servers)
    targets: dict[str, str] = {}
    watched_load = 0
    points, owners = the_ring.points, the_ring.owners
    count = len(points)
    if not (left and count):
        return targets, watched_load
    start_room = dict(room)
    vnodes_of: dict[str, list[int]] = {server: [] for server in the_ring.servers}
    for index, owner in enumerate(owners):
        vnodes_of[owner].append(index)
    # Union-find over vnode indices: skip[i] leads to the first vnode at or after i
    # whose server still has room (index ``count`` is a sentinel that wraps to 0).
    # Without it a job would step over every vnode of every full server, which
    # makes a nearly full cluster quadratic.
    skip = list(range(count + 1))
    for server, vnode_indices in vnodes_of.items():
        if not room.get(server, 0):
            _close(skip, vnode_indices)

    def next_with_room(index: int) -> int:
        found = _find(skip, index)
        return _find(skip, 0) if found == count else found

    # A sorted list is a valid heap; entries are (distance, job, position, vnode).
    heap = []
    for name in names:
        at = ring.position(name)
        index = ring.successor(the_ring, at)
        heap.append((ring.distance(at, points[index]), name, at, index))
    heap.sort()
    while heap and left:
        _, name, at, index = heap[0]
        server = owners[index]
        if room[server]:
            heapq.heappop(heap)
            if name == watch:
                watched_load = start_room[server] - room[server]
            targets[name] = server
            room[server] -= 1
            left -= 1
            if not room[server]:
                _close(skip, vnodes_of[server])
            continue
        index = next_with_room(index + 1)
        heapq.heapreplace(heap, (ring.distance(at, points[index]), name, at, index))
    return targets, watched_load


class Why(StrEnum):
    """Why :func:`stick` gave a job its target (or none)."""

    KEPT = "kept"  # stays on its current server: live, placeable, within capacity
    JOINED = "joined"  # a streaming job handed to a server that joined (its ideal target)
    REBALANCED = "rebalanced"  # moved by the operator's explicit full rebalance
    PLACED = "placed"  # a new job placed by bounded loads
    ORPHANED = "orphaned"  # its server left or has capacity 0: placed again
    # Its live server is drained by an operator (``sparkring server drain``): placed
    # again like an orphan, but a planned move (its owner hands it off). Set by the
    # coordinator, which knows the drains (``coordinator.plan``); never by :func:`stick`.
    DRAINED = "drained"
    AVOIDED = "avoided"  # its server is avoided for it (Job.avoid): placed elsewhere
    SHED = "shed"  # its server's capacity fell below its jobs: placed again
    WAITING = "waiting"  # no target: cluster full (FIFO by start request) or settling


@dataclasses.dataclass(frozen=True)
class Job:
    """A job as sticky placement sees it."""

    current: str | None = None  # where it is now: its owner while owned, else its target
    streaming: bool = True  # only streaming jobs move to a joiner or on a rebalance
    queued_at: float = 0.0  # its start request (seconds): FIFO order when the cluster is full
    # Servers this job must not be placed on although they are live: its lease lapsed
    # there while that server stayed registered, or it failed to start there several
    # times in a row (``scheduler/coordinator.py``). Usually empty.
    avoid: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Pace:
    """How gently a join moves jobs (built by ``scheduler/residency.py``).

    A join moves a job only if it is ``movable`` and neither end of the move is
    ``busy``; each server takes part in at most one such move per placement. A move of a
    ``maturing`` job, or one a busy server blocks, is *deferred*: it keeps its slot on
    the joiner (nothing else is moved there instead) and is made by a later placement.
    A job in neither set (not running healthily) is not moved for balance at all."""

    movable: frozenset[str]  # may move for balance now (resident, healthy)
    maturing: frozenset[str] = frozenset()  # healthy, too young: moves later
    busy: frozenset[str] = frozenset()  # servers already in a move: none to or from them


@dataclasses.dataclass(frozen=True)
class Sticky(Placement):
    """A sticky placement: the targets, and why each job has its target or none."""

    why: dict[str, Why]  # job -> decision, sorted by job name
    ideal: dict[str, str]  # job -> its target under a fresh bounded-load placement
    # joiner -> moves to it that a Pace deferred (0 or absent: its join is complete)
    deferred: dict[str, int] = dataclasses.field(default_factory=dict)


def stick(
    jobs: Mapping[str, Job],
    servers: Mapping[str, int],
    *,
    joined: Iterable[str] = (),
    hold_new: str | None = None,
    rebalance: bool = False,
    pace: Pace | None = None,
    epsilon: float = DEFAULT_EPSILON,
    vnodes: int = ring.DEFAULT_VNODES,
) -> Sticky:
    """Targets that keep every job where it is unless it must move.

    ``jobs`` maps each active job to where it is now; ``servers`` are the placeable
    servers (id -> capacity, 0 = no jobs). The rules, in order:

    1. A job whose current server is among ``servers`` with capacity > 0, and not one
       it avoids (:attr:`Job.avoid`), keeps it. If
       a server has more such jobs than its capacity, it keeps batch jobs before
       streaming ones, then earlier start requests, then names; the rest are shed.
    2. Each streaming job whose ideal target (:func:`place` over every job and server)
       is one of ``joined`` moves there, while that server is below its bound; if that
       leaves the joiner below its fair share ``floor(K / N)`` (few jobs per server),
       it also takes streaming jobs from the most loaded servers. Nothing moves
       between other servers; batch jobs never move for balance. With ``pace``, only
       its movable jobs move, at most one move to or from each server and none to or
       from a busy one; the other moves are deferred (:attr:`Sticky.deferred`), keep
       their slot on the joiner, and happen in a later call (:class:`Pace`).
    3. With ``rebalance`` (the operator's explicit request), every streaming job is
       placed again from scratch around the batch jobs, which stay.
    4. The remaining jobs (new, orphaned, shed) are placed by the bounded-load walk on
       the room left under each server's bound, then under its capacity. If they do
       not all fit, they are admitted in FIFO order: jobs that already ran somewhere
       first, then by ``queued_at``, then by name; the others wait with a reason. A new
       job (``current`` None) waits with the reason ``hold_new`` when it is given
       (membership is settling); orphaned and shed jobs never wait for that. No job is
       placed or moved on a server in its :attr:`Job.avoid` (with no avoided server
       anywhere, the result is exactly the one without this rule).

    A pure function of its arguments: the same answer in any order on every machine.
    """
    names = ring.name_set(jobs, "job")
    capacities = _capacities(servers)
    usable = {server: capacity for server, capacity in capacities.items() if capacity > 0}
    joiners = set(ring.name_set(joined, "server")) & set(usable)
    level = _level(capacities.values(), len(names), _epsilon(epsilon))
    bound = {server: min(capacity, level) for server, capacity in capacities.items()}
    ideal = place(names, capacities, epsilon, vnodes).targets if (joiners or rebalance) else {}
    infos = {name: _job(name, jobs[name]) for name in names}

    targets: dict[str, str] = {}
    why: dict[str, Why] = {}
    free: dict[str, Why] = {}
    on_server: dict[str, list[str]] = {}
    for name in names:
        current = infos[name].current
        if current in usable and current not in infos[name].avoid:
            on_server.setdefault(current, []).append(name)
        elif current in usable:
            free[name] = Why.AVOIDED
        else:
            free[name] = Why.PLACED if current is None else Why.ORPHANED
    for server, held in on_server.items():
        held.sort(key=lambda n: (infos[n].streaming, infos[n].queued_at, n))
        for name in held[: usable[server]]:
            targets[name], why[name] = server, Why.KEPT
        for name in held[usable[server] :]:
            free[name] = Why.SHED
    load = {server: 0 for server in capacities}
    for server in targets.values():
        load[server] += 1

    if rebalance:
        for name in names:
            if infos[name].streaming and why.get(name) == Why.KEPT:
                load[targets.pop(name)] -= 1
                del why[name]
                free[name] = Why.REBALANCED
        claimed, deferred = load, {}
    elif joiners:
        # ``claimed`` is ``load`` with every deferred move counted as made: the decisions
        # use it, so a deferred move keeps its slot and the moves made over several
        # paced placements are those one unpaced placement makes.
        claimed = dict(load)
        gate = _Gate(pace)
        for name in names:
            to = ideal.get(name)
            if (
                to in joiners
                and why.get(name) == Why.KEPT
                and infos[name].streaming
                and targets[name] != to
                and claimed[to] < bound[to]
                and to not in infos[name].avoid
            ):
                gate.offer(name, targets[name], to, targets, why, load, claimed)
        _top_up(joiners, targets, why, claimed, bound, infos, len(names), len(usable), gate, load)
        deferred = gate.deferred
    else:
        claimed, deferred = load, {}

    pending: dict[str, str] = {}
    if hold_new is not None:
        for name in [n for n, w in free.items() if w == Why.PLACED]:
            del free[name]
            pending[name], why[name] = hold_new, Why.WAITING
    spare = {s: capacity - max(load[s], claimed[s]) for s, capacity in usable.items()}
    admitted = sorted(
        free,
        key=lambda n: (free[n] == Why.PLACED, infos[n].queued_at, n),
    )[: max(0, sum(spare.values()))]
    the_ring = ring.build(usable, vnodes)
    # First up to each server's bound, then (only if that is short) up to its capacity.
    # A deferred move's slot stays free on its joiner and taken on its donor.
    taken = {s: max(load[s], claimed[s]) for s in usable}
    room = {s: max(0, min(bound[s], usable[s]) - taken[s]) for s in usable}
    placed = _walk_each(admitted, the_ring, room, infos)
    for server in placed.values():
        load[server] += 1
        taken[server] += 1
    rest = [name for name in admitted if name not in placed]
    if rest:
        spare_now = {s: max(0, usable[s] - taken[s]) for s in usable}
        more = _walk_each(rest, the_ring, spare_now, infos)
        for server in more.values():
            load[server] += 1
        placed.update(more)
    for name, server in placed.items():
        targets[name], why[name] = server, free[name]
    full = f"cluster full: {_pending_reason(capacities)}; waiting in start order"
    for name in free:
        if name not in placed:
            reason = full if usable and sum(usable.values()) else _pending_reason(capacities)
            pending[name], why[name] = reason, Why.WAITING
    return Sticky(
        targets=dict(sorted(targets.items())),
        pending=dict(sorted(pending.items())),
        loads=load,
        bounds=bound,
        why=dict(sorted(why.items())),
        ideal=ideal,
        deferred=dict(sorted(deferred.items())),
    )


class _Gate:
    """Makes or defers the moves of a join under a :class:`Pace` (None: makes all)."""

    def __init__(self, pace: Pace | None) -> None:
        self.pace = pace
        self.busy: set[str] = set(pace.busy) if pace is not None else set()
        self.deferred: dict[str, int] = {}
        self.waiting: set[str] = set()  # jobs whose move was deferred

    def offer(
        self,
        name: str,
        source: str,
        to: str,
        targets: dict[str, str],
        why: dict[str, Why],
        load: dict[str, int],
        claimed: dict[str, int],
    ) -> bool:
        """Move ``name`` from ``source`` to the joiner ``to`` now, or defer it, or (a job
        that is not running healthily) neither. Returns whether its slot was taken."""
        pace = self.pace
        if pace is not None and name not in pace.movable and name not in pace.maturing:
            return False
        claimed[source] -= 1
        claimed[to] += 1
        if pace is None or (
            name in pace.movable and source not in self.busy and to not in self.busy
        ):
            load[source] -= 1
            load[to] += 1
            targets[name], why[name] = to, Why.JOINED
            if pace is not None:
                self.busy |= {source, to}
        else:
            self.deferred[to] = self.deferred.get(to, 0) + 1
            self.waiting.add(name)
        return True


def _walk_each(
    names: list[str], the_ring: ring.Ring, room: dict[str, int], infos: Mapping[str, Job]
) -> dict[str, str]:
    """:func:`_walk` for the jobs that avoid no server, then each job that avoids some
    (few: a lapsed lease, repeated failed starts) to the first server clockwise from its
    position that has room and that it does not avoid. ``room`` is consumed in place."""
    plain = [name for name in names if not infos[name].avoid]
    placed, _ = _walk(plain, the_ring, room)
    avoiding = sorted((ring.position(n), n) for n in names if infos[n].avoid)
    for at, name in avoiding:
        for server, _ in ring.walk(the_ring, at):
            if room.get(server, 0) > 0 and server not in infos[name].avoid:
                placed[name] = server
                room[server] -= 1
                break
    return placed


def _top_up(
    joiners: set[str],
    targets: dict[str, str],
    why: dict[str, Why],
    load: dict[str, int],
    bound: Mapping[str, int],
    infos: Mapping[str, Job],
    jobs: int,
    servers: int,
    gate: _Gate,
    made: dict[str, int],
) -> None:
    """Give each joiner at least its fair share ``floor(K / N)`` (within its bound).

    With few jobs per server the ring's arcs are uneven and the jobs whose ideal target
    is the joiner can be far fewer than its share (8 jobs on 4 servers: none at all for
    one name set in ten). The joiner then also takes kept streaming jobs from the most
    loaded servers, while they hold at least two more than it: from each, the job
    nearest to the joiner on the ring. Still only moves *to* a joiner. ``load`` counts
    deferred moves as made; ``gate`` makes or defers each move (``made``: the loads of
    the moves actually made).
    """
    for joiner in sorted(joiners):
        share = min(jobs // servers, bound[joiner])
        near = ring.build([joiner], 1)
        movable: dict[str, list[tuple[int, str]]] = {}
        for name, server in targets.items():
            if (
                server not in joiners
                and why.get(name) == Why.KEPT
                and name not in gate.waiting
                and infos[name].streaming
                and joiner not in infos[name].avoid
            ):
                at = ring.position(name)
                gap = ring.distance(at, near.points[ring.successor(near, at)])
                movable.setdefault(server, []).append((gap, name))
        for candidates in movable.values():
            candidates.sort(reverse=True)  # nearest last: pop() takes it
        while load[joiner] < share:
            donors = [s for s in movable if movable[s] and load[s] >= load[joiner] + 2]
            if not donors:
                break
            donor = max(donors, key=lambda s: (load[s], s))
            _, name = movable[donor].pop()
            gate.offer(name, donor, joiner, targets, why, made, load)


def _job(name: str, job: object) -> Job:
    if not isinstance(job, Job):
        raise ring.RingError(f"job {name!r} must be described by a placement.Job, got {job!r}")
    if job.current is not None and (not isinstance(job.current, str) or not job.current):
        raise ring.RingError(f"current server of job {name!r} must be a name, got {job.current!r}")
    if not isinstance(job.avoid, frozenset):
        raise ring.RingError(f"servers avoided by job {name!r} must be a frozenset")
    return job


def _close(skip: list[int], vnode_indices: list[int]) -> None:
    """Make the walk skip these vnodes: their server is full."""
    for index in vnode_indices:
        skip[index] = index + 1


def _find(skip: list[int], index: int) -> int:
    root = index
    while skip[root] != root:
        root = skip[root]
    while skip[index] != root:  # path compression
        skip[index], index = root, skip[index]
    return root


def _level(capacities: Iterable[int], jobs: int, epsilon: fractions.Fraction) -> int:
    """Smallest integer L with sum(min(capacity, L)) >= (1 + epsilon) * jobs.

    With N servers of ample capacity that is ceil((1 + epsilon) * jobs / N). If the
    capacities cannot reach it, L is the largest capacity: every server may fill up.
    """
    usable = sorted(c for c in capacities if c > 0)
    need = (1 + epsilon) * jobs
    if sum(usable) <= need:
        return usable[-1] if usable else 0
    filled = 0
    for taken, capacity in enumerate(usable):
        level = math.ceil((need - filled) / (len(usable) - taken))
        if level <= capacity:
            return level
        filled += capacity
    raise AssertionError("unreachable: the capacities exceed the need")


def _epsilon(epsilon: float) -> fractions.Fraction:
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
        raise ring.RingError(f"epsilon must be a number, got {epsilon!r}")
    if not math.isfinite(epsilon) or epsilon < 0:
        raise ring.RingError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    # Read 0.05 as 1/20, not as the binary float just above it: otherwise
    # ceil(1.05 * 10000 / 10) would be 1051 instead of 1050.
    return fractions.Fraction(repr(float(epsilon)))


def _capacities(servers: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(servers, Mapping):
        raise ring.RingError(
            f"servers must map server id to capacity, got {type(servers).__name__}"
        )
    checked = {}
    for server in sorted(servers, key=_sort_key):
        capacity = servers[server]
        if not isinstance(server, str) or not server:
            raise ring.RingError(f"a server name must be a non-empty string, got {server!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ring.RingError(
                f"capacity of server {server!r} must be an integer >= 0, got {capacity!r}"
            )
        checked[server] = capacity
    return checked


def _sort_key(server: object) -> tuple[bool, str]:
    # Sort before validating so that a bad name gets its clear error, not a TypeError.
    return (not isinstance(server, str), str(server))


def _pending_reason(capacities: Mapping[str, int]) -> str:
    if not capacities:
        return NO_LIVE_SERVER
    total = sum(capacities.values())
    live = len(capacities)
    servers = f"{live} live server{'s' if live != 1 else ''}"
    if total == 0:
        return f"no live server has capacity ({servers}, all with capacity 0)"
    return f"total capacity {total} of {servers} is used by other jobs"
