"""End-of-run recording: how a run's end is written to PostgreSQL, and kept until it is.

A run whose driver is gone enters ``ended`` with its outcome as a fenced write
(:func:`end`); :func:`record` writes it and forgets the run, or keeps it when
PostgreSQL cannot be reached (the poll retries it: ``reconcile.Record``; the lease,
still renewed meanwhile, keeps the job from being claimed again). So a batch driver that
exited 0 ends ``finished`` and is never run again (S4).

- :func:`outcome_write`: the write for a driver's end (``reconcile.ending``): release,
  finish, a crash that spends the job's budget, or a deferral when the driver was lost
  to a Spark master outage (S9); nothing when its watchdog recorded it already;
- :func:`after_failure`, :func:`defer`, :func:`defer_for_master`, :func:`release`: the
  ends of a run that never started, or was stopped;
- :func:`reap_ended` (the poll thread): notices the drivers that ended;
- :func:`drop_lost`: the job is no longer ours: kill the driver, record nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from scheduler import distribution, notify
from server import (
    driver,
    driver_error,
    exit_codes,
    log_shipping,
    reconcile,
    run_context,
    run_table,
    rundir,
    runs,
    spark_master,
)

log = logging.getLogger(__name__)

# How long a driver's SIGTERM exit waits for this server's own shutdown to begin before
# it counts as the job's crash: the service manager signals both at once (seconds).
SIGTERM_SHUTDOWN_WAIT_S = 2.0


def reap_ended(table: run_table.RunTable, ctx: run_context.Context) -> None:
    for run in table.snapshot().values():
        if run.phase is not reconcile.Phase.RUNNING or run.driver is None:
            continue
        outcome = run.driver.poll()
        if outcome is not None:
            _ended(table, ctx, run, outcome)


def _ended(
    table: run_table.RunTable, ctx: run_context.Context, run: runs.Run, outcome: driver.Outcome
) -> None:
    extra = {"job": run.name, "epoch": run.epoch, "exit_code": outcome.exit_code}
    if outcome.reason == "lease_expired":
        log.error("watchdog killed the driver: lease lost", extra={"action": "lease_lost", **extra})
    elif outcome.reason == "killed":
        # Killed on request, or its watchdog itself died (kill -9, the OOM killer):
        # either way no process of the run is left (Driver.poll swept it).
        log.error(
            "the run was killed (its watchdog was killed, or asked to kill it); "
            "nothing of it is left",
            extra={"action": "killed", **extra},
        )
    elif outcome.reason == "exited" and outcome.exit_code == 0:
        log.info("driver finished", extra={"action": "finished", **extra})
    end(table, ctx, run, outcome_write(table, ctx, run, outcome))
    ctx.submit(log_shipping.ship, ctx.bucket, run)


def outcome_write(
    table: run_table.RunTable, ctx: run_context.Context, run: runs.Run, outcome: driver.Outcome
) -> Callable[[sa.Connection], object]:
    """The fenced write that records how ``run`` ended."""
    cfg = ctx.config
    if outcome.reason == "killed" and run.killed_as is not None:
        # Killed on a decision taken before the kill (Runner.kill_as): the driver is dead
        # before the record lets anyone claim the job again.
        return run.killed_as
    # A SIGTERM exit while we shut down: the service manager signalled every process
    # of the server's unit (docs/operations.md: use KillMode=mixed).
    if outcome.reason == "exited" and outcome.exit_code in exit_codes.SIGTERM_EXITS:
        # A service manager that signals the whole unit (KillMode=control-group)
        # SIGTERMs the driver and this server together: the driver's exit can be
        # reaped before our own handler has begun the shutdown. Not a crash then.
        ctx.shutting_down.wait(SIGTERM_SHUTDOWN_WAIT_S)
    how = reconcile.ending(
        outcome.reason,
        outcome.exit_code,
        recorded=outcome.recorded,
        shutting_down=ctx.shutting_down.is_set(),
        went=outcome.went,
    )
    if how is reconcile.Ending.RELEASE:
        return lambda conn: distribution.release(conn, run.job_id, run.owner, run.epoch)
    finish = lambda conn: distribution.finish(conn, run.job_id, run.owner, run.epoch)  # noqa: E731
    if how is reconcile.Ending.FINISH:
        return finish
    where = (
        run.driver.run_dir
        if run.driver is not None
        else rundir.run_trace(cfg.work_dir, run.job_id, run.name, run.epoch)
    )
    error = driver_error.crash_error(outcome.reason, outcome.exit_code, where / rundir.LOG_FILE)
    if how is reconcile.Ending.CRASH and spark_master.lost_to_outage(
        run.master, where / rundir.LOG_FILE
    ):
        # It never registered, and no master answers: the outage's, not the job's.
        return _master_defer_write(table, ctx, run, error)
    # Batch and streaming alike: backoff while the job's budget lasts, then failed.
    crash = _failure_write(ctx, run, error, fail=False)
    if how is reconcile.Ending.RECORDED:
        if outcome.exit_code != 0:
            log.warning(
                "driver failed; its watchdog recorded it",
                extra={"action": "crashed", "job": run.name, "epoch": run.epoch},
            )
        own = finish if outcome.exit_code == 0 else crash

        def recorded(conn: sa.Connection) -> None:
            # PostgreSQL, not the result file, says whether it is recorded: a commit
            # the watchdog saw acknowledged is gone after a failover to an
            # asynchronous replica (outside the model: docs/drivers.md). Then the
            # server writes it itself (fenced: nothing if the row moved on).
            if run.job_id not in distribution.ended_at(conn, {run.job_id: run.epoch}):
                own(conn)

        return recorded
    return crash


def _failure_write(
    ctx: run_context.Context, run: runs.Run, error: str, *, fail: bool, cause: str = "driver"
) -> Callable[[sa.Connection], object]:
    cfg = ctx.config

    def write(conn: sa.Connection) -> None:
        state = distribution.record_crash(
            conn,
            run.job_id,
            run.owner,
            run.epoch,
            error,
            retry=not fail,
            backoff_base=cfg.backoff_base,
            backoff_max=cfg.backoff_max,
            cause=cause,
        )
        log.warning(
            "driver failed",
            extra={"action": "crashed", "job": run.name, "epoch": run.epoch, "state": state},
        )

    return write


def after_failure(
    table: run_table.RunTable,
    ctx: run_context.Context,
    run: runs.Run,
    error: str,
    *,
    fail: bool,
    cause: str = "driver",
) -> None:
    end(table, ctx, run, _failure_write(ctx, run, error, fail=fail, cause=cause))


def defer(table: run_table.RunTable, ctx: run_context.Context, run: runs.Run, error: str) -> None:
    """The driver could not be started for a reason that may pass: the job waits, with
    no restart counted, ``backoff_base`` doubling with each consecutive deferral on this
    server, up to ``backoff_max`` (a cause that does not pass must not make a server
    claim the job again every second, an epoch and events each time)."""
    cfg = ctx.config
    streak = table.count_start_deferral(run.job_id)
    delay = spark_master.wait_before_retry(streak, cfg.backoff_base, cfg.backoff_max)
    log.warning(
        error,
        extra={"action": "deferred", "job": run.name, "epoch": run.epoch, "retry_in_s": delay},
    )
    end(
        table,
        ctx,
        run,
        lambda conn: distribution.defer(conn, run.job_id, run.owner, run.epoch, error, delay),
    )


def _master_defer_write(
    table: run_table.RunTable,
    ctx: run_context.Context,
    run: runs.Run,
    after: str = "",
    master: str | None = None,
) -> Callable[[sa.Connection], object]:
    """The deferral of a run that no Spark master could take (S9): no restart
    counted, the wait doubling with each consecutive one, up to ``master_wait_max``;
    ``after``: the error of the driver that ended for it."""
    cfg = ctx.config
    master = run.master if master is None else master
    streak = table.count_master_deferral(run.job_id)
    delay = spark_master.wait_before_retry(streak, cfg.backoff_base, cfg.master_wait_max)
    error = spark_master.detail(master) + (f" after {after}" if after else "")
    error = driver_error.one_line(error)
    log.warning(
        "no Spark master answers: deferred",
        extra={"action": "deferred", "job": run.name, "epoch": run.epoch, "master": master},
    )
    return lambda conn: distribution.defer(
        conn, run.job_id, run.owner, run.epoch, error, delay, cause=spark_master.CAUSE
    )


def defer_for_master(
    table: run_table.RunTable, ctx: run_context.Context, run: runs.Run, master: str
) -> None:
    end(table, ctx, run, _master_defer_write(table, ctx, run, master=master))


def release(table: run_table.RunTable, ctx: run_context.Context, run: runs.Run) -> None:
    end(table, ctx, run, lambda conn: distribution.release(conn, run.job_id, run.owner, run.epoch))


def end(
    table: run_table.RunTable,
    ctx: run_context.Context,
    run: runs.Run,
    write: Callable[[sa.Connection], object],
) -> None:
    """The run's driver is gone: keep its outcome until PostgreSQL records it."""
    table.end(run, write)
    record(table, ctx, run)


