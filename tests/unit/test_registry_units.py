"""Pure logic of the registry: records, names, the state table, candidate order."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry import connection, election, errors, servers, session

ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."

server_infos = st.builds(
    servers.ServerInfo,
    id=st.text(alphabet=ID_CHARS, min_size=1, max_size=64),
    host=st.text(max_size=40),
    pid=st.integers(min_value=1, max_value=2**22),
    capacity=st.integers(min_value=0, max_value=1000),
    role=st.sampled_from(sorted(servers.ROLES)),
    version=st.text(max_size=20),
    started_at=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    health_url=st.text(max_size=40),
    session_id=st.from_regex(r"0x[0-9a-f]{1,16}", fullmatch=True),
)


@given(server_infos)
def test_server_info_round_trips_through_json(info: servers.ServerInfo) -> None:
    assert servers.ServerInfo.from_bytes(info.to_bytes()) == info


def test_unknown_fields_from_newer_versions_are_ignored() -> None:
    raw = servers.ServerInfo("a", "h", 1, 2, "worker", "0.1.0", 1.0).to_dict()
    raw["zone"] = "eu-1"
    assert servers.ServerInfo.from_bytes(json.dumps(raw).encode()).id == "a"


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"id": ""}, "server id ''"),
        ({"id": "a/b"}, "server id 'a/b'"),
        ({"id": "x" * 65}, "1-64 characters"),
        ({"role": "master"}, "server role 'master'"),
        ({"capacity": -1}, "capacity -1"),
        ({"spark_masters": ["m:7077"]}, "spark_masters"),
        ({"spark_masters": {"m:7077": "yes"}}, "spark_masters"),
    ],
)
def test_bad_server_records_are_refused_by_name(kwargs: dict[str, object], problem: str) -> None:
    fields: dict[str, object] = {
        "id": "a",
        "host": "h",
        "pid": 1,
        "capacity": 1,
        "role": "both",
        "version": "v",
        "started_at": 0.0,
    }
    with pytest.raises(errors.InvalidServer, match=problem):
        servers.ServerInfo(**{**fields, **kwargs})  # type: ignore[arg-type]


def test_spark_master_reachability_travels_in_the_record_but_is_no_identity() -> None:
    """A master's reachability flips without the server changing: two records that
    differ only there are the same member (no membership change, no rebalance)."""
    info = servers.ServerInfo("a", "h", 1, 2, "both", "0.1.0", 1.0)
    assert info.spark_masters == {}
    reported = dataclasses.replace(info, spark_masters={"m1:7077": True, "m2:7077": False})
    back = servers.ServerInfo.from_bytes(reported.to_bytes())
    assert back.spark_masters == {"m1:7077": True, "m2:7077": False}
    assert json.loads(reported.to_bytes())["spark_masters"] == {"m1:7077": True, "m2:7077": False}
    assert reported == info and hash(reported) == hash(info)


def test_malformed_record_is_an_invalid_server() -> None:
    with pytest.raises(errors.InvalidServer, match="malformed server record"):
        servers.ServerInfo.from_bytes(b"{not json")


@pytest.mark.parametrize("root", ["sparkring", "/sparkring/", "/a//b", ""])
def test_bad_roots_are_refused(root: str) -> None:
    with pytest.raises(errors.InvalidServer, match="absolute path"):
        servers.validate_root(root)


def test_worker_is_the_only_role_that_never_coordinates() -> None:
    assert {
        r for r in servers.ROLES if not servers.ServerInfo("a", "h", 1, 1, r, "v", 0.0).electable
    } == {"worker"}


def test_auth_is_parsed_and_never_echoed() -> None:
    assert connection.parse_auth("") is None
    assert connection.parse_auth("user:pa:ss") == ("user", "pa:ss")
    for bad in ("nocolon-s3cr3t", ":s3cr3t", "user:"):
        with pytest.raises(errors.InvalidServer) as caught:
            connection.parse_auth(bad)
        assert "s3cr3t" not in str(caught.value)


def test_state_table_is_complete_and_closed_is_terminal() -> None:
    assert set(connection.TRANSITIONS) == set(connection.State)
    assert connection.TRANSITIONS[connection.State.CLOSED] == frozenset()
    # Every state can be closed, and every state is reachable from CONNECTING.
    seen, frontier = {connection.State.CONNECTING}, [connection.State.CONNECTING]
    while frontier:
        for nxt in connection.TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(connection.State)
    for state in set(connection.State) - {connection.State.CLOSED}:
        assert connection.allowed(state, connection.State.CLOSED)
    # Only a registered, connected server may act.
    assert set(connection.State) - connection.SAFE_MODE == {connection.State.CONNECTED}


@given(
    st.lists(
        st.tuples(st.text(alphabet=ID_CHARS, min_size=1, max_size=10), st.integers(0, 10**9)),
        unique_by=lambda t: t[1],
    )
)
def test_candidates_are_ordered_by_sequence_whatever_the_ids(
    entries: list[tuple[str, int]],
) -> None:
    names = [f"{server_id}-abcdef-{seq:010d}" for server_id, seq in entries]
    ordered = election._candidates([*names, "stray-node"])
    assert [int(n.rsplit("-", 1)[1]) for n in ordered] == sorted(seq for _, seq in entries)


def test_only_published_details_may_change_while_registered() -> None:
    info = servers.ServerInfo("a", "h", 1, 2, "both", "0.1.0", 1.0)
    registry = session.Registry("127.0.0.1:1", "/sparkring", info)  # never started
    with pytest.raises(errors.InvalidServer, match="cannot publish capacity, role"):
        registry.publish(capacity=8, role="worker")
    registry.publish(spark_masters={"m1:7077": True})
    assert registry.info.spark_masters == {"m1:7077": True} and registry.info.capacity == 2
