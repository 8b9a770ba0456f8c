"""The watchdog: one small process per driver that kills it when its lease is overdue.

Run as ``python -m server.watchdog --lease-file F --result R [options] -- CMD...``
(``watchdog_contract.WatchdogArgs``, which the server writes and this reads); the
server starts it in a session of its own (``start_new_session=True``), so neither a
signal to the server's process group nor a SIGSTOP of the server reaches it. It owns:

- the **lease file**: the server atomically rewrites ``{"deadline": D}`` after each
  successful lease renewal, D on the system-wide CLOCK_BOOTTIME (:func:`lease_clock`).
  The watchdog re-reads it at least every ``--interval`` seconds and wakes exactly at D;
  when ``lease_clock() >= D`` it SIGKILLs the driver's process group. BOOTTIME, unlike
  MONOTONIC, keeps counting while the host is suspended (a laptop lid, a paused VM):
  PostgreSQL's clock does, so a deadline must too, or a driver would outlive its lease
  by the length of the suspension. A missing or
  unreadable file never extends the last deadline it read.
- the driver's **process group**: CMD starts as the leader of a new group; the watchdog
  is a child subreaper, so descendants that leave the group are re-parented to it and
  killed too. The run ends only when every descendant is gone.
- the **kill request**: SIGUSR1 to the watchdog → SIGKILL to the group and every
  descendant, re-parented ones included (it is their subreaper), then the result
  ``killed``. This is how the server kills a run: killing the watchdog itself would
  orphan descendants that left the group to init. Every process of the run also
  carries ``SPARKRING_RUN_DIR`` in its environment, so that a run whose watchdog
  died anyway can still be swept (:func:`marked_processes`).
- the **stop sequence**: SIGTERM (or SIGINT) to the watchdog → SIGTERM to the driver
  (with ``--term-only ARG``, only to the group's processes other than its leader with
  ARG in their argv, i.e. the Python driver, so that it stops its query while the JVM
  still serves it; otherwise, or when none matches, to the whole group) → after the
  grace (``--stop-file``'s ``{"grace": G}`` if present, else ``--grace``) SIGKILL to
  everything. The lease deadline still applies during the grace.
- the **state file** (``--state``): the watchdog's and the driver's pids, so that a
  restarted server can re-attach (``driver.adopt``) or kill the group.
- the **result file** (``--result``): why and when the driver ended, written atomically
  once everything is dead; the exit status is the matching ``exit_codes.ExitCode``.
  Both carry the run's identity (``--job-id``, ``--job``, ``--epoch``, ``--server``): a
  reader takes them for a run's only when they match it (``driver.RunIdentity``).
- the **record of the end** (``--report-fd``, ``watchdog_contract.FinishReport``): when the
  driver exits on its own, the watchdog records it in PostgreSQL itself before it
  writes the result (an exit 0 ``finished``, a nonzero exit a crash that spends the
  job's budget; ``reconcile.watchdog_ending``; but a deferral, no budget spent, when
  the driver never registered with its Spark master and no master answers:
  ``spark_master.lost_to_outage``), fenced on the run, so that a server
  stalled or dead at that moment loses nothing; ``"recorded": true`` in the result
  tells the server that nothing is left to write.
- the **driver's user** (``--uid``/``--gid``, ``SPARKRING_DRIVER_USER``): the driver
  runs as that user, with its primary group and no supplementary group, while the
  watchdog keeps the server's user. It then trusts no file the driver can write: before
  it spawns the driver it checks that the folders of its lease, stop, state and result
  files are its own user's and writable by no one else, and refuses to start otherwise
  (``spawn_failed``).
- optional **lifetime records** (``--records``): one JSON line when the driver started
  (time taken before the spawn) and one when it ended (time taken after every
  descendant was reaped), so that runs of one job can be proven not to overlap.
- the **go signal** of a warm driver (``--go-file``, docs/drivers.md "Warm hand-off"):
  the driver builds its SparkSession and runs no job code until its server writes the
  go file, after its claim committed. Until then it is no run of the job's: its start is
  the time in the go file (the ``started`` record is written when the file is seen),
  and an end before the file exists is neither recorded in PostgreSQL nor in the
  lifetime records (``"went": false`` in the result).

Run reasons (``Reason``) and the watchdog's exit code for each:
``exited`` (OK or DRIVER_FAILED), ``lease_expired`` (LEASE_EXPIRED), ``stopped``
(STOPPED), ``spawn_failed`` (SPAWN_FAILED), ``killed`` (KILL_REQUESTED; also what a
reader concludes when the watchdog died without a result).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import logging
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from server import exit_codes, rundir, watchdog_contract

log = logging.getLogger("sparkring.watchdog")


def lease_clock() -> float:
    """Seconds on CLOCK_BOOTTIME: the clock of every lease deadline (see above)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


