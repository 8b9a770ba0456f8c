"""Stopping a running driver: a stop, restart or migration of its job, or a shutdown.

:func:`begin_stop` (the poll thread, or the shutdown's hand-off) moves the run to
``stopping``, records it (fenced) and submits :func:`stop_driver`, a task: SIGTERM, the
grace, SIGKILL, then the run's end (``server/outcomes.py``): a release, or the outcome
of a driver that ended on its own before the stop reached it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from scheduler import distribution
from server import log_shipping, metrics, outcomes, reconcile, runs, watchdog

if TYPE_CHECKING:
    from server import runner

# The runner's log: its parts log as the runner did before they had modules of their own.
log = logging.getLogger("server.runner")


def begin_stop(the_runner: runner.Runner, run: runs.Run, reason: str) -> None:
    with the_runner._lock:
        if run.phase is not reconcile.Phase.RUNNING:
            return
        run.phase = reconcile.Phase.STOPPING
    try:
        with the_runner.engine.begin() as conn:
            distribution.begin_stop(conn, run.job_id, run.owner, run.epoch, reason)
    except distribution.FencedError:
        outcomes.drop_lost(the_runner, run, "the job is no longer ours")
        return
    except DBAPIError:
        pass  # stopping is safe without the record; the release below is fenced
    log.info(reason, extra={"action": "stopping", "job": run.name, "epoch": run.epoch})
    the_runner._tasks.submit(the_runner._stop_driver, run)


def stop_driver(the_runner: runner.Runner, run: runs.Run) -> None:
    started = watchdog.lease_clock()
    try:
        outcome = run.driver.stop(the_runner.config.stop_grace) if run.driver is not None else None
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
        outcomes.end(the_runner, run, outcomes.outcome_write(the_runner, run, outcome))
    else:
        outcomes.release(the_runner, run)
    log_shipping.ship(the_runner, run)
