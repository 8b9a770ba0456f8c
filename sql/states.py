"""Job states and their legal transitions, declared once, as data.

A job has a *desired* state (what the operator asked for, in ``jobs.desired``) and a
*run* state (what the cluster is doing, in ``distribution.state``). Run-state changes
are guarded SQL statements in ``scheduler/distribution/`` and ``scheduler/jobs.py``
whose ``WHERE state IN (...)`` clause comes from :data:`TRANSITIONS`, so the table below
is the whole state machine:

    pending  -> starting   a server claimed the job (epoch + 1, lease taken)
    backoff  -> starting   the same, once the restart backoff has passed
    starting -> running    the driver process was spawned
    starting -> backoff    the driver could not be started (S3 unreachable): retry later
    running  -> backoff    a driver crashed (exit != 0); restarts (batch: retries) left
    running  -> failed     a driver crashed with no restarts left
    starting|running|stopping -> finished   a batch driver exited 0 (its 'running' may
                                   never have been recorded: PostgreSQL was restarting;
                                   or it ended on its own as its owner began to stop it)
    starting|running -> stopping   the owner is stopping the driver (migration, stop)
    stopping -> pending    migration: the driver stopped, the lease is released
    stopping -> stopped    stop: the driver stopped, the lease is released
    starting|running -> stopped  the driver ended while the job was wanted stopped
    starting|running|stopping -> pending  the owner was lost (lease expired, reaped or
                                          claimed over); a batch job is re-run
    pending|backoff -> stopped             stop command while no driver runs
    stopping -> backoff|failed|stopped     the driver failed on its own before its owner's
                                           stop reached it (its watchdog saw no stop
                                           request): counted as a crash (CRASH_SOURCES);
                                           'stopped' when the operator wants it stopped
    stopped|finished|failed -> pending     start or restart command
    starting|running|stopping -> starting  claim over an expired lease (owner lost)
"""

from __future__ import annotations

from enum import StrEnum


class Desired(StrEnum):
    RUNNING = "running"  # the operator wants a driver running
    STOPPED = "stopped"  # the operator wants no driver


class RunState(StrEnum):
    PENDING = "pending"  # wants to run; no owner (waiting for a target or a claim)
    STARTING = "starting"  # claimed: the owner is fetching the artifact and spawning
    RUNNING = "running"  # a driver process is alive on the owner
    BACKOFF = "backoff"  # crashed; no owner until not_before, then claimable again
    STOPPING = "stopping"  # the owner is stopping the driver (graceful, then kill)
    STOPPED = "stopped"  # stopped on request; no owner
    FINISHED = "finished"  # a batch driver exited 0; never restarted by failover (S4)
    FAILED = "failed"  # restarts exhausted or unstartable; never restarted by failover


class JobKind(StrEnum):
    STREAMING = "streaming"  # runs until stopped; restarted after a crash
    BATCH = "batch"  # runs to completion; re-run if its owner was lost, retried if it failed


class EventKind(StrEnum):
    """What a ``job_events`` row records; the table's CHECK lists exactly these."""

    CREATED = "created"  # job create (operator)
    START_REQUESTED = "start_requested"  # job start (operator)
    STOP_REQUESTED = "stop_requested"  # job stop (operator)
    RESTART_REQUESTED = "restart_requested"  # job restart (operator)
    DELETED = "deleted"  # job delete (operator)
    RETARGETED = "retargeted"  # the coordinator moved the job's target
    CLAIMED = "claimed"  # a server took the lease (epoch + 1)
    ADOPTED = "adopted"  # a restarted server took over its previous incarnation's lease
    DRIVER_STARTED = "driver_started"  # the owner spawned the driver
    STOPPING = "stopping"  # the owner began stopping the driver
    RELEASED = "released"  # the owner gave the lease up (pending or stopped)
    DEFERRED = "deferred"  # the driver could not start for a passing reason: backoff
    FINISHED = "finished"  # a batch driver exited 0
    CRASHED = "crashed"  # a driver failed; restarts left: backoff
    FAILED = "failed"  # failed for good (own driver past its budget, or invalid)
    REAPED = "reaped"  # the coordinator cleared a departed owner's expired lease
    REVISED = "revised"  # job update/rollback made a new revision (operator)
    HEALTH_FLAGGED = "health_flagged"  # the owner's health monitor raised a HealthFlag
    HEALTH_CLEARED = "health_cleared"  # ... and the flag no longer holds
    ROLLED_BACK = "rolled_back"  # an update watched by auto-rollback was undone