# A supervising loop that has not gone round for this long dumps every thread's stack
# into the driver log (faulthandler, from a thread of its own that needs no GIL): a
# watchdog must never be stuck, and when one is, the log says where. Seconds.
STALL_DUMP_S = 2.0
# Recording the driver's exit (--report-fd): connection and statement limits, the pause
# between two tries while PostgreSQL is away, and how long past the lease deadline it
# keeps trying (after that the server records it, or the job was claimed elsewhere and
# the fenced write could not succeed anyway), seconds.
RECORD_CONNECT_TIMEOUT_S = 2.0
RECORD_STATEMENT_TIMEOUT_S = 2.0
RECORD_RETRY_S = 0.5
RECORD_AFTER_DEADLINE_S = 3.0
# How long a driver's SIGTERM exit waits for a stop of the watchdog's own before the
# watchdog records it as the job's crash: a service manager that signals every process
# of the unit (systemd's KillMode=control-group) SIGTERMs the driver and its watchdog
# together, and the driver's exit can be reaped first (seconds; the server waits as
# long for its own shutdown, outcomes.SIGTERM_SHUTDOWN_WAIT_S).
SIGTERM_STOP_WAIT_S = 2.0

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class Reason(StrEnum):
    EXITED = "exited"  # the driver exited on its own (any exit code)
    LEASE_EXPIRED = "lease_expired"  # the lease confirmation was overdue: group killed
    STOPPED = "stopped"  # a stop was requested: SIGTERM, then SIGKILL after the grace
    SPAWN_FAILED = "spawn_failed"  # the command could not be started
    KILLED = "killed"  # killed on request (SIGUSR1), or the watchdog died without a result


EXIT_CODE_OF_REASON = {
    Reason.LEASE_EXPIRED: exit_codes.ExitCode.LEASE_EXPIRED,
    Reason.STOPPED: exit_codes.ExitCode.STOPPED,
    Reason.SPAWN_FAILED: exit_codes.ExitCode.SPAWN_FAILED,
    Reason.KILLED: exit_codes.ExitCode.KILL_REQUESTED,
}
# Every process of a run inherits this variable (the run directory): the mark by which a
# run's processes are found once nothing else links them (their watchdog is gone).
RUN_MARK_VARIABLE = "SPARKRING_RUN_DIR"


def process_start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (tells a pid's incarnations
    apart), or None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


# --- the supervision itself -------------------------------------------------------------


_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _die_with_parent() -> None:
    # Runs in the driver between fork and exec: if the watchdog itself is SIGKILLed,
    # the driver's leader dies with it instead of running unfenced.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _driver_preexec(nice: int) -> Callable[[], None]:
    """What runs in the driver between fork and exec: the parent-death signal, then
    ``nice`` steps below the watchdog's priority (inherited by everything it starts)."""

    def preexec() -> None:
        _die_with_parent()
        if nice:
            os.nice(nice)

    return preexec


