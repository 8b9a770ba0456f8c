"""CPU time the machine spends while a command runs, by kind of process.

Where does the test suite spend its CPU? This benchmark runs a command (the suite, the
campaign, any pytest selection), samples ``/proc`` twice a second while it runs, and
adds up the CPU seconds (user + system) of every process that was alive at some sample
(the command's and every other: run it on an otherwise quiet machine),
grouped by what it is: sparkring servers, CLI commands (by sub-command), watchdogs,
spark-submit drivers (local or on the standalone cluster; a light driver and one
with a SparkSession look alike), Spark executors, ZooKeeper, PostgreSQL, the pytest
processes, and the rest.

A process is counted from its first sample to its last one, so a process shorter than
the interval is missed and a longer one loses at most an interval of its end: the total
is a lower bound. The command's own process is read once more when it exits, before it
is reaped, so its own CPU is exact. Processes that were running before the command
started (the stack's services) count only the CPU they used while it ran.

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.cpu_by_process -- \
        .venv/bin/python -m pytest --ignore=tests/chaos -n 2 -q tests/integration/test_cli_user.py
    .venv/bin/python -m benchmarks.cpu_by_process --json -- .venv/bin/pytest -q tests/chaos
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

_TICKS = os.sysconf("SC_CLK_TCK")
_CLI_SUBCOMMAND = re.compile(r"-m server (?:--config \S+ )?(\w[\w-]*)(?: (\w[\w-]*))?")


@dataclass
class Seen:
    """One process, as the samples saw it."""

    command: str
    baseline: float  # its CPU seconds when the command started (0 if it started later)
    last_cpu: float

    @property
    def cpu(self) -> float:
        return self.last_cpu - self.baseline


@dataclass
class Sampler:
    """Samples every process's CPU seconds until stopped."""

    interval: float = 0.5
    seen: dict[tuple[int, int], Seen] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self, preexisting: bool = False) -> None:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
                rest = stat[stat.rindex(")") + 2 :].split()
                cpu = (int(rest[11]) + int(rest[12])) / _TICKS
                key = (int(name), int(rest[19]))  # pid and start time: pids are reused
                known = self.seen.get(key)
                if known is None:
                    with open(f"/proc/{name}/cmdline", "rb") as f:
                        command = f.read().replace(b"\0", b" ").decode(errors="replace")
                    if not command:  # a kernel thread, or a process already gone
                        continue
                    self.seen[key] = Seen(command, cpu if preexisting else 0.0, cpu)
                else:
                    known.last_cpu = cpu
            except (OSError, ValueError, IndexError):
                continue  # the process ended between listdir and the read

    def exited_child(self, pid: int, command: list[str]) -> None:
        """Read a child that exited but is not yet reaped (its cmdline is already empty)."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            return
        rest = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(rest[11]) + int(rest[12])) / _TICKS
        key = (pid, int(rest[19]))
        known = self.seen.get(key)
        if known is None:
            self.seen[key] = Seen(" ".join(command), 0.0, cpu)
        else:
            known.last_cpu = cpu

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()


def kind(command: str) -> str:
    """What a process is, from its command line."""
    argv = command.split()
    program = os.path.basename(argv[0]) if argv else ""
    # A watchdog's argv holds its driver's spark-submit command: it is named first.
    if "-m server.watchdog" in command:
        return "watchdog"
    if "server server run" in command:
        return "sparkring server"
    if "org.apache.spark.deploy.SparkSubmit" in command or "spark-submit" in command:
        where = "standalone" if "spark://" in command else "local"
        return f"spark-submit driver (JVM), {where}"
    if "CoarseGrainedExecutorBackend" in command:
        return "Spark executor"
    if "org.apache.spark.deploy.master.Master" in command:
        return "Spark master"
    if "org.apache.spark.deploy.worker.Worker" in command:
        return "Spark worker"
    if "zookeeper" in command and program == "java":
        return "ZooKeeper"
    if program == "postgres" or command.startswith("postgres:"):
        return "PostgreSQL"
    if "moto_server" in command or "minio" in program:
        return "S3 server"
    if "pyspark.daemon" in command or "pyspark/worker" in command:
        return "PySpark Python worker"
    # testing/cli_runner.py's warm parent and what it forks (the tests' CLI commands and
    # test clusters' servers): forked, they keep the parent's command line.
    if "-m testing.cli_runner" in command:
        return "tests' forked processes (CLI commands, servers)"
    match = _CLI_SUBCOMMAND.search(command)
    if match:
        return "CLI: " + " ".join(part for part in match.groups() if part)
    if "xdist" in command or "exec(eval(sys.stdin.readline()))" in command:
        return "pytest worker"
    # "pytest" in a path is not enough: the tests' files live under sparkring-pytest-N.
    script = os.path.basename(argv[1]) if len(argv) > 1 else ""
    if "-m pytest" in command or "pytest" in (program, script):
        return "pytest"
    if "schemathesis" in command:
        return "schemathesis"
    if "chrom" in program:
        return "Chromium"
    if program == "java":
        return "other JVM"
    if program.startswith("python"):
        return "other Python"
    return program or "?"


def group(seen: dict[tuple[int, int], Seen], cli_detail: bool) -> dict[str, tuple[int, float]]:
    """CPU seconds and process counts by kind (CLI commands together unless detailed)."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for process in seen.values():
        name = kind(process.command)
        if name.startswith("CLI: ") and not cli_detail:
            name = "CLI commands"
        totals[name][0] += 1
        totals[name][1] += process.cpu
    return {name: (int(n), cpu) for name, (n, cpu) in totals.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="CPU seconds of a command's processes (and the machine's), by kind.",
        usage="python -m benchmarks.cpu_by_process [--json] [--cli-detail] -- COMMAND ...",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--cli-detail", action="store_true", help="one row per CLI sub-command")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to measure")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: put it after --")
    sampler = Sampler(interval=args.interval)
    sampler.sample(preexisting=True)
    thread = threading.Thread(target=sampler.run, daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        child = subprocess.Popen(command)
    except OSError as exc:  # not found, not executable
        sampler.stop()
        parser.error(f"cannot run {command[0]!r}: {exc.strerror}")
    # Wait without reaping: its /proc entry keeps its CPU seconds until wait() below.
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    sampler.exited_child(child.pid, command)
    code = child.wait()
    wall = time.monotonic() - started
    sampler.stop()
    thread.join()
    sampler.sample()
    rows = group(sampler.seen, args.cli_detail)
    total = sum(cpu for _, cpu in rows.values()) or 1e-9  # a command that used none
    if args.json:
        print(
            json.dumps(
                {
                    "command": command,
                    "exit_code": code,
                    "wall_s": round(wall, 1),
                    "cpu_s": round(total, 1),
                    "cores": os.cpu_count(),
                    "kinds": {
                        k: {"processes": n, "cpu_s": round(c, 1)} for k, (n, c) in rows.items()
                    },
                }
            )
        )
    else:
        print(
            f"\n{' '.join(command)}: exit {code}, {wall:.0f} s wall, {total:.0f} CPU-s "
            f"({total / wall / (os.cpu_count() or 1):.0%} of {os.cpu_count()} cores)"
        )
        print(f"{'CPU-s':>8} {'share':>6} {'procs':>6}  kind")
        for name, (n, cpu) in sorted(rows.items(), key=lambda item: -item[1][1]):
            if cpu >= 0.05:
                print(f"{cpu:8.1f} {cpu / total:6.1%} {n:6d}  {name}")
    return code


if __name__ == "__main__":
    sys.exit(main())
