"""Warm drivers: the next driver of a planned move, started while the old one still runs.

A planned move of a streaming job (a roll, a drain, a join's rebalance, ``ring
rebalance``) costs a Spark cold start when its next driver starts only after the old
one stopped. Here the target starts that driver early, under its watchdog, through the
warm entry point (``server/warm_entry.py``): the JVM and the SparkSession are built
while the old driver still runs, and the job's main runs only once its server writes
``go.json``, after its claim committed. Transitions of one warm driver (this server's
side; the decisions are ``server/reconcile.py``'s)::

    offered   the old owner began a planned stop with handoff_epoch = its epoch
              -> reconcile.PreStart: :func:`prestart` (a task) launches it, with a
                 lease file of its own that kills it after warm_go_timeout
    building  -> ready: its log says READY_LINE; :func:`prestart` records it
                 (distribution.mark_warm_ready): the old owner stops its driver
              -> failed: it could not be launched (no Spark master answers, an
                 artifact or spec error): recorded the same way, so that the old
                 owner stops now; kept driverless until the hand-off moves on, so the
                 offer is not tried again at every poll, and the claim starts cold
    waiting   -> taken: this server claimed the job at the epoch it was built for;
                 :func:`take` (the claim's start task) links the run directory,
                 confirms the claim's lease to its watchdog, then writes go.json
              -> discarded: the hand-off went elsewhere (reconcile.Discard), the claim
                 is not the one it waited for, or it ended: killed, its directory left
    ended     its watchdog's deadline passed without go: it ran no job code, and
              nothing is recorded (watchdog ``--go-file``)

What the server keeps of it is a ``runs.WarmRun`` in the run table, whose ``phase``
(``runs.WarmPhase``) is ``building`` (launching, failed and kept driverless, or
building its session), ``ready``, or ``discarded`` (taken, or to be killed: out of the
table, nobody else may take or keep it).

Why this keeps one driver per job: the old driver is gone before the claim (it released
the job after its stop, or its lease expired and its watchdog killed it), the claim
takes epoch + 1, and the job's main runs only after the claim. Before go.json the warm
driver touches neither the checkpoint nor the output.

A warm run's directory is ``jobs/<id>/<epoch>.warm-<pid>-<n>``, and ``jobs/<id>/<epoch>`` a
link to it once it is taken: a warm driver that was discarded can never be confused
with the cold run of the same epoch, and a server restarted later finds a taken run
where it looks for its epoch (``rundir.run_trace``).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading

from sqlalchemy.exc import DBAPIError

from scheduler import distribution, secrets
from scheduler import jobs as job_catalog
from server import (
    driver,
    launch_spec,
    run_context,
    run_table,
    rundir,
    runs,
    spark_master,
    warm_entry,
    watchdog,
)

log = logging.getLogger(__name__)

# How often a building warm driver's log is read for READY_LINE, seconds.
READY_POLL_S = 0.2
_serial = itertools.count(1)


def warm_epochs(table: run_table.RunTable) -> dict[int, int]:
    """Job id -> the epoch each warm driver waits for (``reconcile.decide``'s ``warm``)."""
    return table.warm_epochs()


def begin(table: run_table.RunTable, ctx: run_context.Context, row: distribution.Row) -> None:
    """Start a warm driver for the claim that follows ``row``'s offered hand-off (the
    poll thread: reconcile.PreStart)."""
    cfg = ctx.config
    epoch = row.epoch + 1
    warm = runs.WarmRun(
        job_id=row.job_id,
        name=row.name,
        kind=row.kind,
        epoch=epoch,
        attempt=row.attempt + 1,
        revision=row.job_revision,
        # Unique per process too: a warm driver of an earlier process may still live.
        run_dir=rundir.job_dir(cfg.work_dir, row.job_id)
        / f"{epoch}.warm-{os.getpid()}-{next(_serial)}",
    )
    table.add_warm(warm)
    log.info(
        "pre-starting a warm driver",
        extra={"action": "warm_start", "job": row.name, "epoch": epoch},
    )
    ctx.submit(prestart, table, ctx, warm, row.epoch)


def prestart(
    table: run_table.RunTable, ctx: run_context.Context, warm: runs.WarmRun, offered_epoch: int
) -> None:
    """Launch ``warm``'s driver, wait until its SparkSession is built, and say so in
    PostgreSQL. Any failure leaves the cold path: the warm run is forgotten (and its
    driver killed), the old owner stops anyway after its bounded wait."""
    try:
        handle = _launch(ctx, warm)
    except Exception as exc:  # a warm start is an optimisation: never the job's failure
        log.warning(
            "no warm driver: %s",
            exc,
            extra={"action": "warm_failed", "job": warm.name, "error": type(exc).__name__},
        )
        handle = None
    if handle is None:
        # Kept, driverless, until the hand-off moves on (the offer is not pre-started
        # again at every poll), and the old owner told to stop now: the claim is cold.
        _mark_ready(ctx, warm, offered_epoch)
        return
    if table.set_warm_driver(warm, handle):  # discarded meanwhile
        handle.kill()
        return
    if _wait_ready(table, ctx, warm):
        _mark_ready(ctx, warm, offered_epoch)


def _launch(ctx: run_context.Context, warm: runs.WarmRun) -> driver.Driver | None:
    cfg = ctx.config
    with ctx.engine.connect() as conn:
        job = job_catalog.definition_of_run(conn, warm.job_id, warm.revision)
        warm.secret_versions = secrets.versions(conn, (job.secret_env or {}).values())
    master = job.spark_master or cfg.spark_master
    if spark_master.unreachable(master):
        log.info(
            "no warm driver: no Spark master answers",
            extra={"action": "warm_failed", "job": warm.name, "epoch": warm.epoch},
        )
        return None  # a cold start, deferred as usual, will wait for the master
    warm.master = master
    deadline = watchdog.lease_clock() + cfg.warm_go_timeout
    # Built for the claim it waits for: its identity (epoch, attempt, revision) is what
    # the driver's environment (SPARKRING_EPOCH, SPARKRING_ATTEMPT) and its watchdog's
    # record of its end name.
    spec = launch_spec.build_spec(
        ctx,
        warm,
        {**job, "run": None},
        master,
        run_dir=warm.run_dir,
        warm_go_timeout=cfg.warm_go_timeout,
    )
    report = launch_spec.finish_report(ctx, warm, spec, master)
    return driver.launch(spec, deadline, records=cfg.records, report=report)


def _wait_ready(table: run_table.RunTable, ctx: run_context.Context, warm: runs.WarmRun) -> bool:
    """Until the warm driver's log says its session is built: True; False when it
    ended, was discarded or taken first, or the runner stops."""
    assert warm.driver is not None
    log_file = warm.driver.log_file
    while not ctx.stop.is_set():
        if not table.warm_wanted(warm):
            return False
        if warm.driver.ended():
            return False
        try:
            if warm_entry.READY_LINE in log_file.read_text(errors="replace"):
                table.warm_ready(warm)
                return True
        except OSError:
            pass
        ctx.stop.wait(READY_POLL_S)
    return False


def _mark_ready(ctx: run_context.Context, warm: runs.WarmRun, offered_epoch: int) -> None:
    try:
        with ctx.engine.begin() as conn:
            distribution.mark_warm_ready(conn, warm.job_id, ctx.owner.server, offered_epoch)
    except distribution.FencedError:
        return  # the offer moved on (released, claimed): the poll decides what is left
    except DBAPIError as exc:
        log.warning(
            "could not record the warm driver as ready: the old owner stops after its wait",
            extra={"action": "warm_ready", "job": warm.name, "error": type(exc.orig).__name__},
        )
        return
    log.info("warm driver ready", extra={"action": "warm_ready", "job": warm.name})


def take(
    table: run_table.RunTable, ctx: run_context.Context, run: runs.Run
) -> tuple[driver.Driver, str] | None:
    """The claim's start task: hand ``run`` the warm driver built for it, with its go
    signal, or None (start it cold). Taken only if it waits for exactly this claim
    (epoch, attempt, revision) and still runs; any other warm driver of the job is
    discarded."""
    # From here on nobody else may take or keep it.
    if (taken := table.take_warm(run.job_id)) is None:
        return None
    warm, handle = taken
    wanted = (run.epoch, run.attempt, run.revision)
    if handle is None or (warm.epoch, warm.attempt, warm.revision) != wanted or handle.ended():
        why = "not built yet" if handle is None else "not the claim it waited for, or ended"
        _kill(table, warm, why)
        return None
    if _secrets_changed(ctx, warm):
        _kill(table, warm, "a secret of its environment has a new value")
        return None
    if spark_master.unreachable(warm.master):
        # Probed between the claim and the start, as every start is: the cold path
        # defers the run until a master answers (S9), never counting it a crash.
        _kill(table, warm, "no Spark master answers")
        return None
    link = rundir.run_dir(ctx.config.work_dir, run.job_id, run.epoch)
    deadline = table.deadline_of(run)
    if watchdog.lease_clock() >= deadline:
        _kill(table, warm, "lease deadline passed before its go signal")
        raise driver.DriverError("lease deadline passed while preparing the driver")
    try:
        os.symlink(warm.run_dir.name, link)
        # The claim's lease, before go: from its go on, the driver lives by the lease.
        handle.confirm(deadline)
        rundir.write_go(warm.run_dir / rundir.GO_FILE)
    except OSError as exc:
        _kill(table, warm, f"cannot give it its go signal: {exc}")
        link.unlink(missing_ok=True)
        return None
    log.info(
        "warm driver takes the run",
        extra={"action": "warm_go", "job": run.name, "epoch": run.epoch},
    )
    return handle, warm.master


def _secrets_changed(ctx: run_context.Context, warm: runs.WarmRun) -> bool:
    """Whether a secret the warm driver holds was given a new value (or deleted) since it
    was read: its driver must not run with the stale one. An error reading them: changed
    (the cold start reads them again, or defers)."""
    if not warm.secret_versions:
        return False
    try:
        with ctx.engine.connect() as conn:
            now = secrets.versions(conn, warm.secret_versions)
    except DBAPIError:
        return True
    return now != warm.secret_versions


def discard(table: run_table.RunTable, ctx: run_context.Context, job_id: int, why: str) -> None:
    """The poll thread (reconcile.Discard): kill the warm driver of ``job_id``, in a task."""
    warm = table.discard_warm(job_id)
    if warm is None:
        return
    ctx.submit(_kill, table, warm, why)


def reap_ended(table: run_table.RunTable) -> None:
    """Forget the warm drivers that ended on their own (no go signal in time, a failed
    session): they ran nothing of the job's and nothing is recorded."""
    for warm in table.reap_ended_warm():
        log.info(
            "warm driver ended without its go signal",
            extra={"action": "warm_ended", "job": warm.name, "epoch": warm.epoch},
        )


def kill_all(table: run_table.RunTable) -> None:
    """Shutdown: kill every warm driver (none ran any job code)."""
    left = table.discard_all_warm()
    threads = [
        threading.Thread(target=_kill, args=(table, warm, "server stopping"), daemon=True)
        for warm in left
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _kill(table: run_table.RunTable, warm: runs.WarmRun, why: str) -> None:
    log.info(
        "discarding a warm driver: %s",
        why,
        extra={"action": "warm_discard", "job": warm.name, "epoch": warm.epoch},
    )
    handle = table.warm_driver(warm)
    if handle is not None:
        handle.kill()
