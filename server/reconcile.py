"""The runner's decisions, as a pure function: what to do with each job this server sees.

:func:`decide` takes the distribution rows targeted at or owned by this server (one
poll), the local runs, and what the server may do now (:class:`Conditions`), and returns
the actions the runner carries out (``server/runner.py``). No I/O, no clock, no threads:
every branch is unit-tested without services (``tests/unit/test_reconcile.py``), and
``benchmarks/scale_sim.py`` drives simulated servers with the same function.

A local run moves through :class:`Phase` (declared once, with its legal transitions in
:data:`PHASE_TRANSITIONS`)::

    starting -> running    the driver was spawned
    starting -> ended      it could not be started (deferred, failed)
    running  -> stopping   a stop, restart or migration began
    running  -> ended      the driver exited, or its lease was lost
    stopping -> ended      the driver stopped
    ended                  its outcome waits to be recorded in PostgreSQL

The decisions, per job, in order:

- a run whose outcome is not recorded yet: :class:`Record` it (again);
- a running run whose row no longer names this incarnation and epoch: :class:`Drop`
  (kill the driver; the job is someone else's), unless the row says its watchdog
  recorded the driver's end (``finished``, ``backoff`` or ``failed`` at its epoch,
  unowned): that run is ending, and the next poll reaps it;
- a running run whose job is wanted stopped, restarted (new generation: a restart, or a
  new revision to roll to) or targeted elsewhere (once migrations are allowed):
  :class:`Stop` it, with the reason;
- a running run whose row still says ``starting`` (that record failed):
  :class:`MarkRunning` again;
- a row with a live lease of this server id but no local run (a previous incarnation's,
  or one this process gave up), or an expired one whose job is wanted stopped:
  :class:`HandleOrphan` (adopt it, record its outcome, release it, or leave it to
  expire: see the runner), once;
- a row targeted here that is free (unowned and claimable, or its lease expired) while
  this server is registered, claiming and below capacity: :class:`Claim`;
- a warm hand-off (docs/drivers.md): a running run stopped for a planned move of a
  streaming job offers one (``Stop.warm``, :func:`offers_warm`); a row targeted here
  whose live owner offers one gets a warm driver, room permitting (:class:`PreStart`,
  :func:`warm_wanted`); a warm driver whose claim can no longer be this server's is
  killed (:class:`Discard`, :func:`warm_discard_reason`); the old owner's bounded wait
  is :func:`warm_wait`'s.

How a driver's end is recorded is decided by :func:`ending`, the same for both kinds:
a driver that exited nonzero is a *crash* of the job's own code, whose budget
(``max_restarts``; a batch job's ``--max-retries``) the fenced write in
``scheduler/distribution.record_crash`` spends: backoff while restarts are left, then
``failed``. The run's watchdog records the same ending itself when it can
(:func:`watchdog_ending`: its server may be stalled or dead at that moment); the
server then writes nothing (:attr:`Ending.RECORDED`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from scheduler import distribution
from server import exit_codes
from sql import states


class Phase(StrEnum):
    STARTING = "starting"  # claimed; the driver is being prepared and spawned
    RUNNING = "running"  # the driver process runs under its watchdog
    STOPPING = "stopping"  # the driver is being stopped (SIGTERM, grace, SIGKILL)
    ENDED = "ended"  # the driver is gone; its outcome waits to be recorded


# target phase -> the phases it may be entered from.
PHASE_TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.RUNNING: frozenset({Phase.STARTING}),
    Phase.STOPPING: frozenset({Phase.RUNNING}),
    Phase.ENDED: frozenset({Phase.STARTING, Phase.RUNNING, Phase.STOPPING}),
}


def may_enter(current: Phase, target: Phase) -> bool:
    return current in PHASE_TRANSITIONS.get(target, frozenset())


@dataclass(frozen=True)
class LocalRun:
    """What the decisions need to know of one local run."""

    job_id: int
    epoch: int
    owner: distribution.Owner
    phase: Phase
    unrecorded: bool  # its outcome is not recorded in PostgreSQL yet


@dataclass(frozen=True)
class Conditions:
    """What this server may do now."""

    me: distribution.Owner
    capacity: int
    may_claim: bool  # registered, claiming (not shutting down), not in safe mode
    may_migrate: bool  # past the settle time after registering (adopted runs stay)
    # Jobs whose lost local run is still being killed: not claimed here until the kill
    # is over, or a new driver could start beside the old one (CHAOS_SEED=81000001).
    dying: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Record:
    job_id: int


@dataclass(frozen=True)
class Drop:
    job_id: int
    why: str


@dataclass(frozen=True)
class Stop:
    job_id: int
    reason: str
    # A planned move of a streaming job: offer the target a warm hand-off, and wait
    # (bounded) for its warm driver before stopping this one (:func:`offers_warm`).
    warm: bool = False


@dataclass(frozen=True)
class MarkRunning:
    job_id: int


@dataclass(frozen=True)
class HandleOrphan:
    job_id: int


@dataclass(frozen=True)
class Claim:
    job_id: int


@dataclass(frozen=True)
class PreStart:
    """Start a warm driver for the run the next claim makes (at ``epoch``)."""

    job_id: int
    epoch: int


@dataclass(frozen=True)
class Discard:
    """Kill a warm driver whose hand-off will not reach this server."""

    job_id: int
    why: str


Action = Record | Drop | Stop | MarkRunning | HandleOrphan | Claim | PreStart | Discard


class WarmWait(StrEnum):
    """What the old owner of a warm hand-off does next (:func:`warm_wait`)."""

    READY = "ready"  # the target's warm driver is ready: stop ours now
    WAIT = "wait"  # the offer stands and nobody is ready yet: wait (bounded)
    GIVE_UP = "give_up"  # the offer no longer stands: stop ours now (the cold path)


class Ending(StrEnum):
    """How a run that ended is recorded (``server/runner.py`` makes it a fenced write)."""

    RELEASE = "release"  # stopped, killed or lease lost: pending (or stopped), no count
    FINISH = "finish"  # exited 0: finished (pending if a restart came meanwhile)
    RECORDED = "recorded"  # its watchdog recorded the ending itself (FINISH or CRASH)
    CRASH = "crash"  # its own code failed: backoff while its budget lasts, then failed


def ending(
    reason: str, exit_code: int | None, *, recorded: bool, shutting_down: bool, went: bool = True
) -> Ending:
    """How to record a run that ended with the watchdog's ``reason`` and ``exit_code``.

    A nonzero exit is a crash for streaming and batch jobs alike: a batch job is
    retried with backoff while its budget (``--max-retries``) lasts, as a streaming
    job is restarted, and is ``failed`` only once it is spent (FAILED keeps its strict
    meaning). A SIGTERM exit while this server shuts down came from the service
    manager (systemd's ``KillMode=control-group``): a hand-off, not a crash.
    ``recorded``: the run's watchdog wrote its ending itself (:func:`watchdog_ending`),
    fenced on the run; nothing is left to write (a write would match no row anyway).
    ``went``: False for a warm driver that never got its go signal (its server died
    between taking it and the go, or it ended before): it ran nothing of the job's, so
    its end is a release, never a crash (docs/drivers.md, "Warm hand-off")."""
    if recorded:
        return Ending.RECORDED
    if not went:
        return Ending.RELEASE
    if reason in ("lease_expired", "killed", "stopped"):
        return Ending.RELEASE
    if reason == "exited" and exit_code == 0:
        return Ending.FINISH
    if exit_code in exit_codes.SIGTERM_EXITS and shutting_down:
        return Ending.RELEASE
    return Ending.CRASH


def watchdog_ending(reason: str, exit_code: int | None, *, stopping: bool) -> Ending | None:
    """What a run's watchdog records itself when the run ends with ``reason`` and
    ``exit_code`` (``server/watchdog.py``): :attr:`Ending.FINISH` or
    :attr:`Ending.CRASH`, exactly as :func:`ending` decides for its server, so that a
    server stalled or dead at that moment loses nothing (a finished batch run never runs
    again; a crash is counted against the job's budget, never run past it). None:
    left to the server: every ending but the driver's own exit (stopped, killed, lease
    lost: the lease is the owner's to give up, and a lost one has expired anyway; a
    spawn failure comes at launch, with the server there) and, with ``stopping`` (a
    stop was requested of the watchdog: its server's stop, or a service manager
    signalling every process of the unit), a nonzero exit: the server decides it with
    what only it knows (a failure during a stop is released, a SIGTERM exit while
    shutting down too). An exit 0 is recorded even then: the run reached its end."""
    if reason != "exited":
        return None
    if exit_code == 0:
        return Ending.FINISH
    return None if stopping else Ending.CRASH


def holds(row: distribution.Row, owner: distribution.Owner, epoch: int) -> bool:
    """The row names this incarnation as owner at this epoch."""
    return (row.owner, row.owner_incarnation, row.epoch) == (
        owner.server,
        owner.incarnation,
        epoch,
    )


def ended_by_its_watchdog(row: distribution.Row, epoch: int) -> bool:
    """The run of ``epoch`` is recorded ended and unowned (finished, or a crash: backoff
    or failed): its watchdog recorded the driver's end (just before exiting itself). Not
    a lost lease: nothing to kill."""
    return row.epoch == epoch and row.owner is None and row.state in distribution.ENDED_BY_WATCHDOG


def stop_reason(row: distribution.Row, me: str, may_migrate: bool) -> str | None:
    """Why a running driver of this row must stop, or None."""
    if row.desired != states.Desired.RUNNING:
        return "stop requested"
    if row.job_generation != row.generation:
        if row.job_revision is not None and row.job_revision != row.revision:
            return f"rolling to revision {row.job_revision}"
        return "restart requested"
    if row.target != me and may_migrate:
        return f"migrating to {row.target or 'no server'}"
    return None


def planned_move(row: distribution.Row, me: str, may_migrate: bool) -> bool:
    """The running driver of this row stops for a planned move: a roll to a new
    revision, or a migration to another server (a drain, a join's rebalance, ``ring
    rebalance``). Not a stop, a restart, or a move to no server."""
    if row.desired != states.Desired.RUNNING:
        return False
    if row.job_generation != row.generation:  # a roll is a new generation, with a revision
        return row.job_revision is not None and row.job_revision != row.revision
    return may_migrate and row.target is not None and row.target != me


def offers_warm(row: distribution.Row, me: str, may_migrate: bool) -> bool:
    """Stop this row's driver through a warm hand-off: a planned move of a streaming
    job that does not opt out (``sparkring.handoff.warm=false``)."""
    return (
        row.kind == states.JobKind.STREAMING
        and row.warm_allowed
        and planned_move(row, me, may_migrate)
    )


def warm_wanted(row: distribution.Row, me: str) -> bool:
    """Its owner offered a warm hand-off to this server: a live lease, stopping for a
    planned move with the offer at its epoch. A lost owner (expired lease) offers
    nothing: a fault keeps the cold path."""
    return (
        row.target == me
        and row.desired == states.Desired.RUNNING
        and row.kind == states.JobKind.STREAMING
        and row.warm_allowed
        and row.owner is not None
        and row.lease_expired is False
        and row.state == states.RunState.STOPPING
        and row.handoff_epoch == row.epoch
    )


def warm_discard_reason(row: distribution.Row | None, me: str, epoch: int) -> str | None:
    """Why a warm driver waiting for the claim of ``epoch`` will never be used, or None
    while that claim may still be this server's."""
    if row is None:
        return "the job is gone"
    if row.desired != states.Desired.RUNNING:
        return "the job is wanted stopped"
    if row.epoch == epoch and row.owner is not None and row.owner != me:
        return f"claimed at epoch {epoch} by {row.owner}"
    if row.epoch == epoch and row.owner is None:
        # Our own claim takes its warm driver before anything could end it.
        return f"epoch {epoch} was claimed and has ended"
    if row.epoch not in (epoch - 1, epoch):
        return f"the job is at epoch {row.epoch}"
    if row.target != me and row.epoch == epoch - 1:
        return f"the job moved to {row.target or 'no server'}"
    return None


def warm_wait(row: distribution.Row | None, me: distribution.Owner, epoch: int) -> WarmWait:
    """The old owner's wait for the target's warm driver, its run at ``epoch``: ready,
    wait, or give up (the offer no longer stands: stopped, moved to no server, or the
    run is no longer ours). A restart asked meanwhile changes nothing: the next claim
    starts the new generation either way."""
    if row is None or not holds(row, me, epoch):
        return WarmWait.GIVE_UP
    if row.warm_ready_epoch == epoch:
        return WarmWait.READY
    if row.handoff_epoch != epoch or row.target is None or row.desired != states.Desired.RUNNING:
        return WarmWait.GIVE_UP
    return WarmWait.WAIT


def claimable(row: distribution.Row, me: str) -> bool:
    """The row is targeted here, wanted running and free to claim now."""
    if row.target != me or row.desired != states.Desired.RUNNING:
        return False
    if row.owner is None:
        return row.state in states.CLAIMABLE and row.claimable_now
    return bool(row.lease_expired)


def orphaned(row: distribution.Row, me: distribution.Owner) -> bool:
    """A lease of this server id (any incarnation) that is this server's to settle when
    it has no local run: a live one; an expired one of a job wanted stopped (nobody
    claims that one over the expired lease, the coordinator reaps only departed owners'
    leases: left alone, it would stay owned for ever); and an expired one of a previous
    incarnation, whose run may have left how it ended in this work dir (a batch exit 0
    or a failure whose record did not reach PostgreSQL): read before the job is claimed
    again (M6 of safety review 3). An expired lease of this incarnation with no local
    run (a claim whose commit answer was lost) holds no trace: claimed over."""
    if row.owner != me.server or row.lease_expired is None:
        return False
    if not row.lease_expired:
        return True
    return row.desired != states.Desired.RUNNING or row.owner_incarnation != me.incarnation


def decide(
    rows: Mapping[int, distribution.Row],
    runs: Mapping[int, LocalRun],
    conditions: Conditions,
    handled_orphans: Iterable[OrphanKey] = (),
    warm: Mapping[int, int] | None = None,
) -> list[Action]:
    """The actions for one poll (see the module docstring), in a stable order.
    ``warm``: this server's warm drivers, job id -> the epoch of the claim each waits for."""
    me = conditions.me.server
    warm = warm or {}
    actions: list[Action] = []
    for job_id in sorted(runs):
        run, row = runs[job_id], rows.get(job_id)
        if run.unrecorded:
            actions.append(Record(job_id))
        elif run.phase is not Phase.RUNNING:
            continue
        elif row is not None and ended_by_its_watchdog(row, run.epoch):
            continue  # ending: the next poll reaps it (and ships its log)
        elif row is None or not holds(row, run.owner, run.epoch):
            actions.append(Drop(job_id, "the job is no longer ours"))
        elif reason := stop_reason(row, me, conditions.may_migrate):
            actions.append(Stop(job_id, reason, offers_warm(row, me, conditions.may_migrate)))
        elif row.state == states.RunState.STARTING:
            actions.append(MarkRunning(job_id))
    handled = set(handled_orphans)
    # A warm driver is a driver: it takes a slot, which the claim of its own job takes
    # over (the claim takes the warm driver), so that claim costs no other slot.
    warm_only = {job_id for job_id in warm if job_id not in runs}
    room = conditions.capacity - len(runs) - len(warm_only)
    for job_id in sorted(rows):
        row = rows[job_id]
        if job_id in runs:
            continue
        own_slot = 1 if job_id in warm_only else 0
        if orphaned(row, conditions.me):
            if orphan_key(row) not in handled:
                actions.append(HandleOrphan(job_id))
        elif (
            conditions.may_claim
            and room + own_slot > 0
            and job_id not in conditions.dying
            and claimable(row, me)
        ):
            actions.append(Claim(job_id))
            room -= 1 - own_slot
    actions += _warm_actions(rows, runs, conditions, warm)
    return actions


def _warm_actions(
    rows: Mapping[int, distribution.Row],
    runs: Mapping[int, LocalRun],
    conditions: Conditions,
    warm: Mapping[int, int],
) -> list[Action]:
    """Warm drivers to start (an offered hand-off to this server, with room: a warm
    driver is a driver) and to discard (their hand-off went elsewhere)."""
    me = conditions.me.server
    actions: list[Action] = []
    for job_id in sorted(warm):
        if why := warm_discard_reason(rows.get(job_id), me, warm[job_id]):
            actions.append(Discard(job_id, why))
    busy = len(runs) + len(warm)
    for job_id in sorted(rows):
        row = rows[job_id]
        if job_id in warm or job_id in conditions.dying or not warm_wanted(row, me):
            continue
        # A roll: the stopping run's slot is its successor's.
        room = conditions.capacity - busy + (1 if job_id in runs else 0)
        if conditions.may_claim and room > 0:
            actions.append(PreStart(job_id, row.epoch + 1))
            busy += 1
    return actions


def next_look(rows: Iterable[distribution.Row], me: str, default: float) -> float:
    """Seconds until a job targeted here may become claimable by time alone (another
    owner's lease expires, a backoff ends), else ``default``: nothing NOTIFYs those."""
    due = [
        row.due_in for row in rows if row.target == me and row.due_in is not None and row.due_in > 0
    ]
    return min(min(due, default=default), default)


# An orphan is handled once per job and lease state: a live lease left to expire is
# handled again once it has expired (if its job is wanted stopped, :func:`orphaned`).
OrphanKey = tuple[int, bool]


def orphan_key(row: distribution.Row) -> OrphanKey:
    return (row.job_id, bool(row.lease_expired))


def live_orphans(rows: Iterable[distribution.Row], me: distribution.Owner) -> set[OrphanKey]:
    """The keys of rows that are still orphans of this server id (:func:`orphaned`:
    they stay handled until their rows move on: released, expired or claimed)."""
    return {orphan_key(row) for row in rows if orphaned(row, me)}
