"""Drivers under their own OS user (``SPARKRING_DRIVER_USER``, server/driver_user.py).

Pure checks of the user's resolution and of what it may reach, then real processes (no
services, no Spark): a stand-in server process holding secrets in its environment
starts a probe (testing/jobs/sandbox_probe.py) as the driver through the real watchdog.
Without a driver user the probe finds the secrets and can rewrite its lease (the
findings of issue 23, kept as controls so that the probe cannot pass by finding
nothing); with one it can do neither, and the watchdog still stops, kills and fences it.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from server import driver, driver_user, exit_codes, rundir, watchdog
from testing import waiting

USER = "sparkring-driver"
REPO = Path(__file__).resolve().parents[2]
PROBE_JOB = REPO / "testing" / "jobs" / "sandbox_probe.py"


@pytest.fixture(scope="module")
def user(driver_account: driver_user.DriverUser) -> driver_user.DriverUser:
    return driver_account


@pytest.fixture
def here(tmp_path: Path) -> Path:
    """A folder the driver user can reach (pytest's own are mode 0700)."""
    for folder in (tmp_path.parent.parent, tmp_path.parent, tmp_path):
        folder.chmod(folder.stat().st_mode | 0o711)
    return tmp_path


# --- pure ------------------------------------------------------------------------------


def test_resolve_names_an_unknown_user() -> None:
    with pytest.raises(driver_user.DriverUserError, match=r"SPARKRING_DRIVER_USER: no user 'nob"):
        driver_user.resolve("nobody-such-user")


def test_resolve_refuses_root_and_the_servers_own_user() -> None:
    with pytest.raises(driver_user.DriverUserError, match="must not run as root"):
        driver_user.resolve("root")
    if os.geteuid() != 0:
        with pytest.raises(driver_user.DriverUserError, match="the server's own user"):
            driver_user.resolve(str(os.geteuid()))


def test_resolve_takes_a_name_or_a_uid(user: driver_user.DriverUser) -> None:
    assert driver_user.resolve(str(user.uid)) == user
    assert user.gid == pwd.getpwnam(USER).pw_gid


def test_missing_capabilities_are_named() -> None:
    assert driver_user.missing_capabilities(0) == [
        "CAP_CHOWN",
        "CAP_KILL",
        "CAP_SETGID",
        "CAP_SETUID",
    ]
    held = sum(1 << bit for bit in driver_user.REQUIRED_CAPABILITIES.values())
    assert driver_user.missing_capabilities(held) == []
    assert driver_user.missing_capabilities(held & ~(1 << driver_user.CAP_KILL)) == ["CAP_KILL"]


def test_a_folder_the_user_cannot_pass_is_named(tmp_path: Path) -> None:
    someone = driver_user.DriverUser(name="someone", uid=54321, gid=54321)
    closed = tmp_path / "closed"
    (closed / "work").mkdir(parents=True)
    closed.chmod(0o700)
    tmp_path.chmod(0o755)
    tmp_path.parent.chmod(0o755)
    tmp_path.parent.parent.chmod(0o711)
    assert driver_user.unreachable(closed / "work" / "later", someone) == closed
    with pytest.raises(driver_user.DriverUserError) as raised:
        driver_user.check_reachable("SPARKRING_WORK_DIR", closed / "work", someone)
    assert f"{closed} is drwx------" in str(raised.value)
    assert "SPARKRING_WORK_DIR" in str(raised.value)
    closed.chmod(0o711)
    assert driver_user.unreachable(closed / "work", someone) is None


# --- real processes ---------------------------------------------------------------------

# The stand-in server: a process whose own environment holds the secrets, as a real
# server's does, and that starts the probe as its driver through the real watchdog.
SERVER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from server import driver, driver_user, watchdog
    here, probe, user, lease_s, linger = sys.argv[1:6]
    run_as = driver_user.resolve(user) if user else None
    # Written to its working directory, the one place it may write.
    command = [sys.executable, probe, "probe.json"]
    if linger == "1":
        command.append("--linger")
    handle = driver.supervise(
        command,
        env=driver.without_secrets(os.environ),
        run_dir=Path(here) / "run",
        lease_deadline=watchdog.lease_clock() + float(lease_s),
        job="probe", epoch=1, server="s", user=run_as,
        records=Path(here) / "records.jsonl",
    )
    outcome = handle.wait(120)
    print(json.dumps({"reason": str(outcome.reason) if outcome else None}), flush=True)
    """
)


def _secret() -> str:
    return "probe-" + os.urandom(8).hex()


def _run_server(here: Path, user: str, secret: str, *, lease_s: float = 60, linger: bool = False):
    probe = here / "probe.py"
    probe.write_text(PROBE_JOB.read_text())
    probe.chmod(0o644)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SPARKRING_S3_SECRET_KEY": secret,
        "SPARKRING_DATABASE_URL": f"postgresql://sparkring:{secret}@db/sparkring",
    }
    return subprocess.Popen(
        [sys.executable, "-c", SERVER, str(here), str(probe), user, str(lease_s), str(int(linger))],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _probe_report(here: Path, secret: str, timeout: float = 60) -> dict[str, Any]:
    """The probe's report, with ``found``: the /proc files in which it read ``secret``."""
    output = here / "run" / rundir.WORKING_DIR / "probe.json"
    waiting.wait_until(output.exists, timeout, message="the probe reported nothing")
    report = json.loads(output.read_text())
    report["found"] = [key for key, text in report["proc"].items() if secret in text]
    return report


def _finish(server: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    out, err = server.communicate(timeout=timeout)
    assert server.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_without_a_driver_user_a_driver_reads_the_servers_secret(here: Path) -> None:
    """The finding, kept as the probe's control: a driver under the server's user finds
    the server's secret in /proc/<server>/environ and can rewrite its own lease."""
    secret = _secret()
    server = _run_server(here, "", secret)
    report = _probe_report(here, secret)
    assert _finish(server)["reason"] == "exited"
    assert report["found"], "the probe missed a secret it could read"
    own = report["proc"][f"{report['pid']}/environ"]
    assert "SPARKRING_RUN_DIR=" in own and secret not in own  # its own was filtered even then
    assert "lease.json" in report["writable"]


def test_a_driver_user_cannot_read_the_servers_secrets(
    here: Path, user: driver_user.DriverUser
) -> None:
    secret = _secret()
    server = _run_server(here, user.name, secret)
    report = _probe_report(here, secret)
    assert _finish(server)["reason"] == "exited"
    assert (report["uid"], report["gid"], report["groups"]) == (user.uid, user.gid, [])
    assert f"{report['pid']}/environ" in report["proc"]  # it did look: its own is readable
    assert report["found"] == []
    run_dir = here / "run"
    assert report["home"] == report["cwd"] == str(run_dir / rundir.WORKING_DIR)


def test_a_driver_user_cannot_touch_its_control_files_nor_outlive_its_lease(
    here: Path, user: driver_user.DriverUser
) -> None:
    """Issue 23: a job rewrote lease.json and ran 4 s past its deadline. Under its own
    user it can open none of its run's control files for writing, nor replace them, and
    the watchdog kills it at the deadline it was given."""
    secret = _secret()
    server = _run_server(here, user.name, secret, lease_s=6, linger=True)
    report = _probe_report(here, secret)
    assert report["writable"] == []
    run_dir = here / "run"
    for name in (rundir.LEASE_FILE, rundir.STATE_FILE, rundir.LOG_FILE):
        st = (run_dir / name).stat()
        assert st.st_uid == os.geteuid() and not st.st_mode & 0o022, name
    st = run_dir.stat()
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o755
    cwd = (run_dir / rundir.WORKING_DIR).stat()
    assert (cwd.st_uid, stat.S_IMODE(cwd.st_mode)) == (user.uid, 0o700)
    assert _finish(server)["reason"] == "lease_expired"


SLEEPER = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(300)\n"


def _sleeper(here: Path, user: driver_user.DriverUser, started: list[driver.Driver]) -> int:
    (here / "sleeper.py").write_text(SLEEPER)
    (here / "sleeper.py").chmod(0o644)
    handle = driver.supervise(
        [sys.executable, str(here / "sleeper.py"), "pid"],
        env=driver.without_secrets(os.environ),
        run_dir=here / "run",
        lease_deadline=watchdog.lease_clock() + 60,
        job="j",
        epoch=1,
        server="s",
        user=user,
    )
    started.append(handle)
    pid_file = here / "run" / rundir.WORKING_DIR / "pid"
    waiting.wait_until(
        lambda: pid_file.exists() and pid_file.read_text(), 20, message="driver not up"
    )
    return int(pid_file.read_text())


def test_a_driver_user_is_stopped_adopted_and_killed_by_the_server(
    here: Path, user: driver_user.DriverUser, started: list[driver.Driver]
) -> None:
    pid = _sleeper(here, user, started)
    assert os.stat(f"/proc/{pid}").st_uid == user.uid
    adopted = driver.adopt(here / "run")
    assert adopted is not None and adopted.pid == started[0].pid
    outcome = adopted.stop(grace=2)
    assert outcome.reason == driver.Reason.STOPPED
    assert watchdog.process_start_ticks(pid) is None


def test_a_driver_user_dies_with_its_watchdog(
    here: Path, user: driver_user.DriverUser, started: list[driver.Driver]
) -> None:
    """The parent-death signal survives the change of user (prctl(2) clears it on a
    change of credentials: it is set after the switch)."""
    pid = _sleeper(here, user, started)
    os.kill(started[0].pid, signal.SIGKILL)
    waiting.wait_until(
        lambda: watchdog.process_start_ticks(pid) is None, 10, message="the driver outlived it"
    )


def test_the_watchdog_refuses_a_run_directory_the_driver_could_write(
    here: Path, user: driver_user.DriverUser
) -> None:
    run_dir = here / "open"
    run_dir.mkdir()
    run_dir.chmod(0o777)
    rundir.write_lease(run_dir / "lease.json", watchdog.lease_clock() + 60)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "server.watchdog",
            "--lease-file",
            str(run_dir / "lease.json"),
            "--result",
            str(run_dir / "result.json"),
            "--uid",
            str(user.uid),
            "--gid",
            str(user.gid),
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert result.returncode == exit_codes.ExitCode.SPAWN_FAILED
    assert "writable by others" in result.stderr
    assert rundir.read_json(run_dir / "result.json")["reason"] == "spawn_failed"


def test_server_list_shows_whose_user_drivers_run_as() -> None:
    from server.cli import servers as cli_server

    own = {"driver_user": "root", "driver_user_isolated": False}
    assert cli_server._drivers_as(own) == "root (own)"
    isolated = {"driver_user": USER, "driver_user_isolated": True}
    assert cli_server._drivers_as(isolated) == USER
    assert cli_server._drivers_as({"driver_user": "", "driver_user_isolated": False}) is None


def test_a_run_the_driver_user_cannot_reach_is_not_started(
    tmp_path: Path, user: driver_user.DriverUser
) -> None:
    """A clear error (the runner defers the job with it), not a driver that fails on a
    permission it cannot explain."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    main = closed / "job.py"
    main.write_text("print('never')\n")
    spark_submit = tmp_path / "spark-submit"
    spark_submit.write_text("")
    spec = driver.DriverSpec(
        job="j",
        kind="batch",
        epoch=1,
        attempt=0,
        server="s",
        main=main,
        run_dir=closed / "run",
        master="local[1]",
        spark_submit=spark_submit,
        user=user,
    )
    with pytest.raises(driver.DriverError) as raised:
        driver.launch(spec, watchdog.lease_clock() + 60)
    assert str(raised.value).startswith(f"job j: the driver user {USER} cannot reach {main}:")
    assert not (closed / "run" / rundir.STATE_FILE).exists()  # no watchdog was started
