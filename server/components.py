"""The parts of a running server, as one ordered list: what each is called, whether
its death stops the server, how it stops and the pool it owns.

``process.Server`` appends each part as it starts and iterates the list: to find a
part that died (:func:`dead`), to stop the side loops at the start of a shutdown
(before the hand-over), to stop the rest at its end (newest first), and then to
dispose of every part's own pool. The runner and the registry are parts too, but their
stops are the hand-over itself, which ``process.Server.shutdown`` orders.

The parts are built here from the settings: the side loops that any server runs
(history pruning, schedule fires, the alert outbox, auto-rollback verdicts, the Spark
master watch) and the health monitor, each with a pool of its own (none may starve the
runner's lease renewals), the runner's configuration and the coordinator's policy.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from registry import session
from scheduler import auto_rollback, coordinator, fires, loop
from server import (
    alert_sender,
    clients,
    defaults,
    driver_network,
    driver_user,
    health,
    master_watch,
    retention,
    runner,
    tls,
)
from server import settings as settings_module
from sql import database


class Watch(StrEnum):
    """Whether a part's death stops the server (exit UNHEALTHY: half-alive is worse
    than dead, a server that renews leases but no longer polls holds jobs it does not
    run)."""

    ALWAYS = "always"  # its death stops the server, even one already stopping
    RUNNING = "running"  # its death stops a server that is not stopping
    NEVER = "never"  # informational: its death never stops the server


@dataclass(frozen=True)
class Component:
    name: str  # as its death is logged: "the <name> thread died"
    alive: Callable[[], bool]
    watch: Watch
    first_stop: Callable[[], None] | None = None  # at a shutdown's start, oldest first
    last_stop: Callable[[], None] | None = None  # at a shutdown's end, newest first
    engine: sa.Engine | None = None  # its own pool, disposed when everything stopped
    side: loop.Loop | None = None  # the side loop it is, if it is one


def dead(parts: Iterable[Component], stopping: bool) -> str | None:
    """The name of the first part whose death stops the server, if any."""
    for part in parts:
        if part.watch == Watch.NEVER or (stopping and part.watch == Watch.RUNNING):
            continue
        if not part.alive():
            return part.name
    return None


def side_loop(
    name: str,
    side: loop.Loop,
    engine: sa.Engine | None = None,
    *,
    watch: Watch = Watch.RUNNING,
    stop_first: bool = True,
    stop_last: bool = False,
) -> Component:
    """A side loop as a part: stopped at a shutdown's start (between two of its passes:
    each is one transaction), or at its end (``stop_last``), or told to begin stopping
    at the start and stopped at the end (both)."""
    first = side.begin_stop if stop_last else side.stop
    return Component(
        name,
        side.is_alive,
        watch,
        first_stop=first if stop_first else None,
        last_stop=side.stop if stop_last else None,
        engine=engine,
        side=side,
    )


def _own_engine(s: settings_module.Settings, pool_size: int) -> sa.Engine:
    """A pool of the side loop's own with the server's session limits, so none of its
    statements can wait on a lock longer than a renewal may. Not checked here: a
    PostgreSQL that blinks now only fails the first pass."""
    return database.create_engine(
        s.database_url.get_secret_value(), pool_size=pool_size, limits=clients.server_limits(s)
    )


def history_pruner(s: settings_module.Settings, server: str, bucket: Any) -> Component | None:
    """Prune job events and shipped logs older than SPARKRING_HISTORY_RETENTION
    about hourly (0: keep them forever, no thread). Housekeeping: a failed pass is
    logged and retried, and this thread's death never stops the server."""
    if s.history_retention <= 0:
        return None
    engine = _own_engine(s, pool_size=1)
    pruner = retention.Pruner(
        lambda keep_going: retention.run_pass(
            engine,
            bucket,
            s.history_retention,
            batch_size=defaults.HISTORY_PRUNE_BATCH,
            keep_going=keep_going,
        ),
        interval=defaults.HISTORY_PRUNE_INTERVAL_S,
        first_delay=defaults.HISTORY_PRUNE_FIRST_DELAY_S,
        server=server,
    )
    return side_loop("history pruner", pruner, engine, watch=Watch.NEVER)


def schedule_firer(s: settings_module.Settings, server: str) -> Component:
    """Fire due schedules on a side thread (scheduler/fires.py). Any server fires:
    the fire's row, committed with its run, makes each fire time happen once."""
    engine = _own_engine(s, pool_size=1)
    firer = fires.FiringLoop(engine, server, interval=defaults.SCHEDULE_FIRE_INTERVAL_S)
    return side_loop("schedule firer", firer, engine)


