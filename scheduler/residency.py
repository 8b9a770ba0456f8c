"""The residency rules of a gentle rebalance: which running jobs a join may move now.

A move for balance stops a healthy driver and cold-starts it elsewhere (40-90 s of
Spark start-up here). One fault must cost a job at most one restart, so a join's
rebalance (``placement.stick`` with ``joined``) moves a job only when:

- it runs healthily on its target: state ``running``, owner = target, no health flag
  on its current run;
- it has run there for at least the minimum residency (``SPARKRING_MIN_RESIDENCY``),
  counted from the claim of its current run (``distribution.started_at``, PostgreSQL's
  clock). Every move, failover and crash restart is a new claim, so a job that moved,
  failed over or restarted within the residency is never moved for balance;
- neither server of the move is in a move already (:func:`busy`), and each server
  takes part in at most one move per rebalance (``placement.stick`` counts those).

A healthy job that is too young *matures*: its move waits, the join stays open
(``ring_members.settled`` stays false) and a later rebalance makes it. A job that is not
healthy (backoff, stopping, flagged) is not moved and does not keep the join open.

Pure functions: no I/O, no clock (ages come from the rows the coordinator read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from scheduler import placement
from sql.states import RunState


@dataclasses.dataclass(frozen=True)
class Run:
    """A job's current run, as the residency rules see it (one distribution row)."""

    state: str  # distribution.state
    owner: str | None
    target: str | None
    age: float | None  # seconds since the current run's claim (started_at); None: never
    flagged: bool = False  # the health monitor flags the current run (stalled, ...)


def seconds_until_movable(run: Run, residency: float) -> float | None:
    """How long until a join may move the job: 0 now, > 0 once it has run that much
    longer; None when it does not run healthily on its target (it is not moved for
    balance, and does not keep a join waiting)."""
    if residency < 0:
        raise ValueError(f"the minimum residency must be >= 0 seconds, got {residency!r}")
    healthy = (
        run.state == RunState.RUNNING
        and run.owner is not None
        and run.owner == run.target
        and not run.flagged
        and run.age is not None
    )
    if not healthy:
        return None
    assert run.age is not None
    return max(0.0, residency - run.age)


def busy(runs: Iterable[Run]) -> frozenset[str]:
    """Servers in a move now, which a join gives no other move: a job retargeted away
    from its owner (both ends: stopping there, starting here), a driver starting or
    stopping on its owner, a job waiting for its target's claim."""
    out: set[str] = set()
    for run in runs:
        if run.owner is not None and run.target is not None and run.owner != run.target:
            out |= {run.owner, run.target}
        if run.owner is not None and run.state in (RunState.STARTING, RunState.STOPPING):
            out.add(run.owner)
        if run.owner is None and run.target is not None and run.state == RunState.PENDING:
            out.add(run.target)
    return frozenset(out)


def pace(runs: Mapping[str, Run], residency: float) -> tuple[placement.Pace, float | None]:
    """The :class:`placement.Pace` of a join for these runs (job -> run), and the
    seconds until the first maturing job may move (None: none matures)."""
    movable, maturing = set(), set()
    due: float | None = None
    for name, run in runs.items():
        wait = seconds_until_movable(run, residency)
        if wait is None:
            continue
        if wait <= 0:
            movable.add(name)
        else:
            maturing.add(name)
            due = wait if due is None else min(due, wait)
    return (
        placement.Pace(
            movable=frozenset(movable), maturing=frozenset(maturing), busy=busy(runs.values())
        ),
        due,
    )
