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

This module keeps the loops and the lifecycle, its pool and its events. The runner's
state (its runs, warm drivers, dying jobs, orphans and deferrals, behind one lock) is a
``run_table.RunTable``; the work of each step lives in a module of its own, whose
functions take that table and a ``run_context.Context`` (settings, clients, owner id,
the pool and the events):

==========================  ==============================================================
``server/claims.py``        claims, lease renewals, the planned restart's hand-over
``server/launch.py``        a claimed run's start: definition -> spec -> files -> process
``server/launch_spec.py``   a driver's spec and finish report (a start's, a warm driver's)
``server/stops.py``         a running driver's stop
``server/outcomes.py``      end-of-run recording, kept until PostgreSQL has it
``server/adoption.py``      leases of this server id with no local run (a restart's)
``server/log_shipping.py``  a finished run's driver log, to the bucket
``server/warm.py``          warm drivers: a planned move's next driver, started early
``server/run_table.py``     the runs and the rest of the shared state, behind one lock
``server/run_context.py``   the settings, clients and signals the steps are given
``server/runs.py``          :class:`runs.Run`, and which thread writes which of its fields
==========================  ==============================================================

Which thread owns which field of a run (details in ``server/runs.py``): the identity
(job, epoch, owner, claim time, revision) is set once when the run is created (the poll
thread's claim, or an adoption task) and never again; ``deadline`` is the renew
thread's; ``driver`` and ``master`` the start task's, set once before ``phase`` becomes
running; ``phase`` moves as ``reconcile.PHASE_TRANSITIONS`` allows, by the start task,
the poll thread or the shutdown (a stop), and whoever ends the run; ``unrecorded`` and
``recording`` are the recording thread's, ``mark`` the thread recording ``running``.
Every write of a mutable field holds the runner's lock, except ``mark`` becoming
``marked``, written only by the one thread that holds it ``marking``.

Every database write is fenced by this server's id, its incarnation and the run's epoch
(``scheduler/distribution/``); a write that matches no row means the job is no longer
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

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from resource_center import cache as cache_module
from resource_center import store
from scheduler import distribution
from server import (
    adoption,
    claims,
    launch,
    outcomes,
    reconcile,
    run_context,
    run_table,
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


# The runner's settings live below its steps (``server/run_context.py``); this name stays
# for those who build a runner (``server/process.py``).
RunnerConfig = run_context.RunnerConfig


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
        self.table = run_table.RunTable()
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
        self.ctx = run_context.Context(
            engine=engine,
            bucket=bucket,
            cache=cache,
            config=config,
            owner=self.owner,
            submit=self._tasks.submit,
            wake=self.wake,
            stop=self._stop,
            shutting_down=self._shutting_down,
            renewed=self._renewed,
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def wake(self) -> None:
        self._wake.set()

    def threads_alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads)

    def runs(self) -> dict[int, runs.Run]:
        return self.table.snapshot()

    def kill_as(
        self, job_id: int, epoch: int, write: Callable[[sa.Connection], object]
    ) -> runs.Run | None:
        """Make ``write`` the record of the run of ``job_id`` at ``epoch`` once its driver
        is killed, and return the run (the caller kills its driver); None when this server
        runs no such driver now (``RunTable.kill_as``)."""
        return self.table.kill_as(job_id, epoch, write)

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
        return claims.hand_over(self.table, self.ctx, window)

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
            local = self.table.snapshot()
            if not local:
                return
            running = [run for run in local.values() if run.phase is reconcile.Phase.RUNNING]
            # Runs still starting become running (or end) soon; stop them then.
            for run in running:
                stops.begin_stop(self.table, self.ctx, run, "server shutting down")
            self._stop.wait(0.05)
        left = list(self.table.snapshot().values())
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
        warm.kill_all(self.table)  # they ran no job code: nothing to hand on

    # ------------------------------------------------------------------ renew

    def _renew_loop(self) -> None:
        while not self._stop.is_set():
            ok = self.renew_once()
            self._stop.wait(self.config.renew_interval if ok else RENEW_RETRY_S)

    def renew_once(self) -> bool:
        """Renew every lease of this incarnation once (``claims.renew``). False when
        PostgreSQL could not be reached: try again soon."""
        return claims.renew(self.table, self.ctx)

    def _renewed(self, at: float) -> None:
        self.last_renew_ok = at

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
        # First: a driver's end is noticed even with PostgreSQL away.
        outcomes.reap_ended(self.table, self.ctx)
        warm.reap_ended(self.table)
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
            dying=self.table.dying(),
        )
        local = {
            job_id: reconcile.LocalRun(
                job_id, run.epoch, run.owner, run.phase, run.unrecorded is not None
            )
            for job_id, run in local_runs.items()
        }
        wait = cfg.poll_interval
        warm_epochs = warm.warm_epochs(self.table)
        for action in reconcile.decide(
            rows, local, conditions, self.table.handled_orphans(), warm_epochs
        ):
            match action:
                case reconcile.Record(job_id):
                    self._tasks.submit(outcomes.record, self.table, self.ctx, local_runs[job_id])
                    wait = min(wait, RECORD_RETRY_S)
                case reconcile.Drop(job_id, why):
                    outcomes.drop_lost(self.table, local_runs[job_id], why)
                case reconcile.Stop(job_id, reason, offer):
                    stops.begin_stop(self.table, self.ctx, local_runs[job_id], reason, warm=offer)
                case reconcile.MarkRunning(job_id):
                    self._tasks.submit(
                        launch.mark_running, self.table, self.ctx, local_runs[job_id]
                    )
                case reconcile.HandleOrphan(job_id):
                    self.table.add_orphan(reconcile.orphan_key(rows[job_id]))
                    self._tasks.submit(self._clean_orphan, rows[job_id])
                case reconcile.Claim(job_id):
                    claims.claim(self.table, self.ctx, rows[job_id])
                case reconcile.PreStart(job_id):
                    warm.begin(self.table, self.ctx, rows[job_id])
                case reconcile.Discard(job_id, why):
                    warm.discard(self.table, self.ctx, job_id, why)
        self.table.keep_orphans(reconcile.live_orphans(rows.values(), self.owner))
        return reconcile.next_look(rows.values(), cfg.server, wait) + DUE_SLACK_S

    # ------------------------------------------------------------------ tasks

    def _clean_orphan(self, row: distribution.Row) -> None:
        """The task that settles a lease of this server id without a local run
        (``adoption.clean_orphan``)."""
        adoption.clean_orphan(self.table, self.ctx, row)
