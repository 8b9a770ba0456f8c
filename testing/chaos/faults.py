"""Fault injectors of the chaos campaign: the stack's ZooKeeper and PostgreSQL stopped and
started (``scripts/stack.py``), a server cut off from ZooKeeper alone or from PostgreSQL
alone (a network namespace, a veth pair and iptables), a driver's watchdog SIGKILLed,
a server's wall clock stepped (libfaketime), one PostgreSQL backend SIGKILLed with WAL
to replay (a crash recovery), a throwaway S3 server a test may kill, Spark standalone
masters of a trial's own that a test may SIGKILL, and a PostgreSQL primary with a
synchronous standby of a trial's own that a test may fail over.

Stopping ZooKeeper or PostgreSQL affects everything that uses the stack at that moment:
the chaos suite runs alone, after every other test (``scripts/test.sh``). Every
injector restores what it broke in ``restore()`` / ``close()``, which the fixtures call
in their teardown whatever the test's outcome.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from server import rundir, spark_master, watchdog
from sql import database, migrate
from testing import services, waiting

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "scripts" / "stack.py"


class FaultError(Exception):
    """A fault could not be injected or undone; the message says which and why."""


def _run(argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 120) -> str:
    result = subprocess.run(
        list(argv), env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise FaultError(f"{' '.join(argv)} failed: {result.stderr.strip() or result.stdout}")
    return result.stdout


# ---------------------------------------------------------------- the stack


class Stack:
    """``scripts/stack.py zk|pg`` against the stack the tests use (its folder and ports
    are taken from the stack's environment, so a private stack works the same)."""

    def __init__(self, stack_env: dict[str, str]) -> None:
        zk_first = stack_env["SPARKRING_ZK_HOSTS"].split(",")[0]
        # The first host of the URL: the primary as the stack started it (the chaos stacks
        # run one PostgreSQL; a case that promotes a standby runs a pair of its own).
        (_, pg_port), *_ = database.hosts(database.parse_url(stack_env["SPARKRING_DATABASE_URL"]))
        self.zk_ports = [
            int(h.rsplit(":", 1)[1]) for h in stack_env["SPARKRING_ZK_HOSTS"].split(",")
        ]
        self.pg_port = pg_port
        self.s3_port = int(stack_env["SPARKRING_S3_ENDPOINT"].rsplit(":", 1)[1])
        self.env = {
            **os.environ,
            "SPARKRING_STACK_DIR": stack_env.get(
                "SPARKRING_STACK_DIR", str(services.REPO / ".stack")
            ),
            "SPARKRING_STACK_ZK_PORT": zk_first.rsplit(":", 1)[1],
            "SPARKRING_STACK_PG_PORT": str(self.pg_port),
        }
        self._check_controls_the_tests_stack(stack_env)

    def _check_controls_the_tests_stack(self, stack_env: dict[str, str]) -> None:
        """Refuse to inject anything unless the stack folder's own record (``env.json``,
        written by ``stack.py up``) names the ZooKeeper and PostgreSQL ports the tests
        use: a stack folder and ports that disagree would stop services of another
        stack (a shared one) while the cluster under test never sees the fault."""
        record = Path(self.env["SPARKRING_STACK_DIR"]) / "env.json"
        if not record.exists():
            raise FaultError(f"{record} is missing: start the stack with scripts/stack.py up")
        written = json.loads(record.read_text())
        ours = (stack_env["SPARKRING_ZK_HOSTS"], self.pg_port)
        theirs = (
            written.get("SPARKRING_ZK_HOSTS"),
            database.hosts(
                database.parse_url(written.get("SPARKRING_DATABASE_URL", "postgresql://x/y"))
            )[0][1],
        )
        if ours != theirs:
            raise FaultError(
                f"the stack in {record.parent} serves ZooKeeper {theirs[0]} and PostgreSQL "
                f"port {theirs[1]}, the tests use {ours[0]} and {ours[1]}: export the same "
                "SPARKRING_STACK_DIR and SPARKRING_STACK_*_PORT for both"
            )

    def _stack(self, *args: str) -> str:
        return _run([sys.executable, str(STACK), *args], env=self.env)

    def zk_kill_leader(self) -> int:
        """SIGKILL the ensemble's leader; its node number."""
        out = self._stack("zk", "kill", "-1").split()
        if not out:
            raise FaultError("no ZooKeeper leader to kill")
        return int(out[0])

    def zk_stop(self) -> None:
        self._stack("zk", "stop")

    def zk_start(self, node: int = 0) -> None:
        """Start ``node`` (0: every stopped node) and wait until the ensemble serves."""
        self._stack("zk", "start", str(node))

    def pg_stop(self) -> None:
        self._stack("pg", "stop")

    def pg_kill(self) -> None:
        """``pg_ctl -m immediate``: a crash (no shutdown checkpoint; the next start
        replays the WAL). Only commits whose WAL reached the OS survive it: the stack
        runs with ``synchronous_commit=on`` for that (``scripts/stack.py``)."""
        self._stack("pg", "kill")

    def pg_start(self) -> None:
        if not services.reachable(f"127.0.0.1:{self.pg_port}"):
            self._stack("pg", "start")

    def restore(self) -> None:
        """Every ZooKeeper node and PostgreSQL running again (idempotent)."""
        self.zk_start()
        self.pg_start()


class PgPair:
    """A PostgreSQL primary with a synchronous standby of one trial's (or benchmark's)
    own: ``scripts/stack.py up --only postgresql --pg-standby`` in ``folder`` on free
    ports, never the stack's, so failing it over disturbs nobody. :attr:`url` is the
    multi-host URL (``target_session_attrs=read-write``) of its database, migrated to
    head: whichever node takes writes, a client of that URL lands there.

    :meth:`kill_primary` crashes the primary (``pg kill``: no node takes writes),
    :meth:`promote` fails over (``pg promote``: the primary killed if it is not yet, the
    standby promoted), :meth:`restore` makes the old primary the new standby (``pg
    start``: copied anew from the new primary) and waits for synchronous replication.
    :meth:`close` brings both nodes down and removes their folders."""

    # stack.py's PostgreSQL programs (a standby is a pg_basebackup of the primary).
    BIN = Path("/usr/lib/postgresql/15/bin")

    @classmethod
    def unavailable(cls) -> str | None:
        """Why no pair can be made here, or None."""
        if not (cls.BIN / "pg_basebackup").exists():
            return f"PostgreSQL 15 is not installed ({cls.BIN})"
        return None

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports = (services.free_port(), services.free_port())
        # Only this pair's folder and ports: a shell's SPARKRING_STACK_* set for another
        # stack must not reach its stack.py.
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_STACK_")},
            "SPARKRING_STACK_DIR": str(folder),
            "SPARKRING_STACK_PG_PORT": str(self.ports[0]),
            "SPARKRING_STACK_PG_STANDBY_PORT": str(self.ports[1]),
        }
        self.url = ""

    def _stack(self, *args: str) -> str:
        return _run([sys.executable, str(STACK), *args], env=self.env)

    def start(self) -> str:
        """Both nodes up, the database migrated; its URL."""
        for line in self._stack("up", "--only", "postgresql", "--pg-standby").splitlines():
            if line.startswith("export SPARKRING_DATABASE_URL="):
                self.url = line.split("=", 1)[1]
        if not self.url:
            raise FaultError(f"stack.py up in {self.folder} printed no SPARKRING_DATABASE_URL")
        engine = sa.create_engine(database.parse_url(self.url), poolclass=NullPool)
        try:
            migrate.upgrade(engine)
        finally:
            engine.dispose()
        return self.url

    def kill_primary(self) -> None:
        self._stack("pg", "kill")

    def stop_primary(self) -> None:
        """``pg stop``: the primary shut down cleanly (its standby keeps waiting for it);
        :meth:`restore` starts it again."""
        self._stack("pg", "stop")

    def promote(self) -> None:
        self._stack("pg", "promote")

    def restore(self) -> None:
        """Whichever node is down started again, the standby copied anew if a promotion
        left it behind as the old primary, synchronous replication waited for
        (idempotent: a whole pair is left as it is)."""
        self._stack("pg", "start")

    def roles(self) -> dict[str, str]:
        """``host:port`` -> ``primary``, ``standby`` or ``down`` (``stack.py status``)."""
        return json.loads(self._stack("status", "--json")).get("postgresql_nodes", {})

    def standby_up_s(self) -> float:
        """How long the standby's postmaster has run, seconds (it answers reads)."""
        (port,) = [int(a.rsplit(":", 1)[1]) for a, r in self.roles().items() if r == "standby"]
        url = sa.engine.URL.create(
            "postgresql+psycopg", username="postgres", host="127.0.0.1", port=port,
            database=database.parse_url(self.url).database,
        )  # fmt: skip
        engine = sa.create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                return conn.execute(
                    sa.text(
                        "SELECT CAST(EXTRACT(EPOCH FROM now() - pg_postmaster_start_time())"
                        " AS double precision)"
                    )
                ).scalar_one()
        finally:
            engine.dispose()

    def close(self) -> None:
        # Each node's folder is a link to one under /tmp (stack.py: initdb refuses root).
        links = [self.folder / name for name in ("pg", "pg-standby")]
        data = [link.resolve() for link in links if link.is_symlink()]
        with contextlib.suppress(FaultError, subprocess.TimeoutExpired):
            self._stack("down")
        for target in data:
            if target.name.startswith("sparkring-pg") and target.is_relative_to("/tmp"):
                shutil.rmtree(target, ignore_errors=True)


