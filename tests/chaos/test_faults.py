"""The fault injectors that need no service: each must do what the campaign says it
does, or a clean run proves nothing."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server import driver_user, watchdog
from testing.chaos import faketime_shared, faults
from testing.waiting import wait_until
from tests.conftest import unavailable

DRIVER_USER = "sparkring-driver"

# Prints, every 0.1 s (through time.sleep, which Debian's libfaketime 0.9.10 breaks),
# the wall clock's and BOOTTIME's offsets from the values it started with.
_CLOCK_PROBE = """
import json, sys, time
while True:
    print(json.dumps({"t": time.time(), "mono": time.clock_gettime(time.CLOCK_BOOTTIME)}),
          flush=True)
    time.sleep(0.1)
"""


def test_a_stepped_clock_moves_the_wall_clock_of_a_running_process_only(tmp_path: Path) -> None:
    clock = faults.SteppableClock(tmp_path / "clock")
    probe = subprocess.Popen(
        [sys.executable, "-c", _CLOCK_PROBE],
        env={**clock.env, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert probe.stdout is not None

    def offset() -> float:
        line = probe.stdout.readline()
        assert line, f"the probe ended (rc {probe.poll()})"
        r = json.loads(line)
        # Its wall clock against the host's, measured through BOOTTIME (unfaked).
        return r["t"] - (r["mono"] + time.time() - watchdog.lease_clock())

    try:
        assert abs(offset()) < 1.0
        clock.step(-300)
        wait_until(lambda: abs(offset() + 300) < 1.0, 10, 0, "no step back")
        clock.step(+300)
        wait_until(lambda: abs(offset() - 300) < 1.0, 10, 0, "no step forward")
        clock.step(0)
        wait_until(lambda: abs(offset()) < 1.0, 10, 0, "no step home")
    finally:
        probe.kill()
        probe.wait(timeout=10)
        probe.stdout.close()


# Run as the drivers' user under a process on the clock: which libfaketime state it uses.
_SHARED_PROBE = "import os; print(os.getpid(), os.environ.get('FAKETIME_SHARED', ''))"


def test_a_driver_under_its_own_user_shares_the_clock_state_of_its_server(
    tmp_path: Path,
) -> None:
    """libfaketime's first process on the clock (the server, root here) creates its
    semaphore and shared memory mode 0600 and names them in FAKETIME_SHARED. A driver
    run as another user could not open them, so it made its own, named after its pid;
    where a killed process of the same pid had left its files (SIGKILL skips the
    library's clean-up), that failed and the driver exited 1 before its first line, a
    crash that burnt its job's restart budget in CI. Under the clock's wrapper the
    driver opens its server's."""
    try:
        driver_user.resolve(DRIVER_USER)
    except driver_user.DriverUserError as exc:
        unavailable(f"{exc}: run scripts/bootstrap.sh")
    if driver_user.missing_capabilities():
        unavailable("switching users needs root or CAP_SETUID/CAP_SETGID")
    for folder in (tmp_path.parent.parent, tmp_path.parent, tmp_path):
        folder.chmod(folder.stat().st_mode | 0o711)
    clock = faults.SteppableClock(tmp_path / "clock")
    clock.file.chmod(0o644)
    done = subprocess.run(
        [
            *clock.wrapper,
            "runuser",
            "-u",
            DRIVER_USER,
            "--",
            "/usr/bin/python3",
            "-c",
            _SHARED_PROBE,
        ],
        env={**clock.env, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    pid, sem, _shm = done.stdout.split()
    assert sem.startswith("/faketime_sem_"), done.stdout
    assert sem != f"/faketime_sem_{pid}", "the driver could not open its server's clock state"


def test_the_shared_wrapper_names_the_files_behind_faketime_shared() -> None:
    assert faketime_shared.shared_files("/faketime_sem_12 /faketime_shm_12") == [
        Path("/dev/shm/sem.faketime_sem_12"),
        Path("/dev/shm/faketime_shm_12"),
    ]
    for bad in ("", "/a", "a b", "/a /b /c", "/ /b"):
        with pytest.raises(ValueError, match="FAKETIME_SHARED"):
            faketime_shared.shared_files(bad)


def test_two_partitions_drawn_the_same_number_get_namespaces_of_their_own() -> None:
    """The campaign's workers partition at the same moment; a number drawn twice must
    not make the second namespace fail (or share the first one's addresses and rules)."""
    reason = faults.namespaces_unavailable()
    if reason:
        unavailable(reason)
    first, second = faults.Partition([1]), faults.Partition([1])
    second._pick(first.index)
    try:
        first.create()
        second.create()
        assert first.name != second.name and first.host != second.host
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert first.name in listed and second.name in listed
    finally:
        first.close()
        second.close()


def test_a_partition_reaches_what_listens_on_another_partitions_host_end() -> None:
    """The randomized mode's webhook receiver and Spark masters listen on the first
    partition's host end; with pg_cut_all drawn, servers live in a second namespace too
    and must reach them (without a route there, the connection fails: unreachable)."""
    reason = faults.namespaces_unavailable()
    if reason:
        unavailable(reason)
    first, second = faults.Partition([1]), faults.Partition([1])
    listener = socket.socket()
    try:
        first.create()
        second.create()
        listener.bind((first.host, 0))
        listener.listen()
        port = listener.getsockname()[1]
        probe = f"import socket; socket.create_connection(('{first.host}', {port}), 5).close()"
        done = subprocess.run(
            [*second.wrapper, sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
    finally:
        listener.close()
        first.close()
        second.close()


def test_a_watchdog_is_a_target_only_in_its_servers_current_work_dir(tmp_path: Path) -> None:
    """watchdog_kill9 spares a run that its server left behind with its work dir
    (same_id_fresh_dir): nothing would sweep what that watchdog's death leaves."""
    old, fresh = tmp_path / "s1" / "work", tmp_path / "s1-fresh1" / "work"

    def dog(server: str, work: Path, epoch: int) -> faults.Watchdog:
        run_dir = work / "jobs" / "4" / str(epoch)
        return faults.Watchdog(job="st0-3", epoch=epoch, server=server, pid=epoch, run_dir=run_dir)

    left_behind, current = dog("s1", old, 9), dog("s1", fresh, 10)
    other = dog("s2", tmp_path / "s2" / "work", 11)
    work_dirs = {"s1": fresh, "s2": tmp_path / "s2" / "work"}
    assert faults.sweepable([left_behind, current, other], work_dirs) == [current, other]
    assert faults.sweepable([left_behind], {"s1": old}) == [left_behind]
