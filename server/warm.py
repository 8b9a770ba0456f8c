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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from scheduler import distribution, secrets
from scheduler import jobs as job_catalog
from server import driver, launch, rundir, runs, spark_master, warm_entry, watchdog

if TYPE_CHECKING:
    from server import runner

log = logging.getLogger("server.runner")

# How often a building warm driver's log is read for READY_LINE, seconds.
READY_POLL_S = 0.2
_serial = itertools.count(1)


@dataclass
class WarmRun:
    """One warm driver of this server. ``driver`` is set by its prestart task; the
    other fields are set when the poll thread creates it."""

    job_id: int
    name: str
    kind: str
    epoch: int  # the claim it waits for: the offered hand-off's epoch + 1
    attempt: int  # that claim's attempt
    revision: int | None  # the revision it runs: the job's current one when offered
    run_dir: Path
    driver: driver.Driver | None = None
    master: str = ""
    ready: bool = False
    discarded: bool = False  # not to be taken any more: killed by whoever sees it first
    # The version of each secret its environment holds (secret name -> version), read
    # before their values: a secret given a new value since is never taken warm.
    secret_versions: dict[str, int] | None = None


def warm_epochs(the_runner: runner.Runner) -> dict[int, int]:
    """Job id -> the epoch each warm driver waits for (``reconcile.decide``'s ``warm``)."""
    with the_runner._lock:
        return {job_id: warm.epoch for job_id, warm in the_runner._warm.items()}


