"""The gentle rebalance: residency rules (scheduler/residency.py) and a paced join
(placement.stick with a Pace): pure functions, no services."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import placement, residency

FAST = settings(max_examples=60, deadline=None)
R = 300.0  # the residency of these tests


def _run(state: str = "running", owner: str | None = "a", target: str | None = "a", **kw):
    return residency.Run(state=state, owner=owner, target=target, **{"age": 1000.0, **kw})


@pytest.mark.parametrize(
    ("run", "wait"),
    [
        (_run(), 0.0),  # ran healthily for longer than the residency
        (_run(age=R), 0.0),
        (_run(age=100.0), 200.0),  # healthy, too young: movable in 200 s
        (_run(age=0.0), R),  # just failed over or moved
        (_run(state="starting"), None),
        (_run(state="stopping"), None),
        (_run(state="backoff", owner=None, age=None), None),
        (_run(state="pending", owner=None), None),
        (_run(target="b"), None),  # already moving
        (_run(flagged=True), None),  # stalled or waiting for resources: not healthy
        (_run(age=None), None),
    ],
)
def test_seconds_until_movable(run: residency.Run, wait: float | None) -> None:
    assert residency.seconds_until_movable(run, R) == wait


def test_a_negative_residency_is_an_error() -> None:
    with pytest.raises(ValueError, match="minimum residency must be >= 0"):
        residency.seconds_until_movable(_run(), -1)


def test_busy_servers_are_those_in_a_move_or_starting_or_stopping_a_driver() -> None:
    runs = [
        _run(owner="a", target="b"),  # moving from a to b
        _run(state="starting", owner="c", target="c"),
        _run(state="stopping", owner="d", target="d"),  # stopping (a stop command)
        _run(state="pending", owner=None, target="e"),  # about to be claimed on e
        _run(owner="f", target="f"),  # settled
        _run(state="backoff", owner=None, target="g"),  # waits for its backoff: not a move
    ]
    assert residency.busy(runs) == {"a", "b", "c", "d", "e"}


def test_pace_sorts_jobs_into_movable_and_maturing_and_says_when_the_first_matures() -> None:
    runs = {
        "old": _run(),
        "young": _run(age=250.0),
        "younger": _run(age=10.0),
        "sick": _run(flagged=True),
        "moving": _run(owner="a", target="b"),
    }
    pace, due = residency.pace(runs, R)
    assert pace.movable == {"old"}
    assert pace.maturing == {"young", "younger"}
    assert pace.busy == {"a", "b"}
    assert due == pytest.approx(50.0)
    assert residency.pace({"old": _run()}, R)[1] is None


# ---------------------------------------------------------------- a paced join

SERVERS = {"a": 10, "b": 10, "c": 10}
JOINER = "d"


def _placed(count: int) -> dict[str, placement.Job]:
    first = placement.stick({f"j{i}": placement.Job() for i in range(count)}, SERVERS, vnodes=16)
    return {name: placement.Job(current=server) for name, server in first.targets.items()}


def _join(jobs: dict[str, placement.Job], pace: placement.Pace | None) -> placement.Sticky:
    return placement.stick(jobs, {**SERVERS, JOINER: 10}, joined=[JOINER], pace=pace, vnodes=16)


def _moves(jobs: dict[str, placement.Job], result: placement.Sticky) -> dict[str, tuple]:
    return {
        n: (j.current, result.targets[n])
        for n, j in jobs.items()
        if result.targets.get(n) != j.current
    }


def test_a_join_moves_no_job_that_failed_over_or_moved_within_the_residency() -> None:
    jobs = _placed(24)
    unpaced = _moves(jobs, _join(jobs, None))
    assert unpaced, "the joiner takes jobs"
    # Every job it would take failed over a minute ago: nothing moves, the join waits.
    young = frozenset(unpaced)
    pace = placement.Pace(movable=frozenset(jobs) - young, maturing=young)
    result = _join(jobs, pace)
    assert _moves(jobs, result) == {}
    assert result.deferred == {JOINER: len(unpaced)}


def test_a_join_moves_at_most_one_job_per_server_and_none_from_a_busy_one() -> None:
    jobs = _placed(24)
    unpaced = _moves(jobs, _join(jobs, None))
    everything = placement.Pace(movable=frozenset(jobs))
    first = _moves(jobs, _join(jobs, everything))
    assert len(first) == 1  # the joiner is one end of every move
    result = _join(jobs, placement.Pace(movable=frozenset(jobs), busy=frozenset({JOINER})))
    assert _moves(jobs, result) == {} and result.deferred == {JOINER: len(unpaced)}


def test_an_unhealthy_job_is_not_moved_and_does_not_keep_the_join_open() -> None:
    jobs = _placed(24)
    unpaced = _moves(jobs, _join(jobs, None))
    result = _join(jobs, placement.Pace(movable=frozenset()))
    assert _moves(jobs, result) == {} and result.deferred == {}
    assert len(unpaced) > 0


def _paced_rounds(jobs: dict[str, placement.Job], ages: dict[str, int]) -> tuple[int, dict]:
    """Join rounds until no move is deferred: a job is movable once its age (in rounds)
    reaches 2; a move takes one round (both servers busy in the next). Returns the
    number of moves made and the final targets."""
    moved, busy, tick = 0, frozenset(), 0
    jobs = dict(jobs)
    ages = dict(ages)
    while True:
        pace = placement.Pace(
            movable=frozenset(n for n in jobs if ages[n] >= 2),
            maturing=frozenset(n for n in jobs if ages[n] < 2),
            busy=busy,
        )
        result = _join(jobs, pace)
        made = _moves(jobs, result)
        servers = [s for move in made.values() for s in move]
        assert len(servers) == len(set(servers)), f"two moves of one server: {made}"
        for name in made:
            ages[name] = 0  # a move is a new run
        moved += len(made)
        busy = frozenset(servers)
        jobs = {n: placement.Job(current=result.targets[n]) for n in jobs}
        ages = {n: a + 1 for n, a in ages.items()}
        tick += 1
        if not made and not result.deferred and not busy:
            return moved, {n: j.current for n, j in jobs.items()}
        assert tick < 500, "the paced join never completed"


@FAST
@given(count=st.integers(0, 60), ages=st.lists(st.integers(0, 3), min_size=60, max_size=60))
def test_a_paced_join_makes_exactly_the_moves_of_an_unpaced_one_only_later(
    count: int, ages: list[int]
) -> None:
    jobs = _placed(count)
    unpaced = _join(jobs, None)
    moved, final = _paced_rounds(jobs, {n: ages[i] for i, n in enumerate(sorted(jobs))})
    assert moved <= len(_moves(jobs, unpaced))
    # Every move goes to the joiner, and the joiner ends with what it takes at once.
    assert {n for n in jobs if final[n] != jobs[n].current} <= {
        n for n in jobs if final[n] == JOINER
    }
    assert sum(1 for t in final.values() if t == JOINER) == unpaced.loads[JOINER]