# ---------------------------------------------------------------- partition


# Where every partition's addresses are (``Partition._pick``: 10.231.<n>.1 and .2).
PARTITION_NETWORK = "10.231.0.0/16"


class Partition:
    """A network namespace joined to the root namespace by a veth pair.

    The stack listens on 127.0.0.1 of the root namespace only, so the namespace reaches
    it through the host end of the veth: each forwarded port is DNAT-ed to 127.0.0.1
    (``route_localnet`` allows that on the veth) and the source is rewritten to
    127.0.0.1 (PostgreSQL's pg_hba trusts loopback only). ``cut(ports)`` drops what the
    namespace sends to those ports (a silent partition: no RST, the ZooKeeper session
    expires; ``cut([pg_port])`` cuts PostgreSQL alone); ``heal()`` removes the drop.
    Every rule carries a comment naming this partition, so ``close()`` removes exactly
    ours.
    """

    def __init__(self, ports: Sequence[int]) -> None:
        self.ports = list(ports)
        self._created = False
        self._pick(random.randint(1, 250))

    def _pick(self, index: int) -> None:
        """Name, interfaces, addresses and rule tag of partition number ``index``."""
        self.index = index
        self.name = f"srchaos{self.index}"
        self.host_if = f"{self.name}h"
        self.ns_if = f"{self.name}n"
        self.host = f"10.231.{self.index}.1"
        self.peer = f"10.231.{self.index}.2"
        self.tag = f"sparkring-chaos-{self.name}"

    def _add_namespace(self) -> None:
        """``ip netns add``, under a number no other partition holds: the campaign's
        workers (one per stack) may partition at the same moment, and the namespace's
        name is the claim on its number (its addresses and rule tag)."""
        taken = set(_run(["ip", "netns", "list"]).split())
        free = [i for i in range(1, 251) if f"srchaos{i}" not in taken]
        for index in [self.index, *random.sample(free, min(len(free), 20))]:
            self._pick(index)
            try:
                _run(["ip", "netns", "add", self.name])
                return
            except FaultError:
                if self.name not in _run(["ip", "netns", "list"]).split():
                    raise
        raise FaultError("no free partition number (srchaos1-250 all exist)")

    @property
    def wrapper(self) -> list[str]:
        """argv prefix that runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def address(self, port: int) -> str:
        return f"{self.host}:{port}"

    def create(self) -> None:
        self._add_namespace()
        self._created = True
        ns = self.wrapper
        for argv in (
            ["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if],
            ["ip", "link", "set", self.ns_if, "netns", self.name],
            ["ip", "addr", "add", f"{self.host}/30", "dev", self.host_if],
            ["ip", "link", "set", self.host_if, "up"],
            [*ns, "ip", "addr", "add", f"{self.peer}/30", "dev", self.ns_if],
            [*ns, "ip", "link", "set", self.ns_if, "up"],
            [*ns, "ip", "link", "set", "lo", "up"],
            # Every partition's host end, not only its own: what the harness serves on
            # one (the random mode's webhook receiver and Spark masters) reaches a
            # server in another.
            [*ns, "ip", "route", "add", PARTITION_NETWORK, "via", self.host],
            ["sysctl", "-qw", f"net.ipv4.conf.{self.host_if}.route_localnet=1"],
        ):
            _run(argv)
        comment = ["-m", "comment", "--comment", self.tag]
        for port in self.ports:
            _run(
                ["iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-i", self.host_if, "-p", "tcp",
                 "-d", self.host, "--dport", str(port), *comment,
                 "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}"]
            )  # fmt: skip
        _run(
            ["iptables", "-w", "-t", "nat", "-A", "INPUT", "-s", self.peer, "-d", "127.0.0.1",
             *comment, "-j", "SNAT", "--to-source", "127.0.0.1"]
        )  # fmt: skip

    def cut(self, ports: Sequence[int]) -> None:
        dports = ",".join(str(p) for p in ports)
        _run(
            ["iptables", "-w", "-I", "INPUT", "-i", self.host_if, "-p", "tcp", "-m", "multiport",
             "--dports", dports, "-m", "comment", "--comment", self.tag, "-j", "DROP"]
        )  # fmt: skip

    def lossy(self, ports: Sequence[int], probability: float) -> None:
        """Drop each packet the namespace sends to ``ports`` with ``probability``
        (``-m statistic --mode random``): retransmissions, stalls and timeouts rather
        than a clean cut. ``heal()`` removes it like a cut."""
        dports = ",".join(str(p) for p in ports)
        _run(
            ["iptables", "-w", "-I", "INPUT", "-i", self.host_if, "-p", "tcp", "-m", "multiport",
             "--dports", dports, "-m", "statistic", "--mode", "random", "--probability",
             f"{probability:.3f}", "-m", "comment", "--comment", self.tag, "-j", "DROP"]
        )  # fmt: skip

    def heal(self) -> None:
        self._delete_rules("filter")

    def _delete_rules(self, table: str) -> None:
        listing = _run(["iptables", "-w", "-t", table, "-S"])
        for line in listing.splitlines():
            if self.tag in line and line.startswith("-A "):
                _run(["iptables", "-w", "-t", table, "-D", *_split_rule(line[3:])])

    def close(self) -> None:
        if not self._created:
            return
        for table in ("filter", "nat"):
            try:
                self._delete_rules(table)
            except FaultError:
                pass
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
        self._created = False


def _split_rule(rule: str) -> list[str]:
    """``iptables -S`` output back to argv (comments are quoted when they have spaces;
    ours have none)."""
    return [part.strip('"') for part in rule.split()]


def namespaces_unavailable() -> str | None:
    """Why a network namespace partition cannot be built here, or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces and iptables need root (CAP_NET_ADMIN)"
    probe = f"srchaosprobe{os.getpid()}"
    for argv in (["ip", "netns", "add", probe], ["iptables", "-w", "-S"]):
        try:
            _run(argv, timeout=10)
        except (FaultError, FileNotFoundError) as exc:
            return f"cannot partition with namespaces here: {exc}"
        finally:
            if argv[0] == "ip":
                subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


