"""The coordinator on the real PostgreSQL: fenced by its term, writes only changes,
resumable after a crash, wakes servers through NOTIFY."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from scheduler import coordinator, jobs, notify
from server import coordinator_loop
from sql import states
from testing import factories, waiting

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


def test_a_drain_retargets_its_jobs_as_drained_and_a_lost_server_as_orphaned(
    engine: sa.Engine,
) -> None:
    """A drain's move is an operator's planned move, not a lost server's: its
    ``retargeted`` event says ``drained`` (the chaos checker's one-fault-one-restart
    tells them apart by it); a drained server that is gone too lost its jobs."""
    for i in range(9):
        factories.job(engine, f"j{i}")
    _become(engine, 1)
    _rebalance(engine, 1)
    on = {server: {n for n, (t, _) in _by_name(engine).items() if t == server} for server in "bc"}
    assert on["b"] and on["c"]
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO drains (server) VALUES ('b'), ('c')"))
    seen = len(_retargets(engine))
    # b is drained and live; c is drained and gone (not among the live servers).
    _rebalance(engine, 1, {"a": 10, "b": 10})
    moved = _retargets(engine)[seen:]
    whys = {(e["from"], e["why"]) for e in moved}
    assert whys == {("b", "drained"), ("c", "orphaned")}, moved
    assert len(moved) == len(on["b"]) + len(on["c"])


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
    loop = coordinator_loop.CoordinatorLoop(
        engine,
        "a",
        9,
        servers=lambda: dict(servers),
        live=lambda: list(servers),
        policy=coordinator.RebalancePolicy(epsilon=0.25, vnodes=160, debounce=0.05, interval=30),
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


# ---------------------------------------------------------------- sticky placement


def _sticky(
    engine: sa.Engine,
    servers: dict[str, int],
    *,
    term: int = 1,
    settle: float = 0.0,
    hold: float = 0.0,
):
    with engine.begin() as conn:
        return coordinator.rebalance(
            conn, term, "a", servers, epsilon=0.05, vnodes=160, settle=settle, hold=hold
        )


def _by_name(engine: sa.Engine) -> dict[str, tuple[str | None, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT j.name, d.target, d.pending_reason FROM distribution d "
                "JOIN jobs j ON j.id = d.job_id"
            )
        ).all()
    return {name: (target, reason) for name, target, reason in rows}


def _retargets(engine: sa.Engine) -> list[dict]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text("SELECT detail FROM job_events WHERE kind = 'retargeted' ORDER BY id")
            ).scalars()
        )


def test_job_churn_moves_no_other_job(engine: sa.Engine) -> None:
    for i in range(12):
        factories.job(engine, f"j{i}")
    _become(engine, 1)
    _sticky(engine, SERVERS)
    before = _by_name(engine)
    with engine.begin() as conn:
        jobs.stop(conn, "j0")
        jobs.stop(conn, "j5")
    for i in range(12, 20):
        factories.job(engine, f"j{i}")
    result = _sticky(engine, SERVERS)
    after = _by_name(engine)
    assert result.moved == 0
    for name in (f"j{i}" for i in range(1, 12) if i != 5):
        assert after[name] == before[name]
    assert after["j0"] == (None, None) and after["j5"] == (None, None)


def test_new_jobs_wait_while_membership_settles_then_spread_over_every_server(
    engine: sa.Engine,
) -> None:
    for i in range(6):
        factories.job(engine, f"j{i}")
    _become(engine, 1)
    result = _sticky(engine, SERVERS, settle=60)
    assert result.pending == 6 and result.settle_due is not None and result.settle_due > 50
    reasons = {reason for _, reason in _by_name(engine).values()}
    assert reasons == {
        "membership settling: new jobs wait until a, b, c have been up for the settle window (60 s)"
    }
    with engine.begin() as conn:  # the window passes
        conn.execute(sa.text("UPDATE ring_members SET joined_at = now() - interval '2 min'"))
    result = _sticky(engine, SERVERS, settle=60)
    assert result.pending == 0 and result.moved == 0
    assert set(target for target, _ in _by_name(engine).values()) == set(SERVERS)


def test_a_join_moves_streaming_jobs_to_the_joiner_only_after_its_settle_window(
    engine: sa.Engine,
) -> None:
    for i in range(24):
        factories.job(engine, f"s{i}")
    for i in range(6):
        factories.job(engine, f"b{i}", kind=states.JobKind.BATCH)
    _become(engine, 1)
    _sticky(engine, SERVERS)
    before = _by_name(engine)
    bigger = {**SERVERS, "d": 10}
    assert _sticky(engine, bigger, settle=60).changed == 0  # d is settling
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE ring_members SET joined_at = now() - interval '2 min' WHERE server = 'd'"
            )
        )
    result = _sticky(engine, bigger, settle=60)
    after = _by_name(engine)
    moved = {name for name in before if after[name] != before[name]}
    assert moved and result.moved == len(moved)
    assert {after[name][0] for name in moved} == {"d"}
    assert all(name.startswith("s") for name in moved)  # batch jobs never move for balance
    assert {e["why"] for e in _retargets(engine)[-len(moved) :]} == {"joined"}
    # A new coordinator (failover) knows the same members: nothing more moves.
    _become(engine, 2, server="b")
    assert _sticky(engine, bigger, term=2, settle=60).changed == 0


def test_a_leave_is_never_delayed_and_a_flap_moves_nothing_back(engine: sa.Engine) -> None:
    for i in range(12):
        factories.job(engine, f"j{i}")
    _become(engine, 1)
    _sticky(engine, SERVERS)
    before = _by_name(engine)
    on_c = {name for name, (target, _) in before.items() if target == "c"}
    without_c = {"a": 10, "b": 10}
    _sticky(engine, without_c, settle=60)  # c left: its jobs go at once
    during = _by_name(engine)
    assert {name for name in before if during[name] != before[name]} == on_c
    assert all(during[name][0] in without_c for name in on_c)
    assert _sticky(engine, SERVERS, settle=60).changed == 0  # back within the window
    assert _by_name(engine) == during


def test_a_server_back_after_a_fault_takes_back_no_running_job(engine: sa.Engine) -> None:
    """One fault, one restart (issue 24): c crashes (kill -9, SIGTERM, SIGSTOP past the
    session), its jobs fail over and run elsewhere; when c returns, however long after,
    it is a known member, not a joiner: no job moves back to it (before: a fresh join
    past the settle window, which moved its streaming jobs back: a second restart)."""
    for i in range(12):
        factories.job(engine, f"j{i}")
    _become(engine, 1)
    _sticky(engine, SERVERS)
    with engine.begin() as conn:  # long settled
        conn.execute(sa.text("UPDATE ring_members SET joined_at = now() - interval '1 hour'"))
    without_c = {"a": 10, "b": 10}
    _sticky(engine, without_c, settle=5)  # c left: its jobs fail over at once
    during = _by_name(engine)
    assert "c" not in {target for target, _ in during.values()}
    with engine.begin() as conn:  # it was away for ten minutes
        conn.execute(sa.text("UPDATE ring_members SET left_at = now() - interval '10 min'"))
    assert _sticky(engine, SERVERS, settle=5).moved == 0
    with engine.begin() as conn:  # and has been back for longer than any window
        conn.execute(sa.text("UPDATE ring_members SET joined_at = now() - interval '1 hour'"))
    assert _sticky(engine, SERVERS, settle=5).moved == 0
    assert _by_name(engine) == during
    # It still takes new jobs.
    for i in range(12, 18):
        factories.job(engine, f"j{i}")
    _sticky(engine, SERVERS, settle=5)
    assert "c" in {target for target, _ in _by_name(engine).values()}


def test_a_server_back_within_the_hold_is_a_return_not_a_join(engine: sa.Engine) -> None:
    """A restarted server (a planned restart with a hand-over window, or a crash whose
    successor started slowly) is back after the settle window but within the hold of its
    live leases: it adopted its drivers, none of its jobs moved, so it is no joiner and
    takes no job from the others. Before this rule, every server of a rolling restart
    came back as a joiner once its restart took longer than the settle window, and took
    streaming jobs (5 of 12 drivers replaced in `benchmarks/adoption.py`)."""
    from scheduler import distribution
    from testing.factories import owner

    ids = {f"j{i}": factories.job(engine, f"j{i}") for i in range(12)}
    _become(engine, 1)
    _sticky(engine, SERVERS)
    with engine.begin() as conn:  # long settled, every job running on its target
        conn.execute(sa.text("UPDATE ring_members SET joined_at = now() - interval '2 min'"))
    before = _by_name(engine)
    with engine.begin() as conn:
        for name, job_id in ids.items():
            distribution.claim(conn, job_id, owner(before[name][0]), 60.0)
    _sticky(engine, {"a": 10, "b": 10}, settle=5, hold=30)  # c left; its jobs are held
    assert _by_name(engine) == before
    with engine.begin() as conn:  # 10 s ago: past the settle window, within the hold
        conn.execute(
            sa.text("UPDATE ring_members SET left_at = now() - interval '10 s' WHERE server = 'c'")
        )
    assert _sticky(engine, SERVERS, settle=5, hold=30).moved == 0
    with engine.begin() as conn:  # however long it has been back, c is no joiner
        conn.execute(sa.text("UPDATE ring_members SET joined_at = now() - interval '2 min'"))
    assert _sticky(engine, SERVERS, settle=5, hold=30).moved == 0
    assert _by_name(engine) == before


def test_a_full_cluster_leaves_new_jobs_pending_in_start_order(engine: sa.Engine) -> None:
    for i in range(4):
        factories.job(engine, f"run{i}")
    _become(engine, 1)
    _sticky(engine, {"a": 2, "b": 2})
    running = _by_name(engine)
    factories.job(engine, "first")
    factories.job(engine, "second")
    _sticky(engine, {"a": 2, "b": 2})
    after = _by_name(engine)
    assert {name: after[name] for name in running} == running  # nothing evicted
    assert after["first"][0] is None and after["first"][1].startswith("cluster full:")
    with engine.begin() as conn:
        jobs.stop(conn, "run0")
    _sticky(engine, {"a": 2, "b": 2})
    after = _by_name(engine)
    assert after["first"][0] is not None and after["second"][0] is None


def test_a_requested_rebalance_moves_streaming_jobs_only_and_is_cleared(
    engine: sa.Engine,
) -> None:
    for i in range(9):
        factories.job(engine, f"s{i}")
    for i in range(3):
        factories.job(engine, f"b{i}", kind=states.JobKind.BATCH)
    _become(engine, 1)
    _sticky(engine, {"a": 20})
    _sticky(engine, {"a": 20, "b": 20, "c": 20})  # b and c joined
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE distribution SET target = 'a'"))  # drifted
        coordinator.request_rebalance(conn)
        assert coordinator.rebalance_pending(conn)
    result = _sticky(engine, {"a": 20, "b": 20, "c": 20})
    after = _by_name(engine)
    assert result.moved > 0
    assert all(after[f"b{i}"][0] == "a" for i in range(3))
    with engine.connect() as conn:
        assert not coordinator.rebalance_pending(conn)
    assert _sticky(engine, {"a": 20, "b": 20, "c": 20}).changed == 0


def test_a_departed_owner_s_live_lease_holds_its_target_for_the_hold_window(
    engine: sa.Engine,
) -> None:
    """A server restarting on its host adopts its drivers and renews their leases: for a
    hold window after it left, its jobs keep their target (no migration of adopted
    drivers). Once the lease expires (a crash without successor), or the window ends
    (a server cut off from ZooKeeper that keeps renewing), the job is placed on a live
    server."""
    from scheduler import distribution
    from testing.factories import owner

    def rebalance(servers: dict[str, int]) -> coordinator.Rebalance:
        with engine.begin() as conn:
            return coordinator.rebalance(conn, 5, "a", servers, epsilon=0.25, vnodes=160, hold=30.0)

    job_id = factories.job(engine, "j")
    _become(engine, 5)
    rebalance(SERVERS)
    first = _targets(engine)[job_id]
    with engine.begin() as conn:
        distribution.claim(conn, job_id, owner(first), 60.0)
    survivors = {s: c for s, c in SERVERS.items() if s != first}
    held = rebalance(survivors)  # the owner's ZooKeeper session expired
    assert _targets(engine)[job_id] == first
    assert held.held_due is not None and 0 < held.held_due <= 30.0
    # Without a hold window nothing is held (the old behaviour).
    with engine.connect() as conn:
        unheld = coordinator.plan(conn, survivors, epsilon=0.25, vnodes=160)
    assert "j" not in unheld.held
    # The owner left longer ago than the window but still renews (cut off from
    # ZooKeeper only): the job goes elsewhere, and the owner will stop its driver.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE ring_members SET left_at = now() - interval '31 seconds'"))
    moved = rebalance(survivors)
    assert _targets(engine)[job_id] in survivors and moved.held_due is None


def test_a_departed_owner_s_expired_lease_holds_nothing(engine: sa.Engine) -> None:
    from scheduler import distribution
    from testing.factories import owner

    job_id = factories.job(engine, "j")
    _become(engine, 5)
    with engine.begin() as conn:
        coordinator.rebalance(conn, 5, "a", SERVERS, epsilon=0.25, vnodes=160, hold=30.0)
    first = _targets(engine)[job_id]
    with engine.begin() as conn:
        distribution.claim(conn, job_id, owner(first), 60.0)
    factories.expire_lease(engine, job_id)  # crashed, no successor: failover
    survivors = {s: c for s, c in SERVERS.items() if s != first}
    with engine.begin() as conn:
        coordinator.rebalance(conn, 5, "a", survivors, epsilon=0.25, vnodes=160, hold=30.0)
    assert _targets(engine)[job_id] in survivors


@pytest.mark.parametrize("leader", [True, False])
def test_after_zookeeper_lost_its_history_the_confirmed_leader_takes_over(
    engine: sa.Engine, leader: bool
) -> None:
    """A wiped ensemble restarts its zxids: every new term is below the recorded one.
    The coordinator ZooKeeper confirms as leader takes over; an unconfirmed one is
    deposed as before."""
    factories.job(engine, "j")
    _become(engine, 1 << 40, server="x")  # a term of the lost history
    deposed = threading.Event()
    loop = coordinator_loop.CoordinatorLoop(
        engine,
        "a",
        7,
        servers=lambda: {"a": 10},
        live=lambda: ["a"],
        policy=coordinator.RebalancePolicy(epsilon=0.25, vnodes=160, debounce=0.05, interval=30),
        on_deposed=deposed.set,
        still_leader=lambda: leader,
    )
    loop.start()
    try:
        if leader:
            waiting.wait_until(lambda: _targets(engine) == {1: "a"}, 10, message="placement")
            with engine.connect() as conn:
                recorded = conn.execute(sa.text("SELECT term, server FROM coordinator")).one()
            assert tuple(recorded) == (7, "a")
            with pytest.raises(coordinator.DeposedError):  # the old history's holder
                _rebalance(engine, 1 << 40)
        else:
            waiting.wait_until(deposed.is_set, 10, message="deposed")
            assert _targets(engine) == {1: None}
    finally:
        loop.stop()


# ---------------------------------------------------------------- lapsed leases (H7)


def _lapse(engine: sa.Engine, job_id: int, seconds: float) -> None:
    """Make the job's lease have expired ``seconds`` ago (its live owner stopped renewing:
    cut off from PostgreSQL while still in ZooKeeper)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE distribution SET lease_until = now() - make_interval(secs => :s) "
                "WHERE job_id = :j"
            ),
            {"j": job_id, "s": seconds},
        )


