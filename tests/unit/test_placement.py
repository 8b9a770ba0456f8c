"""Bounded-load placement: bounds, capacity, pending reasons, explain, balance, movement."""

from __future__ import annotations

import fractions
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import placement, ring

names = st.text(alphabet="abcxyz-_.0123456789", min_size=1, max_size=8)
job_sets = st.sets(names, max_size=60)
capacities = st.dictionaries(names, st.integers(min_value=0, max_value=30), max_size=6)
epsilons = st.sampled_from([0.0, 0.05, 0.1, 0.25, 1.0])
small_vnodes = st.integers(min_value=1, max_value=24)
FAST = settings(max_examples=60, deadline=None)

# The scale of the acceptance figures.
K, N = 10_000, 10
JOBS = [f"job-{i:05d}" for i in range(K)]
SERVERS = {f"server-{i:02d}": 10_000 for i in range(N + 1)}


def _moved(before: placement.Placement, after: placement.Placement) -> int:
    jobs = set(before.targets) | set(before.pending)
    return sum(1 for job in jobs if before.targets.get(job) != after.targets.get(job))


@FAST
@given(jobs=job_sets, servers=capacities, epsilon=epsilons, vnodes=small_vnodes, data=st.data())
def test_order_independent(
    jobs: set[str],
    servers: dict[str, int],
    epsilon: float,
    vnodes: int,
    data: st.DataObject,
) -> None:
    first = placement.place(sorted(jobs), dict(sorted(servers.items())), epsilon, vnodes)
    shuffled_jobs = data.draw(st.permutations(sorted(jobs)))
    shuffled_servers = dict(data.draw(st.permutations(sorted(servers.items()))))
    again = placement.place(shuffled_jobs + shuffled_jobs[:3], shuffled_servers, epsilon, vnodes)
    for field in ("targets", "pending", "loads", "bounds"):
        assert list(getattr(again, field).items()) == list(getattr(first, field).items())


@FAST
@given(jobs=job_sets, servers=capacities, epsilon=epsilons, vnodes=small_vnodes)
def test_bounds_and_capacity_hold(
    jobs: set[str], servers: dict[str, int], epsilon: float, vnodes: int
) -> None:
    result = placement.place(jobs, servers, epsilon, vnodes)
    assert set(result.targets) | set(result.pending) == jobs
    assert not set(result.targets) & set(result.pending)
    assert set(result.loads) == set(result.bounds) == set(servers)
    for server, load in result.loads.items():
        assert load == sum(1 for target in result.targets.values() if target == server)
        assert load <= result.bounds[server] <= servers[server]
    # Every job within total capacity gets a target.
    assert len(result.targets) == min(len(jobs), sum(servers.values()))
    # The textbook bound wherever it is reachable: with ample capacity it is exact.
    live = [c for c in servers.values() if c > 0]
    if live and jobs:
        level = math.ceil((1 + fractions.Fraction(str(epsilon))) * len(jobs) / len(live))
        if min(live) >= level:
            assert all(result.bounds[s] == level for s, c in servers.items() if c > 0)


@FAST
@given(jobs=job_sets, servers=st.sets(names, min_size=1, max_size=6), vnodes=small_vnodes)
def test_without_overflow_it_is_the_plain_ring(
    jobs: set[str], servers: set[str], vnodes: int
) -> None:
    # Bounds no lower than K (epsilon = N) leave nothing to overflow.
    capacity = {server: len(jobs) for server in servers}
    result = placement.place(jobs, capacity, epsilon=len(servers), vnodes=vnodes)
    assert result.targets == ring.assign(jobs, servers, vnodes)


def test_bound_is_exactly_ceil_of_one_plus_epsilon_times_mean() -> None:
    # 1.05 * 10000 / 10 is 1050, not the 1051 that binary floating point would give.
    bounds = placement.place(JOBS, {f"s{i}": 5_000 for i in range(10)}, epsilon=0.05).bounds
    assert set(bounds.values()) == {1050}


def test_small_capacities_raise_the_others_bound_instead_of_leaving_jobs_pending() -> None:
    # min(capacity, ceil(1.05 * 50 / 2)) would be 27 + 10: 13 jobs pending while the big
    # server has 73 free slots. Water-filling raises its bound instead.
    result = placement.place([f"j{i}" for i in range(50)], {"big": 100, "small": 10})
    assert result.pending == {}
    assert result.bounds == {"big": 43, "small": 10}
    assert result.loads["small"] <= 10


