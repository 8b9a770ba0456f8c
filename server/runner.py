"""The runner: this server's side of the distribution table, and its drivers.

Two named threads and a small pool:

- ``runner-poll`` reads the rows targeted at or owned by this server (woken by NOTIFY,
  else every ``poll_interval``) and reconciles: claims free jobs targeted here, stops
  drivers whose job moved away, was stopped or restarted, and reports drivers that
  ended (finished, crashed, lease lost).
- ``runner-renew`` renews every lease of this server in one statement every
  ``renew_interval`` and confirms each renewed driver's watchdog with the deadline
  ``t_sent + ttl - margin`` (``t_sent``: lease-clock time just before the statement), so
  a driver is dead before its lease can expire in PostgreSQL. A driver whose lease was
  not renewed is killed at once.
- ``runner-task-*`` threads start drivers (fetch and verify artifacts, spawn) and stop
  them (SIGTERM, grace, SIGKILL, then release), so a slow stop or download never delays
  renewals or other jobs.

Every database write is fenced by this server's id, its incarnation and the run's epoch
(``scheduler/distribution.py``); a write that matches no row means the job is no longer
ours, and the local driver is killed.

How a run ends is kept until PostgreSQL has recorded it: a write that fails (PostgreSQL
restarting) is retried by every poll, the lease being renewed meanwhile, so a batch
driver that exited 0 ends ``finished`` and is never run again (S4). A lease held by a
previous incarnation of this server id is released early only when its driver is
provably dead on this host (its run directory shows a result, or its watchdog was
found and killed); otherwise it is left to expire (S1).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from resource_center import cache as cache_module
from resource_center import catalog, errors, store
from scheduler import distribution, notify
from scheduler import jobs as job_catalog
from server import (
    checkpoint,
    defaults,
    driver,
    driver_error,
    driver_user,
    metrics,
    reconcile,
    rundir,
    spark_master,
    watchdog,
)
from sql import states

log = logging.getLogger(__name__)

# Look again this long after a lease or backoff is due: PostgreSQL's clock must have
# passed the instant when the claim statement runs.
DUE_SLACK_S = 0.05
# After a failed renewal, try again this soon (seconds): a lock wait that gave up
# (lock_timeout) must not cost a whole renew interval of the watchdog's margin.
RENEW_RETRY_S = 0.25
# How soon an unrecorded run outcome is written again (seconds).
RECORD_RETRY_S = 0.5
# How long a driver's SIGTERM exit waits for this server's own shutdown to begin before
# it counts as the job's crash: the service manager signals both at once (seconds).
SIGTERM_SHUTDOWN_WAIT_S = 2.0
# Pause between two tries of a hand-over's lease extension (seconds).
HAND_OVER_RETRY_S = 0.25


@dataclass
class RunnerConfig:
    server: str
    incarnation: str  # drawn once per process start (distribution.Owner)
    capacity: int
    work_dir: Path
    checkpoint_root: Path
    spark_master: str
    lease_ttl: float
    watchdog_margin: float
    renew_interval: float
    poll_interval: float
    stop_grace: float
    backoff_base: float
    backoff_max: float
    fetch_retry: float
    records: Path | None = None
    # The user drivers run as (driver_user.resolve); None: this server's own user.
    run_as: driver_user.DriverUser | None = None
    # The longest wait between two looks at a Spark master that did not answer, seconds.
    master_wait_max: float = defaults.SPARK_MASTER_WAIT_MAX_S


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
    marking: bool = False  # a thread is recording ``running`` now
    marked: bool = False  # ``running`` is recorded in PostgreSQL


def log_key(job: str, job_id: int, epoch: int) -> str:
    """Where a finished run's driver log is shipped in the bucket: below the job's name
    (to browse) and id (a deleted namesake's logs are never the job's: hole H6)."""
    return f"logs/{job}/{job_id}/{epoch:010d}.log"


def legacy_log_key(job: str, epoch: int) -> str:
    """Where the code before :func:`log_key` shipped a run's log (name and epoch only)."""
    return f"logs/{job}/{epoch:010d}.log"