def test_a_live_owner_whose_lease_lapsed_past_the_grace_loses_its_job(engine: sa.Engine) -> None:
    """H7: a server cut off from PostgreSQL only stays in ZooKeeper. Once its lease has
    been expired for longer than the grace, its job is placed on another server (which
    may claim over the expired lease) and it takes no new job; a lease expired a second
    ago moves nothing (the owner re-claims it at its next poll)."""
    from scheduler import distribution
    from testing.factories import owner

    job_id = factories.job(engine, "j")
    _become(engine, 5)
    _rebalance(engine, 5)
    first = _targets(engine)[job_id]
    with engine.begin() as conn:
        distribution.claim(conn, job_id, owner(first), 60.0)

    def planned() -> coordinator.Plan:
        with engine.connect() as conn:
            return coordinator.plan(conn, SERVERS, epsilon=0.25, vnodes=160, lapse=16.0)

    _lapse(engine, job_id, 1.0)
    assert planned().placement.targets["j"] == first
    _lapse(engine, job_id, 30.0)
    moved = planned()
    assert moved.placement.targets["j"] not in (first, None)
    assert moved.lapsed == {"j": first}
    # Every lease of that server lapsed: its renewals fail, so it gets no new job.
    for i in range(12):
        factories.job(engine, f"new{i}")
    assert first not in planned().placement.targets.values()
    # Without a lapse threshold (the coordinator just reconnected) nothing moves.
    with engine.connect() as conn:
        kept = coordinator.plan(conn, SERVERS, epsilon=0.25, vnodes=160)
    assert kept.placement.targets["j"] == first


