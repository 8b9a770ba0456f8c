"""One sparkring server process: wires the registry, the runner, the coordinator loop,
the NOTIFY listener and the HTTP endpoint (API, console, health, metrics) together, and
shuts them down in order.

Start-up: check the schema, open the HTTP endpoint, register in ZooKeeper (refused if
another live server holds the id), listen for NOTIFY, start the runner. The registry
calls back when membership changes (the coordinator rebalances) and when this server
becomes or stops being coordinator (start or stop the coordinator loop).

A server that cannot renew its leases for longer than the lease TTL (cut off from
PostgreSQL only: its drivers are dead by then) withdraws from ZooKeeper
(``Registry.withdraw``: its node and candidacy go, the session stays), so the
coordinator places its jobs elsewhere and another server coordinates; it comes back
as soon as a renewal succeeds (H7, ``docs/operations.md``).

Shutdown (SIGTERM, or ``stop()``): stop claiming -> leave ZooKeeper (so the coordinator
retargets our jobs at once) -> stop each driver gracefully and release its job as
pending, renewing leases meanwhile -> stop the loops -> close. A second signal exits at
once (``server/signals.py``).
"""

from __future__ import annotations

import logging
import os
import pwd
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import sqlalchemy as sa

from registry import connection, servers, session
from resource_center import cache
from scheduler import jobs, loop, notify
from server import (
    clients,
    components,
    coordinator_loop,
    defaults,
    driver,
    driver_user,
    exit_codes,
    health,
    master_watch,
    metrics,
    runner,
    tls,
    version,
    watchdog,
    workdir,
)
from server import settings as settings_module
from sql import database, migrate, replication
from sql.states import HealthFlag

log = logging.getLogger(__name__)
# The package metadata's (pyproject.toml): in each registration and alert's User-Agent.
VERSION = version.current()


