"""benchmarks/cpu_by_process: what it calls each process, and that it measures a command."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import cpu_by_process

SP = "/repo/.venv/lib/python3.11/site-packages/pyspark"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            f"bash {SP}/bin/spark-class org.apache.spark.deploy.SparkSubmit --master local[1] "
            "--name sparkring-hb /tmp/s/run/testing/jobs/heartbeat.py",
            "spark-submit driver (JVM), local",
        ),
        (
            f"java -cp {SP}/conf:{SP}/jars/* -Xmx1g org.apache.spark.deploy.SparkSubmit "
            "--master spark://127.0.0.1:17077 --name sparkring-pi /tmp/s/run/pi.py",
            "spark-submit driver (JVM), standalone",
        ),
        (
            f"java -cp {SP}/jars/* org.apache.spark.executor.CoarseGrainedExecutorBackend "
            "--driver-url spark://CoarseGrainedScheduler@127.0.0.1:4040",
            "Spark executor",
        ),
        (f"java -cp {SP}/jars/* org.apache.spark.deploy.master.Master", "Spark master"),
        (
            "java -Xmx256m -Dzookeeper.root.logger=INFO -cp /usr/share/java/zookeeper.jar x",
            "ZooKeeper",
        ),
        ("postgres: postgres t_0123 127.0.0.1(5544) idle", "PostgreSQL"),
        ("/repo/.venv/bin/python -m server server run --id s1 --capacity 3", "sparkring server"),
        (
            "/repo/.venv/bin/python -m server.watchdog --lease-file /w/lease.json -- "
            f"{SP}/bin/spark-submit --master spark://127.0.0.1:17077 /w/run/main.py",
            "watchdog",
        ),
        ("/repo/.venv/bin/python -m server job create hb --resource app", "CLI: job create"),
        ("/repo/.venv/bin/python -m server --config /etc/s.toml db upgrade", "CLI: db upgrade"),
        (
            "/repo/.venv/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))",
            "pytest worker",
        ),
        (
            "/repo/.venv/bin/python -m testing.cli_runner /tmp/sparkring-cli-x/fork.sock",
            "tests' forked processes (CLI commands, servers)",
        ),
        ("/repo/.venv/bin/python -m pytest -q tests/chaos", "pytest"),
        ("/repo/.venv/bin/python /repo/.venv/bin/pytest -q", "pytest"),
        ("/repo/.venv/bin/python /tmp/sparkring-pytest-0/s-1/t/run/main.py", "other Python"),
    ],
)
def test_each_kind_of_process_is_named(command: str, expected: str) -> None:
    assert cpu_by_process.kind(command) == expected


def test_cli_commands_are_one_row_unless_detailed() -> None:
    seen = {
        (1, 1): cpu_by_process.Seen("python -m server job list", 0.0, 0.9),
        (2, 1): cpu_by_process.Seen("python -m server job show x", 0.0, 0.8),
        (3, 1): cpu_by_process.Seen("postgres: main", 5.0, 5.5),  # only what it used
    }
    assert cpu_by_process.group(seen, cli_detail=False) == {
        "CLI commands": (2, pytest.approx(1.7)),
        "PostgreSQL": (1, pytest.approx(0.5)),
    }
    assert set(cpu_by_process.group(seen, cli_detail=True)) == {
        "CLI: job list",
        "CLI: job show",
        "PostgreSQL",
    }


def test_a_command_that_burns_cpu_is_measured(capsys: pytest.CaptureFixture[str]) -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass"
    code = cpu_by_process.main(["--json", "--interval", "0.1", "--", sys.executable, "-c", burn])
    figures = json.loads(capsys.readouterr().out)
    assert code == 0
    assert figures["kinds"]["other Python"]["cpu_s"] >= 1.0, figures
    assert figures["cpu_s"] >= figures["kinds"]["other Python"]["cpu_s"]


def test_a_command_shorter_than_the_interval_is_measured_to_its_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No sample falls inside its life: only the read after it exits can see its CPU.
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    code = cpu_by_process.main(["--json", "--interval", "60", "--", sys.executable, "-c", burn])
    figures = json.loads(capsys.readouterr().out)
    assert code == 0
    assert figures["kinds"]["other Python"]["cpu_s"] >= 0.5, figures


def test_no_command_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cpu_by_process.main(["--json"])
    assert exit_info.value.code == 2
    assert "no command given" in capsys.readouterr().err


def test_a_command_that_cannot_run_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cpu_by_process.main(["--", "/nonexistent/benchmark-command"])
    assert exit_info.value.code == 2
    assert "cannot run '/nonexistent/benchmark-command'" in capsys.readouterr().err
