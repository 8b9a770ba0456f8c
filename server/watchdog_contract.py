"""What a server hands the watchdog of each driver it starts (``server/watchdog.py``),
as two values that both sides use: :class:`WatchdogArgs`, the command line
``python -m server.watchdog`` runs with (:meth:`WatchdogArgs.to_argv` on the server's
side, :meth:`WatchdogArgs.parse` on the watchdog's), and :class:`FinishReport`, what
the watchdog needs to record its driver's own exit in PostgreSQL, sent down a pipe
(:meth:`FinishReport.payload`, :meth:`FinishReport.from_payload`).

Small on purpose: the stand-alone watchdog imports it at start-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# How often the lease file is re-read when nothing else wakes the watchdog, seconds.
DEFAULT_INTERVAL_S = 0.1
# Grace between SIGTERM and SIGKILL when no stop file says otherwise, seconds.
DEFAULT_GRACE_S = 20.0


@dataclass(frozen=True)
class FinishReport:
    """What a run's watchdog needs to record how its driver ended itself: an exit 0
    ``finished``, a nonzero exit a crash with the job's backoff
    (``distribution.finish_by_watchdog``, ``record_crash_by_watchdog``), fenced on the
    run (its server and epoch; not the incarnation, which an adoption replaces). The end
    is then known to PostgreSQL even when the server is stalled or dead at that moment:
    no other server runs a finished generation again, or a failed job past its budget.
    Handed to the watchdog through a pipe, never in its argv or environment (the URL
    carries the database password)."""

    database_url: str
    job_id: int
    server: str
    epoch: int
    backoff_base: float  # the server's restart backoff (runner.RunnerConfig), seconds
    backoff_max: float
    log_file: str  # the run's driver.log: its first exception goes into a crash's error
    # The job's master: a driver that exited before it registered while no master of a
    # spark:// URL answers is deferred, not counted as a crash (server/spark_master.py).
    spark_master: str = ""

    def payload(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_payload(cls, payload: bytes) -> FinishReport:
        return cls(**json.loads(payload))

    def to_pipe(self) -> int:
        """The read end of a pipe that holds :meth:`payload`, inheritable (the write end
        is closed): the report waits in the pipe's buffer (far below its 64 KiB) for the
        watchdog to read at start-up (``--report-fd``)."""
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, self.payload())
        finally:
            os.close(write_end)
        os.set_inheritable(read_end, True)
        return read_end


@dataclass(frozen=True)
class WatchdogArgs:
    """The watchdog's command line (its options: ``python -m server.watchdog --help``)."""

    lease_file: Path
    result: Path
    command: tuple[str, ...]  # CMD, run after ``--``
    state: Path | None = None
    records: Path | None = None
    stop_file: Path | None = None
    grace: float = DEFAULT_GRACE_S
    interval: float = DEFAULT_INTERVAL_S
    cwd: Path | None = None
    term_only: str | None = None
    uid: int | None = None
    gid: int | None = None
    nice: int = 0
    job: str | None = None
    job_id: int | None = None
    epoch: int | None = None
    server: str | None = None
    report_fd: int | None = None
    go_file: Path | None = None

    def to_argv(self) -> list[str]:
        """The options and ``-- CMD...``, as :meth:`parse` reads them back."""
        argv = ["--lease-file", str(self.lease_file), "--result", str(self.result)]
        for flag, value in (
            ("--state", self.state),
            ("--stop-file", self.stop_file),
            ("--grace", self.grace),
            ("--interval", None if self.interval == DEFAULT_INTERVAL_S else self.interval),
            ("--job", self.job),
            ("--epoch", self.epoch),
            ("--server", self.server),
            ("--cwd", self.cwd),
            ("--uid", self.uid),
            ("--gid", self.gid),
            ("--job-id", self.job_id),
            ("--nice", self.nice or None),
            ("--records", self.records),
            ("--term-only", self.term_only),
            ("--go-file", self.go_file),
            ("--report-fd", self.report_fd),
        ):
            if value is not None:
                argv += [flag, str(value)]
        return [*argv, "--", *self.command]

    @classmethod
    def parse(cls, argv: Sequence[str] | None = None) -> WatchdogArgs:
        """Read the command line (default: ``sys.argv``); a wrong one exits with the
        usage (status 2), before the watchdog does anything."""
        parser = _parser()
        args = parser.parse_args(argv)
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("no command given after --")
        if args.grace < 0 or args.interval <= 0:
            parser.error("--grace must be >= 0 and --interval > 0")
        if (args.uid is None) != (args.gid is None):
            parser.error("--uid and --gid go together")
        if args.uid == 0:
            parser.error("--uid 0: a driver never runs as root")
        return cls(**{**vars(args), "command": tuple(command)})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m server.watchdog",
        description="Run CMD as a fenced driver: kill its process group when the lease "
        "deadline in --lease-file (CLOCK_MONOTONIC seconds) passes.",
    )
    parser.add_argument("--lease-file", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--state", type=Path, default=None)
    parser.add_argument("--records", type=Path, default=None)
    parser.add_argument("--stop-file", type=Path, default=None)
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S)
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    parser.add_argument("--cwd", type=Path, default=None, help="working directory of CMD")
    parser.add_argument(
        "--term-only",
        default=None,
        metavar="ARG",
        help="on stop, SIGTERM only the group's non-leader processes with ARG in their argv "
        "(falls back to the whole group when none has)",
    )
    parser.add_argument(
        "--uid", type=int, default=None, help="run CMD as this user id (needs --gid)"
    )
    parser.add_argument("--gid", type=int, default=None, help="run CMD with this group id")
    parser.add_argument(
        "--nice",
        type=int,
        choices=range(0, 20),
        default=0,
        metavar="0-19",
        help="run CMD this many nice steps below the watchdog (it must outrun CMD to kill "
        "it on time)",
    )
    parser.add_argument("--job", default=None)
    parser.add_argument("--job-id", type=int, default=None)
    parser.add_argument("--epoch", type=int, default=None)
    parser.add_argument("--server", default=None)
    parser.add_argument(
        "--report-fd",
        type=int,
        default=None,
        metavar="FD",
        help="read a JSON FinishReport (server/watchdog_contract.py) from FD at start-up "
        "and record the driver's own exit in PostgreSQL with it",
    )
    parser.add_argument(
        "--go-file",
        type=Path,
        default=None,
        help="a warm driver: the run is the job's only once this file exists (its time "
        "starts the lifetime record; an end before it is recorded nowhere)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    return parser