def test_a_server_that_defers_a_job_three_times_in_a_row_steps_back_from_it(
    engine: sa.Engine,
) -> None:
    """H7 (same class): a server whose every start of a job fails for a reason that may
    pass (a full work dir, a broken spark-submit) defers it and claims it again for
    ever. After ``defer_streak`` deferrals there with no driver started since, the job
    is placed on another server for ``defer_window`` seconds; fewer move nothing."""
    from scheduler import distribution
    from testing.factories import owner

    job_id = factories.job(engine, "j")
    _become(engine, 5)
    _rebalance(engine, 5)
    first = _targets(engine)[job_id]

    def defer_once() -> None:
        with engine.begin() as conn:
            claim = distribution.claim(conn, job_id, owner(first), 60.0)
            distribution.defer(conn, job_id, owner(first), claim.epoch, "No space left", 0.0)

    def planned(window: float = 300.0) -> coordinator.Plan:
        with engine.connect() as conn:
            return coordinator.plan(
                conn, SERVERS, epsilon=0.25, vnodes=160, defer_streak=3, defer_window=window
            )

    defer_once()
    defer_once()
    assert planned().placement.targets["j"] == first
    defer_once()
    moved = planned()
    assert moved.placement.targets["j"] not in (first, None)
    assert moved.placement.why["j"] == "avoided"
    assert moved.deferring == {"j": frozenset({first})}
    # Older than the window: the server may have been repaired, it is tried again.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE job_events SET at = at - interval '301 seconds'"))
    assert planned().placement.targets["j"] == first
    # A driver started since (there or anywhere) ends the streak.
    for _ in range(3):
        defer_once()
    assert planned().placement.targets["j"] != first
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, owner(first), 60.0)
        distribution.mark_running(conn, job_id, owner(first), claim.epoch, pid=1)
        distribution.release(conn, job_id, owner(first), claim.epoch)
    assert planned().placement.targets["j"] == first