class DeferCause(StrEnum):
    """Why a run was deferred, when the cause lies outside the server (in the event's
    detail): the coordinator does not move a job away from a server for it."""

    SPARK_MASTER_UNREACHABLE = "spark-master-unreachable"  # no master of its URL answered


class HealthFlag(StrEnum):
    """What the health monitor (server/health.py) says is wrong with a running job; it
    informs and restarts nothing unless the job opted in (docs/drivers.md)."""

    STALLED = "stalled"  # a streaming query completed no batch for the stall timeout
    WAITING_FOR_RESOURCES = "waiting_for_resources"  # no executor cores for the timeout


class AlertKind(StrEnum):
    """What an alert tells (``alerts.kinds``; migration 0013's trigger maps job events and
    skipped fire times to these, in the event's own transaction; docs/alerts.md)."""

    FAILED = "failed"  # a job ended FAILED (event failed)
    RESTARTED = "restarted"  # a crash restart or a batch retry (event crashed)
    FAILED_OVER = "failed_over"  # re-claimed after its owner was lost (reaped, or taken over)
    STALLED = "stalled"  # health flag stalled, raised past its window
    WAITING_FOR_RESOURCES = "waiting_for_resources"  # health flag, past its window
    ROLLED_BACK = "rolled_back"  # an update rolled itself back (event rolled_back)
    RECOVERED = "recovered"  # a health flag cleared: health back to ok
    SCHEDULE_SKIPPED = "schedule_skipped"  # a fire time of a schedule was recorded skipped
    TEST = "test"  # ``sparkring alert test``: a delivery with no event behind it


# What ``alert create`` listens to unless told (``--on``).
DEFAULT_ALERT_KINDS: tuple[AlertKind, ...] = (
    AlertKind.FAILED,
    AlertKind.STALLED,
    AlertKind.WAITING_FOR_RESOURCES,
    AlertKind.ROLLED_BACK,
)


class AlertFormat(StrEnum):
    JSON = "json"  # the alert's fields as JSON (docs/alerts.md), signed when a secret is set
    SLACK = "slack"  # a Slack incoming-webhook message ({"text": ...})


class DeliveryStatus(StrEnum):
    PENDING = "pending"  # waiting for its next attempt (or in flight, under a lease)
    DELIVERED = "delivered"  # the receiver answered 2xx
    FAILED = "failed"  # a final answer (4xx other than 408/429), or 24 h of retries


S = RunState
# target state -> the states it may be entered from.
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    S.STARTING: frozenset({S.PENDING, S.BACKOFF, S.STARTING, S.RUNNING, S.STOPPING}),
    S.RUNNING: frozenset({S.STARTING}),
    S.BACKOFF: frozenset({S.STARTING, S.RUNNING}),
    S.FAILED: frozenset({S.STARTING, S.RUNNING}),
    S.FINISHED: frozenset({S.STARTING, S.RUNNING, S.STOPPING}),
    S.STOPPING: frozenset({S.STARTING, S.RUNNING}),
    S.PENDING: frozenset({S.STOPPING, S.STARTING, S.RUNNING, S.STOPPED, S.FINISHED, S.FAILED}),
    S.STOPPED: frozenset({S.STOPPING, S.STARTING, S.RUNNING, S.PENDING, S.BACKOFF}),
}

# Where a crash write (a driver's own failure: backoff, or failed) may come from: a
# running or starting run, and a stopping one whose driver failed before the stop reached
# it (CHAOS_SEED=593937538: released uncounted, the job ran past its budget). A deferral,
# which also enters backoff, may not: a start that failed while being stopped is released.
CRASH_SOURCES: frozenset[RunState] = TRANSITIONS[S.BACKOFF] | TRANSITIONS[S.FAILED] | {S.STOPPING}

# States in which a server owns the job and holds a lease.
OWNED: frozenset[RunState] = frozenset({S.STARTING, S.RUNNING, S.STOPPING})
# States a failover or a cluster restart never leaves on its own (S4).
TERMINAL: frozenset[RunState] = frozenset({S.STOPPED, S.FINISHED, S.FAILED})
# States from which a claim may start a driver when nobody holds the lease.
CLAIMABLE: frozenset[RunState] = frozenset({S.PENDING, S.BACKOFF})


def sources(target: RunState) -> tuple[str, ...]:
    """The states ``target`` may be entered from, sorted, for a SQL ``IN`` list."""
    return tuple(sorted(TRANSITIONS[target]))


def allowed(current: RunState, target: RunState) -> bool:
    return current in TRANSITIONS.get(target, frozenset())
