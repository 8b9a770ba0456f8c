"""The run table: the runner's shared state, behind one lock and named operations.

It owns this server's local runs (:class:`runs.Run`, by job id), its warm drivers
(:class:`runs.WarmRun`, ``server/warm.py``), the jobs whose lost run's kill is still
under way, the orphans handled (``reconcile.orphan_key``), and the two deferral
streaks (no Spark master answered; any other passing reason). The runner's threads
(``server/runner.py``) and its steps (``server/claims.py``, ``launch.py``, ``stops.py``,
``outcomes.py``, ``adoption.py``, ``warm.py``) read and change them only through the
methods below, each of which holds the lock; which thread calls which is
``server/runs.py``'s table of fields.

Transitions of a run (its ``phase``: ``reconcile.PHASE_TRANSITIONS``)::

    (none)    -> starting: :meth:`add` (a claim, the poll thread)
              -> running or stopping: :meth:`add` (an adoption of a live driver)
              -> ended: :meth:`add_ended` (an orphan's outcome, to record)
    starting  -> running: :meth:`start_running` (the start task)
              -> ended: :meth:`end` (a start that failed or deferred)
    running   -> stopping: :meth:`begin_stop` (the poll thread, the shutdown)
              -> ended: :meth:`end` (the driver ended, or its stop did)
    stopping  -> ended: :meth:`end` (the stop task)
    ended     -> (none): :meth:`recorded` (its outcome is in PostgreSQL)
    any       -> (none): :meth:`remove` (the job is no longer ours, or its lease was
                 lost: :meth:`renewed`)

Transitions of a warm driver (its ``phase``: ``runs.WARM_TRANSITIONS``;
``server/warm.py`` says when)::

    (none)    -> building: :meth:`add_warm` (the poll thread); its driver is given
                 by :meth:`set_warm_driver` (its prestart)
    building  -> ready: :meth:`warm_ready` (its prestart)
    building, ready
              -> discarded, and out of the table: :meth:`take_warm` (the claim's
                 start), :meth:`discard_warm` (the poll thread), :meth:`reap_ended_warm`
                 (its driver ended), :meth:`discard_all_warm` (the shutdown)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Set

import sqlalchemy as sa

from scheduler import distribution
from server import driver, reconcile, runs


class RunTable:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._runs: dict[int, runs.Run] = {}
        # Warm drivers waiting for a claim here (server/warm.py), by job id.
        self._warm: dict[int, runs.WarmRun] = {}
        # Jobs whose lost run's kill is still under way (claims.renew): not claimed here
        # until it is over.
        self._dying: set[int] = set()
        # Orphans handled (reconcile.orphan_key): a previous incarnation's lease, or one given up.
        self._orphans: set[reconcile.OrphanKey] = set()
        # Job id -> consecutive deferrals because no Spark master answered (the backoff).
        self._master_deferrals: dict[int, int] = {}
        # Job id -> consecutive deferrals of its start for any other passing reason (the
        # backoff: outcomes.defer); forgotten when a driver of the job starts.
        self._start_deferrals: dict[int, int] = {}

    # ------------------------------------------------------------------ runs

    def snapshot(self) -> dict[int, runs.Run]:
        """A copy of the local runs, by job id."""
        with self._lock:
            return dict(self._runs)

    def has(self, job_id: int) -> bool:
        with self._lock:
            return job_id in self._runs

    def add(self, run: runs.Run) -> None:
        with self._lock:
            self._runs[run.job_id] = run

    def add_ended(self, run: runs.Run, write: Callable[[sa.Connection], object]) -> bool:
        """Add ``run`` with its outcome ``write`` to record, unless its job has a local
        run already (adopted or claimed meanwhile): then False."""
        with self._lock:
            if run.job_id in self._runs:
                return False
            run.unrecorded = write
            self._runs[run.job_id] = run
            return True

    def remove(self, run: runs.Run) -> None:
        """Forget ``run``, if it is still its job's local run."""
        with self._lock:
            if self._runs.get(run.job_id) is run:
                del self._runs[run.job_id]

    def owned_by(self, owner: distribution.Owner) -> list[runs.Run]:
        """The local runs whose lease ``owner`` holds."""
        with self._lock:
            return [run for run in self._runs.values() if run.owner == owner]

    def renewed(
        self,
        owner: distribution.Owner,
        sent: Set[int],
        renewed: dict[int, int],
        deadline: float,
        t_sent: float,
    ) -> list[runs.Run]:
        """A renewal of ``sent`` (sent at ``t_sent``) renewed the leases ``renewed`` (job
        id -> epoch): give each renewed run ``deadline``, and confirm it to its watchdog.
        Returns the runs whose lease was lost: sent, claimed before ``t_sent`` and not
        renewed, with a driver that did not end."""
        lost: list[runs.Run] = []
        with self._lock:
            for run in self._runs.values():
                if run.phase is reconcile.Phase.ENDED or run.owner != owner:
                    continue  # its driver is gone; only its outcome is left to record
                if run.job_id not in sent:
                    continue  # added after the renewal was sent
                if renewed.get(run.job_id) == run.epoch:
                    run.deadline = deadline
                    if run.driver is not None:
                        runs.confirm(run, deadline)
                elif run.driver is not None and run.driver.ended():
                    # The driver ended before the poll noticed (a paused server: its
                    # lease ran out meanwhile). Its outcome is what must be recorded
                    # (a batch exit 0 is 'finished', never a re-run): the poll does it.
                    continue
                elif run.claimed_at < t_sent:
                    lost.append(run)
        return lost

    def confirm_extended(self, extended: dict[int, int], deadline: float) -> list[str]:
        """Give ``deadline`` to the watchdog of each run whose lease was extended
        (``extended``: job id -> epoch). Returns those runs' job names."""
        handed = []
        with self._lock:
            for run in self._runs.values():
                if run.driver is not None and extended.get(run.job_id) == run.epoch:
                    runs.confirm(run, deadline)
                    handed.append(run.name)
        return handed

    def deadline_of(self, run: runs.Run) -> float:
        with self._lock:
            return run.deadline

    def start_running(self, run: runs.Run, handle: driver.Driver, master: str) -> None:
        """``run``'s driver started: starting -> running, its lease confirmed to the
        watchdog, its job's start deferrals forgotten."""
        with self._lock:
            self._start_deferrals.pop(run.job_id, None)
            run.driver = handle
            run.master = master
            runs.confirm(run, run.deadline)
            run.phase = reconcile.Phase.RUNNING

    def begin_marking(self, run: runs.Run) -> bool:
        """Whether this thread is the one to record that ``run`` runs (once: the poll
        may ask again before it sees the first record)."""
        with self._lock:
            if run.mark is not runs.Mark.UNMARKED:
                return False
            run.mark = runs.Mark.MARKING
            return True

    def end_marking(self, run: runs.Run) -> None:
        """The thread recording ``running`` is done: marked, or to be tried again."""
        with self._lock:
            if run.mark is runs.Mark.MARKING:
                run.mark = runs.Mark.UNMARKED

    def begin_stop(self, run: runs.Run) -> bool:
        """running -> stopping; False when ``run`` is not running."""
        with self._lock:
            if run.phase is not reconcile.Phase.RUNNING:
                return False
            run.phase = reconcile.Phase.STOPPING
            return True

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

    def end(self, run: runs.Run, write: Callable[[sa.Connection], object]) -> None:
        """``run``'s driver is gone: -> ended, ``write`` its outcome to record."""
        with self._lock:
            run.phase = reconcile.Phase.ENDED
            run.unrecorded = write

    def begin_recording(self, run: runs.Run) -> Callable[[sa.Connection], object] | None:
        """The outcome this thread is to record now; None when there is none, or another
        thread records it."""
        with self._lock:
            write = run.unrecorded
            if write is None or run.recording:
                return None
            run.recording = True
            return write

    def recording_failed(self, run: runs.Run) -> None:
        """The outcome stays, for the next try."""
        with self._lock:
            run.recording = False

    def recorded(self, run: runs.Run) -> None:
        """``run``'s outcome is recorded (or fenced): forget it, and the run."""
        with self._lock:
            run.recording = False
            run.unrecorded = None
            if self._runs.get(run.job_id) is run:
                del self._runs[run.job_id]

    # ------------------------------------------------------------------ dying jobs

    def add_dying(self, job_id: int) -> None:
        with self._lock:
            self._dying.add(job_id)

    def discard_dying(self, job_id: int) -> None:
        with self._lock:
            self._dying.discard(job_id)

    def dying(self) -> frozenset[int]:
        """The jobs whose lost run's kill is under way: not to be claimed here."""
        with self._lock:
            return frozenset(self._dying)

    # ------------------------------------------------------------------ orphans

    def handled_orphans(self) -> frozenset[reconcile.OrphanKey]:
        with self._lock:
            return frozenset(self._orphans)

    def add_orphan(self, key: reconcile.OrphanKey) -> None:
        with self._lock:
            self._orphans.add(key)

    def forget_orphan(self, key: reconcile.OrphanKey) -> None:
        """Handle ``key`` again at the next poll that lists it."""
        with self._lock:
            self._orphans.discard(key)

    def keep_orphans(self, live: Set[reconcile.OrphanKey]) -> None:
        """Forget the orphans handled that are no longer orphans."""
        with self._lock:
            self._orphans &= live

    # ------------------------------------------------------------------ deferrals

    def count_start_deferral(self, job_id: int) -> int:
        """Count one more deferral of ``job_id``'s start; returns the streak before it."""
        with self._lock:
            streak = self._start_deferrals.get(job_id, 0)
            self._start_deferrals[job_id] = streak + 1
            return streak

    def count_master_deferral(self, job_id: int) -> int:
        """Count one more deferral of ``job_id`` for want of a Spark master; returns the
        streak before it."""
        with self._lock:
            streak = self._master_deferrals.get(job_id, 0)
            self._master_deferrals[job_id] = streak + 1
            return streak

    def forget_master_deferrals(self, job_id: int) -> None:
        """A Spark master answered for ``job_id``: its streak starts again."""
        with self._lock:
            self._master_deferrals.pop(job_id, None)

    # ------------------------------------------------------------------ warm drivers

    def warm_epochs(self) -> dict[int, int]:
        """Job id -> the epoch each warm driver waits for."""
        with self._lock:
            return {job_id: warm.epoch for job_id, warm in self._warm.items()}

    def has_warm(self, job_id: int) -> bool:
        with self._lock:
            return job_id in self._warm

    def add_warm(self, warm: runs.WarmRun) -> None:
        with self._lock:
            self._warm[warm.job_id] = warm

    def set_warm_driver(self, warm: runs.WarmRun, handle: driver.Driver) -> bool:
        """``warm``'s driver was launched; returns whether it was discarded meanwhile
        (then its launcher kills it)."""
        with self._lock:
            warm.driver = handle
            return warm.phase is runs.WarmPhase.DISCARDED

    def warm_driver(self, warm: runs.WarmRun) -> driver.Driver | None:
        with self._lock:
            return warm.driver

    def warm_wanted(self, warm: runs.WarmRun) -> bool:
        """Whether ``warm`` is still its job's warm driver, neither discarded nor taken."""
        with self._lock:
            return (
                warm.phase is not runs.WarmPhase.DISCARDED and self._warm.get(warm.job_id) is warm
            )

    def warm_ready(self, warm: runs.WarmRun) -> None:
        """``warm``'s SparkSession is built (unless it was discarded meanwhile)."""
        with self._lock:
            if warm.phase is runs.WarmPhase.BUILDING:
                warm.phase = runs.WarmPhase.READY

    def take_warm(self, job_id: int) -> tuple[runs.WarmRun, driver.Driver | None] | None:
        """The warm driver of ``job_id``, discarded here (from now on nobody else may
        take or keep it), and its driver; None when there is none."""
        with self._lock:
            warm = self._warm.pop(job_id, None)
            if warm is None:
                return None
            warm.phase = runs.WarmPhase.DISCARDED
            return warm, warm.driver

    def discard_warm(self, job_id: int) -> runs.WarmRun | None:
        """Forget and discard the warm driver of ``job_id`` (its caller kills it)."""
        with self._lock:
            warm = self._warm.pop(job_id, None)
            if warm is not None:
                warm.phase = runs.WarmPhase.DISCARDED
            return warm

    def reap_ended_warm(self) -> list[runs.WarmRun]:
        """Forget and discard the warm drivers that ended on their own; returns them."""
        with self._lock:
            ended = [
                warm
                for warm in self._warm.values()
                if warm.driver is not None and warm.driver.ended()
            ]
            for warm in ended:
                del self._warm[warm.job_id]
                warm.phase = runs.WarmPhase.DISCARDED
            return ended

    def discard_all_warm(self) -> list[runs.WarmRun]:
        """Forget and discard every warm driver (their caller kills them)."""
        with self._lock:
            left = list(self._warm.values())
            self._warm.clear()
            for warm in left:
                warm.phase = runs.WarmPhase.DISCARDED
            return left