# ---------------------------------------------------------------- gentle joins


def _run_on_targets(engine: sa.Engine, ids: dict[str, int], age: str = "1 hour") -> None:
    """Every job claimed by its target and running there, its run ``age`` old."""
    from scheduler import distribution

    targets = _by_name(engine)
    with engine.begin() as conn:
        for name, job_id in ids.items():
            server = factories.owner(targets[name][0])
            claim = distribution.claim(conn, job_id, server, 60.0)
            distribution.mark_running(conn, job_id, server, claim.epoch, 1)
        conn.execute(sa.text(f"UPDATE distribution SET started_at = now() - interval '{age}'"))


def _complete_move(engine: sa.Engine, job_id: int) -> None:
    """The old owner stops the driver and releases the job; the target claims it and
    its driver runs (a new run: its residency starts now)."""
    from scheduler import distribution

    with engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT owner, target, epoch FROM distribution WHERE job_id = :j"),
            {"j": job_id},
        ).one()
    old, new = factories.owner(row.owner), factories.owner(row.target)
    with engine.begin() as conn:
        distribution.begin_stop(conn, job_id, old, row.epoch, "retargeted")
        distribution.release(conn, job_id, old, row.epoch)
        claim = distribution.claim(conn, job_id, new, 60.0)
        distribution.mark_running(conn, job_id, new, claim.epoch, 1)