def group_members(pgid: int) -> dict[int, list[str]]:
    """Live (not zombie) processes of process group ``pgid``: pid -> argv."""
    members: dict[int, list[str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid or fields[0] in ("Z", "X"):
                continue
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue  # exited while we looked
        members[int(entry.name)] = [arg.decode(errors="replace") for arg in argv if arg]
    return members


def marked_processes(run_dir: Path) -> list[int]:
    """Live processes whose environment carries ``SPARKRING_RUN_DIR=<run_dir>``."""
    mark = f"{RUN_MARK_VARIABLE}={run_dir}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue  # exited, or not ours to read
        if mark in environ.split(b"\0") and process_start_ticks(int(entry.name)) is not None:
            found.append(int(entry.name))
    return found


def _children() -> list[int]:
    pid = os.getpid()
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


class Watchdog:
    """One supervised run of CMD; ``run()`` returns the watchdog's exit code."""

    def __init__(
        self,
        args: watchdog_contract.WatchdogArgs,
        report: watchdog_contract.FinishReport | None = None,
    ) -> None:
        self.args = args
        # --report-fd's content: record the driver's exit in PostgreSQL. Never logged: it
        # carries the database URL.
        self.report = report
        self.command: list[str] = list(args.command)
        self.lease_file: Path = args.lease_file
        self.deadline = -math.inf
        self.late_kills = 0  # descendants first killed after kill_everything's first round
        self.stop_requested = False
        self.kill_requested = False
        self.driver: subprocess.Popen[bytes] | None = None
        self.driver_status: int | None = None
        self.started_at: float | None = None
        # A warm driver (--go-file) is the job's run only once its go file exists.
        self.went = args.go_file is None

    # signals arrive through the wake-up pipe; the handler only records the request
    def _on_stop_signal(self, signum: int, frame: object) -> None:
        self.stop_requested = True

    def _on_kill_signal(self, signum: int, frame: object) -> None:
        self.kill_requested = True

    def _read_deadline(self) -> None:
        deadline = rundir.read_lease(self.lease_file)
        if deadline is not None:
            self.deadline = deadline

    def _grace(self) -> float:
        if self.args.stop_file is not None:
            grace = rundir.read_grace(self.args.stop_file)
            if grace is not None:
                return grace
        return float(self.args.grace)

    def _identity(self) -> dict[str, Any]:
        identity = {"job": self.args.job, "epoch": self.args.epoch, "server": self.args.server}
        if self.args.job_id is not None:
            # Names are reused (a job deleted and created again): only the id tells whose
            # run this is (driver.RunIdentity).
            identity["job_id"] = self.args.job_id
        return identity

    def _write_state(self) -> None:
        if self.args.state is None:
            return
        driver_pid = self.driver.pid if self.driver is not None else None
        rundir.write_json_atomically(
            self.args.state,
            {
                **self._identity(),
                "watchdog_pid": os.getpid(),
                "watchdog_start_ticks": process_start_ticks(os.getpid()),
                "driver_pid": driver_pid,
                "driver_pgid": driver_pid,  # the driver leads its own group
                "lease_file": str(self.lease_file),
                "result": str(self.args.result),
                "records": str(self.args.records) if self.args.records else None,
            },
        )

    def _record(self, event: str, t: float, mono: float, **extra: Any) -> None:
        if self.args.records is None:
            return
        rundir.append_record(
            self.args.records,
            {
                **self._identity(),
                "event": event,
                "pid": self.driver.pid if self.driver is not None else None,
                "t": t,
                "mono": mono,
                **extra,
            },
        )

    def _see_go(self) -> None:
        """A warm driver's go signal, once: its start is the time its server wrote."""
        if self.went or (went := rundir.read_go(self.args.go_file)) is None:
            return
        self.went = True
        self.started_at = went[0]
        self._record("started", went[0], went[1])
        log.info("go signal: the driver runs the job's main")

    def _stopping(self) -> bool:
        """A stop was requested: a SIGTERM (its server's stop, or a service manager's), or
        the stop file its server writes just before it."""
        stop_file = self.args.stop_file
        return self.stop_requested or (stop_file is not None and stop_file.exists())

    def _stopping_at_exit(self, exit_code: int | None, sigterm_exits: frozenset[int]) -> bool:
        """:meth:`_stopping`, once a SIGTERM exit has waited up to SIGTERM_STOP_WAIT_S
        for the watchdog's own SIGTERM (the handler only sets a flag: polled)."""
        if exit_code in sigterm_exits:
            until = lease_clock() + SIGTERM_STOP_WAIT_S
            while not self._stopping() and lease_clock() < until:
                time.sleep(0.02)
        return self._stopping()

    def _record_end(self, reason: Reason, exit_code: int | None, stopping: bool) -> bool:
        """Record the driver's own exit in PostgreSQL, as its server would
        (``reconcile.watchdog_ending``): an exit 0 ``finished``, a nonzero exit a crash
        that spends the job's budget (``distribution.finish_by_watchdog`` and
        ``record_crash_by_watchdog``, fenced on the run's server and epoch). So a server
        stalled or dead at that moment can neither let a finished generation run again
        nor let a failed job run past its budget. Retried while PostgreSQL is away,
        until shortly after the lease deadline (by then the server, or nobody, records
        it). False when nothing was recorded here: not the watchdog's to record, not
        possible, or the run is no longer its owner's."""
        if self.report is None or reason is not Reason.EXITED or not self.went:
            # The only endings watchdog_ending records (spares the imports); a warm
            # driver that never got its go signal ran nothing of the job's.
            return False
        try:
            # Imported here: a watchdog that records nothing never loads a database driver.
            from scheduler import distribution
            from server import driver_error, reconcile, spark_master
            from sql import database

            how = reconcile.watchdog_ending(reason, exit_code, stopping=stopping)
            if how is None:
                return False
            report = self.report
            if how is reconcile.Ending.FINISH:
                what = "the exit 0"

                def write(conn: Any) -> Any:
                    return distribution.finish_by_watchdog(
                        conn, report.job_id, report.server, report.epoch
                    )
            elif spark_master.lost_to_outage(
                master := report.spark_master or "", Path(report.log_file)
            ):
                # Not the job's failure: no restart counted; it runs once a master answers.
                what = f"the exit {exit_code} as a deferral (no Spark master answers)"
                error = driver_error.one_line(
                    spark_master.detail(master)
                    + " after "
                    + driver_error.crash_error(str(reason), exit_code, Path(report.log_file))
                )

                def write(conn: Any) -> Any:
                    return distribution.defer_by_watchdog(
                        conn,
                        report.job_id,
                        report.server,
                        report.epoch,
                        error,
                        report.backoff_base,
                        cause=spark_master.CAUSE,
                    )
            else:
                what = f"the exit {exit_code}"
                error = driver_error.crash_error(str(reason), exit_code, Path(report.log_file))

                def write(conn: Any) -> Any:
                    return distribution.record_crash_by_watchdog(
                        conn,
                        report.job_id,
                        report.server,
                        report.epoch,
                        error,
                        backoff_base=report.backoff_base,
                        backoff_max=report.backoff_max,
                    )

            engine = database.create_engine(
                report.database_url,
                pool_size=1,
                connect_timeout=RECORD_CONNECT_TIMEOUT_S,
                limits=database.SessionLimits(
                    lock_timeout=RECORD_STATEMENT_TIMEOUT_S,
                    idle_in_transaction_timeout=RECORD_STATEMENT_TIMEOUT_S,
                    statement_timeout=RECORD_STATEMENT_TIMEOUT_S,
                ),
            )
        except Exception as exc:
            # The result file must still be written: without it the run reads as killed.
            log.warning("cannot record the driver's exit here: %s", type(exc).__name__)
            return False
        give_up = max(self.deadline, lease_clock()) + RECORD_AFTER_DEADLINE_S
        try:
            while True:
                try:
                    with engine.begin() as conn:
                        state = write(conn)
                    log.info("recorded %s in PostgreSQL: job now %s", what, state)
                    return True
                except distribution.FencedError:
                    log.info("%s not recorded here: the run is no longer its owner's", what)
                    return False
                except Exception as exc:  # any failure leaves the record to the server
                    if lease_clock() >= give_up:
                        log.warning("could not record %s: %s", what, type(exc).__name__)
                        return False
                    time.sleep(RECORD_RETRY_S)  # PostgreSQL away: nothing to wait on
        finally:
            engine.dispose()

    def _was_stopping(self, reason: Reason, exit_code: int | None) -> bool:
        """Whether a stop was asked of it when its driver exited on its own: a failure
        before the stop is the job's own, counted even while its server stops it."""
        return reason is not Reason.EXITED or self._stopping_at_exit(
            exit_code, exit_codes.SIGTERM_EXITS
        )

    def _finish(
        self,
        reason: Reason,
        exit_code: int | None,
        ended_at: float,
        stopping: bool | None = None,
    ) -> int:
        if reason is Reason.EXITED:
            code = exit_codes.ExitCode.OK if exit_code == 0 else exit_codes.ExitCode.DRIVER_FAILED
        else:
            code = EXIT_CODE_OF_REASON[reason]
        if stopping is None:
            stopping = self._was_stopping(reason, exit_code)
        recorded = self._record_end(reason, exit_code, stopping)
        rundir.write_json_atomically(
            self.args.result,
            {
                **self._identity(),
                "reason": str(reason),
                "exit_code": exit_code,
                "driver_pid": self.driver.pid if self.driver is not None else None,
                "started_at": self.started_at,
                "ended_at": ended_at,
                "watchdog_exit": int(code),
                "recorded": recorded,
                "stopping": stopping,
                "went": self.went,
            },
        )
        log.info("driver ended: reason=%s exit_code=%s", reason, exit_code)
        return int(code)

    def _signal_group(self, signum: int) -> None:
        assert self.driver is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.driver.pid, signum)

    def _terminate(self, grace: float) -> None:
        """SIGTERM the processes that should stop first: those below the group leader
        with ``--term-only`` in their argv (the Python driver, so that it can end its
        micro-batch and stop its query while the JVM keeps serving it), else the group."""
        assert self.driver is not None
        targets = []
        if self.args.term_only is not None:
            members = group_members(self.driver.pid)
            targets = [
                pid
                for pid, argv in members.items()
                # The leader (spark-submit's JVM) has the main script in its argv too.
                if pid != self.driver.pid and self.args.term_only in argv
            ]
        if not targets:
            log.info("stop requested: SIGTERM to driver group, SIGKILL in %.1f s", grace)
            self._signal_group(signal.SIGTERM)
            return
        log.info("stop requested: SIGTERM to pids %s, SIGKILL in %.1f s", targets, grace)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _reap(self, block: bool) -> bool:
        """Reap exited descendants; True once there are none left."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False
            if self.driver is not None and pid == self.driver.pid:
                self.driver_status = os.waitstatus_to_exitcode(status)
                # Tell Popen the child is gone so it neither waits nor warns on exit.
                self.driver.returncode = self.driver_status
            if block:
                return False

    def kill_everything(self) -> None:
        """SIGKILL the group and every descendant re-parented to us, until none is left.

        The first round of a driver that had not exited is recorded (``killed``, with
        --records): from then on no process it signalled runs another instruction of its
        own, however long the kernel takes to tear it down and this watchdog to reap it
        (seconds on a saturated host, for a JVM of many threads). A descendant that was
        neither in the group nor our child then (one that left the group, its parent
        still alive) is killed in a later round and counted in the ``ended`` record's
        ``late_kills``: until then it ran."""
        assert self.driver is not None
        signalled = set(group_members(self.driver.pid)) | set(_children())
        first, exited = True, self.driver_status is not None
        while True:
            faulthandler.dump_traceback_later(STALL_DUMP_S)
            self._signal_group(signal.SIGKILL)
            children = _children()
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            if first:
                if not exited and self.went:  # a warm driver before its go ran nothing
                    self._record("killed", time.time(), lease_clock())
                first = False
            else:
                self.late_kills += len(set(children) - signalled)
                signalled.update(children)
            if self._reap(block=True):
                faulthandler.cancel_dump_traceback_later()
                return

    def _control_files_are_safe(self) -> bool:
        """With a driver user: no folder of a control file (lease, stop, state, result)
        is writable by anyone but this process's user, so the driver can neither
        rewrite its lease nor plant a state the server would trust. Logs and returns
        False otherwise."""
        if self.args.uid is None:
            return True
        paths = (self.lease_file, self.args.stop_file, self.args.state, self.args.result)
        for folder in {path.absolute().parent for path in paths if path is not None}:
            try:
                st = folder.stat()
            except OSError as exc:
                log.error("cannot check the run directory %s: %s", folder, exc)
                return False
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                log.error(
                    "the run directory %s is writable by others (mode %o, uid %d): "
                    "the driver could rewrite its own lease; not started",
                    folder,
                    st.st_mode & 0o7777,
                    st.st_uid,
                )
                return False
        return True

    def _spawn(self) -> subprocess.Popen[bytes]:
        """Start the driver: leader of a new process group, in its working directory,
        killed if the watchdog dies, and as the driver's user when one is given."""
        identity: dict[str, Any] = {}
        if self.args.uid is not None:
            identity = {"user": self.args.uid, "group": self.args.gid, "extra_groups": []}
        # Popen switches the user before it runs preexec_fn: the parent-death signal,
        # which a change of credentials clears, is set after it (prctl(2)).
        return subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            cwd=self.args.cwd,
            process_group=0,
            preexec_fn=_driver_preexec(self.args.nice),
            **identity,
        )

    def run(self) -> int:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGUSR1, self._on_kill_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        self._write_state()
        if self.report is not None:
            _load_recorder()

        self._read_deadline()
        if lease_clock() >= self.deadline:
            log.error("lease deadline already passed or unreadable: driver not started")
            return self._finish(Reason.LEASE_EXPIRED, None, time.time())
        if self.kill_requested:
            return self._finish(Reason.KILLED, None, time.time())
        if self.stop_requested:
            return self._finish(Reason.STOPPED, None, time.time())
        if not self._control_files_are_safe():
            return self._finish(Reason.SPAWN_FAILED, None, time.time())

        # Taken before the spawn: a record never claims a start later than the real one.
        self.started_at, started_mono = time.time(), lease_clock()
        try:
            self.driver = self._spawn()
        except (OSError, subprocess.SubprocessError) as exc:
            log.error("cannot start driver %r: %s", self.command[0], exc)
            return self._finish(Reason.SPAWN_FAILED, None, time.time())
        self._write_state()
        if self.went:
            self._record("started", self.started_at, started_mono)
        log.info("driver started: pid=%s", self.driver.pid)

        reason = self._supervise(os.pidfd_open(self.driver.pid), wake_read)
        self.kill_everything()
        # Every descendant is reaped: a record never claims an end earlier than the real one.
        ended_at, ended_mono = time.time(), lease_clock()
        # Said in the record too: an exit during a stop is no failure of the job's.
        stopping = self._was_stopping(reason, self.driver_status)
        self._see_go()  # written just before the end: the job's main may have run
        if not self.went:
            return self._finish(reason, self.driver_status, ended_at, stopping)
        self._record(
            "ended",
            ended_at,
            ended_mono,
            reason=str(reason),
            exit_code=self.driver_status,
            late_kills=self.late_kills,
            stopping=stopping,
        )
        return self._finish(reason, self.driver_status, ended_at, stopping)

    def _supervise(self, pidfd: int, wake_read: int) -> Reason:
        """Wait until the driver exits, the lease runs out, or a stop finishes."""
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(wake_read, select.POLLIN)
        reason = Reason.EXITED
        kill_at = math.inf  # SIGKILL time of a stop in progress
        while True:
            faulthandler.dump_traceback_later(STALL_DUMP_S)
            self._read_deadline()
            self._see_go()
            now = lease_clock()
            if self.kill_requested:
                log.warning("kill requested: killing the driver group and its descendants")
                return Reason.KILLED
            if now >= self.deadline:
                log.error(
                    "lease confirmation overdue by %.3f s: killing driver group",
                    now - self.deadline,
                )
                return reason if reason is Reason.STOPPED else Reason.LEASE_EXPIRED
            if self.stop_requested and reason is not Reason.STOPPED:
                reason = Reason.STOPPED
                grace = self._grace()
                kill_at = now + grace
                self._terminate(grace)
            if now >= kill_at:
                log.warning("driver group still alive after the grace: SIGKILL")
                return reason
            wake = min(self.deadline, kill_at, now + self.args.interval)
            events = poller.poll(max(0.0, wake - now) * 1000)
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 512)
            self._reap(block=False)
            if self.driver_status is not None or any(fd == pidfd for fd, _ in events):
                self._reap(block=False)
                if self.driver_status is not None:
                    return reason


