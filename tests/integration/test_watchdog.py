"""The watchdog with plain Python children (no Spark): lease expiry, a paused or killed
parent, the stop sequence, process groups and escaped descendants, kill and adopt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from server import driver, exit_codes, rundir, watchdog, watchdog_contract
from testing import waiting

# How late after its deadline a driver may still be alive: wake-up, killpg and reaping
# on a busy 2-core machine. Measured ~2-5 ms idle; the watchdog margin is 3 s.
KILL_LATENCY_S = 0.5

# A driver that sleeps, with an optional grandchild in its group and one that escaped
# it (own session), their pids written to files, and a marker file per SIGTERM seen.
CHILD = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    here = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "sleep"
    def on_term(signum, frame):
        open(os.path.join(here, "term-%d" % os.getpid()), "w").close()
        if mode != "ignore-term":
            sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    if mode == "family":
        inner = subprocess.Popen(["sleep", "300"])
        escaped = subprocess.Popen(["sleep", "301"], start_new_session=True)
        open(os.path.join(here, "family"), "w").write("%d %d" % (inner.pid, escaped.pid))
    if mode == "forge-lease":
        # A job writing to its working directory: it must not reach the lease file.
        for name in ("lease.json", "stop.json", "result.json", "watchdog.json"):
            open(name, "w").write('{"deadline": 1e12}')
    open(os.path.join(here, "ready"), "w").write(str(os.getpid()))
    if mode == "exit-now":
        sys.exit(0)
    if mode == "exit-3":
        sys.exit(3)
    while True:
        time.sleep(0.2)
    """
)


@pytest.fixture
def child(tmp_path: Path) -> Path:
    path = tmp_path / "child.py"
    path.write_text(CHILD)
    return path


def supervise(
    started: list[driver.Driver],
    tmp_path: Path,
    command: list[str],
    deadline: float,
    **kwargs: Any,
) -> driver.Driver:
    handle = driver.supervise(
        command,
        env=dict(os.environ),
        run_dir=tmp_path / "run",
        lease_deadline=deadline,
        job="j",
        epoch=7,
        server="server-a",
        records=tmp_path / "records.jsonl",
        **kwargs,
    )
    started.append(handle)
    return handle


def alive(pid: int) -> bool:
    return watchdog.process_start_ticks(pid) is not None


