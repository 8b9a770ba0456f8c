"""Stopping a running driver: a stop, restart or migration of its job, or a shutdown.

:func:`begin_stop` (the poll thread, or the shutdown's hand-off) moves the run to
``stopping``, records it (fenced) and submits :func:`stop_driver`, a task: SIGTERM, the
grace, SIGKILL, then the run's end (``server/outcomes.py``): a release, or the outcome
of a driver that ended on its own before the stop reached it.

A planned move of a streaming job offers its target a warm hand-off (``warm``;
``server/warm.py``): the stop task first waits until the target's warm driver is ready,
the offer no longer stands, or ``warm_ready_wait`` passed (:func:`await_warm`), then
stops as above. The driver keeps running, under its renewed lease, while it waits.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import DBAPIError

from scheduler import distribution
from server import (
    log_shipping,
    metrics,
    outcomes,
    reconcile,
    run_context,
    run_table,
    runs,
    watchdog,
)

log = logging.getLogger(__name__)

# How often the old owner of a warm hand-off looks whether the target is ready, seconds.
WARM_LOOK_S = 0.25


def begin_stop(
    table: run_table.RunTable,
    ctx: run_context.Context,
    run: runs.Run,
    reason: str,
    *,
    warm: bool = False,
) -> None:
    if not table.begin_stop(run):
        return
    try:
        with ctx.engine.begin() as conn:
            distribution.begin_stop(conn, run.job_id, run.owner, run.epoch, reason, warm=warm)
        run.warm_offered = warm
    except distribution.FencedError:
        outcomes.drop_lost(table, run, "the job is no longer ours")
        return
    except DBAPIError:
        pass  # stopping is safe without the record; the release below is fenced
    log.info(reason, extra={"action": "stopping", "job": run.name, "epoch": run.epoch})
    ctx.submit(stop_driver, table, ctx, run)


def await_warm(ctx: run_context.Context, run: runs.Run) -> reconcile.WarmWait:
    """Wait, at most ``warm_ready_wait`` seconds, until the target's warm driver is
    ready or the offer no longer stands (``reconcile.warm_wait``); GIVE_UP on timeout."""
    started = watchdog.lease_clock()
    until = started + ctx.config.warm_ready_wait
    outcome = reconcile.WarmWait.GIVE_UP
    while watchdog.lease_clock() < until and not ctx.stop.is_set():
        if ctx.shutting_down.is_set() or (run.driver is not None and run.driver.ended()):
            break  # a shutdown hands off at once; a driver that ended has nothing to wait for
        try:
            with ctx.engine.connect() as conn:
                rows = distribution.poll(conn, run.owner, [run.job_id])
        except DBAPIError:
            rows = None  # PostgreSQL away: keep waiting within the bound
        if rows is not None:
            row = next((r for r in rows if r.job_id == run.job_id), None)
            outcome = reconcile.warm_wait(row, run.owner, run.epoch)
            if outcome is not reconcile.WarmWait.WAIT:
                break
        outcome = reconcile.WarmWait.GIVE_UP  # unless the next look says otherwise
        ctx.stop.wait(WARM_LOOK_S)
    log.info(
        "warm hand-off: stopping the old driver (%s after %.1f s)",
        outcome,
        watchdog.lease_clock() - started,
        extra={"action": "warm_wait", "job": run.name, "epoch": run.epoch},
    )
    return outcome


def stop_driver(table: run_table.RunTable, ctx: run_context.Context, run: runs.Run) -> None:
    if run.warm_offered:
        await_warm(ctx, run)
    started = watchdog.lease_clock()
    try:
        outcome = run.driver.stop(ctx.config.stop_grace) if run.driver is not None else None
    except Exception:
        # The graceful stop itself failed (its stop file could not be written: a full
        # disk, EIO, the run dir gone). Left as it was, the run stayed ``stopping``
        # for ever with its lease renewed and its driver alive: kill it instead.
        log.exception(
            "stopping the driver failed; killing it",
            extra={"action": "stop_failed", "job": run.name, "epoch": run.epoch},
        )
        assert run.driver is not None
        run.driver.kill()
        outcome = run.driver.poll()
    metrics.REGISTRY.observe("sparkring_driver_stop_seconds", watchdog.lease_clock() - started)
    if (
        outcome is not None
        and outcome.reason == "exited"
        and (outcome.exit_code == 0 or outcome.stopping is False)
    ):
        # It ended on its own before the stop reached it: a batch run that exited 0
        # is finished, never released to run again elsewhere; a failure is the
        # job's own, counted against its budget (its watchdog records it, or could
        # not: then this does), never released to run again for free.
        outcomes.end(table, ctx, run, outcomes.outcome_write(table, ctx, run, outcome))
    else:
        outcomes.release(table, ctx, run)
    log_shipping.ship(ctx.bucket, run)
