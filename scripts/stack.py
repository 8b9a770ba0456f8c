#!/usr/bin/env python3
"""The local stack: ZooKeeper, PostgreSQL, an S3 server and Spark standalone as local processes.

For development, the demo and the tests on machines without a Docker engine
(docker-compose.yml is the production-like deployment). Every service listens on
127.0.0.1, keeps its state under one folder (``.stack/`` by default) and is started and
stopped by PID. Standard library only, so it runs before the project is installed.

    python3 scripts/stack.py up [--zk-nodes 3] [--spark-masters 2]  # idempotent
    python3 scripts/stack.py up --only zookeeper,postgresql  # these alone
    python3 scripts/stack.py up --pg-standby     # PostgreSQL with a synchronous standby
    python3 scripts/stack.py status [--json]
    python3 scripts/stack.py env                 # SPARKRING_* exports for a shell
    python3 scripts/stack.py down                # leaves no process behind
    python3 scripts/stack.py zk stop|start N     # fault injection for chaos tests
    python3 scripts/stack.py pg stop|kill|start  # the primary (start: every node)
    python3 scripts/stack.py pg promote          # fail over to the standby
    python3 scripts/stack.py s3 stop|start
    python3 scripts/stack.py spark stop|start|kill  # the standalone masters and worker

Ports come from environment variables (defaults in PORTS below):
SPARKRING_STACK_ZK_PORT (first of N consecutive client ports), SPARKRING_STACK_PG_PORT,
SPARKRING_STACK_S3_PORT, SPARKRING_STACK_SPARK_PORT, SPARKRING_STACK_SPARK_UI_PORT,
SPARKRING_STACK_PG_STANDBY_PORT (default: the PostgreSQL port + 1).
The first ``up`` records them in the state folder (``ports.json``): every later
command uses those, with or without the variables, and ``up`` refuses a variable that
contradicts them. SPARKRING_STACK_DIR moves the state folder.

With ``--pg-standby`` (kept by every later ``up``), PostgreSQL has a streaming standby
that every commit waits for, and ``env`` gives the servers both nodes in one multi-host
URL with ``target_session_attrs=read-write``. ``pg promote`` kills the primary
(immediate) and promotes the standby; the next ``pg start`` or ``up`` copies the new
primary into the old one's folder and starts it as the new standby
(docs/deployment.md, "PostgreSQL with a standby").
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PORTS = {
    "zk": 12181,
    "pg": 15432,
    # A PostgreSQL standby's (``up --pg-standby``); by default the primary's port + 1.
    "pg_standby": 15433,
    "s3": 19000,
    "spark": 17077,
    "spark_ui": 18080,
}
PG_BIN = Path("/usr/lib/postgresql/15/bin")
ZK_CLASSPATH = ":".join(
    [
        "/etc/zookeeper/conf",
        "/usr/share/java/zookeeper.jar",
        "/usr/share/java/zookeeper-jute.jar",
        "/usr/share/java/slf4j-api.jar",
        "/usr/share/java/slf4j-log4j12.jar",
        "/usr/share/java/log4j-1.2.jar",
    ]
)
# In the stack folder: the ports it was created with (recorded_ports).
PORTS_FILE = "ports.json"
S3_ACCESS_KEY = "sparkring"
S3_SECRET_KEY = "sparkring-dev-secret"
DATABASE = "sparkring"


class StackError(Exception):
    """A service could not be brought up or down; the message says which and why."""


def stack_dir() -> Path:
    return Path(os.environ.get("SPARKRING_STACK_DIR", REPO / ".stack")).resolve()


def _port_variable(name: str) -> str:
    return f"SPARKRING_STACK_{name.upper()}_PORT"


def _port_of(address: str) -> int | None:
    """The port of ``host:port``, ``scheme://host:port/...`` or a comma list's first."""
    first = address.split(",")[0]
    host_port = urllib.parse.urlsplit(first if "//" in first else f"//{first}")
    try:
        return host_port.port
    except ValueError:
        return None


def recorded_ports() -> dict[str, int]:
    """The ports the stack folder was created with: its ``ports.json`` (written by
    ``up`` before it starts anything), else, for a folder made before that file existed,
    what its ``env.json`` says; {} for a new folder."""
    root = stack_dir()
    try:
        recorded = json.loads((root / PORTS_FILE).read_text())
        return {name: int(recorded[name]) for name in PORTS if name in recorded}
    except FileNotFoundError:
        pass
    except (ValueError, TypeError) as exc:
        raise StackError(f"{root / PORTS_FILE} is not a JSON map of ports: {exc}") from exc
    try:
        env = json.loads((root / "env.json").read_text())
    except (OSError, ValueError):
        return {}
    sources = {
        "zk": env.get("SPARKRING_ZK_HOSTS"),
        "pg": env.get("SPARKRING_DATABASE_URL"),
        "s3": env.get("SPARKRING_S3_ENDPOINT"),
        "spark": env.get("SPARKRING_STACK_SPARK_MASTER_URL"),
        "spark_ui": env.get("SPARKRING_STACK_SPARK_UI_URL"),
    }
    found = {name: _port_of(value) for name, value in sources.items() if value}
    return {name: number for name, number in found.items() if number is not None}