def test_capacity_zero_takes_no_jobs() -> None:
    result = placement.place([f"j{i}" for i in range(20)], {"a": 30, "drained": 0})
    assert result.loads == {"a": 20, "drained": 0}
    assert result.pending == {}


def test_pending_reason_when_capacity_runs_out() -> None:
    result = placement.place([f"j{i:02d}" for i in range(20)], {"a": 4, "b": 4, "c": 4})
    assert result.loads == {"a": 4, "b": 4, "c": 4}
    assert len(result.pending) == 8
    assert set(result.pending.values()) == {
        "total capacity 12 of 3 live servers is used by other jobs"
    }


@pytest.mark.parametrize(
    ("servers", "reason"),
    [
        ({}, "no live server"),
        ({"a": 0}, "no live server has capacity (1 live server, all with capacity 0)"),
        ({"a": 0, "b": 0}, "no live server has capacity (2 live servers, all with capacity 0)"),
    ],
)
def test_pending_reason_without_usable_servers(servers: dict[str, int], reason: str) -> None:
    result = placement.place(["x", "y"], servers)
    assert result.targets == {}
    assert result.pending == {"x": reason, "y": reason}
    assert result.loads == dict.fromkeys(servers, 0)


def test_placement_is_pinned() -> None:
    result = placement.place(
        [f"etl-{i}" for i in range(8)], {"alpha": 3, "beta": 3, "gamma": 1}, epsilon=0.0
    )
    assert result.targets == {
        "etl-0": "beta",
        "etl-1": "gamma",
        "etl-2": "beta",
        "etl-3": "alpha",
        "etl-5": "beta",
        "etl-6": "alpha",
        "etl-7": "alpha",
    }
    assert result.pending == {"etl-4": "total capacity 7 of 3 live servers is used by other jobs"}


@FAST
@given(jobs=st.sets(names, min_size=1, max_size=40), servers=capacities, vnodes=small_vnodes)
def test_explain_agrees_with_place(jobs: set[str], servers: dict[str, int], vnodes: int) -> None:
    result = placement.place(jobs, servers, 0.05, vnodes)
    live = sorted(s for s, c in servers.items() if c > 0)
    successors = ring.assign(jobs, live, vnodes)
    for job in sorted(jobs)[:8]:
        why = placement.explain(job, jobs, servers, 0.05, vnodes)
        assert why.job == job
        assert why.ring_position == ring.position(job)
        assert why.target == result.targets.get(job)
        if live:
            assert why.candidates[0].server == successors[job]
        *passed, last = why.candidates or (None,)
        for candidate in passed:
            assert candidate.load == candidate.bound  # full when the job was placed
        if why.target is None:
            assert why.reason == result.pending[job]
            assert [c.server for c in why.candidates] == [
                s for s, _ in ring.walk(ring.build(live, vnodes), why.ring_position)
            ]
        else:
            assert last is not None and last.server == why.target
            assert last.load < last.bound == result.bounds[why.target]
            assert why.overflowed == (len(why.candidates) > 1)
            assert why.target in why.reason


def test_explain_an_overflowed_job() -> None:
    jobs = [f"j{i:03d}" for i in range(300)]
    servers = {"a": 100, "b": 100, "c": 100}
    overflowed = [
        why for why in (placement.explain(j, jobs, servers) for j in jobs[:60]) if why.overflowed
    ]
    assert overflowed, "with equal capacity and a random ring some job must overflow"
    why = overflowed[0]
    assert why.candidates[0].load == why.candidates[0].bound == 100
    assert why.reason.startswith(f"{why.candidates[0].server}, the job's ring successor, was full")


def test_explain_unknown_job_is_an_error() -> None:
    with pytest.raises(ring.RingError, match="job 'nope' is not among the jobs being placed"):
        placement.explain("nope", ["a"], {"s": 1})


