"""``server/watchdog_contract.py``: the watchdog's command line and finish report read
back as they were written (no service needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from server import watchdog_contract


def test_the_args_a_server_writes_are_the_args_the_watchdog_reads() -> None:
    args = watchdog_contract.WatchdogArgs(
        lease_file=Path("/run/1/lease.json"),
        result=Path("/run/1/result.json"),
        command=("spark-submit", "--", "main.py", "--flag"),
        state=Path("/run/1/state.json"),
        stop_file=Path("/run/1/stop.json"),
        grace=7.5,
        job="j",
        epoch=3,
        server="s1",
        cwd=Path("/run/1/work"),
        uid=1001,
        gid=1002,
        job_id=9,
        nice=5,
        records=Path("/records.jsonl"),
        term_only="main.py",
        go_file=Path("/run/1/go.json"),
        report_fd=11,
    )
    assert watchdog_contract.WatchdogArgs.parse(args.to_argv()) == args
    plain = watchdog_contract.WatchdogArgs(Path("l"), Path("r"), ("true",))
    assert plain.to_argv() == [
        "--lease-file",
        "l",
        "--result",
        "r",
        "--grace",
        "20.0",
        "--",
        "true",
    ]
    assert watchdog_contract.WatchdogArgs.parse(plain.to_argv()) == plain


@pytest.mark.parametrize(
    "options",
    [
        [],  # no command
        ["--grace", "-1"],
        ["--interval", "0"],
        ["--uid", "1000"],  # without --gid
        ["--uid", "0", "--gid", "0"],
    ],
)
def test_a_wrong_command_line_exits_with_the_usage(options: list[str]) -> None:
    command = [] if not options else ["--", "true"]
    with pytest.raises(SystemExit) as exited:
        watchdog_contract.WatchdogArgs.parse(
            ["--lease-file", "l", "--result", "r", *options, *command]
        )
    assert exited.value.code == 2


def test_a_finish_report_comes_back_from_its_payload_whole() -> None:
    report = watchdog_contract.FinishReport(
        database_url="postgresql://u:p@h/db",
        job_id=1,
        server="s1",
        epoch=2,
        backoff_base=1.0,
        backoff_max=60.0,
        log_file="/run/1/driver.log",
        spark_master="spark://m:7077",
    )
    assert watchdog_contract.FinishReport.from_payload(report.payload()) == report
    fd = report.to_pipe()
    with os.fdopen(fd, "rb") as pipe:
        assert watchdog_contract.FinishReport.from_payload(pipe.read()) == report
