"""The README's "Using it" commands, run as written: bash runs them against this test's
own database, ZooKeeper root, bucket and folders, then the test checks what they did.

The section's set-up lines (bootstrap, the stack, ``stack.py env``, PATH) are what this
test's environment stands for: the stack's ``SPARKRING_*`` with the test's own database,
root and bucket (``testing.cluster.Cluster``), a work dir of its own, and ``sparkring`` on
PATH (this checkout's, run by this interpreter). The test checks that those lines still
say only that, so that the two cannot drift apart; every line after them runs verbatim.
The server the block starts in the background is stopped by the test, with every
process of the block, and the drivers' watchdogs by ``Cluster.close``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.cli import spec
from testing import sink, waiting
from testing.cluster import REPO, Cluster

README = REPO / "README.md"
SECTION = "## Using it"
# The set-up lines, as the test's environment stands for them (comments dropped).
SETUP = [
    "scripts/bootstrap.sh",
    "python3 scripts/stack.py up",
    'eval "$(python3 scripts/stack.py env)"',
    'export PATH="$PWD/.venv/bin:$PATH"',
]
# The whole block: a server start, two Spark drivers (the stream and its roll) and a
# batch run, on a loaded 2-core machine. A command that never ends fails the test here.
BLOCK_TIMEOUT_S = 600
SERVER_STOP_S = 60
TOKEN = re.compile(r"^srt_[A-Za-z0-9_-]+$", re.MULTILINE)
CONSOLE_LINE = re.compile(r"console at (https?://\S+/console/)")


def readme_lines() -> tuple[list[str], list[str]]:
    """The sh blocks of the README's "Using it" section, as lines: those up to and
    including the PATH line (the set-up), and the rest (what a user runs)."""
    text = README.read_text()
    assert f"\n{SECTION}\n" in text, f"README.md has no {SECTION!r} section"
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    lines = "".join(blocks).splitlines()
    cut = next(i for i, line in enumerate(lines) if line.startswith("export PATH="))
    return lines[: cut + 1], lines[cut + 1 :]


def _command(line: str) -> str:
    return re.sub(r"\s+#.*$", "", line).strip()


def test_the_readme_set_up_is_what_this_test_stands_for() -> None:
    setup, use = readme_lines()
    assert [_command(line) for line in setup if _command(line)] == SETUP
    assert use and not any("stack.py" in line for line in use)


def test_the_example_job_file_is_valid() -> None:
    """examples/jobs.toml, which the README plans with `apply --dry-run`, parses against
    the apply schema, with its variables and secrets."""
    parsed = spec.parse(REPO / "examples" / "jobs.toml")
    jobs = {job.name: job for job in parsed.jobs}
    assert sorted(jobs) == ["clicks", "daily-sum", "region-report"]
    assert jobs["region-report"].env == {"REGION": "eu"}
    assert jobs["region-report"].secret_env == {"WAREHOUSE_PASSWORD": "warehouse"}
    assert all(
        job.resource.path is not None and job.resource.path.is_file() for job in jobs.values()
    )


@pytest.fixture
def blocks() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The block's bash, each the leader of a session and process group of its own: the
    server it starts in the background outlives it, and is stopped here (SIGTERM first,
    as `kill %1`), with whatever else of the block is left."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for bash in started:
        _stop_group(bash)


def _stop_group(bash: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the group, then SIGKILL to what is left after SERVER_STOP_S. bash
    itself is reaped first: a zombie still counts as a member of its group."""
    for sig, patience in ((signal.SIGTERM, SERVER_STOP_S), (signal.SIGKILL, 10.0)):
        _signal_group(bash.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            bash.wait(timeout=patience)
        if waiting.poll_until(lambda: not _group_alive(bash.pid), patience, interval=0.5):
            return
    raise AssertionError(f"processes of the README's block are left in group {bash.pid}")


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _sparkring_on_path(folder: Path) -> Path:
    """A ``sparkring`` command that runs this checkout's CLI with this interpreter."""
    folder.mkdir()
    command = folder / "sparkring"
    command.write_text(f'#!/bin/sh\nexec {sys.executable} -m server "$@"\n')
    command.chmod(0o755)
    return folder


@pytest.mark.spark
@pytest.mark.long(120)
def test_the_readme_commands_run_as_written_and_do_the_work(
    cluster: Cluster, tmp_path: Path, blocks: list[subprocess.Popen[bytes]]
) -> None:
    _, use = readme_lines()
    script = tmp_path / "using-it.sh"
    script.write_text("\n".join(use) + "\n")
    out = tmp_path / "out"  # the README's $OUT: it makes the folder itself
    work = cluster.server_dir("s1") / "work"  # Cluster.close sweeps its watchdogs
    work.parent.mkdir(parents=True)
    bin_dir = _sparkring_on_path(tmp_path / "bin")
    env = {
        **cluster.env,
        "SPARKRING_WORK_DIR": str(work),
        "OUT": str(out),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    stdout, stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(stdout, "wb") as out_file, open(stderr, "wb") as err_file:
        block = subprocess.Popen(
            ["bash", "-euo", "pipefail", str(script)],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out_file,
            stderr=err_file,
            start_new_session=True,
        )
        blocks.append(block)
        try:
            code = block.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None  # a command that never ends (a log followed, a wait)
            _stop_group(block)
    printed, logged = stdout.read_text(), stderr.read_text()
    assert code == 0, (
        f"the README's block {'exited ' + str(code) if code is not None else 'never ended'}"
        f"\n--- stdout\n{printed[-4000:]}\n--- stderr\n{logged[-6000:]}"
    )

    # The server said where its console is, `server list` shows it, and it answers; the
    # token the block made opens the API behind it.
    found = CONSOLE_LINE.search(logged)
    assert found, f"the server logged no console URL:\n{logged[-4000:]}"
    console_url = found.group(1)
    assert console_url in printed, "server list does not show the console URL"
    with urllib.request.urlopen(console_url, timeout=10) as page:
        assert page.status == 200 and b"<html" in page.read().lower()
    tokens = TOKEN.findall(printed)
    assert len(tokens) == 1, printed
    base = console_url.removesuffix("/console/")
    request = urllib.request.Request(
        f"{base}/api/v1/jobs", headers={"Authorization": f"Bearer {tokens[0]}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        listed = json.load(answer)
    assert sorted(job["name"] for job in listed["jobs"]) == ["etl", "nightly"]

    # The streaming job rolled to revision 2 (the edited file), and its output grows with
    # micro-batches of that run.
    etl = cluster.wait_job(
        "etl",
        lambda j: j["state"] == "running" and j["run_revision"] == 2,
        180,
        "etl running revision 2",
    )
    assert etl["revision"] == 2 and etl["resource"]["filename"] == "etl_v2.py"
    waiting.wait_until(
        lambda: etl["epoch"] in sink.written_by_epoch(out / "etl"),
        180,
        interval=1,
        message="a micro-batch of revision 2 committed",
    )

    # The batch job's one run finished and its output holds the right sum; its schedule
    # is on, next at 03:00 Berlin time.
    result = json.loads((out / "sum.json").read_text())
    assert (result["n"], result["sum"]) == (1000, sum(range(1000)))
    assert result["env"]["SPARKRING_JOB"] == "nightly"
    runs = cluster.sql(
        "SELECT r.trigger, r.state, r.exit_code FROM runs r JOIN jobs j ON j.id = r.job_id "
        "WHERE j.name = 'nightly'"
    )
    # (a fire of the schedule itself would add a row only at 03:00 Berlin time)
    assert [tuple(r) for r in runs if r.trigger == "manual"] == [("manual", "finished", 0)]
    nightly = cluster.job("nightly")
    assert nightly["schedule"]["active"] and nightly["schedule"]["timezone"] == "Europe/Berlin"
    assert nightly["schedule"]["next_fire"] is not None

    # The dry run planned the example file's jobs and created none; the alert exists.
    for name in ("clicks", "daily-sum", "region-report"):
        assert re.search(rf"^create\s+{name} ", printed, re.MULTILINE), printed
    assert [r.name for r in cluster.sql("SELECT name FROM jobs ORDER BY name")] == [
        "etl",
        "nightly",
    ]
    assert [r.name for r in cluster.sql("SELECT name FROM alerts")] == ["pager"]

    # What the README says of `kill %1`: the server stops its driver and exits, and the
    # job waits for a server. The stream kept each value once across its roll.
    assert _group_alive(block.pid), "the README's server is gone"
    _signal_group(block.pid, signal.SIGTERM)
    waiting.wait_until(
        lambda: not _group_alive(block.pid),
        SERVER_STOP_S,
        interval=0.5,
        message="the README's server did not stop on SIGTERM",
    )
    etl = cluster.job("etl")
    assert (etl["state"], etl["owner"], etl["desired"]) == ("pending", None, "running")
    values = sink.committed_values(out / "etl")
    assert len(values) == len(set(values)), "a value was written twice"
    assert sorted(values) == list(range(len(values))), "a value was lost"
