"""The runner: this server's side of the distribution table, and its drivers.

Two named threads and a small pool:

- ``runner-poll`` reads the rows targeted at or owned by this server (woken by NOTIFY,
  else every ``poll_interval``) and reconciles (:meth:`Runner.poll_once`; the decisions
  are ``server/reconcile.py``'s): claims free jobs targeted here, stops drivers whose job
  moved away, was stopped or restarted, and reports drivers that ended (finished,
  crashed, lease lost).
- ``runner-renew`` renews every lease of this server in one statement every
  ``renew_interval`` and confirms each renewed driver's watchdog, so that a driver is
  dead before its lease can expire in PostgreSQL (``server/claims.py``).
- ``runner-task-*`` threads start drivers (fetch and verify artifacts, spawn) and stop
  them (SIGTERM, grace, SIGKILL, then release), so a slow stop or download never delays
  renewals or other jobs.

This module keeps the loops, the lifecycle and the runner's state (its runs, lock, pool
and events). The work of each step lives in a module of its own, whose functions take
the runner and share its state:

==========================  ==============================================================
``server/claims.py``        claims, lease renewals, the planned restart's hand-over
``server/launch.py``        a claimed run's start: definition -> spec -> files -> process
``server/stops.py``         a running driver's stop
``server/outcomes.py``      end-of-run recording, kept until PostgreSQL has it
``server/adoption.py``      leases of this server id with no local run (a restart's)
``server/log_shipping.py``  a finished run's driver log, to the bucket
``server/runs.py``          :class:`runs.Run`, and which thread writes which of its fields
==========================  ==============================================================

Which thread owns which field of a run (details in ``server/runs.py``): the identity
(job, epoch, owner, claim time, revision) is set once when the run is created (the poll
thread's claim, or an adoption task) and never again; ``deadline`` is the renew
thread's; ``driver`` and ``master`` the start task's, set once before ``phase`` becomes
running; ``phase`` moves as ``reconcile.PHASE_TRANSITIONS`` allows, by the start task,
the poll thread or the shutdown (a stop), and whoever ends the run; ``unrecorded`` and
``recording`` are the recording thread's, ``marking`` and ``marked`` the thread
recording ``running``. Every write of a mutable field holds the runner's lock, except
``marked``, written only by the one thread that holds ``marking``.

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from cryptography.fernet import MultiFernet
from sqlalchemy.exc import DBAPIError

from resource_center import cache as cache_module
from resource_center import store
from scheduler import distribution
from server import (
    adoption,
    claims,
    defaults,
    driver_user,
    launch,
    outcomes,
    reconcile,
    runs,
    stops,
    warm,
    watchdog,
)

log = logging.getLogger(__name__)

# Look again this long after a lease or backoff is due: PostgreSQL's clock must have
# passed the instant when the claim statement runs.
DUE_SLACK_S = 0.05
# After a failed renewal, try again this soon (seconds): a lock wait that gave up
# (lock_timeout) must not cost a whole renew interval of the watchdog's margin.
RENEW_RETRY_S = 0.25
# How soon an unrecorded run outcome is written again (seconds).
RECORD_RETRY_S = 0.5


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
    # Nice steps below this server and the watchdogs its drivers run (Settings.driver_nice).
    driver_nice: int = 0
    # The longest wait between two looks at a Spark master that did not answer, seconds.
    master_wait_max: float = defaults.SPARK_MASTER_WAIT_MAX_S
    # Another server's expired lease is claimed over only once the cluster has reached
    # PostgreSQL again for this long (distribution.HELD_OVER): after an outage, the
    # owner's word first.
    takeover_hold: float = 0.0
    # Warm hand-off (server/warm.py): the old owner's wait for the target's warm driver,
    # and a warm driver's life without its go signal, seconds.
    warm_ready_wait: float = defaults.WARM_READY_WAIT_S
    warm_go_timeout: float = defaults.WARM_GO_TIMEOUT_S
    # This server's address as an IP (driver_network.resolve of SPARKRING_ADVERTISE_HOST):
    # a driver of a cluster master binds on it and gives it to its executors.
    driver_address: str | None = None
    # The keys of SPARKRING_SECRET_KEYS (scheduler/secrets.py): a job's secrets are
    # decrypted with them for its driver. None: not set, a job given secrets defers here.
    secret_box: MultiFernet | None = None


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
        self._runs: dict[int, runs.Run] = {}
        # Warm drivers waiting for a claim here (server/warm.py), by job id. Under the lock.
        self._warm: dict[int, warm.WarmRun] = {}
        # Jobs whose lost run's kill is still under way (claims.renew): not claimed here
        # until it is over. Under the lock.
        self._dying: set[int] = set()
        # Orphans handled (reconcile.orphan_key): a previous incarnation's lease, or one given up.
        self._orphans: set[reconcile.OrphanKey] = set()
        # Job id -> consecutive deferrals because no Spark master answered (the backoff).
        self._master_deferrals: dict[int, int] = {}
        # Job id -> consecutive deferrals of its start for any other passing reason (the
        # backoff: outcomes.defer); forgotten when a driver of the job starts.
        self._start_deferrals: dict[int, int] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._claiming = threading.Event()
        self._claiming.set()
        # Set when shutdown begins (stop_claiming): a SIGTERM exit of a driver waits for
        # it briefly (see outcomes.outcome_write).
        self._shutting_down = threading.Event()
        # Set once ZooKeeper accepted this server id: no claim before (a second process
        # with a live server's id must not take a single job while it waits to be
        # refused). Until then, and for a settle time after, a run adopted from the
        # previous incarnation is not migrated: the coordinator retargeted its jobs when
        # the old session expired and gives them back once we are a member again.
        self._registered = threading.Event()
        self._migrate_after = math.inf
        # Per driver slot: its start or stop, its outcome's record, and a warm hand-off's
        # waits (the old owner's, up to warm_ready_wait; the target's, until its warm
        # driver is ready): a wait must never hold back a record or a claim's start.
        self._tasks = ThreadPoolExecutor(
            max_workers=max(8, 4 * config.capacity), thread_name_prefix="runner-task"
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

    def runs(self) -> dict[int, runs.Run]:
        with self._lock:
            return dict(self._runs)

    def kill_as(
        self, job_id: int, epoch: int, write: Callable[[sa.Connection], object]
    ) -> runs.Run | None:
        """Make ``write`` the record of the run of ``job_id`` at ``epoch`` once its driver
        is killed, and return the run (the caller kills its driver); None when this server
        runs no such driver now (the run moved on, ended or is stopping)."""
        with self._lock:
            run = self._runs.get(job_id)
            if (
                run is None
                or run.epoch != epoch
                or run.phase is not reconcile.Phase.RUNNING
                or run.driver is None
                or run.killed_as is not None
            ):
                return None
            run.killed_as = write
            return run

    def stop_claiming(self) -> None:
        self._claiming.clear()
        self._shutting_down.set()

    def registered(self, settle: float) -> None:
        """ZooKeeper accepted our id: claims may begin; migrations after ``settle`` s."""
        self._migrate_after = watchdog.lease_clock() + settle
        self._registered.set()
        self.wake()

    def hand_over(self, window: float) -> list[str]:
        """A planned restart: extend every lease to ``window`` s for the successor to
        adopt (``claims.hand_over``). Returns the jobs handed over."""
        return claims.hand_over(self, window)

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
                stops.begin_stop(self, run, "server shutting down")
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
        warm.kill_all(self)  # they ran no job code: nothing to hand on

    # ------------------------------------------------------------------ renew

    def _renew_loop(self) -> None:
        while not self._stop.is_set():
            ok = self.renew_once()
            self._stop.wait(self.config.renew_interval if ok else RENEW_RETRY_S)

    def renew_once(self) -> bool:
        """Renew every lease of this incarnation once (``claims.renew``). False when
        PostgreSQL could not be reached: try again soon."""
        return claims.renew(self)

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
        outcomes.reap_ended(self)  # first: a driver's end is noticed even with PostgreSQL away
        warm.reap_ended(self)
        # The local runs before the rows: a task adds a run only once its write has
        # committed (an adoption), so every run listed here is already in the rows read
        # next. Listed after, a run adopted in between would meet its row as the previous
        # incarnation left it, and be dropped (its driver killed) as "no longer ours".
        local_runs = self.runs()
        with self.engine.connect() as conn:
            rows = {row.job_id: row for row in distribution.poll(conn, self.owner, local_runs)}
        conditions = reconcile.Conditions(
            me=self.owner,
            capacity=cfg.capacity,
            may_claim=self._registered.is_set() and self._claiming.is_set() and self._may_claim(),
            may_migrate=watchdog.lease_clock() >= self._migrate_after,
            dying=frozenset(self._dying),
        )
        local = {
            job_id: reconcile.LocalRun(
                job_id, run.epoch, run.owner, run.phase, run.unrecorded is not None
            )
            for job_id, run in local_runs.items()
        }
        wait = cfg.poll_interval
        warm_epochs = warm.warm_epochs(self)
        for action in reconcile.decide(rows, local, conditions, self._orphans, warm_epochs):
            match action:
                case reconcile.Record(job_id):
                    self._tasks.submit(outcomes.record, self, local_runs[job_id])
                    wait = min(wait, RECORD_RETRY_S)
                case reconcile.Drop(job_id, why):
                    outcomes.drop_lost(self, local_runs[job_id], why)
                case reconcile.Stop(job_id, reason, offer):
                    stops.begin_stop(self, local_runs[job_id], reason, warm=offer)
                case reconcile.MarkRunning(job_id):
                    self._tasks.submit(launch.mark_running, self, local_runs[job_id])
                case reconcile.HandleOrphan(job_id):
                    self._orphans.add(reconcile.orphan_key(rows[job_id]))
                    self._tasks.submit(self._clean_orphan, rows[job_id])
                case reconcile.Claim(job_id):
                    claims.claim(self, rows[job_id])
                case reconcile.PreStart(job_id):
                    warm.begin(self, rows[job_id])
                case reconcile.Discard(job_id, why):
                    warm.discard(self, job_id, why)
        self._orphans &= reconcile.live_orphans(rows.values(), self.owner)
        return reconcile.next_look(rows.values(), cfg.server, wait) + DUE_SLACK_S

    # ------------------------------------------------------------------ tasks

    def _stop_driver(self, run: runs.Run) -> None:
        """The task that stops ``run``'s driver (``stops.stop_driver``)."""
        stops.stop_driver(self, run)

    def _clean_orphan(self, row: distribution.Row) -> None:
        """The task that settles a lease of this server id without a local run
        (``adoption.clean_orphan``)."""
        adoption.clean_orphan(self, row)
