"""One supervised Spark driver: its spark-submit argv and environment, its launch under a
watchdog, and the handle the server uses to confirm, stop, kill or re-adopt it.

Process tree (see docs/drivers.md)::

    server ── watchdog (own session; python -m server.watchdog)
                └── spark-submit JVM (leader of its own process group)
                      └── python driver (the job's main .py)

The files of one run, all in ``DriverSpec.run_dir``, are declared with their readers and
writers in ``server/rundir.py`` (the lease, state, stop and result files, the driver's
log, ``cwd/``).

With a driver user (``DriverSpec.user``, ``server/driver_user.py``) the watchdog runs as
the server's user and the driver as that user: the run directory and its control files
stay the server's (the driver can read them, never write them), and only ``cwd/`` (also
its HOME) and its streaming checkpoint are the driver user's.

This module never reads ``os.environ`` itself: the server passes the base environment
to :func:`build_env`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import re
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server import (
    driver_network,
    driver_user,
    job_deps,
    rundir,
    warm_entry,
    watchdog,
    watchdog_contract,
)

log = logging.getLogger("sparkring.driver")

Reason = watchdog.Reason
# What a run's watchdog records its driver's own exit with (the name launch.py builds).
FinishReport = watchdog_contract.FinishReport

# Generated launcher for a .zip/.egg main: spark-submit only runs a .py as a Python main.
ZIP_LAUNCHER_FILE = "sparkring_main.py"
# A warm driver's entry point (server/warm_entry.py, copied into its run directory).
WARM_ENTRY_FILE = "sparkring_warm.py"

KINDS = ("streaming", "batch")
PYTHON_SUFFIXES = (".py", ".zip", ".egg")
# Conf key naming the main class of a .jar job; sparkring.* keys never reach Spark.
MAIN_CLASS_CONF = "sparkring.main.class"
SPARKRING_CONF_PREFIX = "sparkring."
UI_PORT_CONF = "spark.ui.port"
EXECUTOR_PYTHONPATH_CONF = "spark.executorEnv.PYTHONPATH"

# Inherited variables a driver must never see: the server's own configuration
# (database URL, S3 and ZooKeeper credentials) and anything that looks like a secret.
# A job that needs credentials gets them explicitly through DriverSpec.extra_env.
_SECRET_NAME = re.compile(
    r"^SPARKRING_|SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY|^PGPASS",
    re.IGNORECASE,
)
# How long stop() waits beyond the grace for the watchdog itself before killing it, s.
_WATCHDOG_SLACK_S = 10.0
# How long a poll that finds a watchdog dead without a result spends killing what is
# left of its run before it looks again later (the poll thread must not block), s.
_POLL_SWEEP_S = 1.0


class DriverError(Exception):
    """A driver cannot be built or launched; the message names the job and the problem.

    Launch problems (an artifact gone from the cache, no process could be spawned) may
    pass; :class:`SpecError` is the kind that never does."""


class SpecError(DriverError):
    """The job's spec is invalid (bad main, conf, args): no retry can start it."""


