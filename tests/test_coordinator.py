"""The coordinator on the real PostgreSQL: fenced by its term, writes only changes,
resumable after a crash, wakes servers through NOTIFY."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from scheduler import coordinator, notify
from tests import factories, waiting

SERVERS = {"a": 10, "b": 10, "c": 10}


def _rebalance(engine: sa.Engine, term: int, servers: dict[str, int] = SERVERS):
    with engine.begin() as conn:
        return coordinator.rebalance(conn, term, "a", servers, epsilon=0.25, vnodes=160)


def _targets(engine: sa.Engine) -> dict[int, str | None]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT job_id, target FROM distribution")).all())


def _become(engine: sa.Engine, term: int, server: str = "a") -> None:
    with engine.begin() as conn:
        coordinator.become(conn, term, server)


def test_rebalance_writes_targets_then_nothing_when_nothing_changed(engine: sa.Engine) -> None:
    ids = [factories.job(engine, f"j{i}") for i in range(9)]
    _become(engine, 5)
    first = _rebalance(engine, 5)
    assert first.changed == 9 and first.ring_generation == 1
    targets = _targets(engine)
    assert set(targets) == set(ids) and set(targets.values()) <= set(SERVERS)
    second = _rebalance(engine, 5)
    assert (second.changed, second.ring_generation) == (0, None)
    assert _targets(engine) == targets


def test_a_deposed_coordinator_writes_nothing(engine: sa.Engine) -> None:
    factories.job(engine, "j")
    _become(engine, 5)
    _become(engine, 7, server="b")  # a newer election
    with pytest.raises(coordinator.DeposedError):
        _rebalance(engine, 5)
    assert _targets(engine) == {1: None}
    with pytest.raises(coordinator.DeposedError):
        _become(engine, 6)  # terms only grow
    with pytest.raises(coordinator.DeposedError):
        _become(engine, 7, server="a")  # a term belongs to one server


def test_the_same_coordinator_may_resume_its_term(engine: sa.Engine) -> None:
    """Stepped down on a short disconnection, re-elected with the same election node."""
    factories.job(engine, "j")
    _become(engine, 5)
    _become(engine, 5)
    assert _rebalance(engine, 5).changed == 1


def test_stopped_jobs_lose_their_target_and_capacity_limits_hold(engine: sa.Engine) -> None:
    ids = [factories.job(engine, f"j{i}") for i in range(5)]
    factories.job(engine, "idle", start=False)
    _become(engine, 1)
    result = _rebalance(engine, 1, {"a": 2, "b": 1})
    assert result.pending == 2
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT target, pending_reason FROM distribution WHERE job_id = ANY(:ids)"),
            {"ids": ids},
        ).all()
    assert sum(1 for t, _ in rows if t == "a") <= 2 and sum(1 for t, _ in rows if t == "b") <= 1
    assert all(reason for target, reason in rows if target is None)


def test_drained_servers_get_no_jobs(engine: sa.Engine) -> None:
    for i in range(6):
        factories.job(engine, f"j{i}")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO drains (server) VALUES ('b')"))
    _become(engine, 1)
    _rebalance(engine, 1)
    assert "b" not in set(_targets(engine).values())


def test_rebalance_after_a_crash_mid_transaction_resumes_to_the_same_answer(
    engine: sa.Engine,
) -> None:
    for i in range(20):
        factories.job(engine, f"j{i}")
    _become(engine, 1)
    with engine.connect() as conn:
        conn.begin()
        coordinator.rebalance(conn, 1, "a", SERVERS, epsilon=0.25, vnodes=160)
        conn.rollback()  # the coordinator died before committing
    assert set(_targets(engine).values()) == {None}
    _become(engine, 2, server="b")
    with engine.begin() as conn:
        coordinator.rebalance(conn, 2, "b", SERVERS, epsilon=0.25, vnodes=160)
    recovered = _targets(engine)
    _become(engine, 3)
    assert _rebalance(engine, 3).changed == 0
    assert None not in recovered.values()


def test_notify_wakes_a_listener(engine: sa.Engine, database_url: str) -> None:
    woken: list[tuple[str, str]] = []
    got = threading.Event()

    def on_notify(channel: str, payload: str) -> None:
        woken.append((channel, payload))
        if channel == notify.TARGETS_CHANNEL:
            got.set()

    listener = notify.Listener(database_url, [notify.TARGETS_CHANNEL], on_notify)
    listener.start()
    try:
        assert listener.wait_connected(10)
        factories.job(engine, "j")
        _become(engine, 1)
        _rebalance(engine, 1)
        assert got.wait(10)
    finally:
        listener.stop()
    assert (notify.TARGETS_CHANNEL, "1") in woken


def test_coordinator_loop_rebalances_on_wake_and_stops_when_deposed(engine: sa.Engine) -> None:
    factories.job(engine, "j")
    deposed = threading.Event()
    servers = {"a": 4}
    loop = coordinator.CoordinatorLoop(
        engine,
        "a",
        9,
        servers=lambda: dict(servers),
        live=lambda: list(servers),
        epsilon=0.25,
        vnodes=160,
        debounce=0.05,
        interval=30,
        on_deposed=deposed.set,
    )
    loop.start()
    try:
        waiting.wait_until(lambda: _targets(engine) == {1: "a"}, 10, message="first placement")
        servers.clear()
        servers["b"] = 4
        loop.wake()
        waiting.wait_until(lambda: _targets(engine) == {1: "b"}, 10, message="moved on wake")
        _become(engine, 10, server="b")
        loop.wake()
        assert deposed.wait(10)
    finally:
        loop.stop()
    assert not loop.is_alive()
