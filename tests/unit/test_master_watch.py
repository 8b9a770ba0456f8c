"""server/master_watch.py: which Spark masters a server reports on, and how it probes
them (a side thread; a probe stands in for the TCP connect)."""

from __future__ import annotations

import socket
import threading

import pytest

from server import master_watch, spark_master
from testing.waiting import wait_until


def test_the_server_s_own_master_and_its_runs_masters_each_host_port_once() -> None:
    assert master_watch.endpoints_of(
        [
            "spark://m2:7077,m1",
            "local[1]",
            "spark://m1:7077",
            "spark://m3:7078",
            "spark://bad host:x",  # a job's own error, reported on its own run
            "",
        ]
    ) == ["m1:7077", "m2:7077", "m3:7078"]
    assert master_watch.endpoints_of(["local[2]", "yarn"]) == []


class Recorder:
    def __init__(self) -> None:
        self.reports: list[dict[str, bool]] = []
        self.lock = threading.Lock()

    def __call__(self, report: dict[str, bool]) -> None:
        with self.lock:
            self.reports.append(report)


def test_a_check_reports_each_master_and_calls_back_on_change_only() -> None:
    up = {"m1:7077": True, "m2:7077": False}
    masters = ["spark://m1:7077,m2:7077"]
    changed = Recorder()
    watch = master_watch.MasterWatch(
        lambda: masters,
        changed,
        interval=60,
        probe=lambda endpoint: up[str(endpoint)],
    )
    assert watch.current() == {}
    assert watch.check() == {"m1:7077": True, "m2:7077": False}
    assert watch.check() == {"m1:7077": True, "m2:7077": False}
    assert changed.reports == [{"m1:7077": True, "m2:7077": False}]
    up["m2:7077"] = True
    watch.check()
    masters[:] = ["spark://m2:7077"]  # the last job on m1 ended: m1 is no longer ours
    watch.check()
    assert changed.reports[1:] == [{"m1:7077": True, "m2:7077": True}, {"m2:7077": True}]
    assert watch.current() == {"m2:7077": True}


def test_a_failing_callback_or_master_list_never_stops_the_watch() -> None:
    calls = []

    def masters() -> list[str]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("runner gone")
        return ["spark://m1:7077"]

    def broken(report: dict[str, bool]) -> None:
        raise RuntimeError("registry gone")

    watch = master_watch.MasterWatch(masters, broken, interval=60, probe=lambda e: True)
    assert watch.check() == {}
    assert watch.check() == {"m1:7077": True}


def test_the_thread_checks_at_once_then_every_interval_and_stops() -> None:
    changed = Recorder()
    answers = iter([False, True, True, True, True, True, True, True, True, True, True])
    watch = master_watch.MasterWatch(
        lambda: ["spark://m1:7077"],
        changed,
        interval=0.05,
        probe=lambda endpoint: next(answers, True),
    )
    watch.start()
    try:
        wait_until(lambda: len(changed.reports) >= 2, 5, message="no second check")
        assert watch.is_alive()
    finally:
        watch.stop()
        watch.stop()  # idempotent
    assert not watch.is_alive()
    assert changed.reports[:2] == [{"m1:7077": False}, {"m1:7077": True}]


def test_the_default_probe_is_a_short_tcp_connect() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert master_watch.probe(spark_master.Endpoint("127.0.0.1", port))
    assert not master_watch.probe(spark_master.Endpoint("127.0.0.1", port))


@pytest.mark.parametrize("interval", [0, -1])
def test_the_interval_must_be_positive(interval: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        master_watch.MasterWatch(list, print, interval=interval)