def begin(the_runner: runner.Runner, row: distribution.Row) -> None:
    """Start a warm driver for the claim that follows ``row``'s offered hand-off (the
    poll thread: reconcile.PreStart)."""
    cfg = the_runner.config
    epoch = row.epoch + 1
    warm = WarmRun(
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
    with the_runner._lock:
        the_runner._warm[row.job_id] = warm
    log.info(
        "pre-starting a warm driver",
        extra={"action": "warm_start", "job": row.name, "epoch": epoch},
    )
    the_runner._tasks.submit(prestart, the_runner, warm, row.epoch)


def prestart(the_runner: runner.Runner, warm: WarmRun, offered_epoch: int) -> None:
    """Launch ``warm``'s driver, wait until its SparkSession is built, and say so in
    PostgreSQL. Any failure leaves the cold path: the warm run is forgotten (and its
    driver killed), the old owner stops anyway after its bounded wait."""
    try:
        handle = _launch(the_runner, warm)
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
        _mark_ready(the_runner, warm, offered_epoch)
        return
    with the_runner._lock:
        warm.driver = handle
        discarded = warm.discarded
    if discarded:
        handle.kill()
        return
    if _wait_ready(the_runner, warm):
        _mark_ready(the_runner, warm, offered_epoch)


def _launch(the_runner: runner.Runner, warm: WarmRun) -> driver.Driver | None:
    cfg = the_runner.config
    with the_runner.engine.connect() as conn:
        job = job_catalog.run_definition(conn, warm.job_id, warm.revision)
        warm.secret_versions = secrets.versions(conn, (job.get("secret_env") or {}).values())
    master = job["spark_master"] or cfg.spark_master
    if spark_master.unreachable(master):
        log.info(
            "no warm driver: no Spark master answers",
            extra={"action": "warm_failed", "job": warm.name, "epoch": warm.epoch},
        )
        return None  # a cold start, deferred as usual, will wait for the master
    warm.master = master
    # The run as the claim will make it: its identity is what the driver's environment
    # (SPARKRING_EPOCH, SPARKRING_ATTEMPT) and its watchdog's record of its end name.
    deadline = watchdog.lease_clock() + cfg.warm_go_timeout
    planned = runs.Run(
        job_id=warm.job_id,
        name=warm.name,
        kind=warm.kind,
        epoch=warm.epoch,
        attempt=warm.attempt,
        claimed_at=watchdog.lease_clock(),
        deadline=deadline,
        owner=the_runner.owner,
        revision=warm.revision,
    )
    spec = launch.build_spec(
        the_runner,
        planned,
        {**job, "run": None},
        master,
        run_dir=warm.run_dir,
        warm_go_timeout=cfg.warm_go_timeout,
    )
    report = launch.finish_report(the_runner, planned, spec, master)
    return driver.launch(spec, deadline, records=cfg.records, report=report)


def _wait_ready(the_runner: runner.Runner, warm: WarmRun) -> bool:
    """Until the warm driver's log says its session is built: True; False when it
    ended, was discarded or taken first, or the runner stops."""
    assert warm.driver is not None
    log_file = warm.driver.log_file
    while not the_runner._stop.is_set():
        with the_runner._lock:
            if warm.discarded or the_runner._warm.get(warm.job_id) is not warm:
                return False
        if warm.driver.ended():
            return False
        try:
            if warm_entry.READY_LINE in log_file.read_text(errors="replace"):
                warm.ready = True
                return True
        except OSError:
            pass
        the_runner._stop.wait(READY_POLL_S)
    return False


def _mark_ready(the_runner: runner.Runner, warm: WarmRun, offered_epoch: int) -> None:
    try:
        with the_runner.engine.begin() as conn:
            distribution.mark_warm_ready(conn, warm.job_id, the_runner.owner.server, offered_epoch)
    except distribution.FencedError:
        return  # the offer moved on (released, claimed): the poll decides what is left
    except DBAPIError as exc:
        log.warning(
            "could not record the warm driver as ready: the old owner stops after its wait",
            extra={"action": "warm_ready", "job": warm.name, "error": type(exc.orig).__name__},
        )
        return
    log.info("warm driver ready", extra={"action": "warm_ready", "job": warm.name})


def take(the_runner: runner.Runner, run: runs.Run) -> tuple[driver.Driver, str] | None:
    """The claim's start task: hand ``run`` the warm driver built for it, with its go
    signal, or None (start it cold). Taken only if it waits for exactly this claim
    (epoch, attempt, revision) and still runs; any other warm driver of the job is
    discarded."""
    with the_runner._lock:
        warm = the_runner._warm.pop(run.job_id, None)
        if warm is None:
            return None
        warm.discarded = True  # from here on nobody else may take or keep it
        handle = warm.driver
    wanted = (run.epoch, run.attempt, run.revision)
    if handle is None or (warm.epoch, warm.attempt, warm.revision) != wanted or handle.ended():
        why = "not built yet" if handle is None else "not the claim it waited for, or ended"
        _kill(the_runner, warm, why)
        return None
    if _secrets_changed(the_runner, warm):
        _kill(the_runner, warm, "a secret of its environment has a new value")
        return None
    if spark_master.unreachable(warm.master):
        # Probed between the claim and the start, as every start is: the cold path
        # defers the run until a master answers (S9), never counting it a crash.
        _kill(the_runner, warm, "no Spark master answers")
        return None
    link = rundir.run_dir(the_runner.config.work_dir, run.job_id, run.epoch)
    with the_runner._lock:
        deadline = run.deadline
    if watchdog.lease_clock() >= deadline:
        _kill(the_runner, warm, "lease deadline passed before its go signal")
        raise driver.DriverError("lease deadline passed while preparing the driver")
    try:
        os.symlink(warm.run_dir.name, link)
        # The claim's lease, before go: from its go on, the driver lives by the lease.
        handle.confirm(deadline)
        rundir.write_go(warm.run_dir / rundir.GO_FILE)
    except OSError as exc:
        _kill(the_runner, warm, f"cannot give it its go signal: {exc}")
        link.unlink(missing_ok=True)
        return None
    log.info(
        "warm driver takes the run",
        extra={"action": "warm_go", "job": run.name, "epoch": run.epoch},
    )
    return handle, warm.master


def _secrets_changed(the_runner: runner.Runner, warm: WarmRun) -> bool:
    """Whether a secret the warm driver holds was given a new value (or deleted) since it
    was read: its driver must not run with the stale one. An error reading them: changed
    (the cold start reads them again, or defers)."""
    if not warm.secret_versions:
        return False
    try:
        with the_runner.engine.connect() as conn:
            now = secrets.versions(conn, warm.secret_versions)
    except DBAPIError:
        return True
    return now != warm.secret_versions


def discard(the_runner: runner.Runner, job_id: int, why: str) -> None:
    """The poll thread (reconcile.Discard): kill the warm driver of ``job_id``, in a task."""
    with the_runner._lock:
        warm = the_runner._warm.pop(job_id, None)
        if warm is None:
            return
        warm.discarded = True
    the_runner._tasks.submit(_kill, the_runner, warm, why)


def reap_ended(the_runner: runner.Runner) -> None:
    """Forget the warm drivers that ended on their own (no go signal in time, a failed
    session): they ran nothing of the job's and nothing is recorded."""
    with the_runner._lock:
        ended = [
            warm
            for warm in the_runner._warm.values()
            if warm.driver is not None and warm.driver.ended()
        ]
        for warm in ended:
            del the_runner._warm[warm.job_id]
            warm.discarded = True
    for warm in ended:
        log.info(
            "warm driver ended without its go signal",
            extra={"action": "warm_ended", "job": warm.name, "epoch": warm.epoch},
        )


def kill_all(the_runner: runner.Runner) -> None:
    """Shutdown: kill every warm driver (none ran any job code)."""
    with the_runner._lock:
        left = list(the_runner._warm.values())
        the_runner._warm.clear()
        for warm in left:
            warm.discarded = True
    threads = [
        threading.Thread(target=_kill, args=(the_runner, warm, "server stopping"), daemon=True)
        for warm in left
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _kill(the_runner: runner.Runner, warm: WarmRun, why: str) -> None:
    log.info(
        "discarding a warm driver: %s",
        why,
        extra={"action": "warm_discard", "job": warm.name, "epoch": warm.epoch},
    )
    with the_runner._lock:
        handle = warm.driver
    if handle is not None:
        handle.kill()