@dataclass(frozen=True, kw_only=True)
class DriverSpec:
    """Everything needed to start one run of a job's driver."""

    job: str
    kind: str  # "streaming" or "batch"
    epoch: int
    attempt: int
    server: str
    main: Path  # verified artifact: .py, .zip/.egg (Python) or .jar
    run_dir: Path
    master: str
    py_files: Sequence[Path] = ()
    conf: Mapping[str, str] = field(default_factory=dict)
    args: Sequence[str] = ()
    checkpoint_dir: Path | None = None
    spark_submit: Path = field(default_factory=lambda: default_spark_submit())
    python: str = sys.executable
    # The job's own variables, its secrets' values among them: never in a repr.
    extra_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    revision: int | None = None  # the job revision run (SPARKRING_REVISION), if known
    job_id: int | None = None  # recorded in the watchdog's state and result (RunIdentity)
    # The OS user the driver runs as (SPARKRING_DRIVER_USER); None: the server's own.
    user: driver_user.DriverUser | None = None
    # Nice steps below its watchdog the driver runs at (SPARKRING_DRIVER_NICE).
    nice: int = 0
    # The run (SPARKRING_RUN_ID): a batch run's id in ``runs``; "" for a run without a
    # row (a streaming job), which gets ``<job>-e<epoch>``, unique per driver.
    run_id: str = ""
    # A scheduled run's fire time, ISO-8601 UTC with Z (SPARKRING_SCHEDULED_TIME).
    scheduled_time: str | None = None
    # A warm driver (server/warm.py): spark-submit runs the warm entry point, which
    # builds the SparkSession and waits this long for go.json before the job's main
    # runs. None: the job's main runs at once (a cold start).
    warm_go_timeout: float | None = None
    # The Spark UI port the server chose for the driver (spark.ui.port, recorded in the
    # run's ui.json for its health monitor); None: Spark's default, or the job's own.
    ui_port: int | None = None
    # The server's own address, as an IP (driver_network.resolve): a driver of a cluster
    # master binds on it and gives it to its executors. None: loopback, as a local
    # master's driver is.
    address: str | None = None
    # The job's dependencies (server/job_deps.py): the unpacked folder, first on the
    # driver's PYTHONPATH, and the zip a cluster master's executors get (--archives).
    deps_dir: Path | None = None
    deps_zip: Path | None = None

    @property
    def warm(self) -> bool:
        return self.warm_go_timeout is not None


@dataclass(frozen=True)
class Outcome:
    """How a run ended. Times are wall-clock seconds (``time.time()``)."""

    exit_code: int | None  # the driver's; negative = killed by that signal; None = never ran
    reason: watchdog.Reason
    started_at: float | None
    ended_at: float
    # The watchdog itself recorded the run's end in PostgreSQL (the driver's own exit).
    recorded: bool = False
    # A stop was asked of the watchdog when its driver exited (False: it ended on its
    # own first, so a failure is the job's own even if a stop began meanwhile). None:
    # unknown (a result of the older code, or none at all).
    stopping: bool | None = None
    # False: a warm driver that never got its go signal (it ran nothing of the job's).
    went: bool = True


@dataclass(frozen=True)
class RunIdentity:
    """Which run a watchdog's state and result files belong to. A job's name is not
    enough: a job deleted and created again under its name starts again at epoch 1, and
    the files of the deleted job's runs are still on disk (hole H6)."""

    job_id: int
    job: str
    epoch: int
    server: str

    def wrote(self, record: Mapping[str, Any] | None) -> bool:
        """``record`` (a state or result file's content) was written for this run. A
        record without ``job_id`` was written by a watchdog of the older code, which
        recorded only the name: it is taken on the name (the caller looks for such
        records only where the older code kept its runs: rundir.run_trace)."""
        if record is None or record.get("epoch") != self.epoch:
            return False
        if record.get("server") != self.server:
            return False
        if "job_id" in record:
            return record["job_id"] == self.job_id
        return record.get("job") == self.job


def default_spark_submit() -> Path:
    """The ``bin/spark-submit`` of the installed pyspark wheel (pyspark is not imported)."""
    found = importlib.util.find_spec("pyspark")
    if found is None or not found.submodule_search_locations:
        raise DriverError("pyspark is not installed: cannot find bin/spark-submit")
    return Path(next(iter(found.submodule_search_locations))) / "bin" / "spark-submit"


def _is_jar(spec: DriverSpec) -> bool:
    return spec.main.suffix.lower() == ".jar"