def port(name: str) -> int:
    """A service's port: as the stack folder was created, else its SPARKRING_STACK_*_PORT
    variable, else the default (PORTS; the PostgreSQL standby's follows the primary's)."""
    recorded = recorded_ports()
    if name in recorded:
        return recorded[name]
    given = os.environ.get(_port_variable(name))
    if given:
        return int(given)
    if name == "pg_standby":
        return port("pg") + 1
    return PORTS[name]


def check_ports() -> None:
    """Refuse a SPARKRING_STACK_*_PORT that contradicts the existing stack folder: its
    services listen where they were created, and a silent switch would wait for them
    on the wrong port (or start a second set of them)."""
    recorded = recorded_ports()
    for name in PORTS:
        given = os.environ.get(_port_variable(name))
        if given and name in recorded and int(given) != recorded[name]:
            raise StackError(
                f"the stack in {stack_dir()} was created with {_port_variable(name)}="
                f"{recorded[name]}, but {_port_variable(name)}={given} is set: unset it, "
                f"or run `stack.py down` and remove {stack_dir()} to start over"
            )


def warn_ignored_ports() -> None:
    """``env`` and ``status`` speak of this stack folder's services: a port variable
    that contradicts it (a shell set up for another stack) is ignored, and said so on
    stderr, never silently."""
    try:
        check_ports()
    except StackError as exc:
        print(f"stack.py: {exc} (ignored here: this stack's own ports are used)", file=sys.stderr)


def record_ports() -> None:
    """Write the ports this stack folder uses (:func:`port`) to its ``ports.json``."""
    root = stack_dir()
    root.mkdir(parents=True, exist_ok=True)
    ports = {name: port(name) for name in PORTS}
    (root / PORTS_FILE).write_text(json.dumps(ports, indent=2) + "\n")


def venv_bin(name: str) -> str:
    """A tool from the project's virtualenv if there is one, else from PATH."""
    for candidate in (REPO / ".venv" / "bin" / name, Path(sys.executable).parent / name):
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if not found:
        raise StackError(f"{name} not found: run scripts/bootstrap.sh first")
    return found


def port_open(p: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, p), 0.3).close()
        return True
    except OSError:
        return False