# ---------------------------------------------------------------- watchdogs


@dataclasses.dataclass(frozen=True)
class Watchdog:
    """A live watchdog of one run: (job, epoch, server) and its process."""

    job: str
    epoch: int
    server: str
    pid: int
    run_dir: Path


def live_watchdogs(root: Path) -> list[Watchdog]:
    """Every watchdog alive under a cluster's folder (``servers/*/work/jobs/<job id>/<epoch>``,
    and the older layout ``runs/<job>/<epoch>``; fresh work dirs of same-id restarts
    included), found through its run dir's ``watchdog.json``: its pid must still be the
    process that started when the file says (not a reused pid, not a zombie its server
    has yet to reap)."""
    found = []
    state_files = [
        *root.glob("servers/*/work/jobs/*/*/watchdog.json"),
        *root.glob("servers/*/work/runs/*/*/watchdog.json"),
    ]
    for state_file in sorted(state_files):
        state = rundir.read_json(state_file) or {}
        pid, ticks = state.get("watchdog_pid"), state.get("watchdog_start_ticks")
        if not isinstance(pid, int) or not isinstance(ticks, int):
            continue
        if watchdog.process_start_ticks(pid) != ticks:
            continue
        run_dir = state_file.parent
        found.append(
            Watchdog(
                job=str(state.get("job")),
                epoch=int(state.get("epoch") or run_dir.name),
                server=str(state.get("server")),
                pid=pid,
                run_dir=run_dir,
            )
        )
    return found