def _own_user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid without a passwd entry (a container's --user)
        return str(os.geteuid())


class StartupError(Exception):
    """The server cannot start (schema not migrated, id taken); the message says why."""


class Endpoint(Protocol):
    """The server's HTTP listener (API, console, health, metrics), built by
    ``server/web/endpoint.py``: bound when built (``port`` is known), served from
    ``start()`` until ``stop()``."""

    port: int

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class EndpointPlace:
    """What an endpoint is built from: the server it serves, the API's own pool (never
    the runner's: requests must not starve lease renewals), the bucket, and TLS."""

    server: Server
    engine: sa.Engine
    bucket: Any
    listener_tls: tls.ServerTls | None
    peer_tls: ssl.SSLContext


class Server:
    def __init__(
        self,
        settings: settings_module.Settings,
        open_endpoint: Callable[[EndpointPlace], Endpoint],
    ) -> None:
        self.settings = settings
        self._open_endpoint = open_endpoint
        self.id = settings.server_id
        self._stop = threading.Event()
        self._coordinator: coordinator_loop.CoordinatorLoop | None = None
        self._coordinator_lock = threading.Lock()
        self.engine: sa.Engine | None = None
        self.registry: session.Registry | None = None
        self.runner: runner.Runner | None = None
        self.listener: notify.Listener | None = None
        self.http: Endpoint | None = None
        self.listener_tls: tls.ServerTls | None = None
        # The HTTP API's own small pool: requests must never starve lease renewals.
        self.api_engine: sa.Engine | None = None
        # The health monitor of the local drivers, with its own one-connection pool.
        self.health: health.HealthMonitor | None = None
        # The side loops the server looks into (server/components.py builds them).
        self.pruner: loop.Loop | None = None
        self.firer: loop.Loop | None = None
        self.master_watch: master_watch.MasterWatch | None = None
        # Every part started so far, in order: supervised, then stopped, by this list.
        self._parts: list[components.Component] = []
        self.exit_code = exit_codes.ExitCode.OK
        self._work_dir_lock: IO[str] | None = None
        self._handing_over = False

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        s = self.settings
        self.engine = clients.engine(s, pool_size=max(5, s.capacity + 3), server=True)
        current, heads = migrate.current(self.engine), migrate.heads()
        if current not in heads:
            raise StartupError(
                f"database schema is at {current or 'base'}, the code needs {', '.join(heads)}: "
                "run 'sparkring db upgrade'"
            )
        self._say_replication()
        bucket = clients.bucket(s)
        try:
            self._work_dir_lock = workdir.lock(s.work_dir)
        except workdir.WorkDirInUse as exc:
            raise StartupError(str(exc)) from None
        s.checkpoint_root.mkdir(parents=True, exist_ok=True)
        capacity = 0 if s.role == settings_module.Role.COORDINATOR else s.capacity
        run_as = self._driver_user()
        self.runner = runner.Runner(
            self.engine,
            bucket,
            cache.Cache(root=s.work_dir / "cache", max_bytes=s.cache_max_bytes),
            components.runner_config(s, capacity, run_as),
            may_claim=self._may_claim,
        )
        # Its stops are the hand-over (shutdown); it stops claiming first of all.
        self._parts.append(
            components.Component(
                "runner",
                self.runner.threads_alive,
                components.Watch.ALWAYS,
                first_stop=self.runner.stop_claiming,
            )
        )
        self._start_http(bucket)
        self._register_gauges(capacity)
        info = servers.ServerInfo(
            id=self.id,
            host=s.advertise_host,
            pid=os.getpid(),
            capacity=capacity,
            role=s.role.value,
            version=VERSION,
            started_at=time.time(),
            health_url=self.own_url(),
            driver_user=run_as.name if run_as else _own_user_name(),
            driver_user_isolated=run_as is not None,
        )
        self.registry = session.Registry(
            hosts=s.zk_hosts,
            root=s.zk_root,
            info=info,
            session_timeout=s.zk_session_timeout,
            auth=s.zk_auth.get_secret_value(),
            previous_auth=s.zk_auth_previous.get_secret_value(),
            on_members=self._members_changed,
            on_coordinator=self._coordinator_changed,
            on_state=self._state_changed,
            debounce=defaults.MEMBERSHIP_DEBOUNCE_S,
        )
        self.listener = notify.Listener(
            s.database_url.get_secret_value(),
            [notify.JOBS_CHANNEL, notify.TARGETS_CHANNEL],
            self._notified,
        )
        self._start(
            components.side_loop(
                "NOTIFY listener",
                self.listener,
                watch=components.Watch.ALWAYS,
                stop_first=False,
                stop_last=True,
            )
        )
        # The runner starts before registration, which may wait a whole session timeout
        # for our previous incarnation's node to go: it adopts the drivers that
        # incarnation left in our work dir (a proof that is local: the work-dir lock and
        # a live watchdog there) and renews their leases, so they outlive the wait. It
        # claims nothing, and migrates nothing, until ZooKeeper has accepted our id.
        self.runner.start()
        # Stopped at the end, after the hand-over, as the listener is.
        self.health = components.health_monitor(s, self.id, self.runner)
        self._start(
            components.side_loop(
                "health monitor",
                self.health,
                self.health.engine,
                watch=components.Watch.NEVER,
                stop_first=False,
                stop_last=True,
            )
        )
        self._parts += [
            components.Component("registry", self.registry.threads_alive, components.Watch.RUNNING),
            # Its loop comes and goes with the term (_coordinator_changed).
            components.Component(
                "coordinator",
                self._coordinator_alive,
                components.Watch.ALWAYS,
                first_stop=self._stop_coordinator,
            ),
        ]
        self.registry.start(timeout=max(10.0, s.zk_session_timeout * 2))
        self.runner.registered(settle=defaults.ADOPTION_SETTLE_S)
        pruner = components.history_pruner(s, self.id, bucket)
        if pruner is not None:
            self.pruner = self._start(pruner).side
        self.firer = self._start(components.schedule_firer(s, self.id)).side
        self._start(components.alert_outbox(s, self.id, self.own_url(), VERSION))
        self._start(components.rollback_watch(s, self.id))
        self.master_watch = components.spark_masters(s, lambda: self.runner, lambda: self.registry)
        metrics.REGISTRY.spark_masters_up(self.master_watch.current)
        self._start(
            components.side_loop("master watch", self.master_watch, watch=components.Watch.NEVER)
        )
        log.info(
            "server started",
            extra={
                "action": "started",
                "server": self.id,
                "role": s.role.value,
                "capacity": capacity,
                "health_port": self.http.port,
            },
        )
        # The port is random by default (SPARKRING_HEALTH_PORT=0): say where to look.
        log.info(
            "console at %s/console/",
            self.own_url(),
            extra={"action": "console", "server": self.id},
        )

    def _start(self, part: components.Component) -> components.Component:
        """Add a side loop to the parts the server supervises and stops; start it."""
        self._parts.append(part)
        assert part.side is not None
        part.side.start()
        return part

    def _say_replication(self) -> None:
        """Log whether the database commits synchronously to a standby (a failover to an
        asynchronous one can lose claims: docs/deployment.md)."""
        with self.engine.connect() as conn:
            seen = replication.inspect(conn)
        listed = len(database.hosts(self.engine.url))
        level, line = seen.verdict(listed)
        log.log(level, line, extra={"action": "replication", "server": self.id})

    def own_url(self) -> str:
        """This server's HTTP endpoint as its peers and people reach it (``health_url`` in
        its registration): scheme, ``SPARKRING_ADVERTISE_HOST`` and the bound port."""
        assert self.http is not None
        return f"{tls.scheme(self.listener_tls)}://{self.settings.advertise_host}:{self.http.port}"

    def _driver_user(self) -> driver_user.DriverUser | None:
        """The user drivers run as, checked to be usable here; None (and a warning) when
        they run as this server's own user."""
        s = self.settings
        if not s.driver_user:
            log.warning(
                "drivers run as the server's own user: a job can read this server's "
                "credentials and rewrite its own lease; set SPARKRING_DRIVER_USER",
                extra={"action": "driver_user", "user": _own_user_name()},
            )
            return None
        try:
            user = driver_user.resolve(s.driver_user)
            driver_user.check_can_switch(user)
            for setting, path in (
                ("SPARKRING_WORK_DIR", s.work_dir),
                ("SPARKRING_CHECKPOINT_ROOT", s.checkpoint_root),
                ("the Python interpreter", Path(sys.executable)),
                ("the Python interpreter", Path(sys.executable).resolve()),
                ("spark-submit", driver.default_spark_submit().resolve()),
            ):
                driver_user.check_reachable(setting, path, user)
        except (driver_user.DriverUserError, driver.DriverError) as exc:
            raise StartupError(str(exc)) from None
        log.info(
            "drivers run as their own user",
            extra={"action": "driver_user", "user": user.name, "uid": user.uid},
        )
        return user

    def _start_http(self, bucket: Any) -> None:
        """Open the HTTP endpoint that ``open_endpoint`` builds for this server (the web
        package's ``endpoint.open``: the process never imports the web), with the API's
        own small pool and the TLS settings checked here."""
        s = self.settings
        try:
            self.listener_tls = tls.server_tls(s.tls_cert, s.tls_key)
            peer_tls = tls.client_context(s.tls_ca)
        except tls.TlsError as exc:
            raise StartupError(str(exc)) from None
        self.api_engine = clients.engine(s, pool_size=defaults.HTTP_DB_POOL)
        self._parts.append(
            components.Component(
                "HTTP endpoint",
                lambda: True,
                components.Watch.NEVER,
                last_stop=self._stop_http,
                engine=self.api_engine,
            )
        )
        place = EndpointPlace(
            server=self,
            engine=self.api_engine,
            bucket=bucket,
            listener_tls=self.listener_tls,
            peer_tls=peer_tls,
        )
        try:
            self.http = self._open_endpoint(place)
        except OSError as exc:
            raise StartupError(f"SPARKRING_HEALTH_PORT: {exc}") from None
        self.http.start()

    def _stop_http(self) -> None:
        if self.http is not None:
            self.http.stop()

    def _jobs_by_state(self) -> dict[str, int]:
        engine = self.api_engine
        if engine is None:
            return {}
        with engine.connect() as conn:
            return jobs.count_by_state(conn)

    def _register_gauges(self, capacity: int) -> None:
        registry = metrics.REGISTRY
        registry.gauge_fn(
            "sparkring_jobs_owned", lambda: len(self.runner.runs()) if self.runner else 0
        )
        registry.gauge_fn("sparkring_coordinator", lambda: float(self._coordinator is not None))
        registry.gauge_fn(
            "sparkring_zk_connected",
            lambda: float(
                self.registry is not None and self.registry.state == connection.State.CONNECTED
            ),
        )
        registry.gauge_fn("sparkring_capacity", lambda: float(capacity))
        for flag in HealthFlag:
            registry.gauge_fn(
                f"sparkring_jobs_{flag.value}",
                lambda flag=flag: float(self.health.flagged(flag)) if self.health else 0.0,
            )
        registry.jobs_by_state(self._jobs_by_state)

    # ------------------------------------------------------------------ callbacks

    def _may_claim(self) -> bool:
        return self.registry is not None and not self.registry.safe_mode and not self._stop.is_set()

    def _notified(self, channel: str, payload: str) -> None:
        if self.runner is not None:
            self.runner.wake()
        if channel in ("", notify.JOBS_CHANNEL):
            self._wake_coordinator(debounce=defaults.JOB_CHANGE_DEBOUNCE_S)
            if self.firer is not None:
                self.firer.wake()  # a schedule switched on, a backfill queued

    def _members_changed(self, members: dict[str, servers.ServerInfo]) -> None:
        log.info(
            "membership changed",
            extra={"action": "members", "servers": sorted(members)},
        )
        self._wake_coordinator()

    def _wake_coordinator(self, debounce: float | None = None) -> None:
        current = self._coordinator
        if current is not None:
            current.wake(debounce)

    def _coordinator_changed(self, term: int | None) -> None:
        with self._coordinator_lock:
            if self._coordinator is not None:
                self._coordinator.stop()
                self._coordinator = None
            if term is None or self._stop.is_set():
                return
            self._coordinator = coordinator_loop.CoordinatorLoop(
                self.engine,
                self.id,
                term,
                servers=self._server_capacities,
                live=lambda: list(self.registry.members()) if self.registry else [],
                policy=components.rebalance_policy(self.settings),
                on_deposed=self._deposed,
                still_leader=lambda: bool(self.registry and self.registry.confirm_leader()),
            )
            self._coordinator.start()
        log.info("coordinating", extra={"action": "coordinator", "term": term, "server": self.id})

    def _coordinator_alive(self) -> bool:
        current = self._coordinator
        return current is None or current.is_alive()

    def _stop_coordinator(self) -> None:
        with self._coordinator_lock:
            if self._coordinator is not None:
                self._coordinator.stop()
                self._coordinator = None

    def _deposed(self) -> None:
        log.warning("deposed by a newer coordinator term", extra={"action": "deposed"})
        with self._coordinator_lock:
            self._coordinator = None

    def _server_capacities(self) -> dict[str, int]:
        """Live servers and their capacity; the coordinator drops full-time coordinators
        (capacity 0) and drained servers itself (``coordinator.placeable``)."""
        members = self.registry.members() if self.registry else {}
        return {sid: info.capacity for sid, info in members.items()}

    def _state_changed(self, state: connection.State) -> None:
        log.warning(
            "ZooKeeper connection state changed",
            extra={"action": "zk_state", "state": str(state), "server": self.id},
        )
        if state == connection.State.REFUSED:
            # Another live server took our id: we must not run anything.
            self.exit_code = exit_codes.ExitCode.UNHEALTHY
            self.request_stop()
        elif state == connection.State.CONNECTED and self.runner is not None:
            self.runner.wake()

    # ------------------------------------------------------------------ status

    def status(self) -> tuple[bool, dict[str, Any]]:
        s = self.settings
        runs = self.runner.runs() if self.runner else {}
        state = self.registry.state if self.registry else connection.State.CONNECTING
        last_renew = self.runner.last_renew_ok if self.runner else None
        renew_age = None if last_renew is None else watchdog.lease_clock() - last_renew
        loops_alive = bool(self.runner and self.runner.threads_alive())
        listener_alive = bool(self.listener and self.listener.is_alive())
        healthy = (
            loops_alive
            and listener_alive
            and state == connection.State.CONNECTED
            and not (self.registry and self.registry.withdrawn)
            and (not runs or (renew_age is not None and renew_age < s.lease_guard))
        )
        return healthy, {
            "server": self.id,
            "role": s.role.value,
            "zookeeper": str(state),
            # Out of membership and the election: renewals fail (PostgreSQL unreachable).
            "withdrawn": bool(self.registry and self.registry.withdrawn),
            "coordinator": self._coordinator is not None,
            "jobs": sorted(run.name for run in runs.values()),
            "capacity": s.capacity,
            "lease_renew_age_s": None if renew_age is None else round(renew_age, 3),
            "loops_alive": loops_alive,
            "listener_alive": listener_alive,
            # Informational: history pruning and the Spark master watch are not health.
            "history_pruner_alive": bool(self.pruner and self.pruner.is_alive()),
            "master_watch_alive": bool(self.master_watch and self.master_watch.is_alive()),
            "stopping": self._stop.is_set(),
        }

    def log_file(self, job: str) -> Path | None:
        """The local log file of ``job``'s driver on this server, if one runs here."""
        for run in (self.runner.runs() if self.runner else {}).values():
            if run.name == job and run.driver is not None:
                return run.driver.log_file
        return None

    # ------------------------------------------------------------------ run + stop

    def request_stop(self) -> None:
        # At once, in the signal handler: a driver SIGTERMed with us must not be taken
        # for a crash (outcomes.outcome_write).
        if self.runner is not None:
            self.runner.stop_claiming()
        self._stop.set()

    def request_hand_over(self) -> None:
        """Stop for a restart: leave the drivers running for the successor to adopt."""
        self._handing_over = True
        if self.runner is not None:
            self.runner.stop_claiming()
        self._stop.set()

    def run(self) -> exit_codes.ExitCode:
        """Serve until asked to stop, watching the supervised threads; then shut down."""
        try:
            while not self._stop.wait(1.0):
                self._withdraw_unless_renewing()
                dead = self.dead_component()
                if dead is not None:
                    # Half-alive is worse than dead: a server that renews leases but no
                    # longer polls (or coordinates) holds jobs it does not run. Exit with
                    # a named code so the supervisor restarts it.
                    log.error(
                        f"the {dead} thread died; exiting",
                        extra={"action": "unhealthy", "component": dead},
                    )
                    self.exit_code = exit_codes.ExitCode.UNHEALTHY
                    break
        finally:
            self.shutdown()
        return self.exit_code

    def _withdraw_unless_renewing(self) -> None:
        """Withdraw from ZooKeeper after a lease TTL without a successful renewal, come
        back after the next one. The renewal statement runs every renew interval even
        with no lease to renew, so its success is this server's proof that it reaches
        PostgreSQL. Without it the server would stay placeable while its watchdogs kill
        every driver it starts, and its jobs would stay down for the whole fault."""
        runner, registry = self.runner, self.registry
        if runner is None or registry is None or runner.last_renew_ok is None:
            return
        age = watchdog.lease_clock() - runner.last_renew_ok
        withdraw = age > self.settings.lease_ttl
        if withdraw == registry.withdrawn:
            return
        log.warning(
            "no lease renewal for more than the lease TTL: withdrawing from ZooKeeper"
            if withdraw
            else "lease renewals succeed again: registering again",
            extra={"action": "withdraw" if withdraw else "return", "renew_age_s": round(age, 3)},
        )
        registry.withdraw(withdraw)

    def dead_component(self) -> str | None:
        """The name of a supervised side thread that died, if any."""
        return components.dead(self._parts, stopping=self._stop.is_set())

    def shutdown(self, hand_off: bool = True) -> None:
        """Ordered, idempotent: stop claiming, leave, hand off, release, close.

        ``hand_off=False`` (a start-up that failed) stops no driver: the runs this
        process adopted are left to their watchdogs, for the next start to adopt."""
        self._stop.set()
        # The runner stops claiming, the coordinator and the side loops stop (each
        # between two passes: every pass is one transaction).
        for part in self._parts:
            if part.first_stop is not None:
                part.first_stop()
        if self._handing_over and self.runner is not None:
            # Loops first (a renewal must not shorten the extended leases), then extend
            # the leases and the watchdogs' deadlines, then leave ZooKeeper.
            self.runner.stop_loops()
            self.runner.hand_over(self.settings.handover_window)
        if self.registry is not None:
            self.registry.stop()
        if self.runner is not None and not self._handing_over:
            if hand_off:
                self.runner.hand_off(timeout=self.settings.stop_grace + 10)
        if self.runner is not None:
            self.runner.stop()  # after the hand-over: the tasks in flight end first
        for part in reversed(self._parts):
            if part.last_stop is not None:
                part.last_stop()
        for part in self._parts:
            if part.engine is not None:
                part.engine.dispose()
        if self.engine is not None:
            self.engine.dispose()
        if self._work_dir_lock is not None:
            self._work_dir_lock.close()
            self._work_dir_lock = None
        log.info("server stopped", extra={"action": "stopped", "server": self.id})