def _check(spec: DriverSpec) -> None:
    if not spec.job:
        raise SpecError("driver spec has an empty job name")
    if spec.kind not in KINDS:
        raise SpecError(f"job {spec.job}: unknown kind {spec.kind!r} (expected streaming or batch)")
    for name, path in (("main artifact", spec.main), ("run directory", spec.run_dir)):
        if not path.is_absolute():
            raise SpecError(f"job {spec.job}: {name} {path} must be an absolute path")
    suffix = spec.main.suffix.lower()
    if suffix != ".jar" and suffix not in PYTHON_SUFFIXES:
        raise SpecError(
            f"job {spec.job}: main artifact {spec.main.name!r} must be a .py, .zip, .egg or .jar"
        )
    if spec.kind == "streaming" and spec.checkpoint_dir is None:
        raise SpecError(f"job {spec.job}: a streaming job needs a checkpoint directory")
    for key, value in spec.conf.items():
        if not key or "=" in key or any(c.isspace() for c in key):
            raise SpecError(f"job {spec.job}: invalid Spark conf key {key!r}")
        if "\n" in value or "\x00" in value:
            raise SpecError(f"job {spec.job}: conf {key} has a newline or NUL in its value")
    for argument in spec.args:
        if "\x00" in argument:
            raise SpecError(f"job {spec.job}: an argument contains a NUL byte")


def build_argv(spec: DriverSpec) -> list[str]:
    """The spark-submit argv of ``spec``: options first, then the main, then its args."""
    _check(spec)
    argv = [
        str(spec.spark_submit),
        "--master",
        spec.master,
        "--name",
        f"sparkring-{spec.job}",
        "--deploy-mode",
        "client",
    ]
    for key, value in spec.conf.items():
        if not key.startswith(SPARKRING_CONF_PREFIX):
            argv += ["--conf", f"{key}={value}"]
    for key, value in driver_network.driver_conf(spec.master, spec.address, spec.conf).items():
        argv += ["--conf", f"{key}={value}"]
    if spec.ui_port is not None and UI_PORT_CONF not in spec.conf:
        argv += ["--conf", f"{UI_PORT_CONF}={spec.ui_port}"]
    argv += _deps_options(spec)
    py_files = [str(path) for path in spec.py_files]
    if _is_jar(spec):
        main_class = spec.conf.get(MAIN_CLASS_CONF, "").strip()
        if not main_class:
            raise SpecError(
                f"job {spec.job}: a .jar main needs its class: --conf {MAIN_CLASS_CONF}=<class>"
            )
        if py_files:
            raise SpecError(f"job {spec.job}: --py-files apply to Python mains, not a .jar")
        argv += ["--class", main_class]
        main = str(spec.main)
    elif spec.main.suffix.lower() == ".py":
        main = str(spec.main)
    else:
        # A .zip/.egg main runs through a generated launcher; the archive itself must
        # also reach the executors, so it goes first in --py-files.
        py_files.insert(0, str(spec.main))
        main = str(spec.run_dir / ZIP_LAUNCHER_FILE)
    if py_files:
        argv += ["--py-files", ",".join(py_files)]
    if spec.warm:
        if _is_jar(spec):
            raise SpecError(f"job {spec.job}: a .jar main has no warm start")
        main = str(spec.run_dir / WARM_ENTRY_FILE)  # it runs the main of warm.json
    return [*argv, main, *spec.args]


def _deps_options(spec: DriverSpec) -> list[str]:
    """A cluster master's executors get the job's dependencies: the zip, unpacked in
    their working folder, on their Python workers' PYTHONPATH (a job's own
    ``spark.executorEnv.PYTHONPATH`` wins). A local master's run in the driver's JVM,
    with the driver's PYTHONPATH."""
    if spec.deps_zip is None or driver_network.is_local(spec.master):
        return []
    folder = job_deps.EXECUTOR_FOLDER
    options = ["--archives", f"{spec.deps_zip}#{folder}"]
    if EXECUTOR_PYTHONPATH_CONF not in spec.conf:
        options += ["--conf", f"{EXECUTOR_PYTHONPATH_CONF}=./{folder}"]
    return options