class Runner:
    def __init__(
        self,
        engine: sa.Engine,
        bucket: store.Store,
        cache: cache_module.Cache,
        config: RunnerConfig,
        *,
        may_claim: Callable[[], bool] = lambda: True,
    ) -> None:
        self.engine = engine
        self.bucket = bucket
        self.cache = cache
        self.config = config
        self._may_claim = may_claim
        self.owner = distribution.Owner(config.server, config.incarnation)
        self._runs: dict[int, Run] = {}
        # Orphans handled (reconcile.orphan_key): a previous incarnation's lease, or one given up.
        self._orphans: set[reconcile.OrphanKey] = set()
        # Job id -> consecutive deferrals because no Spark master answered (the backoff).
        self._master_deferrals: dict[int, int] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._claiming = threading.Event()
        self._claiming.set()
        # Set when shutdown begins (stop_claiming): a SIGTERM exit of a driver waits for
        # it briefly (see _outcome_write).
        self._shutting_down = threading.Event()
        # Set once ZooKeeper accepted this server id: no claim before (a second process
        # with a live server's id must not take a single job while it waits to be
        # refused). Until then, and for a settle time after, a run adopted from the
        # previous incarnation is not migrated: the coordinator retargeted its jobs when
        # the old session expired and gives them back once we are a member again.
        self._registered = threading.Event()
        self._migrate_after = math.inf
        self._tasks = ThreadPoolExecutor(
            max_workers=max(4, 2 * config.capacity), thread_name_prefix="runner-task"
        )
        self._threads = [
            threading.Thread(target=self._poll_loop, name="runner-poll", daemon=True),
            threading.Thread(target=self._renew_loop, name="runner-renew", daemon=True),
        ]
        self.last_renew_ok: float | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def wake(self) -> None:
        self._wake.set()

    def threads_alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads)

    def runs(self) -> dict[int, Run]:
        with self._lock:
            return dict(self._runs)

    def stop_claiming(self) -> None:
        self._claiming.clear()
        self._shutting_down.set()

    def registered(self, settle: float) -> None:
        """ZooKeeper accepted our id: claims may begin; migrations after ``settle`` s."""
        self._migrate_after = watchdog.lease_clock() + settle
        self._registered.set()
        self.wake()

    def hand_over(self, window: float) -> list[str]:
        """A planned restart: extend every lease of this incarnation to ``window``
        seconds and give each watchdog the matching deadline, then leave the drivers
        running for the successor to adopt (:meth:`_clean_orphan`). Call after
        :meth:`stop_loops` (a renewal must not shorten the extended leases again), and
        before waiting for the tasks: a driver stop in flight can take the stop grace
        and more, and no lease is renewed meanwhile. Returns
        the jobs handed over; if PostgreSQL cannot be reached, nothing is extended and
        the drivers die at their current deadlines (then fail over as after a crash)."""
        cfg = self.config
        # The extension is idempotent: tried again while the drivers' current deadlines
        # leave time. A commit whose answer was lost may have extended the leases, and
        # giving up then would make the jobs wait out the whole window.
        with self._lock:
            give_up = min(
                (run.deadline for run in self._runs.values() if run.owner == self.owner),
                default=watchdog.lease_clock(),
            )
        give_up = max(give_up, watchdog.lease_clock() + HAND_OVER_RETRY_S)
        while True:
            t_sent = watchdog.lease_clock()
            try:
                with self.engine.begin() as conn:
                    extended = distribution.renew_leases(conn, self.owner, window)
                break
            except DBAPIError as exc:
                if watchdog.lease_clock() + HAND_OVER_RETRY_S < give_up:
                    log.warning(
                        "hand-over failed; trying again",
                        extra={"action": "hand_over", "error": type(exc.orig).__name__},
                    )
                    threading.Event().wait(HAND_OVER_RETRY_S)
                    continue
                log.error(
                    "hand-over failed: PostgreSQL unreachable; drivers die at their deadlines",
                    extra={"action": "hand_over", "error": type(exc.orig).__name__},
                )
                return []
        deadline = t_sent + window - cfg.watchdog_margin
        handed = []
        with self._lock:
            for run in self._runs.values():
                if run.driver is not None and extended.get(run.job_id) == run.epoch:
                    self._confirm(run, deadline)
                    handed.append(run.name)
        log.info(
            "leases handed over to the next incarnation",
            extra={"action": "hand_over", "jobs": sorted(handed), "window": window},
        )
        return sorted(handed)

    def resume_claiming(self) -> None:
        self._shutting_down.clear()
        self._claiming.set()
        self.wake()

    def hand_off(self, timeout: float) -> None:
        """Stop every driver gracefully and release its job (pending for another server).

        Called on shutdown after claiming stopped and the server left the registry;
        leases keep being renewed until this returns.
        """
        self.stop_claiming()
        deadline = watchdog.lease_clock() + timeout
        while watchdog.lease_clock() < deadline:
            with self._lock:
                if not self._runs:
                    return
                running = [
                    run for run in self._runs.values() if run.phase is reconcile.Phase.RUNNING
                ]
            # Runs still starting become running (or end) soon; stop them then.
            for run in running:
                self._begin_stop(run, "server shutting down")
            self._stop.wait(0.05)
        with self._lock:
            left = list(self._runs.values())
        for run in left:
            if run.driver is not None:
                run.driver.kill()
        log.warning(
            "hand-off timed out; killed the drivers left",
            extra={"action": "hand_off", "jobs": [run.name for run in left]},
        )

    def stop_loops(self) -> None:
        """Stop the poll and renew loops (idempotent); tasks in flight go on."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=10)

    def stop(self) -> None:
        """Stop the loops, then wait for the tasks in flight (idempotent). Drivers still
        running are left to their watchdogs."""
        self.stop_loops()
        self._tasks.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------ renew

    def _renew_loop(self) -> None:
        while not self._stop.is_set():
            ok = self.renew_once()
            self._stop.wait(self.config.renew_interval if ok else RENEW_RETRY_S)

    def renew_once(self) -> bool:
        cfg = self.config
        # Only the leases of local runs (of this incarnation): a lease this process holds
        # without a run (a claim whose commit answer was lost) must expire. A run added
        # after this list is judged by the next renewal, not this one.
        with self._lock:
            sent = {job_id for job_id, run in self._runs.items() if run.owner == self.owner}
        t_sent = watchdog.lease_clock()
        started = time.perf_counter()
        try:
            with self.engine.begin() as conn:
                renewed = distribution.renew_leases(conn, self.owner, cfg.lease_ttl, sent)
        except DBAPIError as exc:
            metrics.REGISTRY.inc("sparkring_lease_renew_errors_total")
            log.warning(
                "lease renewal failed; drivers die at their deadline unless it recovers",
                extra={"action": "renew_failed", "error": type(exc.orig).__name__},
            )
            return False
        metrics.REGISTRY.observe("sparkring_lease_renew_seconds", time.perf_counter() - started)
        self.last_renew_ok = watchdog.lease_clock()
        deadline = t_sent + cfg.lease_ttl - cfg.watchdog_margin
        lost: list[Run] = []
        with self._lock:
            for run in self._runs.values():
                if run.phase is reconcile.Phase.ENDED or run.owner != self.owner:
                    continue  # its driver is gone; only its outcome is left to record
                if run.job_id not in sent:
                    continue  # added after the renewal was sent
                if renewed.get(run.job_id) == run.epoch:
                    run.deadline = deadline
                    if run.driver is not None:
                        self._confirm(run, deadline)
                elif run.driver is not None and run.driver.ended():
                    # The driver ended before the poll noticed (a paused server: its
                    # lease ran out meanwhile). Its outcome is what must be recorded
                    # (a batch exit 0 is 'finished', never a re-run): the poll does it.
                    continue
                elif run.claimed_at < t_sent:
                    lost.append(run)
        lost = self._not_ended(lost)
        with self._lock:
            for run in lost:
                if self._runs.get(run.job_id) is run:
                    del self._runs[run.job_id]
        for run in lost:
            log.error(
                "lease lost; killing the driver",
                extra={"action": "lease_lost", "job": run.name, "epoch": run.epoch},
            )
            if run.driver is not None:
                # In a task: a kill can take tens of seconds (a hung driver), and the
                # other jobs' leases must keep being renewed meanwhile. The watchdog kills
                # the driver at its deadline anyway, before the lease can be claimed.
                try:
                    self._tasks.submit(run.driver.kill)
                except RuntimeError:  # the pool is shut down: the process is stopping
                    run.driver.kill()
        return True

    def _confirm(self, run: Run, deadline: float) -> None:
        """Give the run's watchdog its new deadline. A lease file that cannot be written
        (a full work dir, EIO) leaves that driver to die at its current deadline, safely;
        it must not end the renewals of every other job (the renew thread would die and
        take the server with it)."""
        assert run.driver is not None
        try:
            run.driver.confirm(deadline)
        except OSError as exc:
            log.error(
                "cannot confirm the driver's lease: it dies at its current deadline",
                extra={"action": "confirm_failed", "job": run.name, "error": str(exc)},
            )

    def _not_ended(self, runs: list[Run]) -> list[Run]:
        """``runs`` (not renewed) but those whose watchdog recorded the driver's exit
        just now (it is exiting: the poll reaps it). If that cannot be read, all of them:
        a run is lost unless PostgreSQL says otherwise."""
        if not runs:
            return runs
        try:
            with self.engine.connect() as conn:
                ended = distribution.ended_at(conn, {r.job_id: r.epoch for r in runs})
        except DBAPIError:
            return runs
        return [run for run in runs if run.job_id not in ended]

    # ------------------------------------------------------------------ poll

    def _poll_loop(self) -> None:
        wait = self.config.poll_interval
        while not self._stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            wait = self.config.poll_interval
            try:
                wait = min(wait, self.poll_once())
            except DBAPIError as exc:
                log.warning(
                    "poll failed; retrying",
                    extra={"action": "poll_failed", "error": type(exc.orig).__name__},
                )
            except Exception:  # a bug must not kill the loop that stops drivers
                log.exception("poll failed unexpectedly", extra={"action": "poll_failed"})

    def poll_once(self) -> float:
        """Reconcile once (the decisions are ``server/reconcile.decide``). Returns how
        soon to look again: just after the earliest time a job targeted here becomes
        claimable, or sooner while an outcome waits to be recorded."""
        cfg = self.config
        self._reap_ended()  # first: a driver's end is noticed even with PostgreSQL away
        # The local runs before the rows: a task adds a run only once its write has
        # committed (an adoption), so every run listed here is already in the rows read
        # next. Listed after, a run adopted in between would meet its row as the previous
        # incarnation left it, and be dropped (its driver killed) as "no longer ours".
        runs = self.runs()
        with self.engine.connect() as conn:
            rows = {row.job_id: row for row in distribution.poll(conn, self.owner, runs)}
        conditions = reconcile.Conditions(
            me=self.owner,
            capacity=cfg.capacity,
            may_claim=self._registered.is_set() and self._claiming.is_set() and self._may_claim(),
            may_migrate=watchdog.lease_clock() >= self._migrate_after,
        )
        local = {
            job_id: reconcile.LocalRun(
                job_id, run.epoch, run.owner, run.phase, run.unrecorded is not None
            )
            for job_id, run in runs.items()
        }
        wait = cfg.poll_interval
        for action in reconcile.decide(rows, local, conditions, self._orphans):
            match action:
                case reconcile.Record(job_id):
                    self._tasks.submit(self._record, runs[job_id])
                    wait = min(wait, RECORD_RETRY_S)
                case reconcile.Drop(job_id, why):
                    self._drop_lost(runs[job_id], why)
                case reconcile.Stop(job_id, reason):
                    self._begin_stop(runs[job_id], reason)
                case reconcile.MarkRunning(job_id):
                    self._tasks.submit(self._mark_running, runs[job_id])
                case reconcile.HandleOrphan(job_id):
                    self._orphans.add(reconcile.orphan_key(rows[job_id]))
                    self._tasks.submit(self._clean_orphan, rows[job_id])
                case reconcile.Claim(job_id):
                    self._claim(rows[job_id])
        self._orphans &= reconcile.live_orphans(rows.values(), cfg.server)
        return reconcile.next_look(rows.values(), cfg.server, wait) + DUE_SLACK_S

    def _claim(self, row: distribution.Row) -> None:
        cfg = self.config
        try:
            # Before the claim: a successor that finds this directory knows that no run
            # of the job here is in the older code's layout (run_trace).
            rundir.job_dir(cfg.work_dir, row.job_id).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning(
                "cannot create the job's run directory: not claimed",
                extra={"action": "claim", "job": row.name, "error": str(exc)},
            )
            return
        t_sent = watchdog.lease_clock()
        try:
            with self.engine.begin() as conn:
                claim = distribution.claim(conn, row.job_id, self.owner, cfg.lease_ttl)
        except distribution.NotClaimable:
            return
        metrics.REGISTRY.inc("sparkring_claims_total")
        metrics.REGISTRY.observe("sparkring_claim_seconds", watchdog.lease_clock() - t_sent)
        if row.owner is not None and row.due_in is not None:
            # Claimed over a lost owner's expired lease: how long it had been expired
            # (as the poll saw it) is what failover added beyond the lease itself.
            metrics.REGISTRY.observe("sparkring_failover_seconds", max(0.0, -row.due_in))
        run = Run(
            job_id=claim.job_id,
            name=claim.name,
            kind=row.kind,
            epoch=claim.epoch,
            attempt=claim.attempt,
            claimed_at=watchdog.lease_clock(),
            # From the time before the claim was sent: PostgreSQL's lease ends later.
            deadline=t_sent + cfg.lease_ttl - cfg.watchdog_margin,
            owner=self.owner,
            revision=claim.revision,
        )
        with self._lock:
            self._runs[run.job_id] = run
        log.info(
            "claimed",
            extra={
                "action": "claim",
                "job": run.name,
                "epoch": run.epoch,
                "attempt": run.attempt,
                "revision": run.revision,
            },
        )
        self._tasks.submit(self._start, run)

    def _start(self, run: Run) -> None:
        cfg = self.config
        try:
            with self.engine.connect() as conn:
                # The revision the claim pinned: a newer one rolls the job anew.
                job = job_catalog.run_definition(conn, run.job_id, run.revision)
            master = job["spark_master"] or cfg.spark_master
            try:
                outage = spark_master.unreachable(master)
            except spark_master.MasterURLError as exc:
                raise driver.SpecError(str(exc)) from exc
            if outage:  # before anything is fetched: a driver could not register now
                self._defer_for_master(run, master)
                return
            self._master_deferrals.pop(run.job_id, None)
            artifacts = [job["resource"], *job["py_files"]]
            fetched = [(self._fetch(item["id"]), item["filename"]) for item in artifacts]
            # The run's own links, under the original names: the cache may evict them.
            main, *py_files = driver.pin_artifacts(
                rundir.run_dir(cfg.work_dir, run.job_id, run.epoch), fetched
            )
            spec = driver.DriverSpec(
                job=run.name,
                kind=job["kind"],
                epoch=run.epoch,
                attempt=run.attempt,
                server=cfg.server,
                main=main,
                py_files=py_files,
                conf=job["conf"],
                args=job["args"],
                master=master,
                checkpoint_dir=(
                    checkpoint.prepare(cfg.checkpoint_root, run.name, run.job_id)
                    if job["kind"] == states.JobKind.STREAMING
                    else None
                ),
                run_dir=rundir.run_dir(cfg.work_dir, run.job_id, run.epoch),
                revision=run.revision,
                job_id=run.job_id,
                user=cfg.run_as,
            )
            with self._lock:
                deadline = run.deadline
            if watchdog.lease_clock() >= deadline:
                raise driver.DriverError("lease deadline passed while preparing the driver")
            # The watchdog records the driver's own exit itself, for both kinds: the
            # server may be stalled or dead at that moment, and neither may a finished
            # generation run again nor a failed job run past its budget.
            report = driver.FinishReport(
                database_url=self.engine.url.render_as_string(hide_password=False),
                job_id=run.job_id,
                server=run.owner.server,
                epoch=run.epoch,
                backoff_base=cfg.backoff_base,
                backoff_max=cfg.backoff_max,
                log_file=str(spec.run_dir / rundir.LOG_FILE),
                spark_master=master,
            )
            handle = driver.launch(spec, deadline, records=cfg.records, report=report)
        # FAILED means only: the job's own driver failed past its budget, or its
        # artifact or spec is invalid. Anything that may pass defers with backoff.
        except (errors.IntegrityError, errors.MissingObject) as exc:
            self._after_failure(run, f"artifact refused: {exc}", fail=True, cause="invalid")
            return
        except driver.SpecError as exc:
            self._after_failure(run, f"invalid job spec: {exc}", fail=True, cause="invalid")
            return
        except errors.ResourceError as exc:
            self._defer(run, f"artifact unavailable: {exc}")
            return
        except driver.DriverError as exc:
            self._defer(run, f"driver not started: {exc}")
            return
        except DBAPIError as exc:
            self._defer(run, f"PostgreSQL unavailable while preparing: {type(exc.orig).__name__}")
            return
        except Exception as exc:
            log.exception("driver start failed", extra={"action": "start", "job": run.name})
            self._defer(run, f"start failed: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            run.driver = handle
            run.master = master
            run.driver.confirm(run.deadline)
            run.phase = reconcile.Phase.RUNNING
        log.info(
            "driver started",
            extra={"action": "driver_started", "job": run.name, "epoch": run.epoch},
        )
        metrics.REGISTRY.inc("sparkring_driver_starts_total")
        metrics.REGISTRY.observe(
            "sparkring_driver_start_seconds", watchdog.lease_clock() - run.claimed_at
        )
        self._mark_running(run)
        self.wake()

    def _mark_running(self, run: Run) -> None:
        """Record that the driver runs. If PostgreSQL is unreachable the row stays
        ``starting`` (every ending is legal from there) and the next poll tries again."""
        assert run.driver is not None
        with self._lock:  # once: the poll may ask again before it sees the first record
            if run.marking or run.marked:
                return
            run.marking = True
        try:
            with self.engine.begin() as conn:
                distribution.mark_running(conn, run.job_id, run.owner, run.epoch, run.driver.pid)
            run.marked = True
        except distribution.FencedError:
            self._drop_lost(run, "lease lost while starting")
        except DBAPIError as exc:
            log.warning(
                "could not record the driver start; retrying",
                extra={"action": "write_failed", "job": run.name, "error": type(exc).__name__},
            )
        finally:
            with self._lock:
                run.marking = False

    def _fetch(self, resource_id: int) -> Path:
        resource = catalog.get(self.engine, resource_id)
        return self.cache.fetch(
            self.bucket, resource, retry_for=self.config.fetch_retry, stop=self._stop
        )

    # ------------------------------------------------------------------ endings

    def _reap_ended(self) -> None:
        for run in self.runs().values():
            if run.phase is not reconcile.Phase.RUNNING or run.driver is None:
                continue
            outcome = run.driver.poll()
            if outcome is not None:
                self._ended(run, outcome)

    def _ended(self, run: Run, outcome: driver.Outcome) -> None:
        extra = {"job": run.name, "epoch": run.epoch, "exit_code": outcome.exit_code}
        if outcome.reason == "lease_expired":
            log.error(
                "watchdog killed the driver: lease lost", extra={"action": "lease_lost", **extra}
            )
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
        self._end(run, self._outcome_write(run, outcome))
        self._tasks.submit(self._ship_log, run)

    def _outcome_write(
        self, run: Run, outcome: driver.Outcome
    ) -> Callable[[sa.Connection], object]:
        """The fenced write that records how ``run`` ended."""
        cfg = self.config
        # A SIGTERM exit while we shut down: the service manager signalled every process
        # of the server's unit (docs/operations.md: use KillMode=mixed).
        if outcome.reason == "exited" and outcome.exit_code in reconcile.SIGTERM_EXITS:
            # A service manager that signals the whole unit (KillMode=control-group)
            # SIGTERMs the driver and this server together: the driver's exit can be
            # reaped before our own handler has begun the shutdown. Not a crash then.
            self._shutting_down.wait(SIGTERM_SHUTDOWN_WAIT_S)
        how = reconcile.ending(
            outcome.reason,
            outcome.exit_code,
            recorded=outcome.recorded,
            shutting_down=self._shutting_down.is_set(),
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
            return self._master_defer_write(run, error)
        # Batch and streaming alike: backoff while the job's budget lasts, then failed.
        crash = self._failure_write(run, error, fail=False)
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
        self, run: Run, error: str, *, fail: bool, cause: str = "driver"
    ) -> Callable[[sa.Connection], object]:
        cfg = self.config

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

    def _after_failure(self, run: Run, error: str, *, fail: bool, cause: str = "driver") -> None:
        self._end(run, self._failure_write(run, error, fail=fail, cause=cause))

    def _defer(self, run: Run, error: str) -> None:
        cfg = self.config
        log.warning(error, extra={"action": "deferred", "job": run.name, "epoch": run.epoch})
        self._end(
            run,
            lambda conn: distribution.defer(
                conn, run.job_id, run.owner, run.epoch, error, cfg.backoff_base
            ),
        )

    def _master_defer_write(
        self, run: Run, after: str = "", master: str | None = None
    ) -> Callable[[sa.Connection], object]:
        """The deferral of a run that no Spark master could take (S9): no restart
        counted, the wait doubling with each consecutive one, up to ``master_wait_max``;
        ``after``: the error of the driver that ended for it."""
        cfg = self.config
        master = run.master if master is None else master
        with self._lock:
            streak = self._master_deferrals.get(run.job_id, 0)
            self._master_deferrals[run.job_id] = streak + 1
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

    def _defer_for_master(self, run: Run, master: str) -> None:
        self._end(run, self._master_defer_write(run, master=master))

    def _release(self, run: Run) -> None:
        self._end(run, lambda conn: distribution.release(conn, run.job_id, run.owner, run.epoch))

    def _end(self, run: Run, write: Callable[[sa.Connection], object]) -> None:
        """The run's driver is gone: keep its outcome until PostgreSQL records it."""
        with self._lock:
            run.phase = reconcile.Phase.ENDED
            run.unrecorded = write
        self._record(run)

    def _record(self, run: Run) -> None:
        """Write the run's outcome (fenced); forget the run once it is recorded or fenced.

        A failure to reach PostgreSQL keeps the outcome: the poll loop retries it, and
        the lease, still renewed meanwhile, keeps the job from being claimed again."""
        with self._lock:
            write = run.unrecorded
            if write is None or run.recording:
                return
            run.recording = True
        try:
            with self.engine.begin() as conn:
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
            with self._lock:
                run.recording = False
            if isinstance(exc, DBAPIError):
                return
            raise
        with self._lock:
            run.recording = False
            run.unrecorded = None
            if self._runs.get(run.job_id) is run:
                del self._runs[run.job_id]
        self.wake()

    def _drop_lost(self, run: Run, why: str) -> None:
        log.error(
            why + "; killing the driver",
            extra={"action": "lost", "job": run.name, "epoch": run.epoch},
        )
        if run.driver is not None:
            run.driver.kill()
        with self._lock:
            if self._runs.get(run.job_id) is run:
                del self._runs[run.job_id]

    # ------------------------------------------------------------------ stop

    def _begin_stop(self, run: Run, reason: str) -> None:
        with self._lock:
            if run.phase is not reconcile.Phase.RUNNING:
                return
            run.phase = reconcile.Phase.STOPPING
        try:
            with self.engine.begin() as conn:
                distribution.begin_stop(conn, run.job_id, run.owner, run.epoch, reason)
        except distribution.FencedError:
            self._drop_lost(run, "the job is no longer ours")
            return
        except DBAPIError:
            pass  # stopping is safe without the record; the release below is fenced
        log.info(reason, extra={"action": "stopping", "job": run.name, "epoch": run.epoch})
        self._tasks.submit(self._stop_driver, run)

    def _stop_driver(self, run: Run) -> None:
        started = watchdog.lease_clock()
        try:
            outcome = run.driver.stop(self.config.stop_grace) if run.driver is not None else None
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
            self._end(run, self._outcome_write(run, outcome))
        else:
            self._release(run)
        self._ship_log(run)

    def _clean_orphan(self, row: distribution.Row) -> None:
        """A live lease of this server id without a local run: left by a previous
        incarnation (a restart), or a run this process gave up. It is ended early only
        when its driver is provably dead on this host, and then its outcome is what
        gets recorded (a batch driver that exited 0 ends ``finished``, never re-run):

        - its watchdog still runs here: adopt the run (:meth:`_adopt`: the lease moves
          to this incarnation, the driver keeps running); if the lease cannot be
          proven ours any more, kill the run (the watchdog kills every descendant)
          and release the job;
        - its run directory holds a result: record that outcome;
        - its watchdog died without a result: sweep what is left, then release;
        - nothing of it here (another host, a fresh work dir): leave the lease to
          expire. Its watchdog, wherever it is, kills the driver before that. Once
          expired, a job wanted stopped comes back here (:func:`reconcile.orphaned`:
          nobody else settles it) and is released.

        A state or result file counts only when it names this run (job id, epoch,
        server: ``driver.RunIdentity``); another job's, such as a deleted namesake's,
        is nothing of it. The run directory is :func:`run_trace`'s.
        """
        with self._lock:
            if row.job_id in self._runs:
                return  # adopted (or claimed) since the poll that listed it as an orphan
        previous = distribution.Owner(self.config.server, row.owner_incarnation or "")
        path = rundir.run_trace(self.config.work_dir, row.job_id, row.name, row.epoch)
        # Files of another job's run (a deleted namesake's, hole H6) are no trace of this
        # one: a result would be recorded as this job's, a pgid swept that may be reused.
        identity = driver.RunIdentity(row.job_id, row.name, row.epoch, self.config.server)
        run = Run(
            job_id=row.job_id,
            name=row.name,
            kind=row.kind,
            epoch=row.epoch,
            attempt=0,
            claimed_at=watchdog.lease_clock(),
            deadline=0.0,
            owner=previous,
            phase=reconcile.Phase.ENDED,
        )
        old = driver.adopt(path, identity)
        if old is not None:
            if self._adopt(row, previous, old):
                return
            old.kill()
            write: Callable[[sa.Connection], object] = lambda conn: distribution.release(  # noqa: E731
                conn, row.job_id, previous, row.epoch
            )
        elif identity.wrote(rundir.read_json(path / rundir.RESULT_FILE)):
            outcome = driver.Driver.outcome_of(path)
            write = self._outcome_write(run, outcome)
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
            # Expired (a job wanted stopped: reconcile.orphaned): its watchdog, wherever
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
        with self._lock:
            if row.job_id in self._runs:
                return
            run.unrecorded = write
            self._runs[row.job_id] = run
        log.info(
            "recording the end of a previous incarnation's run",
            extra={"action": "orphan_released", "job": row.name, "epoch": row.epoch},
        )
        self._record(run)

    def _adopt(
        self, row: distribution.Row, previous: distribution.Owner, old: driver.Driver
    ) -> bool:
        """Take over a run whose watchdog the previous incarnation left alive here: move
        its live lease to this incarnation (fenced on the previous one, the epoch and
        the lease not expired) and supervise the driver as if we had started it. No
        driver restart, no gap. False when the lease is not provably ours (expired or
        taken): the caller kills the run."""
        cfg = self.config
        t_sent = watchdog.lease_clock()
        try:
            with self.engine.begin() as conn:
                state = distribution.adopt(
                    conn, row.job_id, previous, self.owner, row.epoch, cfg.lease_ttl
                )
        except distribution.FencedError:
            return False
        except DBAPIError:
            # Unknown: leave the run alone (its watchdog keeps its deadline), look again.
            with self._lock:
                self._orphans.discard(reconcile.orphan_key(row))
            return True
        deadline = t_sent + cfg.lease_ttl - cfg.watchdog_margin
        old.confirm(deadline)
        stopping = state == states.RunState.STOPPING
        run = Run(
            job_id=row.job_id,
            name=row.name,
            kind=row.kind,
            epoch=row.epoch,
            attempt=0,
            claimed_at=watchdog.lease_clock(),
            deadline=deadline,
            owner=self.owner,
            phase=reconcile.Phase.STOPPING if stopping else reconcile.Phase.RUNNING,
            driver=old,
        )
        with self._lock:
            self._runs[row.job_id] = run
        log.info(
            "adopted a running driver of the previous incarnation",
            extra={"action": "adopted", "job": row.name, "epoch": row.epoch},
        )
        if stopping:  # it was being stopped when its server went: finish the stop
            self._tasks.submit(self._stop_driver, run)
        self.wake()
        return True

    # ------------------------------------------------------------------ logs

    def _ship_log(self, run: Run) -> None:
        if run.driver is None or not run.driver.log_file.exists():
            return
        path = run.driver.log_file
        try:
            self.bucket.put(log_key(run.name, run.job_id, run.epoch), path, path.stat().st_size)
        except errors.ResourceError as exc:
            log.warning(
                "could not ship the driver log",
                extra={"action": "ship_log", "job": run.name, "error": str(exc)},
            )