def wait_for(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise StackError(f"{what} did not come up within {timeout:.0f} s")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def read_pid(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def spawn(argv: list[str], log: Path, pidfile: Path, env: dict[str, str] | None = None) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    pidfile.write_text(str(proc.pid))
    return proc.pid


def kill_pidfile(pidfile: Path, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
    pid = read_pid(pidfile)
    if pid is None:
        pidfile.unlink(missing_ok=True)
        return
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while pid_alive(pid):
            time.sleep(0.05)
    pidfile.unlink(missing_ok=True)


# ---------------------------------------------------------------- ZooKeeper


def zk_nodes_configured() -> int:
    conf = stack_dir() / "zk" / "nodes"
    return int(conf.read_text()) if conf.exists() else 0


def zk_mode(p: int) -> str:
    """'leader', 'follower', 'standalone' or 'none' from the srvr four-letter word."""
    try:
        with socket.create_connection(("127.0.0.1", p), 0.5) as s:
            s.sendall(b"srvr")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
    except OSError:
        return "none"
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            return line.split()[1]
    return "none"


def zk_write_config(nodes: int) -> None:
    root = stack_dir() / "zk"
    root.mkdir(parents=True, exist_ok=True)
    (root / "nodes").write_text(str(nodes))
    base = port("zk")
    for i in range(1, nodes + 1):
        node = root / f"zk{i}"
        (node / "data").mkdir(parents=True, exist_ok=True)
        (node / "data" / "myid").write_text(str(i))
        lines = [
            "tickTime=1000",
            "initLimit=10",
            "syncLimit=5",
            # Let clients negotiate session timeouts from 2 s up.
            "minSessionTimeout=2000",
            "maxSessionTimeout=60000",
            f"dataDir={node / 'data'}",
            f"clientPort={base + i - 1}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "maxClientCnxns=0",
        ]
        if nodes > 1:
            for j in range(1, nodes + 1):
                lines.append(f"server.{j}=127.0.0.1:{base + 100 + j}:{base + 200 + j}")
        (node / "zoo.cfg").write_text("\n".join(lines) + "\n")


def zk_start(i: int) -> None:
    node = stack_dir() / "zk" / f"zk{i}"
    if read_pid(node / "pid"):
        return
    spawn(
        [
            "java",
            "-Xmx256m",
            "-Dzookeeper.root.logger=INFO,CONSOLE",
            "-cp",
            ZK_CLASSPATH,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(node / "zoo.cfg"),
        ],
        node / "zk.log",
        node / "pid",
    )


def zk_stop(i: int, sig: int = signal.SIGTERM) -> None:
    kill_pidfile(stack_dir() / "zk" / f"zk{i}" / "pid", sig=sig)


def zk_wait(nodes: int, timeout: float = 60.0) -> None:
    base = port("zk")
    for i in range(nodes):
        wait_for(
            f"ZooKeeper node {i + 1} (port {base + i})",
            lambda p=base + i: zk_mode(p) in ("leader", "follower", "standalone"),
            timeout,
        )


def zk_up(nodes: int) -> None:
    if zk_nodes_configured() != nodes:
        for i in range(1, max(zk_nodes_configured(), 3) + 1):
            zk_stop(i)
        shutil.rmtree(stack_dir() / "zk", ignore_errors=True)
        zk_write_config(nodes)
    for i in range(1, nodes + 1):
        zk_start(i)
    zk_wait(nodes)


def zk_hosts() -> str:
    base = port("zk")
    return ",".join(f"127.0.0.1:{base + i}" for i in range(max(zk_nodes_configured(), 1)))


def zk_leader() -> int | None:
    base = port("zk")
    for i in range(zk_nodes_configured()):
        if zk_mode(base + i) in ("leader", "standalone"):
            return i + 1
    return None


# ---------------------------------------------------------------- PostgreSQL

# A stack made with ``up --pg-standby`` runs two PostgreSQL nodes, named here by the key
# of their port: ``pg`` and ``pg_standby``. Which one is the primary is kept in the
# stack folder (PG_STATE_FILE): ``pg`` until ``pg promote`` hands the role to the other.
PG_NODES = ("pg", "pg_standby")
PG_STATE_FILE = "postgresql.json"
# The standby's application_name in its primary_conninfo, which the primary's
# synchronous_standby_names lists: a commit returns once this standby has its WAL.
PG_STANDBY_NAME = "sparkring_standby"


def _as_postgres(argv: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


def pg_data(node: str = "pg") -> Path:
    """A PostgreSQL node's folder (its ``data``, log and socket). initdb refuses root, and
    the postgres user may not be able to enter the repository, so it lives in /tmp,
    linked from the stack dir (``pg``, ``pg-standby``)."""
    name = node.replace("_", "-")
    link = stack_dir() / name
    if not link.exists():
        link.unlink(missing_ok=True)  # a link whose folder is gone (/tmp emptied)
        target = Path(f"/tmp/sparkring-{name}-{_stable_key()}")
        target.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(target, "postgres", "postgres")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
    return link.resolve()


def _stable_key() -> str:
    return hashlib.sha256(str(stack_dir()).encode()).hexdigest()[:10]


def pg_state() -> dict[str, object]:
    """Whether this stack has a standby, and which node is the primary."""
    try:
        state = json.loads((stack_dir() / PG_STATE_FILE).read_text())
    except FileNotFoundError:
        return {"standby": False, "primary": "pg"}
    except ValueError as exc:
        raise StackError(f"{stack_dir() / PG_STATE_FILE} is not valid JSON: {exc}") from exc
    if state.get("primary") not in PG_NODES:
        raise StackError(f"{stack_dir() / PG_STATE_FILE} names no primary of {PG_NODES}")
    return state


def _write_pg_state(**changes: object) -> None:
    state = {**pg_state(), **changes}
    stack_dir().mkdir(parents=True, exist_ok=True)
    (stack_dir() / PG_STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")


def pg_standby_configured() -> bool:
    return bool(pg_state()["standby"])


def pg_primary() -> str:
    """The node that takes writes: ``pg``, or ``pg_standby`` after a promotion."""
    return str(pg_state()["primary"])


def pg_standby() -> str:
    """The node that replicates from :func:`pg_primary` (when a standby is configured)."""
    return PG_NODES[1 - PG_NODES.index(pg_primary())]


def pg_initdb(node: str) -> None:
    data = pg_data(node) / "data"
    if (data / "PG_VERSION").exists():
        return
    subprocess.run(
        _as_postgres(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )


def pg_up(standby: bool = False) -> None:
    """Start the primary (made on first use) and create the database on it; with a
    standby (``standby``, or an earlier ``up --pg-standby``), the standby too
    (:func:`pg_standby_up`)."""
    if standby and not pg_standby_configured():
        _write_pg_state(standby=True)
    primary = pg_primary()
    pg_initdb(primary)
    if not port_open(port(primary)):
        pg_start(primary)
        _pg_create_database()
    if pg_standby_configured():
        pg_standby_up()


def pg_standby_up() -> None:
    """Make the standby (a ``pg_basebackup -R`` of the running primary) unless it is one
    already, start it, and make the primary's commits wait for it
    (``synchronous_standby_names``). A node that is not a standby here is the primary a
    promotion left behind: its WAL may run past the new primary's, so it is copied anew
    rather than started (two primaries would take writes)."""
    primary, standby = pg_primary(), pg_standby()
    data = pg_data(standby) / "data"
    if not (data / "standby.signal").exists():
        pg_stop("immediate", standby)
        shutil.rmtree(data, ignore_errors=True)
        conninfo = (
            f"host=127.0.0.1 port={port(primary)} user=postgres application_name={PG_STANDBY_NAME}"
        )
        _pg_tool(
            f"copying the primary on port {port(primary)} into {data} (pg_basebackup)",
            [
                str(PG_BIN / "pg_basebackup"),
                "-D",
                str(data),
                "--write-recovery-conf",
                "--wal-method=stream",
                "--checkpoint=fast",
                "--no-sync",
                "-d",
                conninfo,
            ],
        )
    if not port_open(port(standby)):
        pg_start(standby)
    primary_port = port(primary)
    if _psql(primary_port, "SHOW synchronous_standby_names") != PG_STANDBY_NAME:
        _psql(primary_port, f"ALTER SYSTEM SET synchronous_standby_names = '{PG_STANDBY_NAME}'")
        _psql(primary_port, "SELECT pg_reload_conf()")
    wait_for(
        f"synchronous replication from port {primary_port} to port {port(standby)}",
        lambda: pg_sync_state() == "sync",
        30,
    )


def pg_start(node: str = "pg") -> None:
    data = pg_data(node) / "data"
    # fsync off (speed), but synchronous_commit on: a commit is acknowledged only once
    # its WAL is written to the OS (and, with a standby, written by the standby too). A
    # PostgreSQL crash (the chaos campaign's pg_immediate: ``pg_ctl -m immediate``) is a
    # process crash, which keeps the OS page cache, so every acknowledged commit
    # survives it; with synchronous_commit off the last acknowledged commits would be
    # lost, which is outside the model (docs/drivers.md "Durability and clock
    # assumptions"). Only a machine crash would lose them with fsync off, and nothing
    # injects that. wal_keep_size lets a standby that was away catch up from the
    # primary's WAL; wal_retrieve_retry_interval has it reconnect within a second of
    # its primary's restart.
    options = (
        f"-p {port(node)} -k {pg_data(node)} -c listen_addresses=127.0.0.1 -c fsync=off "
        "-c synchronous_commit=on -c full_page_writes=off -c max_connections=300 "
        "-c wal_keep_size=128MB -c wal_retrieve_retry_interval=1s"
    )
    subprocess.run(
        _as_postgres(
            [
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(pg_data(node) / "server.log"),
                "-w",
                "-o",
                options,
                "start",
            ]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )


def pg_start_all() -> None:
    """``pg start``: every configured node that is down, the standby made anew if a
    promotion left it behind as the old primary."""
    primary = pg_primary()
    if not port_open(port(primary)):
        pg_start(primary)
    if pg_standby_configured():
        pg_standby_up()


def pg_stop(mode: str = "fast", node: str = "pg") -> None:
    if not (stack_dir() / node.replace("_", "-")).exists():
        return
    data = pg_data(node) / "data"
    if not (data / "postmaster.pid").exists():
        return
    subprocess.run(
        _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", mode, "-w", "stop"]),
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def pg_promote() -> None:
    """Fail over: kill the primary (``immediate``, a crash) and promote the standby, then
    wait until it commits a write. The next ``pg start`` or ``up`` makes the old primary
    the new standby."""
    if not pg_standby_configured():
        raise StackError("this stack has no PostgreSQL standby: run `stack.py up --pg-standby`")
    primary, standby = pg_primary(), pg_standby()
    standby_port = port(standby)
    if not port_open(standby_port) or not (pg_data(standby) / "data" / "standby.signal").exists():
        raise StackError(
            f"no standby is running on port {standby_port}: run `stack.py pg start` first"
        )
    started = time.monotonic()
    pg_stop("immediate", primary)
    # The standby's settings are a copy of the primary's: once it is the primary, a
    # synchronous_standby_names naming a standby that is not there would hold every
    # commit forever.
    _psql(standby_port, "ALTER SYSTEM RESET synchronous_standby_names")
    _psql(standby_port, "SELECT pg_reload_conf()")
    _pg_tool(
        f"promoting the standby on port {standby_port}",
        [str(PG_BIN / "pg_ctl"), "-D", str(pg_data(standby) / "data"), "-w", "promote"],
    )
    _write_pg_state(primary=standby)
    wait_for(
        f"PostgreSQL on port {standby_port} taking writes", lambda: _pg_writable(standby_port), 30
    )
    print(
        f"  postgresql  port {standby_port} is the primary ({time.monotonic() - started:.1f} s)",
        file=sys.stderr,
    )


def _pg_tool(what: str, argv: list[str]) -> None:
    """Run a PostgreSQL program as the postgres user; a failure is one line saying
    ``what`` failed and the first line of the program's error."""
    done = subprocess.run(_as_postgres(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        problem = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0]
        raise StackError(f"{what} failed: {problem}")


def _pg_writable(p: int) -> bool:
    """A transaction that takes a transaction id commits (so it is out of recovery, and
    no synchronous standby it waits for is missing)."""
    try:
        _psql(p, "SELECT txid_current()", timeout=5)
    except StackError:
        return False
    return True


def pg_role(node: str) -> str:
    """'primary', 'standby', 'down' or 'unknown' (listening but not answering)."""
    if not port_open(port(node)):
        return "down"
    try:
        in_recovery = _psql(port(node), "SELECT pg_is_in_recovery()", timeout=5)
    except StackError:
        return "unknown"
    return "standby" if in_recovery == "t" else "primary"


def pg_sync_state() -> str:
    """The standby's ``sync_state`` on the primary ('sync', 'async', ...), 'none' when it
    is not connected, 'unknown' when the primary does not answer."""
    try:
        state = _psql(
            port(pg_primary()),
            "SELECT sync_state FROM pg_stat_replication"
            f" WHERE application_name = '{PG_STANDBY_NAME}'",
            timeout=5,
        )
    except StackError:
        return "unknown"
    return state.splitlines()[0] if state else "none"


def _psql(p: int, sql: str, timeout: float = 30.0) -> str:
    """One statement on the PostgreSQL at port ``p`` (database postgres, as postgres);
    its output, trimmed."""
    argv = ["psql", "-X", "-h", "127.0.0.1", "-p", str(p), "-U", "postgres", "-tA", "-c", sql]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise StackError(
            f"PostgreSQL on port {p} gave no answer to {sql!r} within {timeout:.0f} s"
        ) from None
    if done.returncode != 0:
        problem = (done.stderr.strip().splitlines() or ["no message"])[0]
        raise StackError(f"PostgreSQL on port {p} refused {sql!r}: {problem}")
    return done.stdout.strip()


def _pg_create_database() -> None:
    primary_port = port(pg_primary())
    exists = _psql(primary_port, f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'")
    if exists != "1":
        _psql(primary_port, f"CREATE DATABASE {DATABASE}")


def database_url() -> str:
    """The servers' SPARKRING_DATABASE_URL. With a standby, both nodes in libpq's
    multi-host form with ``target_session_attrs=read-write``: a connection tries them in
    turn and keeps the one that takes writes, whichever node is the primary."""
    if not pg_standby_configured():
        return f"postgresql+psycopg://postgres@127.0.0.1:{port('pg')}/{DATABASE}"
    hosts = ",".join(f"127.0.0.1:{port(node)}" for node in PG_NODES)
    return f"postgresql+psycopg://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write"


# ---------------------------------------------------------------- S3 (moto)


def s3_start() -> None:
    root = stack_dir() / "s3"
    root.mkdir(parents=True, exist_ok=True)
    if read_pid(root / "pid") and port_open(port("s3")):
        return
    spawn(
        [venv_bin("moto_server"), "-H", "127.0.0.1", "-p", str(port("s3"))],
        root / "moto.log",
        root / "pid",
    )
    wait_for(f"S3 server (port {port('s3')})", lambda: port_open(port("s3")), 30)


def s3_stop() -> None:
    kill_pidfile(stack_dir() / "s3" / "pid")


# ---------------------------------------------------------------- Spark standalone


def spark_home() -> Path:
    python = venv_bin("python")
    out = subprocess.run(
        [python, "-c", "import pyspark, os; print(os.path.dirname(pyspark.__file__))"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def spark_env() -> dict[str, str]:
    home = spark_home()
    return {
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": venv_bin("python"),
        "SPARK_LOG_DIR": str(stack_dir() / "spark"),
    }


# Spark's standby masters keep their election and recovery state here, in the stack's
# ZooKeeper, apart from sparkring's /sparkring (as in docker-compose.yml).
SPARK_ZK_DIR = "/spark-ha"


def spark_masters_configured() -> int:
    """How many masters this stack runs: as ``up --spark-masters`` last set it, else 1."""
    conf = stack_dir() / "spark" / "masters"
    return int(conf.read_text()) if conf.exists() else 1


def spark_write_config(masters: int) -> None:
    root = stack_dir() / "spark"
    root.mkdir(parents=True, exist_ok=True)
    (root / "masters").write_text(str(masters))


def spark_master_ports(i: int) -> tuple[int, int]:
    """Master ``i``'s (RPC, UI) ports, from 1: the first on the stack's own ports, each
    next one a port up (its UI skips spark_ui + 1, the worker's)."""
    if i == 1:
        return port("spark"), port("spark_ui")
    return port("spark") + i - 1, port("spark_ui") + i


def spark_master_url() -> str:
    """Every master of the stack, as workers and drivers are given them."""
    return "spark://" + ",".join(
        f"127.0.0.1:{spark_master_ports(i)[0]}" for i in range(1, spark_masters_configured() + 1)
    )


def spark_master_argv(i: int, spark_class: str) -> list[str]:
    rpc, ui = spark_master_ports(i)
    return [
        spark_class,
        "org.apache.spark.deploy.master.Master",
        "--host",
        "127.0.0.1",
        "--port",
        str(rpc),
        "--webui-port",
        str(ui),
    ]


# Cores an application gets when it sets no spark.cores.max: one, as in the compose
# deployment (docs/deployment.md), so that a stream that sets nothing cannot take the
# worker's every core and starve the batch jobs beside it (and its own warm successor).
SPARK_DEFAULT_CORES = 1


def spark_master_env(masters: int, env: dict[str, str]) -> dict[str, str]:
    """A master's environment: ``spark.deploy.defaultCores`` (:data:`SPARK_DEFAULT_CORES`),
    and with standbys, Spark's ZooKeeper recovery mode on the stack's ZooKeeper (an
    election picks the active master; the others wait)."""
    options = {"spark.deploy.defaultCores": str(SPARK_DEFAULT_CORES)}
    if masters > 1:
        options.update(
            {
                "spark.deploy.recoveryMode": "ZOOKEEPER",
                "spark.deploy.zookeeper.url": zk_hosts(),
                "spark.deploy.zookeeper.dir": SPARK_ZK_DIR,
            }
        )
    return {**env, "SPARK_DAEMON_JAVA_OPTS": " ".join(f"-D{k}={v}" for k, v in options.items())}


def spark_worker_argv(spark_class: str) -> list[str]:
    return [
        spark_class,
        "org.apache.spark.deploy.worker.Worker",
        spark_master_url(),
        "--host",
        "127.0.0.1",
        "--cores",
        "2",
        "--memory",
        "2g",
        "--webui-port",
        str(port("spark_ui") + 1),
        "--work-dir",
        str(stack_dir() / "spark" / "work"),
    ]


def _master_pidfile(i: int) -> Path:
    return stack_dir() / "spark" / ("master.pid" if i == 1 else f"master{i}.pid")


def _spark_workers_alive() -> bool:
    """A worker is registered with the active master (a standby lists none)."""
    for i in range(1, spark_masters_configured() + 1):
        url = f"http://127.0.0.1:{spark_master_ports(i)[1]}/json"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                state = json.load(response)
        except (OSError, ValueError):  # not answering yet, or not with its JSON yet
            continue
        if any(w.get("state") == "ALIVE" for w in state.get("workers", [])):
            return True
    return False


def spark_up(masters: int | None = None) -> None:
    """Start the masters (``masters``; None: as configured) and the worker. A change of
    the number of masters restarts the Spark processes: the worker must be given the
    new list."""
    root = stack_dir() / "spark"
    if masters is not None and masters != spark_masters_configured():
        spark_down()
        spark_write_config(masters)
    masters = spark_masters_configured()
    (root / "work").mkdir(parents=True, exist_ok=True)
    env = spark_env()
    spark_class = str(Path(env["SPARK_HOME"]) / "bin" / "spark-class")
    for i in range(1, masters + 1):
        if not read_pid(_master_pidfile(i)):
            log = root / ("master.log" if i == 1 else f"master{i}.log")
            spawn(
                spark_master_argv(i, spark_class),
                log,
                _master_pidfile(i),
                spark_master_env(masters, env),
            )
            rpc = spark_master_ports(i)[0]
            wait_for(f"Spark master {i}", lambda rpc=rpc: port_open(rpc), 90)
    if not read_pid(root / "worker.pid"):
        spawn(spark_worker_argv(spark_class), root / "worker.log", root / "worker.pid", env)
    wait_for("Spark worker registration", _spark_workers_alive, 90)


def spark_down(sig: int = signal.SIGTERM) -> None:
    root = stack_dir() / "spark"
    kill_pidfile(root / "worker.pid", sig=sig)
    for i in range(1, max(spark_masters_configured(), 2) + 1):
        kill_pidfile(_master_pidfile(i), sig=sig)


# ---------------------------------------------------------------- whole stack


# The OS user drivers run as (scripts/bootstrap.sh creates it).
DRIVER_USER = "sparkring-driver"


def secret_key(root: Path) -> str:
    """The stack's Fernet key of job secrets (SPARKRING_SECRET_KEYS), made once and kept
    in the stack directory, readable by its owner only: 32 random bytes, url-safe base64."""
    path = root / "secret.key"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        key = base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(key + "\n")
    return path.read_text().strip()


def settings_env() -> dict[str, str]:
    """The SPARKRING_* values a process on this machine uses to reach the stack."""
    root = stack_dir()
    return {
        "SPARKRING_DATABASE_URL": database_url(),
        "SPARKRING_ZK_HOSTS": zk_hosts(),
        "SPARKRING_ZK_ROOT": "/sparkring",
        "SPARKRING_S3_ENDPOINT": f"127.0.0.1:{port('s3')}",
        "SPARKRING_S3_ACCESS_KEY": S3_ACCESS_KEY,
        "SPARKRING_S3_SECRET_KEY": S3_SECRET_KEY,
        "SPARKRING_S3_BUCKET": "sparkring",
        # Not the default local[2] (server/defaults.py): one core per driver, so several
        # drivers fit on a 2-core machine; a job that wants the standalone master gives
        # --master $SPARKRING_STACK_SPARK_MASTER_URL (docs/local-stack.md).
        "SPARKRING_SPARK_MASTER": "local[1]",
        "SPARKRING_CHECKPOINT_ROOT": str(root / "checkpoints"),
        "SPARKRING_WORK_DIR": str(root / "work"),
        "SPARKRING_ADVERTISE_HOST": "127.0.0.1",
        # Everything here is on loopback, webhook receivers of the tests and the demo
        # too; a production cluster allows no such network (docs/alerts.md).
        "SPARKRING_ALERT_ALLOW_NETWORKS": "127.0.0.0/8",
        # Drivers run as a user of their own (created by scripts/bootstrap.sh), never as
        # the server's: a job must not read the server's credentials (docs/drivers.md).
        "SPARKRING_DRIVER_USER": DRIVER_USER,
        # The key job secrets are encrypted with (docs/secrets.md); a production cluster
        # keeps its key in its secret store, never beside the database.
        "SPARKRING_SECRET_KEYS": secret_key(root),
        # Not settings of the server: where the stack's Spark standalone master listens,
        # and the Spark installation, for jobs and tests that use them.
        "SPARKRING_STACK_SPARK_MASTER_URL": spark_master_url(),
        "SPARKRING_STACK_SPARK_UI_URL": f"http://127.0.0.1:{port('spark_ui')}",
        "SPARKRING_STACK_DIR": str(root),
    }


def write_env_files() -> None:
    env = settings_env()
    root = stack_dir()
    (root / "env.json").write_text(json.dumps(env, indent=2) + "\n")
    (root / "env").write_text("".join(f"export {k}={v}\n" for k, v in env.items()))


def status() -> dict[str, object]:
    root = stack_dir()
    base = port("zk")
    nodes = zk_nodes_configured()
    report: dict[str, object] = {
        "zookeeper": {f"127.0.0.1:{base + i}": zk_mode(base + i) for i in range(nodes)},
        "postgresql": port_open(port(pg_primary())),
        "s3": port_open(port("s3")) and read_pid(root / "s3" / "pid") is not None,
        "spark_master": port_open(port("spark")),
        "spark_masters": {
            f"127.0.0.1:{spark_master_ports(i)[0]}": port_open(spark_master_ports(i)[0])
            for i in range(1, spark_masters_configured() + 1)
        },
        "spark_worker": _spark_workers_alive(),
    }
    if pg_standby_configured():
        report["postgresql_nodes"] = {f"127.0.0.1:{port(n)}": pg_role(n) for n in PG_NODES}
        report["postgresql_replication"] = pg_sync_state()
    return report


SERVICES = ("zookeeper", "postgresql", "s3", "spark")


def up(
    zk_nodes: int,
    spark: bool,
    spark_masters: int | None = None,
    only: frozenset[str] = frozenset(SERVICES),
    pg_standby: bool = False,
) -> None:
    """Start the services named in ``only`` (in their order in SERVICES) that are not
    running; ``spark`` False leaves Spark out whatever ``only`` says; ``pg_standby``
    gives PostgreSQL a synchronous standby (kept by every later ``up``)."""
    root = stack_dir()
    check_ports()
    record_ports()  # before any service starts: a failed first `up` still knows them
    for sub in ("checkpoints", "work"):
        (root / sub).mkdir(exist_ok=True)
    steps = [
        ("zookeeper", lambda: zk_up(zk_nodes)),
        ("postgresql", lambda: pg_up(pg_standby)),
        ("s3", s3_start),
    ]
    if spark:
        steps.append(("spark", lambda: spark_up(spark_masters)))
    for name, step in steps:
        if name not in only:
            continue
        started = time.monotonic()
        step()
        print(f"  {name:<11} up ({time.monotonic() - started:.1f} s)", file=sys.stderr)
    write_env_files()


def down() -> None:
    root = stack_dir()
    if not root.exists():
        return
    spark_down()
    s3_stop()
    for i in range(1, max(zk_nodes_configured(), 3) + 1):
        zk_stop(i)
    for node in PG_NODES:
        pg_stop("fast", node)
    # Servers and drivers the demo or tests may have left behind, by their pid files.
    for pidfile in root.glob("**/*.pid"):
        kill_pidfile(pidfile)


def _services(text: str) -> frozenset[str]:
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(names - set(SERVICES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown service {', '.join(unknown) or '(none given)'}: "
            f"choose from {', '.join(SERVICES)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start every service (idempotent)")
    p_up.add_argument(
        "--zk-nodes",
        type=int,
        choices=(1, 3),
        default=None,
        help="ZooKeeper nodes (default: as configured already, else 1)",
    )
    p_up.add_argument("--no-spark", action="store_true", help="skip the Spark standalone cluster")
    p_up.add_argument(
        "--only",
        type=_services,
        default=frozenset(SERVICES),
        metavar="SERVICE[,SERVICE...]",
        help="start only these of " + ", ".join(SERVICES) + " (ZooKeeper and PostgreSQL "
        "need nothing from the venv: scripts/test.sh starts them while pip installs)",
    )
    p_up.add_argument(
        "--pg-standby",
        action="store_true",
        help="give PostgreSQL a streaming standby that every commit waits for "
        "(synchronous_standby_names), on SPARKRING_STACK_PG_STANDBY_PORT (default: the "
        "primary's port + 1); kept by every later up",
    )
    p_up.add_argument(
        "--spark-masters",
        type=int,
        choices=(1, 2),
        default=None,
        help="Spark masters (2: a standby recovering through the stack's ZooKeeper, "
        f"under {SPARK_ZK_DIR}; default: as configured already, else 1)",
    )
    sub.add_parser("down", help="stop every service, leaving no process behind")
    p_status = sub.add_parser("status", help="report each service")
    p_status.add_argument("--json", action="store_true")
    sub.add_parser("env", help="print SPARKRING_* exports for a shell")
    for service in ("zk", "pg", "s3", "spark"):
        about = f"stop or start {service} alone (fault injection)"
        if service == "pg":
            about = (
                "stop or kill the PostgreSQL primary, start every PostgreSQL node, or "
                "fail over (promote: kill the primary, promote the standby)"
            )
        p = sub.add_parser(service, help=about)
        actions = (
            ("start", "stop", "kill", "promote") if service == "pg" else ("start", "stop", "kill")
        )
        p.add_argument("action", choices=actions)
        if service == "zk":
            p.add_argument("node", type=int, nargs="?", default=0, help="node (0: all, -1: leader)")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            up(
                args.zk_nodes or zk_nodes_configured() or 1,
                spark=not args.no_spark,
                spark_masters=args.spark_masters,
                only=args.only,
                pg_standby=args.pg_standby,
            )
            print("".join(f"export {k}={v}\n" for k, v in settings_env().items()), end="")
        elif args.command == "down":
            down()
        elif args.command == "status":
            warn_ignored_ports()
            report = status()
            if args.json:
                print(json.dumps(report, indent=2))
            else:
                width = max(len(name) for name in report)
                for name, value in report.items():
                    print(f"{name:<{width}} {value}")
        elif args.command == "env":
            warn_ignored_ports()
            print("".join(f"export {k}={v}\n" for k, v in settings_env().items()), end="")
        elif args.command == "zk":
            nodes = zk_nodes_configured()
            targets = list(range(1, nodes + 1)) if args.node == 0 else [args.node]
            if args.node == -1:
                leader = zk_leader()
                targets = [leader] if leader else []
            for i in targets:
                if args.action == "start":
                    zk_start(i)
                else:
                    zk_stop(i, signal.SIGKILL if args.action == "kill" else signal.SIGTERM)
            if args.action == "start":
                zk_wait(nodes)
            print(" ".join(str(i) for i in targets))
        elif args.command == "pg":
            if args.action == "start":
                pg_start_all()
            elif args.action == "promote":
                pg_promote()
            else:
                pg_stop("immediate" if args.action == "kill" else "fast", pg_primary())
        elif args.command == "s3":
            s3_start() if args.action == "start" else s3_stop()
        elif args.command == "spark":
            if args.action == "start":
                spark_up()
            else:
                spark_down(signal.SIGKILL if args.action == "kill" else signal.SIGTERM)
    except (StackError, subprocess.CalledProcessError) as exc:
        print(f"stack: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
