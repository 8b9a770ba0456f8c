"""The tests' CLI runner (tests/cli_runner.py) answers as ``python -m server`` does: same
stdout, stderr and exit code, one command's environment never seen by the next, and a
command past its timeout killed (stdin: tests/test_cli_alerts.py's secrets)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests import cli_runner, services

BASE = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}


def _spawned(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server", *args],
        env=env,
        cwd=services.REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["job", "lis"],  # a usage error: exit 2, click's message naming the program
        ["job", "list"],  # no database configured: a settings error, exit 78
        ["server", "list", "--json"],
    ],
)
def test_a_command_answers_as_the_spawned_cli_does(args: list[str]) -> None:
    forked = cli_runner.run(args, env=BASE, cwd=services.REPO, timeout=60)
    spawned = _spawned(args, BASE)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        spawned.returncode,
        spawned.stdout,
        spawned.stderr,
    )
    assert forked.args == [sys.executable, "-m", "server", *args]


def test_one_commands_environment_is_not_seen_by_the_next() -> None:
    config = {**BASE, "SPARKRING_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    with_url = cli_runner.run(["job", "list"], env=config, timeout=60)
    without = cli_runner.run(["job", "list"], env=BASE, timeout=60)
    assert "SPARKRING_DATABASE_URL is not set" not in with_url.stderr
    assert "SPARKRING_DATABASE_URL is not set" in without.stderr
    assert without.returncode == 78


def test_a_command_past_its_timeout_is_killed() -> None:
    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/health"
        with pytest.raises(subprocess.TimeoutExpired):
            cli_runner.run(["health", url, "--timeout", "30"], env=BASE, timeout=1)
