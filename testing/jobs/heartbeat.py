"""A light driver for end-to-end tests: no SparkSession, but started by spark-submit.

Appends {"job","epoch","server","revision","pid","t","mono"} to HEARTBEATS every 0.2 s until
SIGTERM (exit 0) or, with --run-for, until that many seconds passed (exit --exit-code;
with --crash-while PATH only while PATH exists, else it runs on).
Tests use the heartbeats to prove that two drivers of one job never ran at the same time.
With --query-started it logs the line Spark's StreamExecution logs as a streaming query
starts, and never a progress line: to the health monitor (server/spark_status.py) a
query that completes no batch, so a job with a short stall timeout is flagged stalled
(and restarted, with restart-on-stall) with no Spark at all.
With --hostile VICTIM it is the hostile job of the chaos campaign (issue 45): in its
checkpoint it replaces the owner marker of older releases with a FIFO and plants, under
the temporary name those releases wrote it through, a link to VICTIM (a file of the
server's) for each of its ancestors' pids; and it prints a fake Spark UI line naming
--fake-ui-port. None of it may make a server write VICTIM, hang, or probe that port.
With --secret-var NAME each beat also carries ``secret``: the SHA-256 (16 hex digits) of
the variable NAME as the driver got it (a job secret, docs/secrets.md), never the value.
With --import NAME each beat carries ``module``: the ``__version__`` of the module NAME
as the driver imports it (a job's dependency, docs/dependencies.md), null when it cannot.
With --say TEMPLATE it prints TEMPLATE once to stdout as it starts, ``{job}``, ``{epoch}``,
``{server}`` and ``{revision}`` replaced by its SPARKRING_* values: a line of its driver
log that only this driver wrote (``job logs --epoch``).
``t`` is the wall clock; ``mono`` is CLOCK_BOOTTIME, the clock of the watchdogs' lease
deadlines and of their lifetime records (``server.watchdog.lease_clock``), so the checker
compares beats with each other and with the records on a clock that never steps. This
file runs under spark-submit, without sparkring on its path: it reads the clock itself.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import signal
import sys
import time


def ancestors() -> list[int]:
    """This process's ancestors' pids (the JVM, the watchdog, perhaps the server)."""
    found, pid = [], os.getppid()
    while pid > 1 and len(found) < 8:
        found.append(pid)
        try:
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def plant(checkpoint: str | None, victim: str) -> None:
    if not checkpoint or not os.path.isdir(checkpoint):
        return
    marker = os.path.join(checkpoint, ".sparkring-job-id")
    try:
        if os.path.lexists(marker):
            os.unlink(marker)
        os.mkfifo(marker)
    except OSError:
        pass
    for pid in ancestors():
        link = f"{marker}.{pid}.tmp"
        try:
            if not os.path.lexists(link):
                os.symlink(victim, link)
        except OSError:
            pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("heartbeats")
    parser.add_argument("--run-for", type=float, default=None)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--query-started", action="store_true")
    # Exit --exit-code after --run-for only while this file exists (a job that crashes
    # until a test lets it run: the restart window's case in the chaos campaign).
    parser.add_argument("--crash-while", default=None)
    parser.add_argument("--hostile", default=None)
    parser.add_argument("--fake-ui-port", type=int, default=None)
    parser.add_argument("--secret-var", default=None)
    parser.add_argument("--import", dest="module", default=None)
    parser.add_argument("--say", default=None)
    args = parser.parse_args()
    if args.hostile:
        plant(os.environ.get("SPARKRING_CHECKPOINT_DIR"), args.hostile)
    if args.fake_ui_port is not None:
        line = f"INFO Utils: Successfully started service 'SparkUI' on port {args.fake_ui_port}."
        print(line, file=sys.stderr, flush=True)
    if args.query_started:
        line = "INFO MicroBatchExecution: Starting new streaming query."
        print(line, file=sys.stderr, flush=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    identity = {
        k: os.environ.get(f"SPARKRING_{k.upper()}") for k in ("job", "epoch", "server", "revision")
    }
    if args.say is not None:
        print(args.say.format(**identity), flush=True)
    if args.secret_var:
        value = os.environ.get(args.secret_var, "").encode()
        identity["secret"] = hashlib.sha256(value).hexdigest()[:16]
    if args.module:
        try:
            identity["module"] = importlib.import_module(args.module).__version__
        except ImportError:
            identity["module"] = None
    started = time.monotonic()
    while not stopping:
        now = {"t": time.time(), "mono": time.clock_gettime(time.CLOCK_BOOTTIME)}
        line = json.dumps({**identity, "pid": os.getpid(), **now}) + "\n"
        fd = os.open(args.heartbeats, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        if args.run_for is not None and time.monotonic() - started >= args.run_for:
            if args.crash_while is None or os.path.exists(args.crash_while):
                return args.exit_code
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