def record(table: run_table.RunTable, ctx: run_context.Context, run: runs.Run) -> None:
    """Write the run's outcome (fenced); forget the run once it is recorded or fenced.

    A failure to reach PostgreSQL keeps the outcome: the poll loop retries it, and
    the lease, still renewed meanwhile, keeps the job from being claimed again."""
    write = table.begin_recording(run)
    if write is None:
        return
    try:
        with ctx.engine.begin() as conn:
            write(conn)
            notify.notify(conn, notify.TARGETS_CHANNEL, run.name)
    except distribution.FencedError:
        log.warning(
            "write fenced: the job is no longer ours",
            extra={"action": "fenced", "job": run.name, "epoch": run.epoch},
        )
    except BaseException as exc:
        # Kept to retry: a database error, or anything else (a bug must not leave
        # ``recording`` set, or the outcome would never be written again).
        log.warning(
            "could not record the end of a run; keeping it to retry",
            extra={"action": "write_failed", "job": run.name, "error": type(exc).__name__},
        )
        table.recording_failed(run)
        if isinstance(exc, DBAPIError):
            return
        raise
    table.recorded(run)
    ctx.wake()


def drop_lost(table: run_table.RunTable, run: runs.Run, why: str) -> None:
    log.error(
        why + "; killing the driver",
        extra={"action": "lost", "job": run.name, "epoch": run.epoch},
    )
    if run.driver is not None:
        run.driver.kill()
    table.remove(run)
