"""Runners for the runner's integration tests: a live one, and stepped ones whose loops
the test drives itself (poll_once, renew_once)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from resource_center import cache, store
from server import runner
from server import settings as settings_module
from tests.integration import runner_harness as harness


@pytest.fixture
def stage(tmp_path: Path) -> Path:
    folder = tmp_path / "stage"
    folder.mkdir()
    return folder


@pytest.fixture
def margin() -> float:
    """The runner's watchdog margin (a test overrides it to squeeze the deadline)."""
    return 3.0


@pytest.fixture
def the_runner(
    engine: sa.Engine,
    bucket: store.Store,
    settings: settings_module.Settings,
    tmp_path: Path,
    margin: float,
) -> Iterator[runner.Runner]:
    the_runner = runner.Runner(
        engine,
        bucket,
        cache.Cache(root=tmp_path / "cache", max_bytes=1 << 30),
        harness.config(tmp_path, margin),
    )
    the_runner.start()
    the_runner.registered(settle=0.0)  # no registry here: as if ZooKeeper accepted us
    yield the_runner
    the_runner.hand_off(timeout=20)
    the_runner.stop()


@pytest.fixture
def stepped_runner(
    engine: sa.Engine, bucket: store.Store, tmp_path: Path
) -> Iterator[runner.Runner]:
    """A runner whose loops do not run: the test calls poll_once and renew_once itself,
    in the order a paused server would run them when it resumes."""
    yield from harness.stepped(engine, bucket, harness.config(tmp_path, 3.0), tmp_path)


@pytest.fixture
def long_lease_runner(
    engine: sa.Engine, bucket: store.Store, tmp_path: Path
) -> Iterator[runner.Runner]:
    """A stepped runner (no loops) with a 30 s lease: its driver outlives spark-submit's
    start and exit on a busy machine without a single renewal."""
    config = dataclasses.replace(harness.config(tmp_path, 3.0), lease_ttl=30.0)
    yield from harness.stepped(engine, bucket, config, tmp_path)