@pytest.mark.parametrize(
    ("servers", "epsilon", "message"),
    [
        ({"a": -1}, 0.05, "capacity of server 'a' must be an integer >= 0, got -1"),
        ({"a": 1.5}, 0.05, "capacity of server 'a' must be an integer >= 0, got 1.5"),
        ({"": 1}, 0.05, "a server name must be a non-empty string"),
        ({3: 1}, 0.05, "a server name must be a non-empty string, got 3"),
        (["a"], 0.05, "servers must map server id to capacity, got list"),
        ({"a": 1}, -0.1, "epsilon must be a finite number >= 0"),
        ({"a": 1}, float("nan"), "epsilon must be a finite number >= 0"),
    ],
)
def test_bad_input_is_a_clear_error(servers: object, epsilon: float, message: str) -> None:
    with pytest.raises(ring.RingError, match=message):
        placement.place(["j"], servers, epsilon)  # type: ignore[arg-type]


def test_balance_at_ten_servers() -> None:
    servers = dict(list(SERVERS.items())[:N])
    result = placement.place(JOBS, servers)
    assert result.pending == {}
    assert max(result.loads.values()) / (K / N) <= 1.10


# The movement bound (moved <= 1.10 x the ideal) needs a ring with less spread
# than 160 vnodes gives: at 160 this very case moves 1.22x (join) and 1.17x (leave),
# because bounded loads shift the overflow of servers near their bound. 640 vnodes
# keep it within the bound (benchmarks/placement_balance.py, docs/distribution.md).
MOVEMENT_VNODES = 640


def test_join_moves_at_most_one_point_one_times_the_ideal() -> None:
    servers = dict(list(SERVERS.items())[:N])
    before = placement.place(JOBS, servers, vnodes=MOVEMENT_VNODES)
    after = placement.place(JOBS, SERVERS, vnodes=MOVEMENT_VNODES)
    joined = next(iter(SERVERS.keys() - servers.keys()))
    assert after.loads[joined] > 0
    assert _moved(before, after) <= 1.10 * K / (N + 1)
    assert max(after.loads.values()) / (K / (N + 1)) <= 1.10


def test_leave_moves_at_most_one_point_one_times_the_ideal() -> None:
    servers = dict(list(SERVERS.items())[:N])
    before = placement.place(JOBS, servers, vnodes=MOVEMENT_VNODES)
    left = dict(list(servers.items())[1:])
    after = placement.place(JOBS, left, vnodes=MOVEMENT_VNODES)
    # The ideal for a leave from N servers is the leaving server's fair share, K / N.
    assert _moved(before, after) <= 1.10 * K / N
    assert max(after.loads.values()) / (K / (N - 1)) <= 1.10


# ---------------------------------------------------------------- sticky placement


def _current(result: placement.Placement, streaming: bool = True) -> dict[str, placement.Job]:
    """Every targeted job where it is now (as the coordinator would read it back)."""
    return {
        name: placement.Job(current=t, streaming=streaming) for name, t in result.targets.items()
    }


def _fresh(jobs: int, servers: dict[str, int], vnodes: int) -> placement.Sticky:
    return placement.stick(
        {f"job-{i:05d}": placement.Job() for i in range(jobs)}, servers, vnodes=vnodes
    )


churn_events = st.lists(
    st.tuples(st.sampled_from(["start", "stop", "finish"]), st.integers(0, 59)), max_size=40
)


@FAST
@given(servers=capacities, events=churn_events, vnodes=small_vnodes)
def test_job_churn_with_fixed_membership_moves_no_other_job(
    servers: dict[str, int], events: list[tuple[str, int]], vnodes: int
) -> None:
    jobs: dict[str, placement.Job] = {}
    targets: dict[str, str] = {}
    for tick, (kind, number) in enumerate(events):
        name = f"j{number}"
        if kind == "start" and name not in jobs:
            jobs[name] = placement.Job(queued_at=tick)
        elif kind in ("stop", "finish"):
            jobs.pop(name, None)
        result = placement.stick(jobs, servers, vnodes=vnodes)
        # Never above capacity.
        for server, load in result.loads.items():
            assert load == sum(1 for t in result.targets.values() if t == server)
            assert load <= servers[server]
        # A job that had a target keeps it.
        for job, target in targets.items():
            if job in jobs:
                assert result.targets.get(job) == target, (job, target, result.why.get(job))
        targets = dict(result.targets)
        jobs = {
            n: placement.Job(current=targets.get(n), queued_at=j.queued_at) for n, j in jobs.items()
        }


