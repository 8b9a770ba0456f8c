"""``scripts/stack.py up --pg-standby`` runs PostgreSQL as users run it for failover: a
streaming standby that every commit waits for, and a multi-host URL that lands on
whichever node takes writes (issue 46, "PostgreSQL fails over too").

Real PostgreSQL, no mocks: a stack of the test's own (its folder under tmp_path, free
ports), PostgreSQL alone, brought down in a ``finally``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from testing import services
from testing.waiting import wait_until
from tests import conftest

STACK = [sys.executable, str(services.REPO / "scripts" / "stack.py")]
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _stack(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [*STACK, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"stack.py {' '.join(args)}: {done.stderr}"
    return done.stdout


def _connect(*ports: int) -> psycopg.Connection:
    """libpq's multi-host conninfo: the first of ``ports`` that takes writes."""
    hosts = ",".join("127.0.0.1" for _ in ports)
    return psycopg.connect(
        f"host={hosts} port={','.join(map(str, ports))} dbname=sparkring user=postgres"
        " target_session_attrs=read-write connect_timeout=5",
        autocommit=True,
    )


def _rows(port: int) -> list[int]:
    with psycopg.connect(
        f"host=127.0.0.1 port={port} dbname=sparkring user=postgres connect_timeout=5"
    ) as conn:
        return [row[0] for row in conn.execute("SELECT n FROM claims ORDER BY n")]


def _postmaster_pids(stack_dir: Path) -> list[int]:
    pids = []
    for folder in ("pg", "pg-standby"):
        pidfile = stack_dir / folder / "data" / "postmaster.pid"
        if pidfile.exists():
            pids.append(int(pidfile.read_text().split()[0]))
    return pids


def _running(pid: int) -> bool:
    """Alive and not a zombie (the postmaster's parent is whoever adopted it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.long(15)
def test_a_synchronous_standby_takes_over_without_losing_a_commit(tmp_path: Path) -> None:
    if not (PG_BIN / "pg_basebackup").exists():
        conftest.unavailable(f"PostgreSQL 15 is not installed ({PG_BIN})")
    primary, standby = services.free_port(), services.free_port()
    stack_dir = tmp_path / "stack"
    env = {
        **os.environ,
        "SPARKRING_STACK_DIR": str(stack_dir),
        "SPARKRING_STACK_PG_PORT": str(primary),
        "SPARKRING_STACK_PG_STANDBY_PORT": str(standby),
    }
    seen_pids: set[int] = set()
    try:
        exports = _stack(env, "up", "--only", "postgresql", "--pg-standby")
        assert (
            f"SPARKRING_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:{primary},"
            f"127.0.0.1:{standby}/sparkring?target_session_attrs=read-write\n"
        ) in exports
        assert json.loads((stack_dir / "ports.json").read_text())["pg_standby"] == standby
        seen_pids.update(_postmaster_pids(stack_dir))
        assert len(seen_pids) == 2

        with psycopg.connect(f"host=127.0.0.1 port={primary} dbname=sparkring user=postgres") as c:
            c.execute("CREATE TABLE claims (n int PRIMARY KEY)")
            c.execute("INSERT INTO claims VALUES (1)")
            c.commit()
            replication = c.execute(
                "SELECT application_name, sync_state FROM pg_stat_replication"
            ).fetchall()
        assert replication == [("sparkring_standby", "sync")]
        # synchronous_commit=on: the standby has the commit's WAL when it returns, and
        # shows it once replayed.
        wait_until(lambda: _rows(standby) == [1], 10, message="the standby never showed it")

        status = json.loads(_stack(env, "status", "--json"))
        assert status["postgresql_nodes"] == {
            f"127.0.0.1:{primary}": "primary",
            f"127.0.0.1:{standby}": "standby",
        }
        assert status["postgresql_replication"] == "sync"
        _stack(env, "up", "--only", "postgresql")  # idempotent, the standby kept

        _stack(env, "pg", "promote")
        with _connect(primary, standby) as conn:
            conn.execute("INSERT INTO claims VALUES (2)")
            landed = conn.execute("SELECT inet_server_port()").fetchone()
        assert landed == (standby,)
        assert _rows(standby) == [1, 2]  # the commit acknowledged before the failover kept

        # The old primary comes back as the new primary's standby, never as a primary.
        _stack(env, "pg", "start")
        seen_pids.update(_postmaster_pids(stack_dir))
        status = json.loads(_stack(env, "status", "--json"))
        assert status["postgresql_nodes"] == {
            f"127.0.0.1:{primary}": "standby",
            f"127.0.0.1:{standby}": "primary",
        }
        assert status["postgresql_replication"] == "sync"
        with _connect(primary, standby) as conn:
            conn.execute("INSERT INTO claims VALUES (3)")
        wait_until(lambda: _rows(primary) == [1, 2, 3], 10, message="not on the new standby")
    finally:
        folders = [(stack_dir / f).resolve() for f in ("pg", "pg-standby")]
        seen_pids.update(_postmaster_pids(stack_dir))
        subprocess.run([*STACK, "down"], env=env, capture_output=True, timeout=120, check=False)
        for folder in folders:
            if folder.is_relative_to("/tmp"):
                shutil.rmtree(folder, ignore_errors=True)
    assert not services.reachable(f"127.0.0.1:{primary}")
    assert not services.reachable(f"127.0.0.1:{standby}")
    wait_until(lambda: not any(map(_running, seen_pids)), 10, message=f"left running: {seen_pids}")
