"""The tests' CLI runner (testing/cli_runner.py) answers as ``python -m server`` does: same
stdout, stderr and exit code, one command's environment never seen by the next, and a
command past its timeout killed (stdin: tests/integration/test_cli_alerts.py's secrets); and a
long-running ``server run`` started forked behaves as the spawned one for what the
harness does with it (signals, exit status, its log, its session)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from testing import cli_runner, cluster, services
from testing.cluster import Cluster

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


# ---------------------------------------------------------------- long-running processes


def test_a_started_process_exits_as_the_spawned_one_and_appends_to_its_log(
    tmp_path: Path,
) -> None:
    """``start`` stands in for ``Popen(python -m server ...)``: a server that refuses its
    settings exits 78 with the same words, appended to the log it was given."""
    log = tmp_path / "server.log"
    log.write_text("an earlier run\n")
    started = cli_runner.start(["server", "run", "--id", "x"], env=BASE, log=log)
    assert started.pid > 0 and started.pid != os.getpid()
    assert started.wait(timeout=60) == 78
    spawned = _spawned(["server", "run", "--id", "x"], BASE)
    assert spawned.returncode == 78
    assert log.read_text() == "an earlier run\n" + spawned.stdout + spawned.stderr
    assert (started.poll(), started.returncode) == (78, 78)
    started.kill()  # as Popen: a process known to have ended gets no signal, and no error


def test_a_started_server_has_its_own_session_and_reports_what_ended_it(
    stack_env: dict[str, str], database_url: str, zk_root: str, s3_bucket: str, tmp_path: Path
) -> None:
    """A real ``server run`` forked warm: registered, in a session of its own (as
    ``start_new_session=True``), its log open as its stdout and stderr only, its status
    that of a Popen: -9 after kill -9, 0 after
    SIGTERM's graceful stop (its threads joined and its exit handlers run)."""
    c = Cluster(stack_env, database_url, zk_root, s3_bucket, tmp_path, fork_servers=True)
    try:
        c.start_server("s1", capacity=1)
        c.start_server("s2", capacity=1)
        first, second = c.servers["s1"], c.servers["s2"]
        assert isinstance(first, cli_runner.Detached), type(first)
        c.wait_members(2, timeout=60)
        assert os.getsid(first.pid) == first.pid
        log = str(c.server_dir("s1") / "server.log")
        fds = Path(f"/proc/{first.pid}/fd")
        assert sorted(int(f.name) for f in fds.iterdir() if os.readlink(f) == log) == [1, 2]
        assert first.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            first.wait(timeout=0.3)
        c.kill("s1")
        assert first.returncode == -signal.SIGKILL
        assert c.terminate("s2") == 0
        assert second.returncode == 0
        assert "server stopped" in c.log("s2")
    finally:
        c.close()


@pytest.mark.parametrize(
    ("wrapper", "env", "setting", "forked"),
    [
        ((), {}, None, True),
        ((), {}, "1", True),
        ((), {}, "0", False),  # every server spawned, as a user starts one
        (("ip", "netns", "exec", "ns1"), {}, None, False),  # a wrapper must exec
        ((), {"LD_PRELOAD": "/lib/libfaketime.so.1"}, None, False),  # a preload too
    ],
)
def test_which_servers_start_forked(
    wrapper: tuple[str, ...], env: dict[str, str], setting: str | None, forked: bool
) -> None:
    assert cluster.forks_server(wrapper, env, setting) is forked