def job_python_file(spec: DriverSpec) -> Path:
    """The Python file that runs the job: its .py main, or the launcher of its archive."""
    if spec.main.suffix.lower() == ".py":
        return spec.main
    return spec.run_dir / ZIP_LAUNCHER_FILE


def without_secrets(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without the server's configuration and anything named like a secret."""
    return {name: value for name, value in base.items() if not _SECRET_NAME.search(name)}


def build_env(spec: DriverSpec, base: Mapping[str, str]) -> dict[str, str]:
    """The driver's environment: ``base`` without secrets, then the job's variables."""
    _check(spec)
    env = without_secrets(base)
    # The UI's bind (the health monitor reads it on loopback) and Spark's default host;
    # a cluster master's driver advertises spec.address instead (build_argv).
    env.setdefault("SPARK_LOCAL_IP", driver_network.LOOPBACK)
    env.update(spec.extra_env)
    if spec.deps_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(spec.deps_dir), env.get("PYTHONPATH", "")) if p
        )
    env.update(
        {
            "SPARKRING_JOB": spec.job,
            "SPARKRING_EPOCH": str(spec.epoch),
            "SPARKRING_SERVER": spec.server,
            "SPARKRING_ATTEMPT": str(spec.attempt),
            "PYSPARK_PYTHON": spec.python,
            "PYSPARK_DRIVER_PYTHON": spec.python,
        }
    )
    if spec.revision is not None:
        env["SPARKRING_REVISION"] = str(spec.revision)
    env["SPARKRING_RUN_ID"] = spec.run_id or f"{spec.job}-e{spec.epoch}"
    if spec.scheduled_time is not None:
        env["SPARKRING_SCHEDULED_TIME"] = spec.scheduled_time
    else:
        env.pop("SPARKRING_SCHEDULED_TIME", None)
    if spec.kind == "streaming":
        assert spec.checkpoint_dir is not None  # _check
        env["SPARKRING_CHECKPOINT_DIR"] = str(spec.checkpoint_dir)
    else:
        env.pop("SPARKRING_CHECKPOINT_DIR", None)
    return env


def _zip_launcher(archive: Path) -> str:
    return (
        '"""Generated by sparkring: runs the __main__.py of a zipped Python main."""\n'
        "import runpy\nimport sys\n\n"
        f"ARCHIVE = {str(archive)!r}\n"
        "sys.argv[0] = ARCHIVE\n"
        "sys.path.insert(0, ARCHIVE)\n"
        'runpy.run_path(ARCHIVE, run_name="__main__")\n'
    )


