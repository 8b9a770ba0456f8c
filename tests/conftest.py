"""Fixtures over the local stack: each service checked once per session, each test
isolated by its own database, ZooKeeper chroot and S3 bucket.

A service that is not running skips the tests that need it locally and fails them when
``CI=true`` (CI must never pass by skipping).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from resource_center import store
from server import driver, driver_user
from server import settings as settings_module
from sql import database
from testing import dealing, services

# Kept of the folders of earlier sessions (pytest's own default is 3).
KEPT_SESSIONS = 3


@pytest.hookimpl(trylast=True)  # after tests/chaos/conftest.py marks its cases skipped or not
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``long(seconds)`` at the front of every worker's share
    (``testing/dealing.py``): collected together (the end-to-end tests come first, the
    campaign's longest cases too), worksteal gave them all to one worker, and the last
    of them ran there while the other workers had nothing left to do."""
    dealing.deal_items(config, items)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """With drivers under their own user (SPARKRING_DRIVER_USER, the stack's default), each
    session's temporary folders live under a parent that user may pass through
    (``testing.cluster.open_to_drivers`` opens the rest). Not under pytest's
    ``/tmp/pytest-of-<user>``: every pytest session that starts resets that folder to
    0700, which locked the drivers of a session already running out of their artifacts
    ("Permission denied", "the driver user cannot reach ..."). The driver user is the
    stack's (its env file, or the environment): ``scripts/test.sh``, and so CI, exports
    nothing. An explicit ``--basetemp`` is left alone."""
    if config.option.basetemp is not None or not services.stack_env().get("SPARKRING_DRIVER_USER"):
        return
    parent = Path(tempfile.gettempdir()) / f"sparkring-pytest-{os.geteuid()}"
    parent.mkdir(mode=0o711, exist_ok=True)
    parent.chmod(0o711)
    _forget_old_sessions(parent)
    config.option.basetemp = str(parent / f"session-{os.getpid()}")


def _forget_old_sessions(parent: Path) -> None:
    """Remove the folders of finished sessions but the newest KEPT_SESSIONS."""
    finished = []
    for folder in parent.glob("session-*"):
        pid = folder.name.removeprefix("session-")
        if pid.isdigit() and not Path("/proc", pid).exists():
            finished.append(folder)
    finished.sort(key=lambda folder: folder.stat().st_mtime, reverse=True)
    for folder in finished[KEPT_SESSIONS:]:
        shutil.rmtree(folder, ignore_errors=True)


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(message: str) -> None:
    """Skip locally, fail under ``CI=true``: a missing service or capability must never
    turn into a green CI run by skipping."""
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


# The driver user scripts/bootstrap.sh creates (and the image has).
DRIVER_USER = "sparkring-driver"


@pytest.fixture(scope="session")
def driver_account() -> driver_user.DriverUser:
    """The bootstrap's driver user; this process must be able to switch to it."""
    try:
        resolved = driver_user.resolve(DRIVER_USER)
    except driver_user.DriverUserError as exc:
        unavailable(f"{exc}: run scripts/bootstrap.sh")
    if driver_user.missing_capabilities():
        unavailable("switching users needs root or CAP_SETUID/CAP_SETGID")
    return resolved


def _missing(what: str) -> None:
    unavailable(f"{what} is not running: start the stack with 'python3 scripts/stack.py up'")


@pytest.fixture(scope="session")
def stack_env() -> dict[str, str]:
    return services.stack_env()


@pytest.fixture(scope="session")
def postgres_url(stack_env: dict[str, str]) -> Iterator[str]:
    url = stack_env.get("SPARKRING_DATABASE_URL")
    if not url:
        _missing("PostgreSQL")
    engine = database.create_engine(url, pool_size=1, connect_timeout=2)
    try:
        database.check(engine)
    except database.DatabaseError:
        _missing("PostgreSQL")
    finally:
        engine.dispose()
    services.create_template(url)
    yield url
    services.drop_template(url)


@pytest.fixture
def database_url(postgres_url: str) -> Iterator[str]:
    """A database of this test's own, migrated to head (copied from a template)."""
    url = services.create_test_database(postgres_url)
    yield url
    services.drop_database(url)


@pytest.fixture
def bench_databases(postgres_url: str) -> Iterator[set[str]]:
    """The benchmarks' scratch databases (``bench_*``) before the test, which has them to
    itself until it ends: a benchmark's smoke test checks it left none behind, which two
    at once (on two of the suite's workers) would see as each other's leftovers."""
    with services.held_alone("bench-databases"):
        yield services.bench_databases(postgres_url)


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = database.create_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def zk_hosts(stack_env: dict[str, str]) -> str:
    hosts = stack_env.get("SPARKRING_ZK_HOSTS", "")
    if not hosts or not any(services.reachable(h) for h in hosts.split(",")):
        _missing("ZooKeeper")
    return hosts


@pytest.fixture
def zk_root(zk_hosts: str) -> Iterator[str]:
    """A ZooKeeper path of this test's own; removed afterwards."""
    from kazoo.client import KazooClient

    root = f"/sparkring-test/{services.unique_name('t')}"
    yield root
    client = KazooClient(hosts=zk_hosts, timeout=5)
    try:
        client.start(timeout=10)
        client.delete(root, recursive=True)
    except Exception:  # cleanup must not hide the test's own result
        pass
    finally:
        client.stop()
        client.close()


@pytest.fixture(scope="session")
def s3_endpoint(stack_env: dict[str, str]) -> str:
    endpoint = stack_env.get("SPARKRING_S3_ENDPOINT", "")
    if not endpoint or not services.reachable(endpoint.split("://")[-1]):
        _missing("the S3 server")
    return endpoint


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A bucket name of this test's own (created by the code under test if absent)."""
    return services.unique_name("t")


@pytest.fixture
def settings(
    stack_env: dict[str, str],
    database_url: str,
    zk_root: str,
    s3_endpoint: str,
    s3_bucket: str,
    tmp_path: Path,
) -> settings_module.Settings:
    """Settings pointing at this test's own database, chroot and bucket."""
    return settings_module.Settings(
        database_url=database_url,
        zk_hosts=stack_env["SPARKRING_ZK_HOSTS"],
        zk_root=zk_root,
        s3_endpoint=s3_endpoint,
        s3_access_key=stack_env["SPARKRING_S3_ACCESS_KEY"],
        s3_secret_key=stack_env["SPARKRING_S3_SECRET_KEY"],
        s3_bucket=s3_bucket,
        checkpoint_root=tmp_path / "checkpoints",
        work_dir=tmp_path / "work",
        server_id="test-server",
        # In-process servers run drivers as themselves under pytest's 0700 folders, the
        # stack's SPARKRING_DRIVER_USER notwithstanding; a test that wants the driver
        # user says so (test_process, test_driver_user; testing/cluster.py for e2e).
        driver_user="",
    )


@pytest.fixture
def bucket(settings: settings_module.Settings) -> store.Store:
    """This test's own bucket (created), reached with the stack's S3 credentials."""
    bucket = store.Store(
        endpoint=settings.s3_endpoint,
        access_key=settings.s3_access_key.get_secret_value(),
        secret_key=settings.s3_secret_key.get_secret_value(),
        bucket=settings.s3_bucket,
        secure=False,
        region="us-east-1",
    )
    bucket.ensure_bucket()
    return bucket


@pytest.fixture
def started() -> Iterator[list[driver.Driver]]:
    """Drivers started by a test; killed afterwards whatever happened."""
    drivers: list[driver.Driver] = []
    yield drivers
    for handle in drivers:
        handle.kill()
