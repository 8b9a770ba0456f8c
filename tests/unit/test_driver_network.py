"""Where a driver listens and what it advertises (server/driver_network.py): pure rules,
and their effect on the spark-submit argv and the environment a driver gets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server import driver, driver_network
from tests.integration.test_driver import BASE, make_spec

CLUSTER = "spark://spark-master-1:7077,spark-master-2:7077"


def _confs(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


@pytest.mark.parametrize("master", ["local", "local[1]", "local[*]", "local[2,3]"])
def test_a_local_masters_driver_stays_on_loopback(master: str) -> None:
    spec = make_spec(master=master, address="10.89.0.7")
    assert driver_network.is_local(master)
    assert "spark.driver.host" not in _confs(driver.build_argv(spec))
    assert driver.build_env(spec, BASE)["SPARK_LOCAL_IP"] == "127.0.0.1"


@pytest.mark.parametrize("master", [CLUSTER, "spark://10.0.0.1:7077", "local-cluster[2,1,1024]"])
def test_a_cluster_masters_driver_advertises_the_servers_address(master: str) -> None:
    # The bug of issue 43: every driver defaulted to SPARK_LOCAL_IP=127.0.0.1, so the
    # executors in other containers were told to connect to their own loopback.
    spec = make_spec(master=master, address="10.89.0.7")
    assert _confs(driver.build_argv(spec))["spark.driver.host"] == "10.89.0.7"
    # Its UI stays on loopback, where its server's health monitor reads it.
    assert driver.build_env(spec, BASE)["SPARK_LOCAL_IP"] == "127.0.0.1"


def test_the_jobs_own_driver_host_and_the_servers_spark_local_ip_win() -> None:
    spec = make_spec(master=CLUSTER, address="10.89.0.7", conf={"spark.driver.host": "gw"})
    argv = driver.build_argv(spec)
    assert [a for a in argv if a.startswith("spark.driver.host=")] == ["spark.driver.host=gw"]
    env = driver.build_env(spec, {**BASE, "SPARK_LOCAL_IP": "0.0.0.0"})
    assert env["SPARK_LOCAL_IP"] == "0.0.0.0"


def test_without_an_address_a_cluster_masters_driver_keeps_spark_defaults_and_loopback() -> None:
    spec = make_spec(master=CLUSTER, address=None)
    assert "spark.driver.host" not in _confs(driver.build_argv(spec))
    assert driver.build_env(spec, BASE)["SPARK_LOCAL_IP"] == "127.0.0.1"


def test_resolve_keeps_an_address_and_resolves_a_name() -> None:
    assert driver_network.resolve("10.89.0.7") == "10.89.0.7"
    assert driver_network.resolve("[::1]") == "::1"
    assert driver_network.is_loopback(driver_network.resolve("localhost"))
    # A name nobody resolves is passed on as it is (Spark, and the executors, try it).
    assert driver_network.resolve("no-such-host.invalid") == "no-such-host.invalid"


@given(st.from_regex(r"local(\[[0-9*]{1,3}(,[0-9]{1,2})?\])?", fullmatch=True))
def test_every_local_master_form_is_local(master: str) -> None:
    assert driver_network.is_local(master)
    assert driver_network.driver_conf(master, "10.0.0.1", {}) == {}


def test_the_server_gives_the_driver_its_ui_port_unless_the_job_chose_one() -> None:
    assert _confs(driver.build_argv(make_spec(ui_port=45123)))["spark.ui.port"] == "45123"
    own = make_spec(ui_port=45123, conf={"spark.ui.port": "4099"})
    assert [a for a in driver.build_argv(own) if a.startswith("spark.ui.port=")] == [
        "spark.ui.port=4099"
    ]
    assert driver_network.free_port() > 0