class Driver:
    """Handle on one watchdog (and through it, one driver run). Thread-safe.

    The watchdog is reaped with ``waitpid`` rather than held in a ``Popen``: a server may
    drop the handle of a watchdog that outlives it on purpose, without a warning.
    """

    def __init__(self, run_dir: Path, pid: int, *, is_child: bool) -> None:
        self.run_dir = run_dir
        self.pid = pid  # the watchdog's pid
        self._is_child = is_child  # False when adopted: only the start time identifies it
        self._start_ticks = watchdog.process_start_ticks(pid)
        self._lock = threading.Lock()
        self._status: int | None = None  # the watchdog's exit status, once reaped
        self._outcome: Outcome | None = None
        self._stop_requested = False

    @property
    def lease_file(self) -> Path:
        return self.run_dir / rundir.LEASE_FILE

    @property
    def log_file(self) -> Path:
        return self.run_dir / rundir.LOG_FILE

    @property
    def watchdog_exit(self) -> int | None:
        """The watchdog's exit status (``exit_codes.ExitCode``, or minus a signal) when it
        was our child and has ended; None otherwise."""
        return self._status

    def _watchdog_alive(self) -> bool:
        with self._lock:
            if self._outcome is not None or self._status is not None:
                return False
            if not self._is_child:
                ticks = watchdog.process_start_ticks(self.pid)
                return ticks is not None and ticks == self._start_ticks
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: treat like a death without status
                self._is_child = False
                return False
            if pid == 0:
                return True
            self._status = os.waitstatus_to_exitcode(status)
            return False

    def poll(self) -> Outcome | None:
        """None while the watchdog runs; then how the run ended."""
        if self._outcome is not None:
            return self._outcome
        if self._watchdog_alive():
            return None
        outcome = self._read_outcome()
        if outcome is None:
            return None  # processes of the run survive its watchdog: not over yet
        with self._lock:
            if self._outcome is None:
                self._outcome = outcome
            return self._outcome

    @staticmethod
    def outcome_of(run_dir: Path) -> Outcome:
        """How the run in ``run_dir`` ended, from its result file (``killed`` when the
        watchdog left none: it was SIGKILLed)."""
        result = rundir.read_json(run_dir / rundir.RESULT_FILE)
        if result is not None and result.get("reason") in set(watchdog.Reason):
            return Outcome(
                exit_code=result.get("exit_code"),
                reason=watchdog.Reason(result["reason"]),
                started_at=result.get("started_at"),
                ended_at=float(result.get("ended_at") or time.time()),
                recorded=result.get("recorded") is True,
                stopping=result.get("stopping")
                if isinstance(result.get("stopping"), bool)
                else None,
                went=result.get("went") is not False,
            )
        return Outcome(None, watchdog.Reason.KILLED, None, time.time())

    def ended(self) -> bool:
        """The run is over: its watchdog wrote the result (it may still be exiting), or
        it is gone."""
        return (self.run_dir / rundir.RESULT_FILE).exists() or self.poll() is not None

    def _read_outcome(self) -> Outcome | None:
        if (self.run_dir / rundir.RESULT_FILE).exists():
            return self.outcome_of(self.run_dir)
        # No result: the watchdog was SIGKILLed (by kill(), by an operator or the OOM
        # killer, or by SIGTERM before it had installed its handler when a stop was
        # requested right after the launch). Its driver group's leader died with it
        # (PDEATHSIG), but not the job's Python main, the leader's child, nor anything
        # that left the group: they are orphaned to init and would run on beside the
        # job's next driver. The run is over only once none of them is left.
        left = sweep(self.run_dir, within=_POLL_SWEEP_S)
        if left:
            log.error(
                "the watchdog died and processes of its run survive SIGKILL; "
                "the run is not over until they are gone",
                extra={"action": "sweep", "pids": left, "run_dir": str(self.run_dir)},
            )
            return None
        stopped = self._stop_requested and self._status == -signal.SIGTERM
        return Outcome(
            exit_code=None,
            reason=watchdog.Reason.STOPPED if stopped else watchdog.Reason.KILLED,
            started_at=None,
            ended_at=time.time(),
        )

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """Block until the run ends (or ``timeout`` seconds pass: then None)."""
        end = math.inf if timeout is None else time.monotonic() + timeout
        if (outcome := self.poll()) is not None:
            return outcome
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return self.poll()
        try:
            # The pid may have been recycled between poll() and pidfd_open().
            if not self._watchdog_alive():
                return self.poll()
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            while (outcome := self.poll()) is None:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                poller.poll(min(left, 1.0) * 1000)
            return outcome
        finally:
            os.close(pidfd)

    def confirm(self, deadline: float) -> None:
        """Extend the watchdog's deadline to ``deadline`` (``watchdog.lease_clock()``)."""
        rundir.write_lease(self.lease_file, deadline)

    def stop(self, grace: float) -> Outcome:
        """SIGTERM the driver group through the watchdog, SIGKILL after ``grace``; block."""
        if grace < 0:
            raise ValueError(f"grace must be >= 0 seconds, not {grace}")
        if (outcome := self.poll()) is not None:
            return outcome
        rundir.write_stop(self.run_dir / rundir.STOP_FILE, grace)
        self._stop_requested = True
        log.info(
            "stopping driver",
            extra={"action": "stop", "watchdog_pid": self.pid, "grace": grace},
        )
        with contextlib.suppress(ProcessLookupError):
            if self._watchdog_alive():
                os.kill(self.pid, signal.SIGTERM)
        outcome = self.wait(grace + _WATCHDOG_SLACK_S)
        if outcome is None:
            log.error("watchdog did not end after the grace: killing it", extra={"action": "stop"})
            self.kill()
            outcome = self.wait()
            assert outcome is not None
        return outcome

    def kill(self) -> None:
        """Kill the run now: the driver, its group and every descendant, escaped ones
        (own session or group) included; return once none is left.

        The watchdog does it (SIGUSR1): it is the subreaper of the run, so descendants
        that left the group are its children once their parents die. Killing the
        watchdog instead would hand them to init. If the watchdog does not answer (it
        died, or was SIGSTOPped), it is SIGKILLed and the run's processes are found by
        the mark in their environment (``watchdog.marked_processes``) and killed."""
        if self._watchdog_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGUSR1)
            self.wait(_WATCHDOG_SLACK_S)
        if self._watchdog_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.wait(_WATCHDOG_SLACK_S)
        if left := sweep(self.run_dir):
            log.error(
                "processes of a killed run survive SIGKILL (uninterruptible sleep?)",
                extra={"action": "sweep", "pids": left, "run_dir": str(self.run_dir)},
            )


