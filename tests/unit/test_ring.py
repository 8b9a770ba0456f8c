"""The plain consistent-hash ring: stable positions, order independence, minimal movement."""

from __future__ import annotations

import collections

import pytest
import uhashring
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import ring

names = st.text(alphabet="abcxyz-_.0123456789", min_size=1, max_size=8)
job_sets = st.sets(names, max_size=60)
server_sets = st.sets(names, min_size=1, max_size=8)
small_vnodes = st.integers(min_value=1, max_value=24)
FAST = settings(max_examples=60, deadline=None)


def test_position_is_md5_of_the_name() -> None:
    # The same value `printf job-1 | md5sum` prints: no Python hash(), no salt.
    assert ring.position("job-1") == 0xAC15A52E59F363D653442A598FFAB484


def test_vnode_points_are_pinned() -> None:
    # uhashring names vnode i of server s "s-i". If an upgrade changed that, every job
    # would move on a coordinator running the new version: fail here instead.
    built = ring.build(["alpha", "beta"], vnodes=3)
    expected = sorted(
        (ring.position(f"{server}-{i}"), server) for server in ("alpha", "beta") for i in range(3)
    )
    assert list(zip(built.points, built.owners, strict=True)) == expected
    assert built.servers == ("alpha", "beta")


def test_assignment_is_pinned() -> None:
    jobs = [f"etl-{i}" for i in range(8)]
    assert ring.assign(jobs, ["alpha", "beta", "gamma"]) == {
        "etl-0": "beta",
        "etl-1": "gamma",
        "etl-2": "beta",
        "etl-3": "alpha",
        "etl-4": "beta",
        "etl-5": "beta",
        "etl-6": "gamma",
        "etl-7": "alpha",
    }


@FAST
@given(jobs=job_sets, servers=server_sets, vnodes=small_vnodes)
def test_agrees_with_uhashring(jobs: set[str], servers: set[str], vnodes: int) -> None:
    reference = uhashring.HashRing(
        nodes={s: {"vnodes": vnodes, "weight": 1} for s in sorted(servers)},
        hash_fn=ring.position,
        vnodes=vnodes,
    )
    assert ring.assign(jobs, servers, vnodes) == {job: reference.get_node(job) for job in jobs}


def test_a_job_exactly_on_a_vnode_goes_to_the_next_one() -> None:
    # "a-0" is the name uhashring hashes for vnode 0 of server a: the job sits on it.
    assert ring.assign(["a-0"], ["a", "b"], vnodes=1) == {"a-0": "b"}


@FAST
@given(jobs=job_sets, servers=server_sets, vnodes=small_vnodes, data=st.data())
def test_order_independent(
    jobs: set[str], servers: set[str], vnodes: int, data: st.DataObject
) -> None:
    first = ring.assign(sorted(jobs), sorted(servers), vnodes)
    shuffled_jobs = data.draw(st.permutations(sorted(jobs)))
    shuffled_servers = data.draw(st.permutations(sorted(servers)))
    again = ring.assign(shuffled_jobs + shuffled_jobs[:3], shuffled_servers, vnodes)
    assert list(again.items()) == list(first.items())


@FAST
@given(jobs=job_sets, servers=server_sets, vnodes=small_vnodes)
def test_every_job_goes_to_a_given_server(jobs: set[str], servers: set[str], vnodes: int) -> None:
    assigned = ring.assign(jobs, servers, vnodes)
    assert set(assigned) == jobs
    assert set(assigned.values()) <= servers


@FAST
@given(jobs=job_sets, servers=server_sets, joining=names, vnodes=small_vnodes)
def test_join_moves_only_jobs_to_the_new_server(
    jobs: set[str], servers: set[str], joining: str, vnodes: int
) -> None:
    before = ring.assign(jobs, servers - {joining}, vnodes)
    after = ring.assign(jobs, servers | {joining}, vnodes)
    for job in jobs:
        if after[job] != before.get(job):
            assert after[job] == joining


@FAST
@given(jobs=job_sets, servers=server_sets, vnodes=small_vnodes, data=st.data())
def test_leave_moves_only_jobs_of_the_leaving_server(
    jobs: set[str], servers: set[str], vnodes: int, data: st.DataObject
) -> None:
    leaving = data.draw(st.sampled_from(sorted(servers)))
    before = ring.assign(jobs, servers, vnodes)
    after = ring.assign(jobs, servers - {leaving}, vnodes)
    for job in after:
        if after[job] != before[job]:
            assert before[job] == leaving
        assert after[job] != leaving


def test_no_servers_gives_no_assignment() -> None:
    assert ring.assign(["a", "b"], []) == {}
    assert ring.assign([], ["a"]) == {}


def test_plain_ring_balance_at_ten_servers() -> None:
    # The plain ring's spread with 160 vnodes: the reason placement adds bounded loads.
    jobs = [f"job-{i:05d}" for i in range(10_000)]
    loads = collections.Counter(ring.assign(jobs, [f"server-{i:02d}" for i in range(10)]).values())
    assert len(loads) == 10
    assert 1.0 < max(loads.values()) / 1_000 < 1.25


def test_walk_visits_each_server_once_in_ring_order() -> None:
    built = ring.build(["a", "b", "c"], vnodes=8)
    at = ring.position("some-job")
    walked = list(ring.walk(built, at))
    assert sorted(server for server, _ in walked) == ["a", "b", "c"]
    distances = [ring.distance(at, point) for _, point in walked]
    assert distances == sorted(distances)
    assert walked[0][0] == ring.assign(["some-job"], ["a", "b", "c"], vnodes=8)["some-job"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ring.assign(["j"], ["a"], vnodes=0), "vnodes must be a positive integer"),
        (lambda: ring.assign(["j"], ["a"], vnodes=True), "vnodes must be a positive integer"),
        (lambda: ring.assign(["j"], ["a", ""]), "a server name must be a non-empty string"),
        (lambda: ring.assign([7], ["a"]), "a job name must be a non-empty string"),  # type: ignore[list-item]
        (lambda: ring.assign(["j"], "abc"), "servers must be a collection of names"),
        (lambda: ring.successor(ring.build([]), 5), "the ring has no servers"),
    ],
)
def test_bad_input_is_a_clear_error(call: object, message: str) -> None:
    with pytest.raises(ring.RingError, match=message):
        call()  # type: ignore[operator]


def test_a_ring_over_the_same_servers_is_built_once() -> None:
    """A coordinator cycle over an unchanged membership reuses the ring (it is immutable)."""
    first = ring.build(["s2", "s1"], 160)
    assert ring.build(("s1", "s2", "s1"), 160) is first
    assert ring.build(["s1", "s2", "s3"], 160) is not first
    assert ring.build(["s1", "s2"], 8) is not first
