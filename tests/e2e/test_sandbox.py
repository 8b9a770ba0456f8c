"""Drivers under their own OS user, through a real server with the stack's settings
(``SPARKRING_DRIVER_USER``, docs/drivers.md "The driver's user"): a job finds none of the
server's secrets in any ``/proc/*/environ`` or ``cmdline`` it can read, cannot open its
run's control files for writing, and Spark's own example ``pi.py`` still runs."""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
from pathlib import Path

import pytest

from server import defaults, driver_user
from testing import waiting
from testing.cluster import REPO, Cluster
from tests import conftest
from tests.e2e import helpers

PROBE_JOB = REPO / "testing" / "jobs" / "sandbox_probe.py"
DEFAULT_DRIVER_USER = "sparkring-driver"  # scripts/stack.py's


@pytest.fixture
def sandboxed(
    stack_env: dict[str, str], database_url: str, zk_root: str, s3_bucket: str, tmp_path: Path
) -> Cluster:
    """A cluster whose servers run drivers as the stack's driver user."""
    name = stack_env.get("SPARKRING_DRIVER_USER") or DEFAULT_DRIVER_USER
    try:
        driver_user.resolve(name)
    except driver_user.DriverUserError as exc:
        conftest.unavailable(f"{exc}: run scripts/bootstrap.sh")
    extra = {"SPARKRING_DRIVER_USER": name}
    c = Cluster(
        stack_env, database_url, zk_root, s3_bucket, tmp_path, extra_env=extra, fork_servers=True
    )
    yield c
    c.close()


def _pi_example() -> Path:
    found = importlib.util.find_spec("pyspark")
    assert found is not None and found.submodule_search_locations
    root = Path(next(iter(found.submodule_search_locations)))
    return root / "examples" / "src" / "main" / "python" / "pi.py"


def _secrets(c: Cluster) -> dict[str, str]:
    """What a job must never read: each secret the servers hold, and the variables that
    carry them."""
    secrets = {
        "S3 secret key": c.env["SPARKRING_S3_SECRET_KEY"],
        "database URL": c.env["SPARKRING_DATABASE_URL"],
        "S3 secret variable": "SPARKRING_S3_SECRET_KEY=",
        "database URL variable": "SPARKRING_DATABASE_URL=",
    }
    if c.env.get("SPARKRING_ZK_AUTH"):
        secrets["ZooKeeper auth"] = c.env["SPARKRING_ZK_AUTH"]
    return secrets


def test_a_job_reads_no_server_secret_and_cannot_touch_its_control_files(
    sandboxed: Cluster,
) -> None:
    c = sandboxed
    user = pwd.getpwnam(c.env["SPARKRING_DRIVER_USER"])
    helpers.start_cluster(c, servers=("s1",))
    [listed] = json.loads(c.cli("server", "list", "--json").stdout)
    assert (listed["driver_user"], listed["driver_user_isolated"]) == (user.pw_name, True)
    assert "drivers run as the server's own user" not in c.log("s1")

    output = c.root / "probe.json"
    c.cli("resource", "upload", "probe", str(PROBE_JOB))
    c.cli("job", "create", "probe", "--resource", "probe", "--kind", "batch", f"--arg={output}")
    c.cli("job", "start", "probe")
    job = c.wait_job("probe", lambda j: j["state"] in ("finished", "failed"), 120, "probe ended")
    assert job["state"] == "finished", job["last_error"]
    report = json.loads(output.read_text())

    assert report["uid"] == user.pw_uid
    # Below its server and watchdog (which run at this test's priority): SPARKRING_DRIVER_NICE.
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert report["nice"] == min(own + defaults.DRIVER_NICE, 19)
    run_dir = Path(report["run_dir"])
    assert report["home"] == report["cwd"] == str(run_dir / "cwd")
    # It did read: its own environ (its job variables are there) and everyone's cmdline.
    own = [text for key, text in report["proc"].items() if "SPARKRING_JOB=probe" in text]
    assert own, "the probe read no environ at all"
    leaks = {
        f"{what} in /proc/{key}": text[:200]
        for key, text in report["proc"].items()
        for what, secret in _secrets(c).items()
        if secret in text
    }
    assert leaks == {}
    assert report["writable"] == []
    for name in ("lease.json", "watchdog.json", "result.json"):
        st = (run_dir / name).stat()
        assert st.st_uid == os.geteuid() and not st.st_mode & 0o022, name


@pytest.mark.spark
@pytest.mark.long(25)
def test_sparks_own_pi_example_runs_as_the_driver_user(sandboxed: Cluster) -> None:
    c = sandboxed
    helpers.start_cluster(c, servers=("s1",))
    c.cli("resource", "upload", "pi", str(_pi_example()))
    c.cli("job", "create", "pi", "--resource", "pi", "--kind", "batch", "--arg=2")
    c.cli("job", "start", "pi")
    job = c.wait_job("pi", lambda j: j["state"] in ("finished", "failed"), 240, "pi ended")
    assert job["state"] == "finished", job["last_error"]
    # The driver log is shipped to S3 just after the run is recorded ended: until then
    # `job logs` says "no driver log yet" (a busy CI machine showed that moment).
    waiting.wait_until(
        lambda: c.cli("job", "logs", "pi", "-n", "5000", check=False).returncode == 0,
        60,
        interval=0.5,
        message="the driver log of pi was never shipped",
    )
    logs = c.cli("job", "logs", "pi", "-n", "5000").stdout
    assert "Pi is roughly 3." in logs