def sweep(run_dir: Path, within: float = _WATCHDOG_SLACK_S) -> list[int]:
    """SIGKILL every process left of the run in ``run_dir`` (its driver group and any
    process carrying its mark) until none is left or ``within`` seconds passed (a
    process in uninterruptible sleep dies only when it leaves it); record the end if
    nobody did. Returns the pids still alive (empty: the run's processes are gone)."""
    # Read only now: the watchdog may have spawned the driver until it died.
    state = rundir.read_json(run_dir / rundir.STATE_FILE) or {}
    pgid = state.get("driver_pgid")
    end = time.monotonic() + within
    while True:
        left = watchdog.marked_processes(run_dir)
        if isinstance(pgid, int) and pgid > 1:
            left += list(watchdog.group_members(pgid))
        if not left or time.monotonic() >= end:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    if left:
        return sorted(set(left))
    records = state.get("records")
    if records and not (run_dir / rundir.RESULT_FILE).exists():
        # The watchdog died before writing its own "ended" record (or after it, unable
        # to write its result: a full disk): write one for it, after everything is
        # gone, so that lifetime records stay complete. A reader keeps the first.
        rundir.append_record(
            Path(records),
            {
                "job": state.get("job"),
                "epoch": state.get("epoch"),
                "server": state.get("server"),
                "event": "ended",
                "pid": state.get("driver_pid"),
                "t": time.time(),
                "mono": watchdog.lease_clock(),
                "reason": str(watchdog.Reason.KILLED),
                "exit_code": None,
            },
        )
    return []