def sweepable(watchdogs: list[Watchdog], work_dirs: dict[str, Path]) -> list[Watchdog]:
    """The watchdogs whose run lies in its server's current work dir: a server started
    there again sweeps what the watchdog's death leaves (``driver.sweep``). A run left in
    a work dir that no incarnation of its server uses any more (same_id_fresh_dir: another
    host took the name) is fenced by its watchdog alone; killing that one too is two faults
    on one run at once, beyond the fault model (CHAOS_SEED=84460986: st0-3's epoch 9 had
    no server to sweep it for 14 minutes, and the checker rightly could not tell that its
    driver had died with the watchdog)."""
    return [
        w
        for w in watchdogs
        if w.server in work_dirs and w.run_dir.is_relative_to(work_dirs[w.server])
    ]


def kill_watchdog(target: Watchdog) -> None:
    """SIGKILL one watchdog (the OOM killer's or an operator's ``kill -9``): it cannot
    kill its driver or write its ``ended`` record; its server finds it dead. The
    driver's processes must then be swept by the server (hole H1); the caller sweeps
    them with ``server.driver.sweep(run_dir)`` at the end, in case they were not."""
    os.kill(target.pid, signal.SIGKILL)


# ---------------------------------------------------------------- processes


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []  # exited, or not ours to read


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def work_dir_processes(work_dir: Path) -> set[int]:
    """Every live process of a server's work dir but the server itself: its watchdogs
    (``python -m server.watchdog`` with their state files under the work dir, or the
    server's ``SPARKRING_WORK_DIR`` in their environment) and every driver process
    (``SPARKRING_RUN_DIR`` under the work dir: ``server.watchdog.RUN_MARK_VARIABLE``,
    which spark-submit's JVM and the Python driver inherit)."""
    work = str(work_dir)
    inside = work + "/"
    work_mark = f"SPARKRING_WORK_DIR={work}".encode()
    run_mark = f"{watchdog.RUN_MARK_VARIABLE}={inside}".encode()
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        environ = _environ(pid)
        if work_mark in environ or any(v.startswith(run_mark) for v in environ):
            found.add(pid)
            continue
        argv = _argv(pid)
        if "server.watchdog" in argv and any(a.startswith(inside) for a in argv):
            found.add(pid)
    return found


def freeze(server_pid: int, work_dir: Path) -> list[int]:
    """SIGSTOP a server together with its watchdogs and drivers (what ``podman pause``
    or a cgroup freeze does to a host): the server first, so it starts nothing new, then
    every process of its work dir, looked for again until a look finds no new one (a
    process forked between the scan and its signal is caught by the next look). The
    pids stopped, for :func:`thaw`."""
    stopped: list[int] = []
    candidates = {server_pid}
    for _ in range(10):
        new = sorted(candidates - set(stopped))
        if not new and stopped:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            except ProcessLookupError:
                pass
        candidates = work_dir_processes(work_dir)
    return stopped