def alert_outbox(s: settings_module.Settings, server: str, own_url: str, version: str) -> Component:
    """Send alert deliveries on a side thread (server/alert_sender.py). Any server
    may; a lease makes each attempt one server's. At a shutdown's start it sends no
    more; what is still in flight after the hand-over, which no receiver may delay, is
    cut and sent again later (at least once, same id)."""
    engine = _own_engine(s, pool_size=2)
    sender = alert_sender.AlertSender(
        engine,
        server,
        interval=s.alert_interval,
        console_url=s.console_url or own_url,
        user_agent=f"sparkring/{version}",
        verify=tls.webhook_context(s.tls_ca if s.alert_trust_cluster_ca else None),
        allow_networks=s.alert_networks(),
    )
    return side_loop("alert sender", sender, engine, stop_last=True)


def rollback_watch(s: settings_module.Settings, server: str) -> Component:
    """Judge auto-rollback watches on a side thread (scheduler/auto_rollback.py). Any
    server may; a row lock makes each verdict one server's."""
    engine = _own_engine(s, pool_size=1)
    watch = auto_rollback.WatchLoop(engine, server, interval=defaults.AUTO_ROLLBACK_INTERVAL_S)
    return side_loop("auto-rollback watch", watch, engine)


def spark_masters(
    s: settings_module.Settings,
    local_runner: Callable[[], runner.Runner | None],
    registry: Callable[[], session.Registry | None],
) -> master_watch.MasterWatch:
    """Probe our Spark masters (the default one and those of the runs here) on a side
    thread and publish what answers in our ZooKeeper node (whether they answer is
    informational: never part of health)."""

    def masters() -> list[str]:
        owner = local_runner()
        runs = owner.runs().values() if owner else []
        return [s.spark_master, *(run.master for run in runs)]

    def publish(report: master_watch.Report) -> None:
        registered = registry()
        if registered is not None:
            registered.publish(spark_masters=report)

    return master_watch.MasterWatch(masters, publish)


def health_monitor(
    s: settings_module.Settings, server: str, local_runner: runner.Runner
) -> health.HealthMonitor:
    """The health monitor of the local drivers, with its own one-connection pool."""
    engine = clients.engine(s, pool_size=1)
    monitor = health.HealthMonitor(
        engine,
        server,
        s.advertise_host,
        local_runner.runs,
        local_runner.kill_as,
        interval=s.health_interval,
        stall_timeout=s.stall_timeout,
        resource_wait_timeout=s.resource_wait_timeout,
    )
    return monitor


def runner_config(
    s: settings_module.Settings, capacity: int, run_as: driver_user.DriverUser | None
) -> runner.RunnerConfig:
    """What the runner is built with, from the settings."""
    return runner.RunnerConfig(
        server=s.server_id,
        # This process's incarnation: its leases are its own, never those of an
        # earlier process with the same id (distribution.Owner).
        incarnation=uuid.uuid4().hex,
        capacity=capacity,
        work_dir=s.work_dir,
        checkpoint_root=s.checkpoint_root,
        spark_master=s.spark_master,
        lease_ttl=s.lease_ttl,
        watchdog_margin=s.watchdog_margin,
        renew_interval=s.lease_renew_interval,
        poll_interval=s.poll_interval,
        stop_grace=s.stop_grace,
        backoff_base=s.restart_backoff_base,
        backoff_max=s.restart_backoff_max,
        fetch_retry=s.s3_fetch_retry,
        records=s.driver_records,
        run_as=run_as,
        driver_nice=s.driver_nice,
        takeover_hold=s.lease_lapse_grace,
        warm_ready_wait=s.warm_ready_wait,
        # A warm driver outlives the longest hand-off: the wait, the stop, a claim.
        warm_go_timeout=s.warm_ready_wait + s.stop_grace + defaults.WARM_GO_SLACK_S,
        driver_address=driver_network.resolve(s.advertise_host),
        secret_box=s.secret_box(),
    )


def rebalance_policy(s: settings_module.Settings) -> coordinator.RebalancePolicy:
    """How this server's coordinator loop places jobs, from the settings."""
    return coordinator.RebalancePolicy(
        epsilon=s.placement_epsilon,
        vnodes=defaults.RING_VNODES,
        debounce=defaults.MEMBERSHIP_DEBOUNCE_S,
        interval=s.poll_interval,
        settle=s.placement_settle,
        # A restarting server's successor re-registers within the settle window after
        # its old session expired; a planned restart within the hand-over window (set
        # it cluster-wide).
        hold=max(s.placement_settle, s.handover_window),
        lapse=s.lease_lapse_grace,
        defer_streak=s.defer_streak,
        defer_window=s.defer_avoid,
        residency=s.min_residency,
        # After an outage of PostgreSQL, its owners' word first (reap).
        reap_hold=s.lease_lapse_grace,
    )