def pin_artifacts(run_dir: Path, artifacts: Sequence[tuple[Path, str]]) -> list[Path]:
    """Give the run links of its own to its verified artifacts, under their original
    file names: ``[(cached path, file name)]`` -> the run's paths, in order.

    A hard link keeps the file's content alive when the cache evicts its entry while
    the run still reopens it (a ``.zip`` main or ``--py-files`` are read again during
    the run), and the driver sees ``etl.py``, not a content hash. Where a hard link is
    impossible (another file system), the file is copied. Names are made unique by an
    index prefix."""
    folder = run_dir / rundir.ARTIFACTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    pinned: list[Path] = []
    used: set[str] = set()
    for index, (source, filename) in enumerate(artifacts):
        name = Path(filename).name or source.name
        if name in used:
            name = f"{index}-{name}"
        used.add(name)
        target = folder / name
        target.unlink(missing_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
        pinned.append(target)
    return pinned


def _working_dir(run_dir: Path, user: driver_user.DriverUser | None = None) -> Path:
    """The driver's working directory: a folder of its own inside the run directory, so
    that the job cannot overwrite the watchdog's control files (lease, state, stop,
    result) and switch off its own fencing by writing to its current directory. With a
    driver user it is that user's alone (mode 0700), and the run directory stays the
    server's, readable and passable by all, writable by the server only."""
    path = run_dir / rundir.WORKING_DIR
    path.mkdir(parents=True, exist_ok=True)
    if user is not None:
        os.chmod(run_dir, 0o755)
        driver_user.give(path, user, 0o700)
    return path


def supervise(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    run_dir: Path,
    lease_deadline: float,
    job: str,
    epoch: int,
    server: str,
    records: Path | None = None,
    default_grace: float = watchdog_contract.DEFAULT_GRACE_S,
    term_only: str | None = None,
    report: FinishReport | None = None,
    job_id: int | None = None,
    user: driver_user.DriverUser | None = None,
    nice: int = 0,
    go_file: Path | None = None,
) -> Driver:
    """Run ``command`` under a new watchdog in its own session; see :func:`launch`.

    ``term_only``: on stop, SIGTERM only the processes with this argv element (see
    ``server/watchdog.py``); None sends it to the whole group. ``report``: the watchdog
    records the driver's own exit in PostgreSQL itself. ``user``: the watchdog (this
    process's user) starts ``command`` as that user. ``nice``: ``command`` runs that many
    nice steps below the watchdog, so that a busy host still schedules the watchdog in
    time to kill it (``Settings.driver_nice``). ``go_file``: a warm driver's (see
    ``server/warm.py``): the run is the job's only once that file exists.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in (rundir.RESULT_FILE, rundir.STOP_FILE, rundir.STATE_FILE, rundir.GO_FILE):
        (run_dir / stale).unlink(missing_ok=True)
    # The lease file exists before the watchdog does: it never starts unconfirmed.
    rundir.write_lease(run_dir / rundir.LEASE_FILE, lease_deadline)
    cwd = _working_dir(run_dir, user)
    report_fd = None if report is None else report.to_pipe()
    args = watchdog_contract.WatchdogArgs(
        lease_file=run_dir / rundir.LEASE_FILE,
        result=run_dir / rundir.RESULT_FILE,
        command=tuple(command),
        state=run_dir / rundir.STATE_FILE,
        stop_file=run_dir / rundir.STOP_FILE,
        grace=default_grace,
        job=job,
        epoch=epoch,
        server=server,
        cwd=cwd,
        uid=user and user.uid,
        gid=user and user.gid,
        job_id=job_id,
        nice=nice,
        records=records,
        term_only=term_only,
        go_file=go_file,
        report_fd=report_fd,
    )
    argv = [sys.executable, "-m", "server.watchdog", *args.to_argv()]
    env = {**env, watchdog.RUN_MARK_VARIABLE: str(run_dir)}
    if user is not None:
        # The server's HOME is not the driver's to write (Spark and Ivy keep caches
        # below HOME): its private working directory is.
        env.update(HOME=str(run_dir / rundir.WORKING_DIR), USER=user.name, LOGNAME=user.name)
    log_fd = os.open(run_dir / rundir.LOG_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        pid = os.posix_spawn(
            sys.executable,
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, log_fd, 1),
                (os.POSIX_SPAWN_DUP2, log_fd, 2),
            ],
            setsid=True,  # its own session: the server's signals and pauses never reach it
        )
    except OSError as exc:
        raise DriverError(f"job {job}: cannot start the watchdog: {exc}") from exc
    finally:
        os.close(log_fd)
        if report_fd is not None:
            os.close(report_fd)
    log.info(
        "driver launched",
        extra={"action": "launch", "job": job, "epoch": epoch, "watchdog_pid": pid},
    )
    return Driver(run_dir, pid, is_child=True)


def launch(
    spec: DriverSpec,
    lease_deadline: float,
    *,
    base_env: Mapping[str, str] | None = None,
    records: Path | None = None,
    report: FinishReport | None = None,
) -> Driver:
    """Write the lease file, then start the watchdog, which starts spark-submit.

    ``base_env`` is the environment the driver inherits before :func:`build_env` filters
    it (default: this process's, read here because the caller is the server process).
    """
    argv = build_argv(spec)
    env = build_env(spec, os.environ if base_env is None else base_env)
    for artifact in (spec.main, *spec.py_files):
        if not artifact.is_file():
            raise DriverError(f"job {spec.job}: artifact {artifact} is missing")
    if not spec.spark_submit.is_file():
        raise DriverError(f"job {spec.job}: spark-submit not found at {spec.spark_submit}")
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    if spec.main.suffix.lower() in (".zip", ".egg"):
        launcher = spec.run_dir / ZIP_LAUNCHER_FILE
        launcher.write_text(_zip_launcher(spec.main))
        launcher.chmod(0o644)  # read by the driver, whatever the umask
    if spec.warm:
        entry = spec.run_dir / WARM_ENTRY_FILE
        entry.write_text(Path(warm_entry.__file__).read_text())
        entry.chmod(0o644)
        settings = spec.run_dir / rundir.WARM_FILE
        rundir.write_json_atomically(
            settings, {"main": str(job_python_file(spec)), "go_timeout": spec.warm_go_timeout}
        )
        settings.chmod(0o644)
    if spec.ui_port is not None and UI_PORT_CONF not in spec.conf:
        rundir.write_json_atomically(spec.run_dir / rundir.UI_FILE, {"port": spec.ui_port})
    if spec.checkpoint_dir is not None and spec.kind == "streaming":
        spec.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        if spec.user is not None:
            driver_user.give_tree(spec.checkpoint_dir, spec.user)
    if spec.user is not None:
        # Its artifacts and launcher are below the run directory: a folder the server
        # created under a strict umask would hide them from the driver's user.
        for folder in (spec.run_dir, spec.run_dir / rundir.ARTIFACTS_DIR):
            if folder.is_dir():
                folder.chmod(0o755)
        for path in (spec.main, spec.run_dir):
            if (blocked := driver_user.unreachable(path, spec.user)) is not None:
                raise DriverError(
                    f"job {spec.job}: the driver user {spec.user.name} cannot reach "
                    f"{path}: {blocked} is closed to it"
                )
    # A Python main is stopped through its own process (argv[-1 - len(args)]): it can
    # stop its query while the JVM still serves it. A JVM main gets SIGTERM itself.
    python_main = None if _is_jar(spec) else argv[-1 - len(spec.args)]
    return supervise(
        argv,
        env=env,
        run_dir=spec.run_dir,
        lease_deadline=lease_deadline,
        job=spec.job,
        epoch=spec.epoch,
        server=spec.server,
        records=records,
        term_only=python_main,
        report=report,
        job_id=spec.job_id,
        user=spec.user,
        nice=spec.nice,
        go_file=spec.run_dir / rundir.GO_FILE if spec.warm else None,
    )


def adopt(run_dir: Path, identity: RunIdentity | None = None) -> Driver | None:
    """Re-attach to the watchdog still running in ``run_dir`` (a server restarted with the
    same id), or None when there is none (its pid gone or reused by another process), or
    when its state file is not ``identity``'s (another job's run: hole H6)."""
    state = rundir.read_json(run_dir / rundir.STATE_FILE)
    if state is None:
        return None
    if identity is not None and not identity.wrote(state):
        return None
    pid, ticks = state.get("watchdog_pid"), state.get("watchdog_start_ticks")
    if not isinstance(pid, int) or not isinstance(ticks, int):
        return None
    if watchdog.process_start_ticks(pid) != ticks:
        return None
    return Driver(run_dir, pid, is_child=False)
