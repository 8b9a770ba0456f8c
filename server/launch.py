"""Launching a claimed run: from the job's definition to a driver under its watchdog.

:func:`start` (a task of the runner) reads the revision the claim pinned
(``jobs.run_definition``), defers at once when no Spark master answers, fetches and
verifies the artifacts (``resource_center``), pins them in the run directory, builds the
``driver.DriverSpec`` and the watchdog's ``driver.FinishReport``, and launches
(``driver.launch``); the run is then ``running``, and :func:`mark_running` records it.
A start that fails ends the run through ``server/outcomes.py``: an invalid artifact or
spec fails the job, anything that may pass defers it with backoff.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError

from resource_center import catalog, errors
from scheduler import distribution, secrets
from scheduler import jobs as job_catalog
from scheduler import runs as run_rows
from server import (
    checkpoint,
    driver,
    driver_network,
    job_deps,
    metrics,
    outcomes,
    reconcile,
    rundir,
    runs,
    spark_master,
    warm,
    watchdog,
)
from sql import states

if TYPE_CHECKING:
    from server import runner

# The runner's log: its parts log as the runner did before they had modules of their own.
log = logging.getLogger("server.runner")


def start(the_runner: runner.Runner, run: runs.Run) -> None:
    """Start ``run``'s driver, or end the run (failed or deferred) if it cannot start."""
    try:
        launched = _launch(the_runner, run)
    # FAILED means only: the job's own driver failed past its budget, or its
    # artifact or spec is invalid. Anything that may pass defers with backoff.
    except (errors.IntegrityError, errors.MissingObject) as exc:
        outcomes.after_failure(
            the_runner, run, f"artifact refused: {exc}", fail=True, cause="invalid"
        )
        return
    except driver.SpecError as exc:
        outcomes.after_failure(
            the_runner, run, f"invalid job spec: {exc}", fail=True, cause="invalid"
        )
        return
    except errors.ResourceError as exc:
        outcomes.defer(the_runner, run, f"artifact unavailable: {exc}")
        return
    except driver.DriverError as exc:
        outcomes.defer(the_runner, run, f"driver not started: {exc}")
        return
    except DBAPIError as exc:
        outcomes.defer(
            the_runner, run, f"PostgreSQL unavailable while preparing: {type(exc.orig).__name__}"
        )
        return
    except Exception as exc:
        log.exception("driver start failed", extra={"action": "start", "job": run.name})
        outcomes.defer(the_runner, run, f"start failed: {type(exc).__name__}: {exc}")
        return
    if launched is None:
        return  # deferred: no Spark master answers
    handle, master = launched
    with the_runner._lock:
        the_runner._start_deferrals.pop(run.job_id, None)
        run.driver = handle
        run.master = master
        runs.confirm(run, run.deadline)
        run.phase = reconcile.Phase.RUNNING
    log.info(
        "driver started",
        extra={"action": "driver_started", "job": run.name, "epoch": run.epoch},
    )
    metrics.REGISTRY.inc("sparkring_driver_starts_total")
    metrics.REGISTRY.observe(
        "sparkring_driver_start_seconds", watchdog.lease_clock() - run.claimed_at
    )
    mark_running(the_runner, run)
    the_runner.wake()


def _launch(the_runner: runner.Runner, run: runs.Run) -> tuple[driver.Driver, str] | None:
    """Definition -> spec -> files -> process: the launched driver and its Spark master,
    or None when the run was deferred because no master answers. Raises what
    :func:`start` turns into the run's end. A warm driver built for this claim takes the
    run instead (``server/warm.py``)."""
    cfg = the_runner.config
    if (taken := warm.take(the_runner, run)) is not None:
        return taken
    with the_runner.engine.connect() as conn:
        # The revision the claim pinned: a newer one rolls the job anew.
        job = job_catalog.run_definition(conn, run.job_id, run.revision)
        # The run row the claim moved (batch jobs): SPARKRING_RUN_ID and a fire's time.
        job["run"] = run_rows.of_claim(conn, run.job_id, run.epoch)
    master = job["spark_master"] or cfg.spark_master
    try:
        outage = spark_master.unreachable(master)
    except spark_master.MasterURLError as exc:
        raise driver.SpecError(str(exc)) from exc
    if outage:  # before anything is fetched: a driver could not register now
        outcomes.defer_for_master(the_runner, run, master)
        return None
    the_runner._master_deferrals.pop(run.job_id, None)
    spec = build_spec(the_runner, run, job, master)
    with the_runner._lock:
        deadline = run.deadline
    if watchdog.lease_clock() >= deadline:
        raise driver.DriverError("lease deadline passed while preparing the driver")
    report = finish_report(the_runner, run, spec, master)
    return driver.launch(spec, deadline, records=cfg.records, report=report), master


