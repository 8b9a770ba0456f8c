"""A local run of a job (:class:`Run`): one driver at one epoch, as this server sees it;
and a warm driver waiting for its claim (:class:`WarmRun`, ``server/warm.py``).

A run is shared by the runner's threads (``server/runner.py``) through the run table
(``server/run_table.py``), whose lock is "the runner's lock" below. Which thread writes
which field, and under which guard:

- ``job_id``, ``name``, ``kind``, ``epoch``, ``attempt``, ``claimed_at``, ``owner``,
  ``revision`` (the run's identity): whoever creates the run, the poll thread (a claim,
  ``server/claims.py``) or a task (an adoption or an orphan's end,
  ``server/adoption.py``). Set once: assigning one again raises
  (:meth:`Run.__setattr__`).
- ``deadline``: the renew thread (``claims.renew``), under the runner's lock.
- ``driver``, ``master``: the start task (``launch.start``), once, under the runner's
  lock, before ``phase`` becomes running; or the adoption that creates the run.
- ``phase``: the start task (starting -> running); the poll thread or the shutdown's
  hand-off (running -> stopping, ``stops.begin_stop``); whoever ends the run (-> ended,
  ``outcomes.end``). Under the runner's lock; the legal moves are
  ``reconcile.PHASE_TRANSITIONS``.
- ``unrecorded``: whoever ends the run (``outcomes.end``), under the runner's lock;
  cleared by the thread that recorded it.
- ``recording``: the one thread recording ``unrecorded`` (``outcomes.record``), under
  the runner's lock.
- ``killed_as``: the health monitor (``Runner.kill_as``, ``server/health.py``), once,
  under the runner's lock, before it kills the driver;
- ``warm_offered``: whoever begins the run's stop (``stops.begin_stop``), before it
  submits the stop task that reads it;
- ``mark`` (:class:`Mark`, moves as :data:`MARK_TRANSITIONS` allows): the one thread
  recording ``running`` (``launch.mark_running``); to and from ``marking`` under the
  runner's lock, to ``marked`` only by the thread that holds ``marking``.

Every other thread reads the mutable fields under the runner's lock, or from a copy of
the runs taken under it (``RunTable.snapshot``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from scheduler import distribution
from server import driver, reconcile

log = logging.getLogger(__name__)

# The fields that name the run: set when it is created, never again.
IDENTITY_FIELDS = frozenset(
    {"job_id", "name", "kind", "epoch", "attempt", "claimed_at", "owner", "revision"}
)


class Mark(StrEnum):
    """Whether PostgreSQL has recorded that the run's driver runs."""

    UNMARKED = "unmarked"  # not recorded yet: the row still says starting
    MARKING = "marking"  # one thread records it now
    MARKED = "marked"  # recorded


# target state -> the states it may be entered from.
MARK_TRANSITIONS: dict[Mark, frozenset[Mark]] = {
    Mark.MARKING: frozenset({Mark.UNMARKED}),
    Mark.MARKED: frozenset({Mark.MARKING}),
    Mark.UNMARKED: frozenset({Mark.MARKING}),  # the write failed: the next poll tries again
}


class WarmPhase(StrEnum):
    """Where a warm driver is, as its server sees it (``server/warm.py``)."""

    BUILDING = "building"  # launching, or building its SparkSession; or kept driverless
    READY = "ready"  # its log says its SparkSession is built: it waits for its claim
    DISCARDED = "discarded"  # taken by its claim, or to be killed by whoever sees it first


# target phase -> the phases it may be entered from.
WARM_TRANSITIONS: dict[WarmPhase, frozenset[WarmPhase]] = {
    WarmPhase.READY: frozenset({WarmPhase.BUILDING}),
    WarmPhase.DISCARDED: frozenset({WarmPhase.BUILDING, WarmPhase.READY}),
}


@dataclass
class Run:
    """One local driver run of a job at one epoch."""

    job_id: int
    name: str
    kind: str
    epoch: int
    attempt: int
    # Lease-clock time (watchdog.lease_clock) just after the claim committed: a renewal
    # sent later must include this job, else the lease was lost.
    claimed_at: float
    deadline: float  # lease-clock time the watchdog kills the driver unless confirmed
    owner: distribution.Owner  # this incarnation, or a previous one whose run ended here
    phase: reconcile.Phase = reconcile.Phase.STARTING
    # The job revision the claim pinned (None: claimed by a release without revisions,
    # or adopted): the driver is started from it, not from whatever is current later.
    revision: int | None = None
    driver: driver.Driver | None = None
    # The Spark master its driver was launched with ("": unknown, e.g. adopted).
    master: str = ""
    # How the run ended, not yet recorded in PostgreSQL (retried until it is).
    unrecorded: Callable[[sa.Connection], object] | None = None
    recording: bool = False  # a thread is writing ``unrecorded`` now
    mark: Mark = Mark.UNMARKED  # whether ``running`` is recorded in PostgreSQL
    # Its stop offered the target a warm hand-off (server/warm.py): the stop waits,
    # bounded, for the target's warm driver before it stops this one.
    warm_offered: bool = False
    # How the run ends if its driver is killed on request: decided before the kill (a
    # stall past the restart budget is FAILED: server/health.py), recorded after it,
    # instead of the release a kill is otherwise.
    killed_as: Callable[[sa.Connection], object] | None = None

    def __setattr__(self, field: str, value: Any) -> None:
        # Another thread may hold this run by its identity (a task, the renewals): it
        # must not change under it.
        if field in IDENTITY_FIELDS and field in self.__dict__:
            raise AttributeError(f"Run.{field} is set when the run is created, never again")
        super().__setattr__(field, value)


@dataclass
class WarmRun:
    """One warm driver of this server. ``driver`` is set by its prestart task, ``phase``
    moves as :data:`WARM_TRANSITIONS` allows (under the run table's lock); the other
    fields are set when the poll thread creates it."""

    job_id: int
    name: str
    kind: str
    epoch: int  # the claim it waits for: the offered hand-off's epoch + 1
    attempt: int  # that claim's attempt
    revision: int | None  # the revision it runs: the job's current one when offered
    run_dir: Path
    driver: driver.Driver | None = None
    master: str = ""
    phase: WarmPhase = WarmPhase.BUILDING
    # The version of each secret its environment holds (secret name -> version), read
    # before their values: a secret given a new value since is never taken warm.
    secret_versions: dict[str, int] | None = None


def confirm(run: Run, deadline: float) -> None:
    """Give the run's watchdog its new deadline. A lease file that cannot be written
    (a full work dir, EIO) leaves that driver to die at its current deadline, safely:
    it must neither end the renewals of every other job (the renew thread would die and
    take the server with it) nor a start task before its run is running (the run would
    stay 'starting' for ever, never reaped: CHAOS_SEED=417020630)."""
    assert run.driver is not None
    try:
        run.driver.confirm(deadline)
    except OSError as exc:
        log.error(
            "cannot confirm the driver's lease: it dies at its current deadline",
            extra={"action": "confirm_failed", "job": run.name, "error": str(exc)},
        )
