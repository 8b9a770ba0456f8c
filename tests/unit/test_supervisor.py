"""``sparkring server supervise``: the in-container supervisor of ``server run``.

A stand-in child (testing/stand_in_server.py) plays the server, so each case controls how
the child ends: a crash is restarted at once (the successor adopts the live drivers), a
clean exit, a refusal or a forced exit ends the supervisor with the child's code, a
signal to the supervisor reaches the child once and is never followed by a restart, and
a crash loop ends with ``ExitCode.CRASH_LOOP`` so that the container engine takes over.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from server import defaults, exit_codes, supervisor
from server.cli import main as cli
from testing import waiting

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "testing" / "stand_in_server.py"
# Fast enough for a test, slow enough to see an (unwanted) second restart.
FAST = {"restart_delay": 0.05, "restart_delay_max": 0.2, "crash_limit": 3, "crash_window": 60.0}
# The supervisor as its own process, with the CLI's signal forwarding (supervisor.main).
LAUNCHER = (
    "import sys\n"
    "from server import logs, supervisor\n"
    "logs.configure('INFO')\n"
    "sys.exit(supervisor.main(supervisor.Supervisor(sys.argv[1:], restart_delay=0.05)))\n"
)


def _child(state: Path, *steps: str) -> list[str]:
    return [sys.executable, str(STAND_IN), str(state), *steps]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for pid in _lines(tmp_path / "orphans"):
        if _alive(int(pid)):
            os.kill(int(pid), signal.SIGKILL)


def _supervise(state: Path, *steps: str) -> int:
    return supervisor.Supervisor(_child(state, *steps), **FAST).run()


# --- restarts ---------------------------------------------------------------------


def test_a_crashed_server_is_restarted_until_it_exits_cleanly(state: Path) -> None:
    assert _supervise(state, "crash", "crash", "exit:0") == 0
    starts = _lines(state / "starts")
    assert len(starts) == 3 and len(set(starts)) == 3


@pytest.mark.parametrize(
    "code",
    [
        1,  # an uncaught exception in Python
        exit_codes.ExitCode.INTERNAL_ERROR,
        exit_codes.ExitCode.UNHEALTHY,
        exit_codes.ExitCode.UNAVAILABLE,  # ZooKeeper or PostgreSQL away at start-up
    ],
)
def test_an_exit_that_asks_for_a_restart_is_restarted(state: Path, code: int) -> None:
    assert _supervise(state, f"exit:{int(code)}", "exit:0") == 0
    assert len(_lines(state / "starts")) == 2


@pytest.mark.parametrize(
    "code",
    [
        exit_codes.ExitCode.OK,
        exit_codes.ExitCode.USAGE,
        exit_codes.ExitCode.CONFIG_ERROR,
        exit_codes.ExitCode.KILLED,
    ],
)
def test_a_final_exit_ends_the_supervisor_with_the_child_s_code(state: Path, code: int) -> None:
    assert _supervise(state, f"exit:{int(code)}", "exit:0") == code
    assert len(_lines(state / "starts")) == 1


def test_a_crash_loop_gives_up_with_a_named_code(state: Path) -> None:
    assert _supervise(state, "crash") == exit_codes.ExitCode.CRASH_LOOP
    # The first start and one restart per crash the limit allows.
    assert len(_lines(state / "starts")) == 1 + FAST["crash_limit"]


def test_each_restart_is_logged_with_its_cause(
    state: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=supervisor.__name__)
    assert _supervise(state, "exit:70", "crash", "exit:0") == 0
    restarts = [r for r in caplog.records if getattr(r, "action", None) == "restart"]
    assert [(r.exit_code, r.crashes) for r in restarts] == [(70, 1), (-signal.SIGKILL, 2)]
    assert all(r.delay_s < 1.0 for r in restarts)


def test_the_drivers_watchdogs_outlive_a_crash_of_the_server(state: Path) -> None:
    """Watchdogs run in sessions of their own: the supervisor never kills them, so the
    restarted server can adopt them."""
    assert _supervise(state, "orphan", "exit:0") == 0
    (orphan,) = _lines(state / "orphans")
    assert _alive(int(orphan)), "the supervisor killed the crashed child's watchdog"


# --- crash accounting -------------------------------------------------------------


def test_crash_history_backs_off_and_gives_up_within_the_window() -> None:
    history = supervisor.CrashHistory(limit=3, window=60.0, delay=0.25, delay_max=1.0)
    assert [history.record(now) for now in (0.0, 1.0, 2.0)] == [0.25, 0.5, 1.0]
    assert history.record(3.0) is None  # the fourth crash within 60 s: a crash loop


def test_crashes_older_than_the_window_are_forgotten() -> None:
    history = supervisor.CrashHistory(limit=2, window=10.0, delay=0.25, delay_max=5.0)
    assert history.record(0.0) == 0.25
    assert history.record(5.0) == 0.5
    assert history.record(12.0) == 0.5  # the crash at 0 s has left the window
    assert history.record(30.0) == 0.25


def test_the_first_restart_comes_well_within_the_lease_guard() -> None:
    """A restart must adopt the drivers before their watchdogs' deadline: the lease TTL
    minus the watchdog margin after the last renewal (5 s by default)."""
    assert defaults.SUPERVISOR_RESTART_DELAY_S < 1.0
    assert defaults.SUPERVISOR_RESTART_DELAY_S < defaults.LEASE_TTL_S - defaults.WATCHDOG_MARGIN_S


# --- signals ----------------------------------------------------------------------


def _start_supervisor(state: Path, *steps: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, *_child(state, *steps)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    waiting.wait_until(lambda: _lines(state / "starts"), 30, message="the child did not start")
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_is_forwarded_once_and_not_followed_by_a_restart(
    state: Path, sig: signal.Signals
) -> None:
    proc = _start_supervisor(state, "serve:0", "exit:3")
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 0
    assert _lines(state / "signals") == [sig.name]
    assert len(_lines(state / "starts")) == 1


def test_a_child_that_dies_after_a_forwarded_signal_is_not_restarted(state: Path) -> None:
    proc = _start_supervisor(state, "serve:kill", "exit:3")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL
    assert len(_lines(state / "starts")) == 1


def test_stop_is_idempotent(state: Path) -> None:
    sup = supervisor.Supervisor(_child(state, "serve:0", "exit:3"), **FAST)

    def stop_twice() -> None:
        waiting.wait_until(lambda: _lines(state / "starts"), 30)
        sup.stop()
        sup.stop()

    stopper = threading.Thread(target=stop_twice)
    stopper.start()
    assert sup.run() == 0
    stopper.join()
    assert _lines(state / "signals") == ["SIGTERM"]


def test_a_stop_during_the_back_off_is_not_followed_by_a_restart(state: Path) -> None:
    sup = supervisor.Supervisor(
        _child(state, "crash", "exit:3"), **{**FAST, "restart_delay": 60, "restart_delay_max": 60}
    )

    def stop_after_the_first_start() -> None:
        waiting.wait_until(lambda: _lines(state / "starts"), 30)
        sup.stop()

    stopper = threading.Thread(target=stop_after_the_first_start)
    stopper.start()
    assert sup.run() == 128 + signal.SIGKILL  # the crash's status: nothing runs now
    stopper.join()
    assert len(_lines(state / "starts")) == 1


# --- command line -----------------------------------------------------------------


def test_the_child_is_server_run_with_the_same_options() -> None:
    argv = supervisor.server_argv(
        config=Path("/etc/sparkring.toml"),
        options={"--id": "s1", "--capacity": 2, "--role": None, "--log-level": "DEBUG"},
    )
    assert argv == [
        sys.executable,
        "-m",
        "server",
        "--config",
        "/etc/sparkring.toml",
        "server",
        "run",
        "--id",
        "s1",
        "--capacity",
        "2",
        "--log-level",
        "DEBUG",
    ]


def test_supervise_help_names_the_restart_rules() -> None:
    result = CliRunner().invoke(cli.app, ["server", "supervise", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for option in ("--id", "--capacity", "--role", "--log-level"):
        assert option in text
    assert "server run" in text and "restart" in text and "adopt" in text


def test_a_server_refused_for_its_settings_is_not_restarted(tmp_path: Path) -> None:
    """Bad settings make `server run` exit 78 (a refusal, not a crash): the supervisor
    ends with it at once instead of restarting it into a crash loop."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    env["SPARKRING_CAPACITY"] = "-1"
    result = subprocess.run(
        [sys.executable, "-m", "server", "server", "supervise", "--id", "s1"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == exit_codes.ExitCode.CONFIG_ERROR, result.stderr
    assert "invalid settings" in result.stderr
    assert result.stderr.count("action=child_started") == 1, result.stderr