def _load_recorder() -> None:
    """Import what :meth:`Watchdog._record_end` writes with, before the driver starts. A
    batch run's exit 0 is a fact on this host alone until it is committed: a host lost
    (frozen, powered off) in between runs the generation again elsewhere
    (docs/drivers.md, "What a batch job may see twice"). Imported at the exit, the
    database client took 0.4 s on an idle 2-core host and over a second under load;
    loaded before, the exit is committed within a connect and one statement. About 24 MB
    per watchdog that records (one per running driver). A failure here is harmless: the
    recording imports again, and says why it cannot.

    Not on a thread of its own while the driver runs, as it was: on a saturated host
    that thread held the GIL through its imports while the supervising loop waited for
    it, seconds at a time, past the lease deadline (CHAOS_SEED=500268951: a stop's
    SIGTERM and a kill at the deadline each came over 10 s late; the stall dump,
    STALL_DUMP_S, showed the loop waiting in a /proc read while this import ran)."""
    with contextlib.suppress(Exception):
        from scheduler import distribution  # noqa: F401
        from server import driver_error, reconcile, spark_master  # noqa: F401
        from sql import database  # noqa: F401


def main(argv: Sequence[str] | None = None) -> int:
    args = watchdog_contract.WatchdogArgs.parse(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s sparkring-watchdog[%(process)d] %(levelname)s %(message)s",
    )
    report = None
    if args.report_fd is not None:
        with os.fdopen(args.report_fd, "rb") as pipe:
            report = watchdog_contract.FinishReport.from_payload(pipe.read())
    # Nothing the launcher leaked (sockets, files) may reach the driver or pin resources.
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    watchdog = Watchdog(args, report)
    try:
        return watchdog.run()
    except Exception:
        log.exception("watchdog failed: killing the driver group, it must not run unfenced")
        if watchdog.driver is not None:
            with contextlib.suppress(Exception):
                watchdog.kill_everything()
        return int(exit_codes.ExitCode.INTERNAL_ERROR)


if __name__ == "__main__":
    sys.exit(main())
