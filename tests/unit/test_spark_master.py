"""The Spark master check (server/spark_master.py): pure parts, and a TCP probe of a
port where nothing listens and of one where something does."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from server import spark_master
from server.spark_master import Endpoint

DATA = Path(__file__).parents[1] / "data"


def test_the_masters_of_a_standalone_url_are_read_in_order() -> None:
    assert spark_master.endpoints("spark://m1:7077,m2:7078") == [
        Endpoint("m1", 7077),
        Endpoint("m2", 7078),
    ]
    assert spark_master.endpoints("spark://10.0.0.5") == [Endpoint("10.0.0.5", 7077)]
    assert spark_master.endpoints("spark://[::1]:7077/") == [Endpoint("::1", 7077)]
    assert str(Endpoint("::1", 7077)) == "[::1]:7077"


@pytest.mark.parametrize("master", ["local[1]", "local[*]", "yarn", "k8s://https://api:6443"])
def test_other_masters_have_nothing_to_check(master: str) -> None:
    assert spark_master.endpoints(master) == []
    assert spark_master.unreachable(master, probe=lambda e: pytest.fail("probed")) is False


@pytest.mark.parametrize(
    ("master", "names"),
    [
        ("spark://", "''"),
        ("spark://m1:7077,", "''"),
        ("spark://m1:port", "'m1:port'"),
        ("spark://m1:70770", "port 70770"),
        ("spark://a b:7077", "'a b:7077'"),
    ],
)
def test_a_malformed_standalone_url_is_refused_naming_the_entry(master: str, names: str) -> None:
    with pytest.raises(spark_master.MasterURLError, match=names.replace("[", r"\[")):
        spark_master.endpoints(master)


def test_unreachable_only_when_no_master_answers() -> None:
    asked: list[Endpoint] = []

    def only(alive: set[str]):
        def probe(endpoint: Endpoint) -> bool:
            asked.append(endpoint)
            return endpoint.host in alive

        return probe

    master = "spark://m1:7077,m2:7077"
    assert spark_master.unreachable(master, probe=only(set())) is True
    assert asked == [Endpoint("m1", 7077), Endpoint("m2", 7077)]
    assert spark_master.unreachable(master, probe=only({"m2"})) is False
    assert spark_master.unreachable(master, probe=only({"m1"})) is False


def test_a_tcp_probe_tells_a_listening_port_from_a_closed_one() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert spark_master.answers(Endpoint("127.0.0.1", port), timeout=1.0)
    assert not spark_master.answers(Endpoint("127.0.0.1", port), timeout=1.0)


def test_registration_is_read_from_the_driver_log() -> None:
    assert spark_master.registered((DATA / "spark_driver.log").read_text()) is False
    assert spark_master.registered((DATA / "spark_driver_no_master.log").read_text()) is False
    line = "26/11/25 10:24:09 INFO StandaloneSchedulerBackend: Connected to Spark cluster "
    assert spark_master.registered(line + "with app ID app-20261125102409-0000\n")


def test_a_driver_is_the_outages_victim_only_unregistered_and_with_no_master(
    tmp_path: Path,
) -> None:
    log = tmp_path / "driver.log"
    log.write_text((DATA / "spark_driver_no_master.log").read_text())
    master = "spark://127.0.0.1:7077"
    down, up = (lambda e: False), (lambda e: True)
    assert spark_master.lost_to_outage(master, log, probe=down)
    # Spark itself gave up: every master was unresponsive for the driver's whole
    # registration window (3 tries, ~60 s). A standby that answers by the time the
    # server looks (a takeover of ~60 s after kill -9) does not make it the job's
    # failure (issue 29: seen measuring the standby takeover, p50 54.8 s, max 64.2 s).
    assert spark_master.lost_to_outage(master, log, probe=up)
    own = tmp_path / "own.log"
    own.write_text((DATA / "spark_driver.log").read_text())
    assert not spark_master.lost_to_outage(master, own, probe=up), "its own failure"
    assert spark_master.lost_to_outage(master, own, probe=down)
    assert not spark_master.lost_to_outage("local[1]", log, probe=down)
    assert not spark_master.lost_to_outage("spark://bad:port", log, probe=down)
    log.write_text("INFO StandaloneSchedulerBackend: Connected to Spark cluster with app ID a\n")
    assert not spark_master.lost_to_outage(master, log, probe=down), "it had registered"
    assert spark_master.lost_to_outage(master, tmp_path / "none.log", probe=down)


def test_the_wait_doubles_up_to_its_cap() -> None:
    waits = [spark_master.wait_before_retry(n, 1.0, 15.0) for n in range(6)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    assert spark_master.wait_before_retry(10_000, 1.0, 15.0) == 15.0
    with pytest.raises(ValueError, match="negative"):
        spark_master.wait_before_retry(-1, 1.0, 15.0)


def test_the_deferrals_error_names_cause_and_master() -> None:
    assert (
        spark_master.detail("spark://m1:7077,m2:7077")
        == "cause=spark-master-unreachable master=spark://m1:7077,m2:7077"
    )
