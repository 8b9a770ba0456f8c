"""A real sparkring cluster for end-to-end and chaos tests: ``sparkring server run``
subprocesses against the stack's ZooKeeper, PostgreSQL and S3, with real drivers.

Each cluster has its own database, ZooKeeper root, bucket and folders. Timeouts are
shortened (ZooKeeper session 4 s, lease 8 s) so failover fits in a test; the margins
keep the same proportions as production. Stopping is part of the harness: ``close()``
kills every server and every watchdog it left, so no driver outlives a test.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from registry import connection
from registry import servers as registry_servers
from scheduler import job_events, job_views
from server import driver
from sql import database
from testing import cli_runner, waiting

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "jobs"
# The light driver of the end-to-end and chaos tests (spark-submit, no SparkSession).
HEARTBEAT_JOB = REPO / "testing" / "jobs" / "heartbeat.py"

FAST_TIMEOUTS = {
    "SPARKRING_ZK_SESSION_TIMEOUT": "4",
    "SPARKRING_LEASE_TTL": "8",
    "SPARKRING_WATCHDOG_MARGIN": "3",
    "SPARKRING_LEASE_RENEW_INTERVAL": "1",
    "SPARKRING_POLL_INTERVAL": "1",
    "SPARKRING_STOP_GRACE": "10",
    "SPARKRING_RESTART_BACKOFF_BASE": "0.5",
    "SPARKRING_RESTART_BACKOFF_MAX": "2",
    "SPARKRING_S3_FETCH_RETRY": "3",
    # A joiner takes jobs that ran 10 s (not 300 s): the join tests stay short.
    "SPARKRING_MIN_RESIDENCY": "10",
    # A planned move waits at most 30 s (not 90 s) for its warm driver: under a chaos
    # run's load a warm start took over 90 s, and the recovery bound is 90 s. Past it
    # the claim still takes the warm driver (docs/drivers.md, "Warm hand-off").
    "SPARKRING_WARM_READY_WAIT": "30",
}


# "0" spawns every test server as a user starts one (``python -m server server run``)
# instead of forking it warm from the tests' forking parent (testing/cli_runner.py).
FORK_SERVERS_VARIABLE = "SPARKRING_TEST_FORK_SERVERS"


def forks_server(wrapper: Sequence[str], env: Mapping[str, str], setting: str | None) -> bool:
    """Whether a test server starts forked from the warm parent (``cli_runner.start``:
    about 0.9 CPU-second of imports skipped per server) rather than spawned. Not when a
    ``wrapper`` must exec it (``ip netns exec``), nor with an ``LD_PRELOAD`` (libfaketime
    is loaded by exec only), nor when ``SPARKRING_TEST_FORK_SERVERS=0``."""
    return setting != "0" and not wrapper and "LD_PRELOAD" not in env


def open_to_drivers(root: Path) -> None:
    """Let drivers under their own user (SPARKRING_DRIVER_USER, the stack's default) use
    a test's folder as jobs use a shared scratch folder: pass through its ancestors that
    this process owns (pytest makes them 0700) and write their outputs (heartbeats,
    sinks, markers) at its root, sticky like /tmp. The servers keep their own folders
    below it, which the drivers can read but not write."""
    temp = Path(tempfile.gettempdir())
    for folder in reversed(root.parents):
        st = folder.stat()
        mine = st.st_uid == os.geteuid() and folder.is_relative_to(temp) and folder != temp
        if mine and not st.st_mode & 0o001:
            folder.chmod(stat.S_IMODE(st.st_mode) | 0o711)
    root.chmod(0o1777)


class Cluster:
    def __init__(
        self,
        stack_env: dict[str, str],
        database_url: str,
        zk_root: str,
        bucket: str,
        root: Path,
        extra_env: dict[str, str] | None = None,
        *,
        fork_servers: bool = False,
    ) -> None:
        """``fork_servers``: start servers forked warm where they can be (the tests'
        clusters); the demo and the benchmarks start them as a user does."""
        self.root = root
        self.fork_servers = fork_servers
        self.records = root / "driver-records.jsonl"
        self.heartbeats = root / "heartbeats.jsonl"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")},
            **{k: v for k, v in stack_env.items() if k.startswith("SPARKRING_")},
            "SPARKRING_DATABASE_URL": database_url,
            "SPARKRING_ZK_ROOT": zk_root,
            "SPARKRING_S3_BUCKET": bucket,
            "SPARKRING_CHECKPOINT_ROOT": str(root / "checkpoints"),
            "SPARKRING_DRIVER_RECORDS": str(self.records),
            "SPARKRING_ADVERTISE_HOST": "127.0.0.1",
            **FAST_TIMEOUTS,
            **(extra_env or {}),
        }
        self.servers: dict[str, subprocess.Popen[bytes] | cli_runner.Detached] = {}
        self.engine = database.create_engine(database_url, pool_size=2)
        self._zk: KazooClient | None = None
        if self.env.get("SPARKRING_DRIVER_USER"):
            open_to_drivers(root)

    # ------------------------------------------------------------------ servers

    def server_dir(self, server_id: str) -> Path:
        return self.root / "servers" / server_id

    def start_server(
        self,
        server_id: str,
        capacity: int = 4,
        role: str = "both",
        *,
        wrapper: Sequence[str] = (),
        env: dict[str, str] | None = None,
        command: str = "run",
    ) -> None:
        """Start ``sparkring server run``; ``wrapper`` prefixes the argv (for example
        ``ip netns exec NS``), ``env`` overrides this server's environment and
        ``command="supervise"`` runs it under ``sparkring server supervise``. The
        process is forked warm (``fork_servers`` and ``forks_server``) or spawned; either way
        ``self.servers[server_id]`` is driven as a ``subprocess.Popen``."""
        folder = self.server_dir(server_id)
        folder.mkdir(parents=True, exist_ok=True)
        env = {**self.env, "SPARKRING_WORK_DIR": str(folder / "work"), **(env or {})}
        args = [
            "server",
            command,
            "--id",
            server_id,
            "--capacity",
            str(capacity),
            "--role",
            role,
        ]
        setting = os.environ.get(FORK_SERVERS_VARIABLE)
        if self.fork_servers and forks_server(wrapper, env, setting):
            self.servers[server_id] = cli_runner.start(args, env=env, log=folder / "server.log")
            return
        with open(folder / "server.log", "ab") as log:
            self.servers[server_id] = subprocess.Popen(
                [*wrapper, sys.executable, "-m", "server", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def pid(self, server_id: str) -> int:
        return self.servers[server_id].pid

    def signal(self, server_id: str, sig: signal.Signals) -> None:
        self.servers[server_id].send_signal(sig)

    def kill(self, server_id: str) -> None:
        proc = self.servers.pop(server_id)
        proc.kill()
        proc.wait(timeout=10)

    def terminate(self, server_id: str, timeout: float = 60) -> int:
        """SIGTERM (graceful hand-off) and wait; the exit code."""
        proc = self.servers.pop(server_id)
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout)

    def log(self, server_id: str) -> str:
        path = self.server_dir(server_id) / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        for proc in self.servers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        self.servers.clear()
        # Watchdogs live in their own sessions: kill what is left, by their run folders.
        for state in self.root.glob("servers/*/work/jobs/*/*"):
            left = driver.adopt(state)
            if left is not None:
                left.kill()
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()
            self._zk = None
        self.engine.dispose()

    # ------------------------------------------------------------------ CLI + jobs

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``sparkring ARGS`` in a process of its own (forked warm: testing/cli_runner.py)."""
        result = cli_runner.run(
            args, env={**self.env, "SPARKRING_WORK_DIR": str(self.root / "cli")}, timeout=120
        )
        if check and result.returncode != 0:
            raise AssertionError(f"sparkring {' '.join(args)} failed: {result.stderr}")
        return result

    def job(self, name: str) -> dict[str, Any]:
        with self.engine.connect() as conn:
            return job_views.show(conn, name).as_json()

    def events(self, name: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return job_events.events(conn, name, limit=1000)

    def wait_job(
        self, name: str, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str
    ) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def check() -> bool:
            seen.update(self.job(name))
            return predicate(seen)

        try:
            waiting.wait_until(check, timeout, interval=0.2)
        except AssertionError:
            raise AssertionError(
                f"{what} not reached in {timeout:g} s; job: {_brief(seen)}"
            ) from None
        return dict(seen)

    def members(self) -> set[str]:
        """The server ids registered in ZooKeeper now (the nodes ``server list`` reads),
        through one client of the harness's own: a ``server list`` per look (every 0.3 s
        while servers start) forked a CLI process with a ZooKeeper session of its own."""
        if self._zk is None:
            # A server's client, which reconnects for ever (kazoo's default gives up).
            self._zk = connection.make_client(self.env["SPARKRING_ZK_HOSTS"], session_timeout=10)
            self._zk.start(timeout=30)
        try:
            return set(registry_servers.read_all(self._zk, self.env["SPARKRING_ZK_ROOT"]))
        except KazooException:
            return set()  # ZooKeeper away: the next look sees the members

    def wait_members(self, count: int, timeout: float = 30) -> None:
        waiting.wait_until(
            lambda: len(self.members()) == count,
            timeout,
            interval=0.3,
            message=f"{count} live servers",
        )

    def sql(self, statement: str, **params: Any) -> list[sa.Row]:
        with self.engine.begin() as conn:
            result = conn.execute(sa.text(statement), params)
            return result.all() if result.returns_rows else []

    # ------------------------------------------------------------------ evidence

    def driver_records(self) -> list[dict[str, Any]]:
        if not self.records.exists():
            return []
        return [json.loads(line) for line in self.records.read_text().splitlines() if line]

    def heartbeat_records(self) -> list[dict[str, Any]]:
        if not self.heartbeats.exists():
            return []
        out = []
        for line in self.heartbeats.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by SIGKILL mid-write
        return out


def _brief(job: dict[str, Any]) -> str:
    keys = ("state", "desired", "owner", "target", "epoch", "attempt", "restarts", "last_error")
    return ", ".join(f"{k}={job.get(k)}" for k in keys)


def overlaps(records: list[dict[str, Any]], key: str = "job") -> list[tuple[dict, dict]]:
    """Pairs of driver lifetimes of one job that overlap in time (must be empty: S1).

    ``records`` are watchdog lifetime records: one 'started' and one 'ended' per driver
    (job, epoch, server, t). A driver with no 'ended' record lives until now.
    """
    spans: dict[tuple[str, int, str], list[float]] = {}
    for r in records:
        span = spans.setdefault((r[key], r["epoch"], r["server"]), [float("inf"), time.time()])
        if r["event"] == "started":
            span[0] = r["t"]
        elif r["event"] == "ended":
            span[1] = r["t"]
    bad = []
    items = sorted(spans.items(), key=lambda kv: kv[1][0])
    for i, (ka, (sa_, ea)) in enumerate(items):
        for kb, (sb, eb) in items[i + 1 :]:
            if ka[0] == kb[0] and sb < ea and sa_ < eb:
                bad.append(({"id": ka, "span": (sa_, ea)}, {"id": kb, "span": (sb, eb)}))
    return bad


def sigstop(proc_pid: int) -> None:
    os.kill(proc_pid, signal.SIGSTOP)


def sigcont(proc_pid: int) -> None:
    os.kill(proc_pid, signal.SIGCONT)
