"""What each step of the runner is given besides its run table (``server/run_table.py``):
the runner's settings (:class:`RunnerConfig`), its clients (PostgreSQL, the bucket, the
artifact cache), this incarnation's owner id, and the runner's pool and events
(:class:`Context`). The steps (``server/claims.py``, ``launch.py``, ``stops.py``,
``outcomes.py``, ``adoption.py``, ``warm.py``, ``log_shipping.py``) take the table and
this value; ``server/runner.py`` builds both and composes the steps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from cryptography.fernet import MultiFernet

from resource_center import cache as cache_module
from resource_center import store
from scheduler import distribution
from server import defaults, driver_user


@dataclass
class RunnerConfig:
    server: str
    incarnation: str  # drawn once per process start (distribution.Owner)
    capacity: int
    work_dir: Path
    checkpoint_root: Path
    spark_master: str
    lease_ttl: float
    watchdog_margin: float
    renew_interval: float
    poll_interval: float
    stop_grace: float
    backoff_base: float
    backoff_max: float
    fetch_retry: float
    records: Path | None = None
    # The user drivers run as (driver_user.resolve); None: this server's own user.
    run_as: driver_user.DriverUser | None = None
    # Nice steps below this server and the watchdogs its drivers run (Settings.driver_nice).
    driver_nice: int = 0
    # The longest wait between two looks at a Spark master that did not answer, seconds.
    master_wait_max: float = defaults.SPARK_MASTER_WAIT_MAX_S
    # Another server's expired lease is claimed over only once the cluster has reached
    # PostgreSQL again for this long (distribution.HELD_OVER): after an outage, the
    # owner's word first.
    takeover_hold: float = 0.0
    # Warm hand-off (server/warm.py): the old owner's wait for the target's warm driver,
    # and a warm driver's life without its go signal, seconds.
    warm_ready_wait: float = defaults.WARM_READY_WAIT_S
    warm_go_timeout: float = defaults.WARM_GO_TIMEOUT_S
    # This server's address as an IP (driver_network.resolve of SPARKRING_ADVERTISE_HOST):
    # a driver of a cluster master binds on it and gives it to its executors.
    driver_address: str | None = None
    # The keys of SPARKRING_SECRET_KEYS (scheduler/secrets.py): a job's secrets are
    # decrypted with them for its driver. None: not set, a job given secrets defers here.
    secret_box: MultiFernet | None = None


@dataclass(frozen=True)
class Context:
    """The runner's settings, clients and signals, as its steps see them."""

    engine: sa.Engine
    bucket: store.Store
    cache: cache_module.Cache
    config: RunnerConfig
    owner: distribution.Owner  # this incarnation
    # Runs a task in the runner's pool (a start, a stop, a record, a warm hand-off's
    # wait); raises RuntimeError once the pool is shut down.
    submit: Callable[..., Future[Any]]
    # Asks the poll thread to look again now.
    wake: Callable[[], None]
    # Set when the runner's loops stop: a wait in a task ends early.
    stop: threading.Event
    # Set while shutdown is under way (Runner.stop_claiming): a SIGTERM exit of a driver
    # waits for it briefly (outcomes.outcome_write), a warm wait gives up at once.
    shutting_down: threading.Event
    # Told the lease-clock time of each renewal PostgreSQL accepted (Runner.last_renew_ok).
    renewed: Callable[[float], None]