def _gentle(engine: sa.Engine, servers: dict[str, int], residency: float = 300.0):
    with engine.begin() as conn:
        return coordinator.rebalance(
            conn, 1, "a", servers, epsilon=0.05, vnodes=160, settle=5, residency=residency
        )


def _settled(engine: sa.Engine, server: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT settled FROM ring_members WHERE server = :s"), {"s": server}
        ).scalar_one()


def test_a_join_moves_only_resident_jobs_one_move_per_server_at_a_time(
    engine: sa.Engine,
) -> None:
    """Gentle rebalance (issue 24): the joiner takes only jobs that ran healthily for the
    residency, one move at a time (it is one end of each), never a job that failed over
    or moved within the residency; its join stays open until the last such move."""
    ids = {f"s{i}": factories.job(engine, f"s{i}") for i in range(24)}
    _become(engine, 1)
    _sticky(engine, SERVERS)
    _run_on_targets(engine, ids)
    with engine.begin() as conn:  # two jobs failed over a minute ago
        conn.execute(
            sa.text(
                "UPDATE distribution SET started_at = now() - interval '1 min' "
                "WHERE job_id = ANY(:ids)"
            ),
            {"ids": [ids["s0"], ids["s1"]]},
        )
    bigger = {**SERVERS, "d": 10}
    assert _gentle(engine, bigger).moved == 0  # d settles first
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE ring_members SET joined_at = now() - interval '2 min' WHERE server = 'd'"
            )
        )
    moves: list[str] = []
    for _ in range(30):
        before = _by_name(engine)
        result = _gentle(engine, bigger)
        after = _by_name(engine)
        moved = [n for n in after if after[n] != before[n]]
        assert len(moved) == result.moved <= 1
        if not moved:
            break
        assert after[moved[0]][0] == "d" and moved[0] not in ("s0", "s1")
        assert not _settled(engine, "d")
        assert _gentle(engine, bigger).moved == 0  # d is busy until the move completes
        moves += moved
        _complete_move(engine, ids[moved[0]])
    assert len(moves) >= 2, moves
    # The young jobs wait; once they have run for the residency, they may move too.
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE distribution SET started_at = now() - interval '1 hour' "
                "WHERE job_id = ANY(:ids)"
            ),
            {"ids": [ids["s0"], ids["s1"]]},
        )
    for _ in range(5):
        result = _gentle(engine, bigger)
        if not result.moved:
            break
        moved = [n for n, (t, _) in _by_name(engine).items() if t == "d" and n not in moves]
        moves += moved
        for name in moved:
            _complete_move(engine, ids[name])
    assert _settled(engine, "d")
    assert len(moves) == len(set(moves))  # no job moved twice
    assert {t for t, _ in _by_name(engine).values()} == set(bigger)