@FAST
@given(
    jobs=st.sets(names, max_size=60),
    servers=st.sets(names, min_size=1, max_size=6),
    joiner=names,
    batch=st.sets(names, max_size=30),
    vnodes=small_vnodes,
)
def test_a_join_moves_only_streaming_jobs_and_only_to_the_joiner(
    jobs: set[str], servers: set[str], joiner: str, batch: set[str], vnodes: int
) -> None:
    capacity = dict.fromkeys(servers, 100)
    before = placement.stick(dict.fromkeys(jobs, placement.Job()), capacity, vnodes=vnodes)
    current = {
        name: placement.Job(current=t, streaming=name not in batch)
        for name, t in before.targets.items()
    }
    after = placement.stick(current, {**capacity, joiner: 100}, joined=[joiner], vnodes=vnodes)
    for name, target in before.targets.items():
        if after.targets[name] != target:
            assert after.targets[name] == joiner and name not in batch
            assert after.why[name] == placement.Why.JOINED
    if joiner not in servers:
        assert after.loads[joiner] <= after.bounds[joiner]


@FAST
@given(
    jobs=st.sets(names, max_size=60),
    servers=st.sets(names, min_size=2, max_size=6),
    vnodes=small_vnodes,
)
def test_a_leave_moves_only_the_leavers_jobs(
    jobs: set[str], servers: set[str], vnodes: int
) -> None:
    capacity = dict.fromkeys(servers, 100)
    before = placement.stick(dict.fromkeys(jobs, placement.Job()), capacity, vnodes=vnodes)
    leaver = sorted(servers)[0]
    del capacity[leaver]
    after = placement.stick(_current(before), capacity, vnodes=vnodes)
    assert after.pending == {}
    for name, target in before.targets.items():
        if target != leaver:
            assert after.targets[name] == target
        else:
            assert after.targets[name] != leaver and after.why[name] == placement.Why.ORPHANED


@FAST
@given(
    jobs=st.dictionaries(
        names,
        st.builds(
            placement.Job,
            current=st.none() | st.sampled_from(["a", "b", "c", "gone"]),
            streaming=st.booleans(),
            queued_at=st.integers(0, 5),
        ),
        max_size=40,
    ),
    servers=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 12)),
    joined=st.sets(st.sampled_from(["a", "b", "c", "d"])),
    rebalance=st.booleans(),
    data=st.data(),
)
def test_sticky_is_order_independent_and_within_capacity(
    jobs: dict[str, placement.Job],
    servers: dict[str, int],
    joined: set[str],
    rebalance: bool,
    data: st.DataObject,
) -> None:
    first = placement.stick(jobs, servers, joined=sorted(joined), rebalance=rebalance, vnodes=8)
    again = placement.stick(
        dict(data.draw(st.permutations(list(jobs.items())))),
        dict(data.draw(st.permutations(list(servers.items())))),
        joined=data.draw(st.permutations(sorted(joined))),
        rebalance=rebalance,
        vnodes=8,
    )
    assert again == first
    assert set(first.targets) | set(first.pending) == set(jobs)
    for server, load in first.loads.items():
        assert load <= servers[server]
    # Everything fits that can: a job waits only when every slot is taken.
    if first.pending and any(servers.values()):
        assert sum(first.loads.values()) == sum(servers.values())
    # Batch jobs never move while their server stays placeable with room.
    for name, job in jobs.items():
        if not job.streaming and servers.get(job.current or "", 0) >= len(jobs):
            assert first.targets[name] == job.current


def test_a_new_job_never_evicts_a_running_one_and_waits_in_fifo_order() -> None:
    running = {f"r{i}": placement.Job(current="a", queued_at=i) for i in range(4)}
    waiting = {
        "late": placement.Job(queued_at=20),
        "early": placement.Job(queued_at=10),
        "middle": placement.Job(queued_at=15),
    }
    result = placement.stick({**running, **waiting}, {"a": 4})
    assert all(result.targets[name] == "a" for name in running)
    assert set(result.pending) == set(waiting)
    assert result.pending["early"].startswith("cluster full: total capacity 4 of 1 live server")
    # One slot frees up (r0 stops): the earliest start request gets it.
    del running["r0"]
    result = placement.stick({**running, **waiting}, {"a": 4})
    assert result.targets.get("early") == "a"
    assert set(result.pending) == {"middle", "late"}


