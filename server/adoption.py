"""Adoption: the leases of this server id that have no local run.

They were left by a previous incarnation (a restart) or given up by this process.
:func:`clean_orphan` (a task of the runner) adopts a run whose watchdog still runs here
(the lease moves to this incarnation, the driver keeps running: no restart, no gap),
records the outcome of one whose run directory holds a result, releases one whose driver
is provably dead, and otherwise leaves the lease to expire (S1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from scheduler import distribution
from server import (
    driver,
    outcomes,
    reconcile,
    run_context,
    run_table,
    rundir,
    runs,
    stops,
    watchdog,
)
from sql import states

log = logging.getLogger(__name__)

# How far ahead the watchdog's deadline must be for its run to be adopted: the
# adoption's statement and its confirmation (a file write) must land before it, and on
# a loaded machine a commit can take most of a second.
ADOPT_SLACK_S = 1.0


def clean_orphan(
    table: run_table.RunTable, ctx: run_context.Context, row: distribution.Row
) -> None:
    """A live lease of this server id without a local run: left by a previous
    incarnation (a restart), or a run this process gave up. It is ended early only
    when its driver is provably dead on this host, and then its outcome is what
    gets recorded (a batch driver that exited 0 ends ``finished``, never re-run):

    - its watchdog still runs here: adopt the run (:func:`_adopt`: the lease moves
      to this incarnation, the driver keeps running); if the lease cannot be
      proven ours any more, kill the run (the watchdog kills every descendant)
      and release the job, unless its driver exited on its own meanwhile (its
      result says so): then that outcome is recorded;
    - its run directory holds a result: record that outcome;
    - its watchdog died without a result: sweep what is left, then release;
    - nothing of it here (another host, a fresh work dir): leave the lease to
      expire. Its watchdog, wherever it is, kills the driver before that. Once
      expired it comes back here if the job is wanted stopped (nobody else settles
      it) or was a previous incarnation's (:func:`reconcile.orphaned`), and is
      released.

    A state or result file counts only when it names this run (job id, epoch,
    server: ``driver.RunIdentity``); another job's, such as a deleted namesake's,
    is nothing of it. The run directory is ``rundir.run_trace``'s.
    """
    if table.has(row.job_id):
        return  # adopted (or claimed) since the poll that listed it as an orphan
    previous = distribution.Owner(ctx.config.server, row.owner_incarnation or "")
    path = rundir.run_trace(ctx.config.work_dir, row.job_id, row.name, row.epoch)
    # Files of another job's run (a deleted namesake's, hole H6) are no trace of this
    # one: a result would be recorded as this job's, a pgid swept that may be reused.
    identity = driver.RunIdentity(row.job_id, row.name, row.epoch, ctx.config.server)
    run = _run_of(row, previous, 0.0, reconcile.Phase.ENDED)
    old = driver.adopt(path, identity)
    if old is not None:
        if _adopt(table, ctx, row, previous, old):
            return
        old.kill()
        ended = old.poll()
        if ended is not None and ended.reason == "exited":
            # Its driver exited on its own before the kill reached it (its watchdog wrote
            # the result as it went): that end is the run's (M6 of safety review 3), a
            # batch exit 0 finished, never released to run again.
            write: Callable[[sa.Connection], object] = outcomes.outcome_write(
                table, ctx, run, ended
            )
        else:
            write = lambda conn: distribution.release(  # noqa: E731
                conn, row.job_id, previous, row.epoch
            )
    elif identity.wrote(rundir.read_json(path / rundir.RESULT_FILE)):
        outcome = driver.Driver.outcome_of(path)
        write = outcomes.outcome_write(table, ctx, run, outcome)
    elif identity.wrote(rundir.read_json(path / rundir.STATE_FILE)):
        if left := driver.sweep(path):
            log.error(
                "processes of a previous incarnation's run survive SIGKILL: "
                "its lease is left to expire",
                extra={"action": "orphan_left", "job": row.name, "pids": left},
            )
            return
        write = lambda conn: distribution.release(  # noqa: E731
            conn, row.job_id, previous, row.epoch
        )
    elif row.lease_expired:
        # Expired (a job wanted stopped, or a previous incarnation's:
        # reconcile.orphaned) with no trace here: its watchdog, wherever
        # it runs, has killed the driver at its deadline, before the expiry.
        write = lambda conn: distribution.release(  # noqa: E731
            conn, row.job_id, previous, row.epoch
        )
    else:
        log.warning(
            "a lease of this server id with no trace of its driver here: left to expire",
            extra={"action": "orphan_left", "job": row.name, "epoch": row.epoch},
        )
        return
    if not table.add_ended(run, write):
        return
    log.info(
        "recording the end of a previous incarnation's run",
        extra={"action": "orphan_released", "job": row.name, "epoch": row.epoch},
    )
    outcomes.record(table, ctx, run)


def _adopt(
    table: run_table.RunTable,
    ctx: run_context.Context,
    row: distribution.Row,
    previous: distribution.Owner,
    old: driver.Driver,
) -> bool:
    """Take over a run whose watchdog the previous incarnation left alive here: move
    its live lease to this incarnation (fenced on the previous one, the epoch and
    the lease not expired) and supervise the driver as if we had started it. No
    driver restart, no gap. False when the lease is not provably ours (expired or
    taken), or when the watchdog's deadline is too close for the confirmation to reach
    it (``ADOPT_SLACK_S``): the caller kills the run and releases the job."""
    cfg = ctx.config
    t_sent = watchdog.lease_clock()
    watchdog_deadline = rundir.read_lease(old.lease_file)
    left = None if watchdog_deadline is None else round(watchdog_deadline - t_sent, 3)
    if left is None or left < ADOPT_SLACK_S:
        # PostgreSQL's lease outlives the watchdog's deadline by its margin: in that
        # window the statement below would succeed and the watchdog, which never sees
        # the confirmation in time, kill the driver after all (adopted, then lost).
        log.warning(
            "the previous incarnation's watchdog is at its deadline: not adopted",
            extra={"action": "adopt_refused", "job": row.name, "epoch": row.epoch, "left_s": left},
        )
        return False
    try:
        with ctx.engine.begin() as conn:
            state = distribution.adopt(
                conn, row.job_id, previous, ctx.owner, row.epoch, cfg.lease_ttl
            )
    except distribution.FencedError:
        return False
    except DBAPIError:
        # Unknown: leave the run alone (its watchdog keeps its deadline), look again.
        table.forget_orphan(reconcile.orphan_key(row))
        return True
    deadline = t_sent + cfg.lease_ttl - cfg.watchdog_margin
    old.confirm(deadline)
    stopping = state == states.RunState.STOPPING
    phase = reconcile.Phase.STOPPING if stopping else reconcile.Phase.RUNNING
    run = _run_of(row, ctx.owner, deadline, phase, old)
    table.add(run)
    log.info(
        "adopted a running driver of the previous incarnation",
        extra={"action": "adopted", "job": row.name, "epoch": row.epoch},
    )
    if stopping:  # it was being stopped when its server went: finish the stop
        ctx.submit(stops.stop_driver, table, ctx, run)
    ctx.wake()
    return True


def _run_of(
    row: distribution.Row,
    owner: distribution.Owner,
    deadline: float,
    phase: reconcile.Phase,
    old: driver.Driver | None = None,
) -> runs.Run:
    """The local run of an orphan's row: its attempt is unknown here (0)."""
    return runs.Run(
        job_id=row.job_id,
        name=row.name,
        kind=row.kind,
        epoch=row.epoch,
        attempt=0,
        claimed_at=watchdog.lease_clock(),
        deadline=deadline,
        owner=owner,
        phase=phase,
        driver=old,
    )