def thaw(pids: Sequence[int]) -> None:
    """SIGCONT every process :func:`freeze` stopped (all at once, as a cgroup thaw)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def postgres_client_ports(pid: int, pg_port: int) -> set[int]:
    """The local ports of ``pid``'s TCP connections to ``pg_port`` (its own sockets, in
    its own network namespace's table: ``/proc/<pid>/net/tcp``). A namespaced server's
    connections reach PostgreSQL SNAT-ed to 127.0.0.1, normally with the same port."""
    inodes = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(fd.path)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == pg_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def terminate_backends(engine: sa.Engine, client_ports: Sequence[int]) -> int:
    """``pg_terminate_backend`` of every backend of ``engine``'s database whose client
    port is one of ``client_ports`` (never the harness's own connection): what a
    connection reset or an idle-session kill by an operator does. How many went."""
    with engine.begin() as conn:
        return len(
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND client_port = ANY(:ports)"
                ),
                {"ports": list(client_ports)},
            ).all()
        )


# ---------------------------------------------------------------- PostgreSQL crash recovery


# Held while a crash recovery fault builds its WAL (each takes a reload, no restart): no
# checkpoint may come between the WAL built and the crash, or there is nothing to replay.
NO_CHECKPOINTS = {"checkpoint_timeout": "1h", "max_wal_size": "64GB"}
# The scratch table whose rows are updated until the WAL is built: 2 million narrow rows
# (~70 MB a version, more than the stack's 128 MB of shared buffers after two updates),
# each full update ~250 MB of WAL.
BALLAST = "chaos_wal_ballast"
BALLAST_ROWS = 2_000_000
# PostgreSQL's log lines of a crash recovery (PostgreSQL 15).
REINITIALIZING = "all server processes terminated; reinitializing"
REDO_STARTS = "redo starts at"
READY = "database system is ready to accept connections"
_REDO_ELAPSED = re.compile(r"redo done at .* elapsed: ([0-9.]+) s")


class CrashRecovery:
    """kill -9 of one PostgreSQL backend, not the postmaster (the OOM killer's pick, an
    operator's ``kill -9``), once there is WAL to replay. The postmaster sees a child die
    uncleanly, terminates every other backend, reinitializes shared memory ("all server
    processes terminated; reinitializing") and replays the WAL since the last checkpoint
    before it accepts connections again: an outage of every connection for as long as
    the replay, while ``pg_postmaster_start_time()`` stays where it was (unlike
    :meth:`Stack.pg_kill`, whose restart moves it).

    :meth:`build_wal` holds checkpoints off (``ALTER SYSTEM`` and a reload, so a stack
    started by any ``stack.py`` will do) and updates a scratch table in the trial's
    database until the WAL since the last checkpoint's redo point reaches a size. The
    replay runs at about 200 MB/s on the 2-core development machine, quiet (2.7 GB:
    13.7 s), and its generation takes about 1.4 times as long. :meth:`close` sets
    checkpoints back and drops the table."""

    def __init__(self, stack: Stack, database_url: str) -> None:
        self.stack = stack
        self.engine = sa.create_engine(
            database_url, poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 2}
        )
        self.log = Path(stack.env["SPARKRING_STACK_DIR"]) / "pg" / "server.log"
        self._builder: sa.Connection | None = None
        self._log_offset = 0
        self._killed_at: float | None = None
        self._postmaster_start: object = None

    def _wal_to_replay(self, conn: sa.Connection) -> int:
        return int(
            conn.execute(
                sa.text(
                    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), redo_lsn)"
                    " FROM pg_control_checkpoint()"
                )
            ).scalar_one()
        )

    def build_wal(self, target: int, timeout: float) -> int:
        """Write WAL until ``target`` bytes wait for replay (since the last checkpoint's
        redo point) or ``timeout`` s passed; the bytes waiting then."""
        deadline = time.monotonic() + timeout
        conn = self._builder = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        for name, value in NO_CHECKPOINTS.items():
            conn.execute(sa.text(f"ALTER SYSTEM SET {name} = '{value}'"))
        conn.execute(sa.text("SELECT pg_reload_conf()"))
        conn.execute(sa.text(f"CREATE TABLE IF NOT EXISTS {BALLAST} (id int, n int NOT NULL)"))
        if conn.execute(sa.text(f"SELECT NOT EXISTS (SELECT FROM {BALLAST})")).scalar_one():
            conn.execute(
                sa.text(f"INSERT INTO {BALLAST} SELECT g, 0 FROM generate_series(1, :rows) g"),
                {"rows": BALLAST_ROWS},
            )
        while (built := self._wal_to_replay(conn)) < target and time.monotonic() < deadline:
            conn.execute(sa.text(f"UPDATE {BALLAST} SET n = n + 1"))
        return built

    def server_backends(self, server_pids: Sequence[int]) -> list[int]:
        """The backends (their pids) serving ``server_pids``' connections to this
        database, found by client port (:func:`postgres_client_ports`), in pid order."""
        ports = sorted(
            {port for pid in server_pids for port in postgres_client_ports(pid, self.stack.pg_port)}
        )
        if not ports:
            return []
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND client_port = ANY(:ports) ORDER BY pid"
                ),
                {"ports": ports},
            )
            return [int(r.pid) for r in rows]

    def own_backend(self) -> int:
        """The backend of :meth:`build_wal`'s connection (one to kill when no server
        has a connection open)."""
        assert self._builder is not None, "build_wal() first"
        return int(self._builder.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())

    def kill(self, backend: int) -> None:
        """SIGKILL of ``backend``, a PostgreSQL backend's pid (never the postmaster's)."""
        with self.engine.connect() as conn:
            kind = conn.execute(
                sa.text("SELECT backend_type FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": backend},
            ).scalar()
            self._postmaster_start = conn.execute(
                sa.text("SELECT pg_postmaster_start_time()")
            ).scalar_one()
        if kind != "client backend":
            raise FaultError(f"{backend} is no client backend of PostgreSQL ({kind})")
        self._log_offset = self.log.stat().st_size if self.log.exists() else 0
        self._killed_at = time.monotonic()
        try:
            os.kill(backend, signal.SIGKILL)
        except ProcessLookupError as exc:
            raise FaultError(f"backend {backend} is gone: {exc}") from exc

    def logged(self, line: str) -> bool:
        """Whether PostgreSQL logged ``line`` since the kill."""
        if not self.log.exists():
            return False
        with self.log.open("rb") as f:
            f.seek(self._log_offset)
            return line.encode() in f.read()

    def wait_replaying(self, timeout: float = 30) -> None:
        """Until the postmaster reinitialized and its startup process began to replay
        (or is done already)."""
        waiting.wait_until(
            lambda: self.logged(REDO_STARTS) or self.logged(READY),
            timeout,
            interval=0.05,
            message=f"PostgreSQL replaying its WAL after the kill ({self.log})",
        )

    def wait_recovered(self, timeout: float) -> float:
        """Until PostgreSQL accepts connections again after its crash recovery; the
        seconds since the kill. A postmaster that restarted is no crash recovery: a
        :class:`FaultError`."""
        assert self._killed_at is not None, "kill() first"
        waiting.wait_until(
            lambda: self.logged(REINITIALIZING),
            30,
            interval=0.05,
            message=f"PostgreSQL reinitializing after the kill ({self.log})",
        )
        conn = self._connect(timeout)
        took = time.monotonic() - self._killed_at
        try:
            started = conn.execute(sa.text("SELECT pg_postmaster_start_time()")).scalar_one()
        finally:
            conn.close()
        if started != self._postmaster_start:
            raise FaultError(
                f"the postmaster restarted ({self._postmaster_start} -> {started}): "
                "not a crash recovery"
            )
        return took

    def _connect(self, timeout: float) -> sa.Connection:
        """A connection, as soon as PostgreSQL accepts one (within ``timeout`` s)."""
        got: list[sa.Connection] = []

        def accepted() -> bool:
            try:
                got.append(self.engine.connect())
            except sa.exc.DBAPIError:
                return False
            return True

        waiting.wait_until(accepted, timeout, interval=0.1, message="PostgreSQL accepting")
        return got[0]

    def redo_seconds(self) -> float | None:
        """How long the replay itself took, by PostgreSQL's log (None: not logged)."""
        if not self.log.exists():
            return None
        with self.log.open("rb") as f:
            f.seek(self._log_offset)
            found = _REDO_ELAPSED.search(f.read().decode(errors="replace"))
        return float(found.group(1)) if found else None

    def close(self) -> None:
        """Checkpoints as before, the scratch table dropped (PostgreSQL started again if
        it is down: a case that failed mid-fault)."""
        if self._builder is not None:
            with contextlib.suppress(sa.exc.DBAPIError):
                self._builder.close()
            self._builder = None
        self.stack.pg_start()
        conn = self._connect(120).execution_options(isolation_level="AUTOCOMMIT")
        try:
            for name in NO_CHECKPOINTS:
                conn.execute(sa.text(f"ALTER SYSTEM RESET {name}"))
            conn.execute(sa.text("SELECT pg_reload_conf()"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {BALLAST}"))
        finally:
            conn.close()
            self.engine.dispose()


# ---------------------------------------------------------------- disk


class SmallDisk:
    """A small tmpfs mounted on a folder (a server's work dir, before the server
    starts), which :meth:`fill` fills to the last byte with a filler file and
    :meth:`free` empties again: a full disk under one server alone. ``close()``
    unmounts it once nothing uses it any more (after the cluster's teardown)."""

    FILLER = ".chaos-disk-filler"

    def __init__(self, folder: Path, size_mb: int) -> None:
        self.folder = folder
        self.size_mb = size_mb
        self._mounted = False

    def mount(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        _run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755", "tmpfs",
              str(self.folder)])  # fmt: skip
        self._mounted = True

    def fill(self) -> int:
        """Write the filler until the disk is full (ENOSPC); the bytes written."""
        written = 0
        chunk = b"\0" * (1 << 20)
        with open(self.folder / self.FILLER, "wb", buffering=0) as f:
            try:
                while True:
                    written += f.write(chunk)
            except OSError:
                pass  # ENOSPC: full
            # The last partial chunk: fill to the byte (a small write may still fit).
            for size in (1 << 16, 1 << 12, 1 << 8, 1):
                try:
                    while True:
                        written += f.write(b"\0" * size)
                except OSError:
                    continue
        return written

    def free(self) -> None:
        (self.folder / self.FILLER).unlink(missing_ok=True)

    def close(self) -> None:
        if not self._mounted:
            return
        self.free()
        # Lazy: a process of the trial that outlived the teardown must not keep the
        # mount (and its memory) around; it goes once the last user closes.
        subprocess.run(["umount", "-l", str(self.folder)], capture_output=True, check=False)
        self._mounted = False


def mounts_unavailable() -> str | None:
    """Why a tmpfs cannot be mounted here, or None if it can."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (CAP_SYS_ADMIN)"
    probe = Path(f"/tmp/srchaos-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        _run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)], timeout=10)
    except (FaultError, FileNotFoundError) as exc:
        return f"cannot mount a tmpfs here: {exc}"
    finally:
        subprocess.run(["umount", str(probe)], capture_output=True, check=False)
        probe.rmdir()
    return None


# ---------------------------------------------------------------- clock


class SteppableClock:
    """A wall clock a test can step, for one server and every process it starts
    (watchdogs, drivers' Python; not the JVM: ``env``): libfaketime preloaded, its
    offset read from ``file`` (re-read every second), BOOTTIME and CLOCK_MONOTONIC left
    alone (``FAKETIME_DONT_FAKE_MONOTONIC``), as an NTP or operator step of the host's
    clock would.

    The library comes from the ``libfaketime`` wheel (a test dependency): Debian's
    0.9.10 breaks Python's ``time.sleep`` with EINVAL when monotonic clocks are not
    faked (libfaketime issue #426, fixed in the wheel's newer build)."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.file.write_text("+0\n")

    @staticmethod
    def library() -> Path:
        import importlib.resources

        path = Path(str(importlib.resources.files("libfaketime"))) / (
            "vendor/libfaketime/src/libfaketime.so.1"
        )
        if not path.is_file():
            raise FaultError(f"libfaketime's library is not at {path}: reinstall the wheel")
        return path

    @property
    def env(self) -> dict[str, str]:
        """The environment that puts a process (and its children) on this clock."""
        return {
            "LD_PRELOAD": str(self.library()),
            "FAKETIME_TIMESTAMP_FILE": str(self.file),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            # A JVM under the library never got to run the driver's Python (a chaos run's
            # drivers hung after spark-submit's first line): spark-submit's JVM keeps
            # the host's clock; the job's Python, the server and its watchdogs step.
            "FAKETIME_SKIP_CMDS": "java",
        }

    @property
    def wrapper(self) -> list[str]:
        """The argv prefix of a process started on this clock (a server: with
        ``start_server(wrapper=..., env=self.env)``): ``faketime_shared.py``, which
        opens the library's state to the drivers' user before the process runs."""
        return [sys.executable, str(Path(__file__).with_name("faketime_shared.py"))]

    def step(self, seconds: float) -> None:
        """Set the clock ``seconds`` away from the host's (0: back to it). Processes
        see it within a second (the library's cache)."""
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+g}\n")
        tmp.replace(self.file)


def clock_unavailable() -> str | None:
    """Why a steppable clock cannot be had here, or None if it can."""
    try:
        SteppableClock.library()
    except (FaultError, ModuleNotFoundError) as exc:
        return f"libfaketime: {exc}"
    return None


# ---------------------------------------------------------------- S3


class ThrowawayS3(services.ThrowawayS3):
    """The tests' throwaway S3 server, made unreachable with ``block()`` (iptables
    rejects connections to its port) rather than by restarting it: a restarted moto
    would lose the objects a real S3 keeps."""

    def block(self) -> None:
        """Refuse every connection to the server (it keeps running, with its objects)."""
        _run(
            ["iptables", "-w", "-I", "INPUT", "-i", "lo", "-p", "tcp", "--dport", str(self.port),
             "-m", "comment", "--comment", self._tag, "-j", "REJECT",
             "--reject-with", "tcp-reset"]
        )  # fmt: skip

    def unblock(self) -> None:
        listing = _run(["iptables", "-w", "-S"])
        for line in listing.splitlines():
            if self._tag in line and line.startswith("-A "):
                _run(["iptables", "-w", "-D", *_split_rule(line[3:])])

    @property
    def _tag(self) -> str:
        return f"sparkring-chaos-s3-{self.port}"

    def kill(self) -> None:
        self.unblock()
        super().kill()


# ---------------------------------------------------------------- Spark masters


# JVM options of the chaos masters: one GC thread and the C1 compiler only. Half the
# CPU of a master's start (2.7 s instead of 5.6 s, measured at load 30-50) on a 2-core
# machine the campaign shares; nothing the masters do for the campaign needs more.
LIGHT_JVM = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


class SparkMasters:
    """Spark standalone masters of one trial's own (pyspark's ``spark-class ...Master``,
    free ports, logs in ``folder``): never the stack's, so killing one disturbs nobody.
    With ``zk_hosts`` they run Spark's ZooKeeper recovery mode (as ``stack.py up
    --spark-masters 2`` and docker-compose.yml do) under a ZooKeeper folder of their own:
    one is elected active, the others stand by. No worker: the chaos drivers never
    register (heartbeat.py has no SparkContext); what sparkring sees of a master is
    whether it answers (``server/spark_master.py``'s probe), and that is what a real
    master's death takes away. Masters are numbered from 0; each is stopped by SIGKILL
    through its own process handle (``spark-class`` execs the JVM). ``host``: the address
    they listen on (the host end of a :class:`Partition`'s veth, when a server lives in
    its namespace: 127.0.0.1 there is the namespace's own)."""

    def __init__(
        self,
        folder: Path,
        count: int,
        zk_hosts: str | None = None,
        host: str = "127.0.0.1",
        jvm_options: str = LIGHT_JVM,
    ) -> None:
        self.folder = folder
        self.host = host
        self.jvm_options = jvm_options
        self.zk_hosts = zk_hosts
        self.zk_dir = f"/spark-ha-chaos-{uuid.uuid4().hex[:8]}"
        self.ports = [(services.free_port(), services.free_port()) for _ in range(count)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        folder.mkdir(parents=True, exist_ok=True)

    def endpoint(self, i: int) -> str:
        return f"{self.host}:{self.ports[i][0]}"

    def url(self, *which: int) -> str:
        """The ``spark://`` URL of masters ``which`` (default: all), as a job names them."""
        return "spark://" + ",".join(self.endpoint(i) for i in which or range(len(self.ports)))

    def env(self) -> dict[str, str]:
        import pyspark  # the venv's, whose spark-class runs the servers' drivers too

        env = {
            **os.environ,
            "SPARK_HOME": str(Path(pyspark.__file__).parent),
            "SPARK_LOCAL_IP": self.host,  # the RPC and the UI bind there
            "SPARK_LOG_DIR": str(self.folder),
            "SPARK_DAEMON_MEMORY": "256m",
        }
        options = {}
        if self.zk_hosts:
            options = {
                "spark.deploy.recoveryMode": "ZOOKEEPER",
                "spark.deploy.zookeeper.url": self.zk_hosts,
                "spark.deploy.zookeeper.dir": self.zk_dir,
            }
        java = [self.jvm_options, *(f"-D{k}={v}" for k, v in options.items())]
        env["SPARK_DAEMON_JAVA_OPTS"] = " ".join(o for o in java if o)
        return env

    def start(self, *which: int) -> None:
        """Spawn masters ``which`` (default: all); :meth:`wait_answering` waits for them."""
        env = self.env()
        spark_class = Path(env["SPARK_HOME"]) / "bin" / "spark-class"
        for i in which or range(len(self.ports)):
            if self.alive(i):
                continue
            rpc, ui = self.ports[i]
            argv = [str(spark_class), "org.apache.spark.deploy.master.Master", "--host",
                    self.host, "--port", str(rpc), "--webui-port", str(ui)]  # fmt: skip
            with (self.folder / f"master{i}.log").open("ab") as log:
                self.procs[i] = subprocess.Popen(
                    argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )

    def alive(self, i: int) -> bool:
        proc = self.procs.get(i)
        return proc is not None and proc.poll() is None

    def answers(self, i: int) -> bool:
        return spark_master.answers(spark_master.Endpoint(self.host, self.ports[i][0]), 1.0)

    def wait_answering(self, *which: int, timeout: float = 180) -> None:
        """Until masters ``which`` (default: all) accept connections (a JVM start takes
        ~10 s, much more on a loaded 2-core machine)."""
        which = which or tuple(range(len(self.ports)))
        waiting.wait_until(
            lambda: all(self.answers(i) for i in which),
            timeout,
            interval=0.5,
            message=f"Spark masters {[self.endpoint(i) for i in which]} answering",
        )

    def status(self, i: int) -> str | None:
        """The master's own word (its UI's ``/json``): ``ALIVE`` (active), ``STANDBY``,
        ``RECOVERING``...; None when it does not answer."""
        try:
            url = f"http://{self.host}:{self.ports[i][1]}/json"
            with urllib.request.urlopen(url, timeout=2) as response:
                return str(json.load(response).get("status"))
        except (OSError, ValueError):
            return None

    def active(self) -> int | None:
        return next((i for i in range(len(self.ports)) if self.status(i) == "ALIVE"), None)

    def wait_active(self, timeout: float = 180) -> int:
        """The master that is ALIVE, once one is (with standbys: once elected)."""
        found: list[int] = []

        def elected() -> bool:
            i = self.active()
            found[:] = [] if i is None else [i]
            return bool(found)

        waiting.wait_until(elected, timeout, interval=1.0, message="an active Spark master")
        return found[0]

    def kill(self, i: int) -> None:
        """SIGKILL of master ``i`` (kill -9: no goodbye to ZooKeeper or anybody)."""
        proc = self.procs.get(i)
        if proc is None or proc.poll() is not None:
            return
        proc.kill()
        proc.wait(timeout=30)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