def test_lowered_capacity_sheds_streaming_before_batch_and_later_before_earlier() -> None:
    jobs = {
        "batch-0": placement.Job(current="a", streaming=False, queued_at=3),
        "stream-0": placement.Job(current="a", queued_at=1),
        "stream-1": placement.Job(current="a", queued_at=2),
    }
    result = placement.stick(jobs, {"a": 2, "b": 1})
    assert result.targets == {"batch-0": "a", "stream-0": "a", "stream-1": "b"}
    assert result.why["stream-1"] == placement.Why.SHED


def test_new_jobs_wait_while_membership_settles_but_orphans_do_not() -> None:
    jobs = {"new": placement.Job(), "orphan": placement.Job(current="gone")}
    result = placement.stick(jobs, {"a": 4}, hold_new="membership settling")
    assert result.pending == {"new": "membership settling"}
    assert result.targets == {"orphan": "a"}


def test_rebalance_moves_streaming_jobs_only() -> None:
    jobs = {f"s{i}": placement.Job(current="a") for i in range(6)}
    jobs |= {f"b{i}": placement.Job(current="a", streaming=False) for i in range(3)}
    result = placement.stick(jobs, {"a": 20, "b": 20, "c": 20}, rebalance=True)
    assert all(result.targets[f"b{i}"] == "a" for i in range(3))
    assert max(result.loads.values()) <= result.bounds["a"]
    assert {result.why[f"s{i}"] for i in range(6)} <= {placement.Why.REBALANCED}


# Join and leave at the sizes. The join bound is moved <= the joiner's bound
# ceil((1 + epsilon) * K / (N + 1)), so moved/ideal <= 1.10 holds once K / (N + 1) >= 10
# (1.53 at N = 50, K = 100, where the ideal is 1.96 jobs per server).
SIZES = [(n, k) for n in (3, 10, 50) for k in (100, 1000, 10_000)]


@pytest.mark.parametrize(("n", "k"), SIZES)
def test_join_and_leave_move_only_what_they_must_at_scale(n: int, k: int) -> None:
    servers = {f"server-{i:02d}": k for i in range(n)}
    before = _fresh(k, servers, vnodes=160)
    if k / n >= 10:
        assert max(before.loads.values()) / (k / n) <= 1.10
    joined = placement.stick(
        _current(before), {**servers, "joiner": k}, joined=["joiner"], vnodes=160
    )
    moved = {name for name, t in before.targets.items() if joined.targets[name] != t}
    assert {joined.targets[name] for name in moved} == {"joiner"}
    ideal = k / (n + 1)
    assert len(moved) / ideal <= max(1.10, math.ceil(1.05 * ideal) / ideal)
    left = dict(list(servers.items())[1:])
    after_leave = placement.stick(_current(before), left, vnodes=160)
    moved = {name for name, t in before.targets.items() if after_leave.targets[name] != t}
    assert moved == {name for name, t in before.targets.items() if t == "server-00"}
    if k / (n - 1) >= 10:
        assert max(after_leave.loads.values()) / (k / (n - 1)) <= 1.10


def test_a_job_never_goes_to_a_server_it_avoids_and_nothing_else_moves() -> None:
    """A job whose current server is avoided for it (its lease lapsed there, or that
    server failed to start it several times in a row) is placed on another server; every
    other job stays where it is."""
    servers = {"a": 10, "b": 10, "c": 10}
    names = [f"j{i}" for i in range(12)]
    before = placement.stick(dict.fromkeys(names, placement.Job()), servers, vnodes=16)
    moved = names[0]
    home = before.targets[moved]
    jobs = {name: placement.Job(current=before.targets[name]) for name in names}
    jobs[moved] = placement.Job(current=home, avoid=frozenset({home}))
    after = placement.stick(jobs, servers, vnodes=16)
    assert after.targets[moved] != home
    assert after.why[moved] == placement.Why.AVOIDED
    assert {n: t for n, t in after.targets.items() if n != moved} == {
        n: t for n, t in before.targets.items() if n != moved
    }
    # A new job that avoids every server but one goes to that one.
    jobs["new"] = placement.Job(avoid=frozenset({"a", "b"}))
    assert placement.stick(jobs, servers, vnodes=16).targets["new"] == "c"
