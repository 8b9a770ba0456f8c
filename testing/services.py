"""Where the local stack's services are, and cheap per-test isolation on top of them.

The stack is started once, outside pytest, by ``scripts/stack.py up`` (``make test``
does it). Tests get a database copied from a migrated template, a ZooKeeper chroot and
an S3 bucket of their own.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from sql import database, migrate
from testing import waiting

REPO = Path(__file__).resolve().parent.parent
MOTO_SERVER = Path(sys.executable).with_name("moto_server")
# One template per test process: concurrent pytest runs (two checkouts sharing one local
# stack) must not drop each other's template while copying from it.
TEMPLATE_DATABASE = f"sparkring_template_{os.getpid()}"


def stack_env() -> dict[str, str]:
    """SPARKRING_* values of the running stack: the env file, overridden by the env."""
    stack_dir = Path(os.environ.get("SPARKRING_STACK_DIR", REPO / ".stack"))
    env: dict[str, str] = {}
    env_file = stack_dir / "env.json"
    if env_file.exists():
        env.update(json.loads(env_file.read_text()))
    env.update({k: v for k, v in os.environ.items() if k.startswith("SPARKRING_")})
    return env


def reachable(host_port: str) -> bool:
    host, _, port = host_port.rpartition(":")
    try:
        socket.create_connection((host, int(port)), 1).close()
        return True
    except (OSError, ValueError):
        return False


def admin_engine(database_url: str) -> sa.Engine:
    """An autocommit engine on the server's 'postgres' database (CREATE DATABASE needs it)."""
    url = database.parse_url(database_url).set(database="postgres")
    return sa.create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")


def create_template(database_url: str) -> None:
    admin = admin_engine(database_url)
    with admin.connect() as connection:
        connection.execute(sa.text(f"DROP DATABASE IF EXISTS {TEMPLATE_DATABASE} WITH (FORCE)"))
        connection.execute(sa.text(f"CREATE DATABASE {TEMPLATE_DATABASE}"))
    admin.dispose()
    url = database.parse_url(database_url).set(database=TEMPLATE_DATABASE)
    engine = sa.create_engine(url, poolclass=NullPool)
    migrate.upgrade(engine)
    engine.dispose()


def create_test_database(database_url: str, prefix: str = "t") -> str:
    """A fresh database copied from the migrated template; returns its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = admin_engine(database_url)
    with admin.connect() as connection:
        connection.execute(sa.text(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DATABASE}"))
    admin.dispose()
    return database.parse_url(database_url).set(database=name).render_as_string(hide_password=False)


def drop_template(database_url: str) -> None:
    drop_database(
        database.parse_url(database_url)
        .set(database=TEMPLATE_DATABASE)
        .render_as_string(hide_password=False)
    )


def drop_database(database_url: str) -> None:
    name = database.parse_url(database_url).database
    admin = admin_engine(database_url)
    with admin.connect() as connection:
        connection.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


@contextlib.contextmanager
def scratch_database(url: str | None, prefix: str) -> Iterator[str]:
    """A database of a benchmark's own, copied from this process's template, dropped on
    exit. The template is made (and dropped on exit) only if this process has none: a
    benchmark run inside a pytest session must leave the session's template alone.
    ``url``: the PostgreSQL server (None: refused with the hint)."""
    if not url:
        raise SystemExit(
            'SPARKRING_DATABASE_URL is not set: eval "$(python3 scripts/stack.py env)"'
        )
    admin = admin_engine(url)
    with admin.connect() as connection:
        has_template = connection.execute(
            sa.text("SELECT 1 FROM pg_database WHERE datname = :name"),
            {"name": TEMPLATE_DATABASE},
        ).scalar_one_or_none()
    admin.dispose()
    if not has_template:
        create_template(url)
    database_url = create_test_database(url, prefix=prefix)
    try:
        yield database_url
    finally:
        drop_database(database_url)
        if not has_template:
            drop_template(url)


@contextlib.contextmanager
def held_alone(name: str) -> Iterator[None]:
    """Hold ``name`` against every other test process on this stack (the suite's
    pytest-xdist workers) until exit: an exclusive lock on a file in the stack folder."""
    folder = Path(stack_env().get("SPARKRING_STACK_DIR", REPO / ".stack"))
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "w") as handle:  # closing it releases the lock
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def bench_databases(url: str) -> set[str]:
    """The scratch databases benchmarks create (``bench_*``): a smoke test checks none
    is left behind."""
    admin = admin_engine(url)
    try:
        with admin.connect() as conn:
            return set(
                conn.execute(
                    sa.text("SELECT datname FROM pg_database WHERE datname LIKE 'bench\\_%'")
                ).scalars()
            )
    finally:
        admin.dispose()


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ThrowawayS3:
    """A moto S3 server of one test's own on a free port, which the test may kill: the
    stack's S3 is shared and is never stopped. moto keeps objects in memory only."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        waiting.wait_until(
            lambda: reachable(self.endpoint), 30, message="moto_server did not start"
        )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def set_connections(database_url: str, allowed: bool) -> None:
    """Open or close this test's database to new sessions; closing ends the open ones."""
    name = database.parse_url(database_url).database
    admin = admin_engine(database_url)
    with admin.connect() as conn:
        conn.execute(sa.text(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {allowed}'))
        if not allowed:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
    admin.dispose()
