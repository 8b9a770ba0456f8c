"""Past driver logs end to end (``job logs --epoch``, ``--run ID --attempt K``): a real
server runs light drivers under spark-submit (testing/jobs/heartbeat.py, which prints its
own epoch; testing/jobs/fail_once.py, whose first attempt fails), and each earlier
driver's log is read back from S3, its own lines and no other driver's."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from testing import cli_runner, waiting
from testing.cluster import Cluster
from tests.e2e import helpers

FAIL_ONCE_JOB = Path(__file__).parents[2] / "testing" / "jobs" / "fail_once.py"
SAY = "talk says: I am epoch {epoch}"


def _said(epoch: int) -> str:
    return SAY.format(epoch=epoch)


def _logged(cluster: Cluster, *args: str, wanted: str) -> str:
    """``job logs ARGS`` once it prints ``wanted`` (a log is shipped just after its
    driver ended)."""
    seen = ""

    def found() -> bool:
        nonlocal seen
        result = cluster.cli("job", "logs", *args, check=False)
        seen = result.stdout + result.stderr
        return result.returncode == 0 and wanted in result.stdout

    try:
        waiting.wait_until(found, 60, interval=1)
    except AssertionError:
        raise AssertionError(f"{wanted!r} not in job logs {args}: {seen[-2000:]}") from None
    return cluster.cli("job", "logs", *args).stdout


def test_job_logs_epoch_shows_an_earlier_streaming_drivers_own_lines(cluster: Cluster) -> None:
    """Epoch N's driver, restarted away (epoch N + 1), is read back by ``--epoch N``:
    its own lines, not its successor's. ``--epoch`` of the live driver reads it from its
    owner, and with ``--follow`` follows that driver only, until it ends."""
    helpers.start_cluster(cluster, servers=("s1",))
    helpers.heartbeat_job(cluster, "talk", extra=["--say", SAY])
    cluster.cli("job", "start", "talk", "--wait", "--timeout", "100")
    first = cluster.job("talk")["epoch"]
    _logged(cluster, "talk", wanted=_said(first))
    cluster.cli("job", "restart", "talk")
    second = cluster.wait_job(
        "talk", lambda j: helpers.running(j) and j["epoch"] > first, 120, "the next driver"
    )["epoch"]
    past = _logged(cluster, "talk", "--epoch", str(first), wanted=_said(first))
    assert _said(second) not in past, past
    live = _logged(cluster, "talk", "--epoch", str(second), wanted=_said(second))
    assert _said(first) not in live, live
    # What makes no sense is refused by name, in one line.
    cli_runner.one_line_error(
        cluster.cli("job", "logs", "talk", "--epoch", str(first), "--follow", check=False),
        "--follow",
        f"epoch {first}",
    )
    cli_runner.one_line_error(
        cluster.cli("job", "logs", "talk", "--epoch", "99", check=False), "has no epoch 99"
    )
    cli_runner.one_line_error(
        cluster.cli("job", "logs", "talk", "--epoch", "1", "--run", "1", check=False),
        "--epoch",
        "--run",
    )
    # The live driver followed by its epoch: until that driver ends, not on to the next.
    follower, received, errors = _follow(cluster, "talk", "--epoch", str(second), "-f")
    try:
        waiting.wait_until(lambda: _said(second).encode() in received, 60, message="the tail")
        cluster.cli("job", "restart", "talk")
        assert follower.wait(timeout=120) == 0, errors.read_text()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    ended = b"[sparkring] follow ended: the run ended\n"
    waiting.wait_until(lambda: received.endswith(ended), 10, message="the follow's last line")
    assert received.count(b"[sparkring] follow ended") == 1, bytes(received[-500:])
    assert f"job talk: the driver of epoch {second} ended" in errors.read_text()


def _follow(cluster: Cluster, *args: str) -> tuple[subprocess.Popen, bytearray, Path]:
    """``job logs ARGS`` running, its stdout read into the bytearray as it comes; its
    stderr goes to the file."""
    errors = cluster.root / "follow.err"
    with errors.open("wb") as stderr:
        follower = subprocess.Popen(
            [sys.executable, "-m", "server", "job", "logs", *args],
            env={**cluster.env, "SPARKRING_WORK_DIR": str(cluster.root / "cli")},
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    received = bytearray()

    def read() -> None:
        assert follower.stdout is not None
        with follower.stdout:
            while chunk := follower.stdout.read1(4096):
                received.extend(chunk)

    threading.Thread(target=read, daemon=True).start()
    return follower, received, errors


def test_job_logs_run_attempt_shows_the_failed_attempts_output(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A batch run that failed once and then succeeded: its attempt 1 (a retry is a new
    claim, so a new epoch) shows the failure's output, attempt 2 does not."""
    helpers.start_cluster(cluster, servers=("s1",))
    cluster.cli("resource", "upload", "fail-once", str(FAIL_ONCE_JOB))
    marker = tmp_path / "marker"
    cluster.cli(
        "job", "create", "flaky", "--resource", "fail-once", "--kind", "batch",
        "--max-retries", "1", f"--arg={marker}",
    )  # fmt: skip
    cluster.cli("job", "start", "flaky")
    cluster.wait_job("flaky", lambda j: j["state"] == "finished", 180, "job finished")
    (run,) = json.loads(cluster.cli("job", "runs", "flaky", "--json").stdout)
    assert (run["state"], run["attempts"]) == ("finished", 2), run
    run_id = str(run["run_id"])
    failing = "fail_once: first run, failing on purpose"
    first = _logged(cluster, "flaky", "--run", run_id, "--attempt", "1", wanted=failing)
    second = _logged(cluster, "flaky", "--run", run_id, "--attempt", "2", wanted="")
    assert failing not in second, second
    assert cluster.cli("job", "logs", "flaky", "--run", run_id).stdout == second
    # Attempt 1 ran as the epoch before the run's last: the same log by its epoch.
    by_epoch = cluster.cli("job", "logs", "flaky", "--epoch", str(run["epoch"] - 1)).stdout
    assert by_epoch == first
    claimed = [e["epoch"] for e in cluster.events("flaky") if e["kind"] == "claimed"]
    assert claimed == [run["epoch"] - 1, run["epoch"]], claimed
    cli_runner.one_line_error(
        cluster.cli("job", "logs", "flaky", "--run", run_id, "--attempt", "3", check=False),
        f"run {run_id} made 2 attempts",
        "no attempt 3",
    )