def test_a_joins_young_jobs_keep_it_open_and_unhealthy_ones_do_not(engine: sa.Engine) -> None:
    ids = {f"s{i}": factories.job(engine, f"s{i}") for i in range(12)}
    _become(engine, 1)
    _sticky(engine, SERVERS)
    _run_on_targets(engine, ids, age="10 s")  # every job just (re)started
    bigger = {**SERVERS, "d": 10}
    _gentle(engine, bigger)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE ring_members SET joined_at = now() - interval '2 min'"))
    result = _gentle(engine, bigger)
    assert result.moved == 0 and not _settled(engine, "d")
    assert result.join_due is not None and 280 < result.join_due <= 290
    with engine.begin() as conn:  # every run flagged (stalled): none is moved for balance
        conn.execute(
            sa.text(
                "INSERT INTO run_health (job_id, epoch, server, app_state, flag, flagged_at) "
                "SELECT job_id, epoch, owner, 'RUNNING', 'stalled', now() FROM distribution"
            )
        )
    result = _gentle(engine, bigger)
    assert result.moved == 0 and _settled(engine, "d")


def test_a_claim_between_the_plan_and_its_write_is_not_undone(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coordinator writes a target only on the row it planned from: a claim that
    commits between its read and its write (a server that came back from a PostgreSQL
    outage, claiming on the target it had) keeps its target, and no retarget event is
    written for it. Before: the plan, made from the row before the claim, moved the
    job just after it started, and the job started twice for one fault (the campaign's
    PostgreSQL-past-the-lease case under load, a clean-clone run at 1d3b02e)."""
    from scheduler import distribution

    job_id = factories.job(engine, "j")
    _become(engine, 1)
    _rebalance(engine, 1, {"b": 10})
    assert _targets(engine) == {job_id: "b"}
    read = coordinator.job_rows

    def read_then_claimed(conn: sa.Connection) -> list[sa.Row]:
        rows = read(conn)
        with engine.begin() as other:  # b's claim commits while the coordinator plans
            distribution.claim(other, job_id, distribution.Owner("b", "b-1"), 30.0)
        return rows

    monkeypatch.setattr(coordinator, "job_rows", read_then_claimed)
    seen = len(_retargets(engine))
    generation = _ring_generation(engine)
    result = _rebalance(engine, 1, {"a": 10})  # b missing from this view: the plan moves j
    assert _targets(engine) == {job_id: "b"}
    assert _retargets(engine)[seen:] == []
    assert result.changed == 0
    # Nothing written, nothing announced: the ring's generation stays.
    assert result.ring_generation is None
    assert _ring_generation(engine) == generation


def _ring_generation(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT ring_generation FROM coordinator WHERE id = 1")
        ).scalar_one()
