"""sql/replication: what a server says of its database's replication at start."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from sql import replication
from sql.replication import Replication


def test_commits_waiting_for_a_connected_standby_are_safe() -> None:
    level, line = Replication("on", "standby1", 1, 1).verdict(listed_hosts=2)
    assert level == logging.INFO and "loses no claim" in line


@pytest.mark.parametrize("commit", ["local", "off"])
def test_a_standby_not_waited_for_is_a_warning(commit: str) -> None:
    level, line = Replication(commit, "standby1", 1, 0).verdict(listed_hosts=2)
    assert level == logging.WARNING and "run a job twice" in line


def test_an_asynchronous_standby_is_a_warning() -> None:
    level, line = Replication("on", "", 2, 0).verdict(listed_hosts=1)
    assert level == logging.WARNING and "2 standby(s)" in line


def test_several_hosts_without_synchronous_replication_is_a_warning() -> None:
    level, _ = Replication("on", "", 0, 0).verdict(listed_hosts=2)
    assert level == logging.WARNING


def test_a_synchronous_standby_that_is_gone_blocks_commits() -> None:
    level, line = Replication("on", "standby1", 0, 0).verdict(listed_hosts=2)
    assert level == logging.WARNING and "blocks" in line


def test_one_database_without_standby_is_said_plainly() -> None:
    level, line = Replication("on", "", 0, 0).verdict(listed_hosts=1)
    assert level == logging.INFO and "failover is not" in line


def test_inspect_reads_the_stacks_postgresql(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        seen = replication.inspect(conn)
        names = conn.execute(sa.text("SHOW synchronous_standby_names")).scalar()
    assert seen.standby_names == names
    assert seen.synchronous_commit in {"on", "off", "local", "remote_write", "remote_apply"}
    assert seen.sync_standbys <= seen.standbys