def records(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "records.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def ended_record(tmp_path: Path) -> dict[str, Any]:
    [ended] = [r for r in records(tmp_path) if r["event"] == "ended"]
    return ended


def wait_ended(tmp_path: Path, timeout: float) -> dict[str, Any]:
    """The watchdog's "ended" record, written once every descendant is reaped."""
    waiting.wait_until(
        lambda: any(r["event"] == "ended" for r in records(tmp_path)),
        timeout,
        interval=0.01,
        message="the driver outlived its lease",
    )
    return ended_record(tmp_path)


def wait_ready(tmp_path: Path, timeout: float = 10) -> int:
    ready = tmp_path / "ready"
    # The child creates the file, then writes its pid: wait for the pid, not the file.
    waiting.wait_until(
        lambda: ready.exists() and ready.read_text().strip(), timeout, message="child not ready"
    )
    return int(ready.read_text())


def test_lease_expiry_kills_the_group_at_the_deadline(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    deadline = watchdog.lease_clock() + 1.5
    handle = supervise(
        started, tmp_path, [sys.executable, str(child), str(tmp_path), "family"], deadline
    )
    pid = wait_ready(tmp_path)
    inner, escaped = map(int, (tmp_path / "family").read_text().split())
    assert os.getsid(handle.pid) == handle.pid != os.getsid(0)  # its own session

    outcome = handle.wait(10)

    assert outcome is not None
    assert outcome.reason == driver.Reason.LEASE_EXPIRED
    assert outcome.exit_code == -signal.SIGKILL
    ended = ended_record(tmp_path)
    assert deadline <= float(ended["mono"]) <= deadline + KILL_LATENCY_S
    assert ended["pid"] == pid and ended["job"] == "j" and ended["epoch"] == 7
    # The grandchild in its group and the one that left the group are gone too.
    assert not alive(pid) and not alive(inner) and not alive(escaped)
    assert handle.watchdog_exit == exit_codes.ExitCode.LEASE_EXPIRED


def test_the_first_kill_is_recorded_and_a_descendant_that_left_the_group_is_a_late_kill(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    """The ``killed`` record marks the first SIGKILL round: from then on nothing it
    signalled runs, however long the reaping takes (a thawed or saturated host took
    seconds: the chaos checker ends a driver's run there). The descendant in its own
    session is not in the group: it is killed once re-parented, a late kill."""
    deadline = watchdog.lease_clock() + 1.5
    handle = supervise(
        started, tmp_path, [sys.executable, str(child), str(tmp_path), "family"], deadline
    )
    wait_ready(tmp_path)

    assert handle.wait(10) is not None

    [killed] = [r for r in records(tmp_path) if r["event"] == "killed"]
    ended = ended_record(tmp_path)
    assert deadline <= killed["mono"] <= ended["mono"]
    assert killed["pid"] == ended["pid"] and killed["epoch"] == 7
    assert ended["late_kills"] == 1


def test_a_driver_whose_processes_all_share_its_group_has_no_late_kill(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    handle = supervise(
        started, tmp_path, [sys.executable, str(child), str(tmp_path)], watchdog.lease_clock() + 1
    )
    wait_ready(tmp_path)
    assert handle.wait(10) is not None
    assert [r["event"] for r in records(tmp_path)] == ["started", "killed", "ended"]
    assert ended_record(tmp_path)["late_kills"] == 0


def test_confirmations_keep_the_driver_alive(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    handle = supervise(
        started, tmp_path, [sys.executable, str(child), str(tmp_path)], watchdog.lease_clock() + 0.5
    )
    end = watchdog.lease_clock() + 2.0  # four times the confirmed window
    while watchdog.lease_clock() < end:
        handle.confirm(watchdog.lease_clock() + 0.5)
        assert handle.poll() is None
        time.sleep(0.1)  # the renewal period of this simulated server
    outcome = handle.wait(5)
    assert outcome is not None and outcome.reason == driver.Reason.LEASE_EXPIRED


# A tiny "server": launches a watchdog, prints its pid, then either never confirms
# again (pause test) or confirms every 0.1 s with deadline = now + 1.0 (kill -9 test).
PARENT = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from server import driver, watchdog
    here, child, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    handle = driver.supervise(
        [sys.executable, child, str(here)], env=dict(os.environ), run_dir=here / "run",
        lease_deadline=watchdog.lease_clock() + 1.5, job="j", epoch=1, server="parent",
        records=here / "records.jsonl",
    )
    print(json.dumps({"watchdog": handle.pid}), flush=True)
    while True:
        if mode == "confirm":
            handle.confirm(watchdog.lease_clock() + 1.0)
        time.sleep(0.1)
    """
)


StartParent = Callable[[str], tuple["subprocess.Popen[str]", int]]


@pytest.fixture
def parent(tmp_path: Path, child: Path) -> Iterator[StartParent]:
    processes: list[subprocess.Popen[str]] = []

    def start(mode: str) -> tuple[subprocess.Popen[str], int]:
        process = subprocess.Popen(
            [sys.executable, "-c", PARENT, str(tmp_path), str(child), mode],
            stdout=subprocess.PIPE,
            text=True,
        )
        processes.append(process)
        assert process.stdout is not None
        return process, json.loads(process.stdout.readline())["watchdog"]

    yield start
    for process in processes:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
    # Whatever the outcome, no child of this test may survive it.
    handle = driver.adopt(tmp_path / "run")
    if handle is not None:
        handle.kill()


def test_a_paused_parent_does_not_pause_the_watchdog(tmp_path: Path, parent: StartParent) -> None:
    process, watchdog_pid = parent("never-confirm")
    pid = wait_ready(tmp_path)
    deadline = rundir.read_lease(tmp_path / "run" / rundir.LEASE_FILE)
    assert deadline is not None and watchdog.lease_clock() < deadline

    process.send_signal(signal.SIGSTOP)

    ended = wait_ended(tmp_path, 10)
    assert not alive(pid)
    assert ended["reason"] == "lease_expired"
    assert deadline <= float(ended["mono"]) <= deadline + KILL_LATENCY_S
    waiting.wait_until(lambda: not alive(watchdog_pid), 5, message="watchdog did not exit")


def test_a_killed_parent_s_driver_dies_at_the_deadline_not_before(
    tmp_path: Path, parent: StartParent
) -> None:
    process, _ = parent("confirm")
    pid = wait_ready(tmp_path)
    lease_file = tmp_path / "run" / rundir.LEASE_FILE
    seen: set[float | None] = set()

    def renewed_a_few_times() -> bool:
        seen.add(rundir.read_lease(lease_file))
        return len(seen) >= 4

    waiting.wait_until(renewed_a_few_times, 10, interval=0.02, message="parent never confirmed")

    process.kill()
    process.wait()
    deadline = rundir.read_lease(lease_file)
    assert deadline is not None

    while watchdog.lease_clock() < deadline - 0.05:
        assert alive(pid), "the driver died before its confirmed deadline"
        time.sleep(0.02)
    ended = wait_ended(tmp_path, 5)
    assert not alive(pid)
    assert ended["reason"] == "lease_expired"
    assert deadline <= float(ended["mono"]) <= deadline + KILL_LATENCY_S


def test_stop_sends_sigterm_then_sigkill_after_the_grace(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    handle = supervise(
        started,
        tmp_path,
        [sys.executable, str(child), str(tmp_path), "ignore-term"],
        watchdog.lease_clock() + 60,
    )
    pid = wait_ready(tmp_path)

    begin = watchdog.lease_clock()
    outcome = handle.stop(grace=1.0)
    elapsed = watchdog.lease_clock() - begin

    assert outcome.reason == driver.Reason.STOPPED
    assert outcome.exit_code == -signal.SIGKILL
    assert (tmp_path / f"term-{pid}").exists()  # it was asked first
    assert 1.0 <= elapsed < 1.0 + KILL_LATENCY_S + 0.5
    assert not alive(pid)
    assert ended_record(tmp_path)["stopping"] is True


def test_stop_of_a_driver_that_honours_sigterm_returns_at_once(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    handle = supervise(
        started, tmp_path, [sys.executable, str(child), str(tmp_path)], watchdog.lease_clock() + 60
    )
    wait_ready(tmp_path)
    begin = watchdog.lease_clock()
    outcome = handle.stop(grace=30)
    assert watchdog.lease_clock() - begin < 5
    assert outcome.reason == driver.Reason.STOPPED and outcome.exit_code == 0
    assert handle.stop(grace=30) == outcome  # idempotent


# The shape of spark-submit: a leader (the JVM) serving one child (the Python driver),
# exiting with the child's code when the child exits.
LEADER = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    here, child = sys.argv[1], sys.argv[2]
    signal.signal(signal.SIGTERM, lambda *_: open(os.path.join(here, "leader-term"), "w").close())
    sys.exit(subprocess.Popen([sys.executable, child, here]).wait())
    """
)


def test_stop_with_term_only_asks_just_the_python_driver(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    handle = supervise(
        started,
        tmp_path,
        [sys.executable, "-c", LEADER, str(tmp_path), str(child)],
        watchdog.lease_clock() + 60,
        term_only=str(child),
    )
    pid = wait_ready(tmp_path)
    outcome = handle.stop(grace=30)
    assert outcome.reason == driver.Reason.STOPPED and outcome.exit_code == 0
    assert (tmp_path / f"term-{pid}").exists()
    assert not (tmp_path / "leader-term").exists()


def test_descendants_die_with_a_driver_that_exits(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    handle = supervise(
        started,
        tmp_path,
        [sys.executable, str(child), str(tmp_path), "family"],
        watchdog.lease_clock() + 60,
    )
    wait_ready(tmp_path)
    inner, escaped = map(int, (tmp_path / "family").read_text().split())
    # "family" mode sleeps: ask it to exit by itself through SIGTERM of its own pid only.
    os.kill(wait_ready(tmp_path), signal.SIGTERM)
    outcome = handle.wait(10)
    assert outcome is not None
    assert outcome.reason == driver.Reason.EXITED and outcome.exit_code == 0
    assert not alive(inner) and not alive(escaped)


def test_the_driver_and_its_children_run_below_the_watchdog_s_priority(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    """A host thawed from a freeze, or simply busy, must schedule the watchdog before the
    drivers it is to kill: the driver's whole group runs ``nice`` steps below it."""
    handle = supervise(
        started,
        tmp_path,
        [sys.executable, str(child), str(tmp_path), "family"],
        watchdog.lease_clock() + 60,
        nice=7,
    )
    pid = wait_ready(tmp_path)
    inner, escaped = map(int, (tmp_path / "family").read_text().split())
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, handle.pid) == own  # the watchdog keeps ours
    for member in (pid, inner, escaped):  # inherited by what the driver starts
        assert os.getpriority(os.PRIO_PROCESS, member) == min(own + 7, 19)


def test_a_failing_driver_reports_its_exit_code(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    handle = supervise(
        started,
        tmp_path,
        [sys.executable, str(child), str(tmp_path), "exit-3"],
        watchdog.lease_clock() + 60,
    )
    outcome = handle.wait(10)
    assert outcome is not None
    assert outcome.reason == driver.Reason.EXITED and outcome.exit_code == 3
    assert outcome.started_at is not None and outcome.started_at <= outcome.ended_at
    assert handle.watchdog_exit == exit_codes.ExitCode.DRIVER_FAILED
    assert [r["event"] for r in records(tmp_path)] == ["started", "ended"]
    assert ended_record(tmp_path)["stopping"] is False  # its own failure: the budget's
    assert "driver ended: reason=exited exit_code=3" in handle.log_file.read_text()


def test_a_command_that_cannot_start_is_spawn_failed(
    tmp_path: Path, started: list[driver.Driver]
) -> None:
    handle = supervise(
        started, tmp_path, [str(tmp_path / "no-such-binary")], watchdog.lease_clock() + 60
    )
    outcome = handle.wait(10)
    assert outcome is not None
    assert outcome.reason == driver.Reason.SPAWN_FAILED and outcome.exit_code is None
    assert records(tmp_path) == []


def test_an_expired_lease_never_starts_the_driver(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    handle = supervise(
        started, tmp_path, [sys.executable, str(child), str(tmp_path)], watchdog.lease_clock() - 0.1
    )
    outcome = handle.wait(10)
    assert outcome is not None
    assert outcome.reason == driver.Reason.LEASE_EXPIRED and outcome.exit_code is None
    assert not (tmp_path / "ready").exists()


def test_kill_ends_watchdog_and_group_and_records_the_end(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    handle = supervise(
        started,
        tmp_path,
        [sys.executable, str(child), str(tmp_path), "family"],
        watchdog.lease_clock() + 60,
    )
    pid = wait_ready(tmp_path)
    inner, escaped = map(int, (tmp_path / "family").read_text().split())
    handle.kill()
    # The escaped descendant (own session, as PySpark's daemon or anything a job starts
    # with setsid) dies too: a kill that leaves it running is a double run waiting.
    assert not alive(pid) and not alive(inner) and not alive(handle.pid)
    assert not alive(escaped)
    outcome = handle.poll()
    assert outcome is not None and outcome.reason == driver.Reason.KILLED
    assert ended_record(tmp_path)["reason"] == "killed"


def test_a_watchdog_killed_with_sigkill_is_over_only_once_its_run_is_gone(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    """Hole H1: SIGKILL of the watchdog itself (an operator, the OOM killer) leaves no
    result, and its subreaper is gone: the driver's children and anything that left the
    group are orphaned to init. ``poll()`` must not report the run over (the job would be
    released and started elsewhere) while any of them lives."""
    handle = supervise(
        started,
        tmp_path,
        [sys.executable, str(child), str(tmp_path), "family"],
        watchdog.lease_clock() + 60,
    )
    pid = wait_ready(tmp_path)
    inner, escaped = map(int, (tmp_path / "family").read_text().split())
    os.kill(handle.pid, signal.SIGKILL)
    waiting.wait_until(lambda: handle.poll() is not None, 15, message="the run never ended")
    outcome = handle.poll()
    assert outcome is not None and outcome.reason == driver.Reason.KILLED
    assert not alive(pid) and not alive(inner) and not alive(escaped)
    assert ended_record(tmp_path)["reason"] == "killed"


def test_adopt_reattaches_to_a_live_watchdog(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    handle = supervise(
        started, tmp_path, [sys.executable, str(child), str(tmp_path)], watchdog.lease_clock() + 60
    )
    pid = wait_ready(tmp_path)
    adopted = driver.adopt(tmp_path / "run")
    assert adopted is not None and adopted.pid == handle.pid
    assert adopted.poll() is None

    adopted.confirm(watchdog.lease_clock() + 60)
    outcome = adopted.stop(grace=5)

    assert outcome.reason == driver.Reason.STOPPED and not alive(pid)
    assert handle.wait(5) == outcome
    # Once the watchdog is gone there is nothing to adopt.
    assert driver.adopt(tmp_path / "run") is None
    assert driver.adopt(tmp_path / "nowhere") is None


def test_adopt_takes_only_the_watchdog_of_the_run_it_is_asked_for(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    """Hole H6: a job deleted and created again under its name is at epoch 1 again. A
    live watchdog of job id 5 is no run of job id 9, whatever their names; its state
    and result carry the id, and a successor adopts or records only its own run's."""
    handle = supervise(
        started,
        tmp_path,
        [sys.executable, str(child), str(tmp_path), "exit-3"],
        watchdog.lease_clock() + 60,
        job_id=5,
    )
    run_dir = tmp_path / "run"
    waiting.wait_until(lambda: (run_dir / rundir.STATE_FILE).exists(), 10, message="no state file")
    mine = driver.RunIdentity(5, "j", 7, "server-a")
    namesake = driver.RunIdentity(9, "j", 7, "server-a")
    state = rundir.read_json(run_dir / rundir.STATE_FILE)
    assert state is not None and state["job_id"] == 5
    assert mine.wrote(state) and not namesake.wrote(state)
    assert driver.adopt(run_dir, namesake) is None
    assert handle.wait(10) is not None
    result = rundir.read_json(run_dir / rundir.RESULT_FILE)
    assert result is not None and result["job_id"] == 5 and result["exit_code"] == 3
    assert mine.wrote(result) and not namesake.wrote(result)
    # Another epoch or another server's run is not this run either.
    assert not driver.RunIdentity(5, "j", 8, "server-a").wrote(result)
    assert not driver.RunIdentity(5, "j", 7, "server-b").wrote(result)


def test_adopt_still_takes_a_watchdog_of_the_older_code_by_its_name(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    """Upgrade compatibility: a watchdog started by the older code records no job id (as
    one started here without ``job_id``); a restarted server adopts it by name, epoch
    and server (rundir.run_trace looks for it only where that code kept its runs)."""
    handle = supervise(
        started, tmp_path, [sys.executable, str(child), str(tmp_path)], watchdog.lease_clock() + 60
    )
    wait_ready(tmp_path)
    state = rundir.read_json(tmp_path / "run" / rundir.STATE_FILE)
    assert state is not None and "job_id" not in state
    adopted = driver.adopt(tmp_path / "run", driver.RunIdentity(9, "j", 7, "server-a"))
    assert adopted is not None and adopted.pid == handle.pid
    assert driver.adopt(tmp_path / "run", driver.RunIdentity(9, "other", 7, "server-a")) is None


def test_adopt_refuses_a_reused_pid(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # Our own pid with a wrong start time: a recycled pid, not the watchdog that wrote it.
    ticks = watchdog.process_start_ticks(os.getpid())
    assert ticks is not None
    rundir.write_json_atomically(
        run_dir / rundir.STATE_FILE,
        {"watchdog_pid": os.getpid(), "watchdog_start_ticks": ticks + 1},
    )
    assert driver.adopt(run_dir) is None


def test_watchdog_usage_errors_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server.watchdog", "--lease-file", "x", "--result", "y"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == exit_codes.ExitCode.USAGE
    assert "no command given" in result.stderr


def test_a_driver_cannot_forge_its_own_lease_from_its_working_directory(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    deadline = watchdog.lease_clock() + 2.0
    supervise(
        started,
        tmp_path,
        [sys.executable, str(child), str(tmp_path), "forge-lease"],
        deadline,
    )
    wait_ready(tmp_path)
    ended = wait_ended(tmp_path, timeout=2.0 + 5.0)
    assert ended["reason"] == "lease_expired"
    assert ended["mono"] < deadline + KILL_LATENCY_S


@pytest.mark.parametrize(
    ("exit_code", "stop", "writes"),
    [
        (1, None, True),  # a crash of its own: recorded here (hole H5)
        (0, None, True),  # an exit 0: recorded here
        (1, "file", False),  # its server began a stop (stop.json): the server decides
        (1, "signal", False),  # SIGTERM (its server's, or a service manager's)
        # A SIGTERM exit waits for the watchdog's own SIGTERM, which the service manager
        # sent together with the driver's (KillMode=control-group).
        (143, "late signal", False),
        (-15, "late signal", False),
        (143, None, True),  # none came: a crash (after SIGTERM_STOP_WAIT_S)
        (0, "file", True),  # an exit 0 ran to its end, stop or not
    ],
)
def test_a_watchdog_records_its_driver_s_own_exit_but_not_a_failure_during_a_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exit_code: int, stop: str | None, writes: bool
) -> None:
    """Which ends a watchdog writes to PostgreSQL itself (``reconcile.watchdog_ending``),
    with a stop seen the way the watchdog sees it. A failure while its server stops the
    driver is released by the server, never counted as a crash."""
    from sql import database

    connecting: list[str] = []

    def no_database(url: str, **kwargs: Any) -> Any:
        connecting.append(url)
        raise RuntimeError("no database in this test")

    monkeypatch.setattr(database, "create_engine", no_database)
    args = watchdog_contract.WatchdogArgs.parse(
        [
            "--lease-file",
            str(tmp_path / "lease.json"),
            "--result",
            str(tmp_path / "result.json"),
            "--stop-file",
            str(tmp_path / "stop.json"),
            "--",
            "true",
        ]
    )
    report = watchdog_contract.FinishReport(
        database_url="postgresql://nowhere/x",
        job_id=1,
        server="s1",
        epoch=1,
        backoff_base=1.0,
        backoff_max=2.0,
        log_file=str(tmp_path / "driver.log"),
    )
    dog = watchdog.Watchdog(args, report)
    if stop == "file":
        rundir.write_json_atomically(tmp_path / "stop.json", {"grace": 1})
    dog.stop_requested = stop == "signal"
    if stop == "late signal":
        threading.Timer(0.3, lambda: setattr(dog, "stop_requested", True)).start()
    monkeypatch.setattr(watchdog, "SIGTERM_STOP_WAIT_S", 1.0)
    stopping = dog._stopping_at_exit(exit_code, exit_codes.SIGTERM_EXITS)
    assert dog._record_end(watchdog.Reason.EXITED, exit_code, stopping) is False
    assert connecting == (["postgresql://nowhere/x"] if writes else [])
    for reason in ("stopped", "lease_expired", "killed", "spawn_failed"):
        assert dog._record_end(watchdog.Reason(reason), None, True) is False
    assert len(connecting) == int(writes), "an ending that is not the driver's own was written"


def test_a_watchdog_that_records_loads_its_database_client_before_its_driver_starts(
    started: list[driver.Driver], tmp_path: Path, child: Path
) -> None:
    """A batch run's exit 0 is a fact on one host until its watchdog commits it: a host lost
    in that window runs the generation again (docs/drivers.md, "What a batch job
    may see twice"; CHAOS_SEED=593937537: the exit came 0.85 s before its host froze,
    while the watchdog was still importing its database client). So a watchdog that
    records loads that client before it starts the driver: not after the exit, and not on
    a thread beside its supervising loop, which that import starved of the GIL for
    seconds on a saturated host (CHAOS_SEED=500268951)."""
    report = driver.FinishReport(
        database_url="postgresql+psycopg://nobody@127.0.0.1:1/none",
        job_id=1,
        server="server-a",
        epoch=7,
        backoff_base=1.0,
        backoff_max=2.0,
        log_file=str(tmp_path / "driver.log"),
    )
    handle = supervise(
        started, tmp_path, ["sleep", "60"], watchdog.lease_clock() + 60, report=report
    )
    state = tmp_path / "run" / rundir.STATE_FILE

    def spawned() -> bool:
        return bool((rundir.read_json(state) or {}).get("driver_pid"))

    waiting.wait_until(spawned, 30, interval=0.005, message="the driver never started")
    # Loaded already at the spawn, without waiting: it came first.
    assert "sqlalchemy" in Path(f"/proc/{handle.pid}/maps").read_text()
    handle.kill()


def test_a_warm_driver_that_ends_before_its_go_signal_leaves_no_lifetime_record(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    """A warm driver (docs/drivers.md, "Warm hand-off") runs no job code until its
    server writes the go file: an end before it is no run of the job's (nothing to
    record, no lifetime to overlap another driver's)."""
    handle = supervise(
        started,
        tmp_path,
        [sys.executable, str(child), str(tmp_path), "exit-3"],
        watchdog.lease_clock() + 60,
        go_file=tmp_path / "run" / rundir.GO_FILE,
    )
    outcome = handle.wait(10)
    assert outcome is not None and outcome.exit_code == 3
    assert records(tmp_path) == []
    assert rundir.read_json(tmp_path / "run" / rundir.RESULT_FILE)["went"] is False


def test_a_warm_driver_s_lifetime_starts_at_its_go_signal(
    tmp_path: Path, child: Path, started: list[driver.Driver]
) -> None:
    go_file = tmp_path / "run" / rundir.GO_FILE
    handle = supervise(
        started,
        tmp_path,
        [sys.executable, str(child), str(tmp_path), "sleep"],
        watchdog.lease_clock() + 60,
        go_file=go_file,
    )
    wait_ready(tmp_path)
    time.sleep(0.3)
    assert records(tmp_path) == []  # warm, not yet a run of the job
    went_at = rundir.write_go(go_file)
    waiting.wait_until(lambda: records(tmp_path), 5, message="no started record after go")
    [first] = records(tmp_path)
    assert first["event"] == "started" and first["t"] == went_at
    outcome = handle.stop(1.0)
    assert outcome.reason == driver.Reason.STOPPED
    assert [r["event"] for r in records(tmp_path)] == ["started", "ended"]
    assert rundir.read_json(tmp_path / "run" / rundir.RESULT_FILE)["went"] is True
