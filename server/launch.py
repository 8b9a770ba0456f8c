"""Launching a claimed run: from the job's definition to a driver under its watchdog.

:func:`start` (a task of the runner) reads the revision the claim pinned
(``jobs.definition_of_run``), defers at once when no Spark master answers, fetches and
verifies the artifacts (``resource_center``), pins them in the run directory, builds the
``driver.DriverSpec`` and the watchdog's ``driver.FinishReport`` (``server/launch_spec.py``),
and launches
(``driver.launch``); the run is then ``running``, and :func:`mark_running` records it.
A start that fails ends the run through ``server/outcomes.py``: an invalid artifact or
spec fails the job, anything that may pass defers it with backoff.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import DBAPIError

from resource_center import errors
from scheduler import distribution
from scheduler import jobs as job_catalog
from scheduler import runs as run_rows
from server import (
    driver,
    launch_spec,
    metrics,
    outcomes,
    run_context,
    run_table,
    runs,
    spark_master,
    warm,
    watchdog,
)

log = logging.getLogger(__name__)


def start(table: run_table.RunTable, ctx: run_context.Context, run: runs.Run) -> None:
    """Start ``run``'s driver, or end the run (failed or deferred) if it cannot start."""
    try:
        launched = _launch(table, ctx, run)
    # FAILED means only: the job's own driver failed past its budget, or its
    # artifact or spec is invalid. Anything that may pass defers with backoff.
    except (errors.IntegrityError, errors.MissingObject) as exc:
        outcomes.after_failure(
            table, ctx, run, f"artifact refused: {exc}", fail=True, cause="invalid"
        )
        return
    except driver.SpecError as exc:
        outcomes.after_failure(
            table, ctx, run, f"invalid job spec: {exc}", fail=True, cause="invalid"
        )
        return
    except errors.ResourceError as exc:
        outcomes.defer(table, ctx, run, f"artifact unavailable: {exc}")
        return
    except driver.DriverError as exc:
        outcomes.defer(table, ctx, run, f"driver not started: {exc}")
        return
    except DBAPIError as exc:
        outcomes.defer(
            table, ctx, run, f"PostgreSQL unavailable while preparing: {type(exc.orig).__name__}"
        )
        return
    except Exception as exc:
        log.exception("driver start failed", extra={"action": "start", "job": run.name})
        outcomes.defer(table, ctx, run, f"start failed: {type(exc).__name__}: {exc}")
        return
    if launched is None:
        return  # deferred: no Spark master answers
    handle, master = launched
    table.start_running(run, handle, master)
    log.info(
        "driver started",
        extra={"action": "driver_started", "job": run.name, "epoch": run.epoch},
    )
    metrics.REGISTRY.inc("sparkring_driver_starts_total")
    metrics.REGISTRY.observe(
        "sparkring_driver_start_seconds", watchdog.lease_clock() - run.claimed_at
    )
    mark_running(table, ctx, run)
    ctx.wake()


def _launch(
    table: run_table.RunTable, ctx: run_context.Context, run: runs.Run
) -> tuple[driver.Driver, str] | None:
    """Definition -> spec -> files -> process: the launched driver and its Spark master,
    or None when the run was deferred because no master answers. Raises what
    :func:`start` turns into the run's end. A warm driver built for this claim takes the
    run instead (``server/warm.py``)."""
    cfg = ctx.config
    if (taken := warm.take(table, ctx, run)) is not None:
        return taken
    with ctx.engine.connect() as conn:
        # The revision the claim pinned: a newer one rolls the job anew.
        job = job_catalog.definition_of_run(conn, run.job_id, run.revision)
        # The run row the claim moved (batch jobs): SPARKRING_RUN_ID and a fire's time.
        run_row = run_rows.of_claim(conn, run.job_id, run.epoch)
    master = job.spark_master or cfg.spark_master
    try:
        outage = spark_master.unreachable(master)
    except spark_master.MasterURLError as exc:
        raise driver.SpecError(str(exc)) from exc
    if outage:  # before anything is fetched: a driver could not register now
        outcomes.defer_for_master(table, ctx, run, master)
        return None
    table.forget_master_deferrals(run.job_id)
    spec = launch_spec.build_spec(ctx, run, job, master, run_row=run_row)
    deadline = table.deadline_of(run)
    if watchdog.lease_clock() >= deadline:
        raise driver.DriverError("lease deadline passed while preparing the driver")
    report = launch_spec.finish_report(ctx, run, spec, master)
    return driver.launch(spec, deadline, records=cfg.records, report=report), master


def mark_running(table: run_table.RunTable, ctx: run_context.Context, run: runs.Run) -> None:
    """Record that the driver runs. If PostgreSQL is unreachable the row stays
    ``starting`` (every ending is legal from there) and the next poll tries again."""
    assert run.driver is not None
    # Once: the poll may ask again before it sees the first record.
    if not table.begin_marking(run):
        return
    try:
        with ctx.engine.begin() as conn:
            distribution.mark_running(conn, run.job_id, run.owner, run.epoch, run.driver.pid)
        run.mark = runs.Mark.MARKED
    except distribution.FencedError:
        outcomes.drop_lost(table, run, "lease lost while starting")
    except DBAPIError as exc:
        log.warning(
            "could not record the driver start; retrying",
            extra={"action": "write_failed", "job": run.name, "error": type(exc).__name__},
        )
    finally:
        table.end_marking(run)
