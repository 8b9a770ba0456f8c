"""``sparkring server list`` against a live registration, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from registry import servers
from server.cli import servers as cli_server
from testing import cli_runner
from testing.waiting import wait_until
from tests.integration import test_registry as helpers


@pytest.fixture
def make(zk_hosts: str, zk_root: str) -> Iterator[helpers.Factory]:
    yield from helpers.registries(zk_hosts, zk_root)


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_runner.run(args, env={**os.environ, **env}, timeout=60)


def test_server_list_shows_live_servers(
    make: helpers.Factory, stack_env: dict[str, str], zk_root: str, database_url: str
) -> None:
    a, _ = make("a")
    w, _ = make("w", role="worker")
    a.start()
    w.start()
    env = {**stack_env, "SPARKRING_ZK_ROOT": zk_root, "SPARKRING_DATABASE_URL": database_url}

    listed = _run(env, "server", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert set(rows) == {"a", "w"}
    assert rows["a"]["coordinator"] is True and rows["a"]["term"] == a.term
    assert rows["w"]["coordinator"] is False and rows["w"]["term"] is None
    assert rows["a"]["role"] == "both" and rows["w"]["role"] == "worker"
    assert rows["a"]["capacity"] == 4 and rows["a"]["session_id"] == a.info.session_id
    assert 0 <= rows["a"]["uptime_s"] < 60

    table = _run({**env, "COLUMNS": "250"}, "server", "list")
    assert table.returncode == 0, table.stderr
    header = [c.strip() for c in table.stdout.splitlines()[0].split("┃")]
    cells = [[c.strip() for c in line.split("│")] for line in table.stdout.splitlines()[2:]]
    lines = {row[0]: row for row in cells}
    assert lines["a"][:5] == ["a", "both", "4", "yes", str(a.term)]
    assert lines["w"][:4] == ["w", "worker", "4", "-"]
    # Where to open each one's console (the port is random by default).
    assert lines["a"][header.index("console")] == f"{a.info.health_url}/console/"


def test_server_list_shows_which_spark_masters_each_server_reaches(
    make: helpers.Factory, stack_env: dict[str, str], zk_hosts: str, zk_root: str, database_url: str
) -> None:
    a, _ = make("a")
    w, _ = make("w", role="worker")
    a.start()
    w.start()
    reported = {"m1:7077": False, "m2:7077": True}
    a.publish(spark_masters=reported)
    wait_until(
        lambda: (
            {s.id: s.spark_masters for s in servers.list_servers(zk_hosts, zk_root)}["a"]
            == reported
        ),
        5,
        message="the report never reached ZooKeeper",
    )
    env = {**stack_env, "SPARKRING_ZK_ROOT": zk_root, "SPARKRING_DATABASE_URL": database_url}

    listed = _run(env, "server", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert rows["a"]["spark_masters"] == reported and rows["w"]["spark_masters"] == {}

    table = _run({**env, "COLUMNS": "250"}, "server", "list")
    assert table.returncode == 0, table.stderr
    header = table.stdout.splitlines()[0]
    columns = [c.strip() for c in header.split("┃")]
    rows = [[c.strip() for c in line.split("│")] for line in table.stdout.splitlines()[2:]]
    cells = {row[0]: row for row in rows if len(row) > 1}
    assert "spark masters" in columns, table.stdout
    where = columns.index("spark masters")
    assert cells["a"][where] == "1/2 up, down: m1:7077"
    assert cells["w"][where] == "-"


def test_the_console_cell() -> None:
    assert cli_server.console_cell("https://h:8090") == "https://h:8090/console/"
    assert cli_server.console_cell("") is None  # a server that published no endpoint


@pytest.mark.parametrize(
    ("report", "shown"),
    [
        ({}, None),
        ({"m1:7077": True}, "1/1 up"),
        ({"m1:7077": True, "m2:7077": True}, "2/2 up"),
        ({"m1:7077": False, "m2:7077": False}, "0/2 up, down: m1:7077 m2:7077"),
    ],
)
def test_the_spark_masters_cell(report: dict[str, bool], shown: str | None) -> None:
    assert cli_server.spark_masters_cell(report) == shown


def test_server_list_with_zookeeper_down_is_one_clear_line(stack_env: dict[str, str]) -> None:
    result = _run({**stack_env, "SPARKRING_ZK_HOSTS": "127.0.0.1:1"}, "server", "list")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: cannot reach ZooKeeper at 127.0.0.1:1 within 5 s"
    ]


def test_drain_of_an_unknown_server_is_refused_and_writes_nothing(
    make: helpers.Factory, stack_env: dict[str, str], zk_root: str, database_url: str
) -> None:
    a, _ = make("a")
    a.start()
    env = {**stack_env, "SPARKRING_ZK_ROOT": zk_root, "SPARKRING_DATABASE_URL": database_url}
    typo = _run(env, "server", "drain", "nosuch")
    assert typo.returncode == 1
    assert "no server 'nosuch'" in typo.stderr and "live: a" in typo.stderr, typo.stderr
    undo = _run(env, "server", "drain", "a", "--undo")
    assert undo.returncode == 1 and "server 'a' is not drained" in undo.stderr, undo.stderr
    drained = _run(env, "server", "drain", "a")
    assert drained.returncode == 0, drained.stderr
    assert "draining" in drained.stdout
    engine = sa.create_engine(sa.make_url(database_url).set(drivername="postgresql+psycopg"))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT server FROM drains")).scalars().all() == ["a"]
    engine.dispose()


def test_server_list_shows_a_drained_server(
    make: helpers.Factory, stack_env: dict[str, str], zk_root: str, database_url: str
) -> None:
    for server_id in ("a", "b"):
        make(server_id)[0].start()
    env = {**stack_env, "SPARKRING_ZK_ROOT": zk_root, "SPARKRING_DATABASE_URL": database_url}
    assert _run(env, "server", "drain", "b").returncode == 0
    listed = _run(env, "server", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {row["id"]: row["drained"] for row in json.loads(listed.stdout)} == {
        "a": False,
        "b": True,
    }
    table = _run(env, "server", "list")
    assert table.returncode == 0, table.stderr
    header = [c.strip() for c in table.stdout.splitlines()[0].split("┃")]
    cells = [[c.strip() for c in line.split("│")] for line in table.stdout.splitlines()[2:]]
    drained = {row[0]: row[header.index("drained")] for row in cells}
    assert drained == {"a": "-", "b": "yes"}