def build_spec(
    the_runner: runner.Runner,
    run: runs.Run,
    job: dict[str, Any],
    master: str,
    *,
    run_dir: Path | None = None,
    warm_go_timeout: float | None = None,
) -> driver.DriverSpec:
    """The run's driver spec: its artifacts fetched, verified and pinned in its run
    directory (``run_dir``, default its epoch's), its streaming checkpoint prepared.
    ``warm_go_timeout``: a warm driver's (``server/warm.py``)."""
    cfg = the_runner.config
    run_dir = run_dir or rundir.run_dir(cfg.work_dir, run.job_id, run.epoch)
    deps = job.get("deps")
    artifacts = [job["resource"], *job["py_files"], *([deps] if deps else [])]
    fetched = [(_fetch(the_runner, item["id"]), item["filename"]) for item in artifacts]
    # The run's own links, under the original names: the cache may evict them.
    pinned = driver.pin_artifacts(run_dir, fetched)
    deps_zip = pinned.pop() if deps else None
    main, *py_files = pinned
    deps_dir = job_deps.unpacked(cfg.work_dir, deps_zip, deps["sha256"]) if deps_zip else None
    env = {**job.get("env", {}), **_secret_values(the_runner, job.get("secret_env") or {})}
    return driver.DriverSpec(
        job=run.name,
        kind=job["kind"],
        epoch=run.epoch,
        attempt=run.attempt,
        server=cfg.server,
        main=main,
        py_files=py_files,
        conf=job["conf"],
        args=job["args"],
        extra_env=env,
        master=master,
        checkpoint_dir=(
            checkpoint.prepare(cfg.checkpoint_root, run.name, run.job_id)
            if job["kind"] == states.JobKind.STREAMING
            else None
        ),
        run_dir=run_dir,
        revision=run.revision,
        job_id=run.job_id,
        user=cfg.run_as,
        nice=cfg.driver_nice,
        run_id=str(job["run"]["run_id"]) if job.get("run") else "",
        scheduled_time=job["run"]["scheduled_time"] if job.get("run") else None,
        warm_go_timeout=warm_go_timeout,
        address=cfg.driver_address,
        ui_port=driver_network.free_port(),
        deps_dir=deps_dir,
        deps_zip=deps_zip,
    )


def _secret_values(the_runner: runner.Runner, secret_env: dict[str, str]) -> dict[str, str]:
    """The job's secret variables with their values as stored now: a driver started after
    a secret changed gets the new value. A secret gone fails the job (its definition
    names what does not exist); a key this server lacks defers it (another release of
    its settings may hold it)."""
    if not secret_env:
        return {}
    try:
        with the_runner.engine.connect() as conn:
            return secrets.values_for(conn, secret_env, the_runner.config.secret_box)
    except secrets.SecretNotFound as exc:
        raise driver.SpecError(f"secret: {exc}") from None
    except secrets.KeyProblem as exc:
        raise driver.DriverError(f"secret: {exc}") from None


def finish_report(
    the_runner: runner.Runner, run: runs.Run, spec: driver.DriverSpec, master: str
) -> driver.FinishReport:
    """What the run's watchdog needs to record its driver's own exit. It does so for
    both kinds: the server may be stalled or dead at that moment, and neither may a
    finished generation run again nor a failed job run past its budget."""
    cfg = the_runner.config
    return driver.FinishReport(
        database_url=the_runner.engine.url.render_as_string(hide_password=False),
        job_id=run.job_id,
        server=run.owner.server,
        epoch=run.epoch,
        backoff_base=cfg.backoff_base,
        backoff_max=cfg.backoff_max,
        log_file=str(spec.run_dir / rundir.LOG_FILE),
        spark_master=master,
    )


def mark_running(the_runner: runner.Runner, run: runs.Run) -> None:
    """Record that the driver runs. If PostgreSQL is unreachable the row stays
    ``starting`` (every ending is legal from there) and the next poll tries again."""
    assert run.driver is not None
    with the_runner._lock:  # once: the poll may ask again before it sees the first record
        if run.marking or run.marked:
            return
        run.marking = True
    try:
        with the_runner.engine.begin() as conn:
            distribution.mark_running(conn, run.job_id, run.owner, run.epoch, run.driver.pid)
        run.marked = True
    except distribution.FencedError:
        outcomes.drop_lost(the_runner, run, "lease lost while starting")
    except DBAPIError as exc:
        log.warning(
            "could not record the driver start; retrying",
            extra={"action": "write_failed", "job": run.name, "error": type(exc).__name__},
        )
    finally:
        with the_runner._lock:
            run.marking = False


def _fetch(the_runner: runner.Runner, resource_id: int) -> Path:
    resource = catalog.get(the_runner.engine, resource_id)
    return the_runner.cache.fetch(
        the_runner.bucket, resource, retry_for=the_runner.config.fetch_retry, stop=the_runner._stop
    )
