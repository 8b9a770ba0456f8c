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
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import sqlalchemy as sa

from registry import connection, servers, session
from resource_center import cache
from scheduler import auto_rollback, coordinator, fires, jobs, notify
from server import (
    alert_sender,
    clients,
    coordinator_loop,
    defaults,
    driver,
    driver_network,
    driver_user,
    exit_codes,
    health,
    master_watch,
    metrics,
    retention,
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
        self._health_engine: sa.Engine | None = None
        # History retention: a side thread with a connection of its own (never the
        # runner's pool), which prunes while it holds the retention advisory lock.
        self.pruner: retention.Pruner | None = None
        self._prune_engine: sa.Engine | None = None
        # Fires due schedules (any server may; a row lock makes each fire one server's),
        # with a one-connection pool of its own.
        self.firer: fires.FiringLoop | None = None
        self._firer_engine: sa.Engine | None = None
        # Sends the alert outbox (any server may; a lease makes each attempt one
        # server's), with a small pool of its own.
        self.alert_sender: alert_sender.AlertSender | None = None
        self._alert_engine: sa.Engine | None = None
        # Judges auto-rollback watches (any server may; a row lock makes each verdict one
        # server's), with a one-connection pool of its own.
        self.rollback_watch: auto_rollback.WatchLoop | None = None
        self._watch_engine: sa.Engine | None = None
        # Whether the Spark masters we use answer (informational: never part of health).
        self.master_watch: master_watch.MasterWatch | None = None
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
            runner.RunnerConfig(
                server=self.id,
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
            ),
            may_claim=self._may_claim,
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
        self.listener.start()
        # The runner starts before registration, which may wait a whole session timeout
        # for our previous incarnation's node to go: it adopts the drivers that
        # incarnation left in our work dir (a proof that is local: the work-dir lock and
        # a live watchdog there) and renews their leases, so they outlive the wait. It
        # claims nothing, and migrates nothing, until ZooKeeper has accepted our id.
        self.runner.start()
        self._start_health()
        self.registry.start(timeout=max(10.0, s.zk_session_timeout * 2))
        self.runner.registered(settle=defaults.ADOPTION_SETTLE_S)
        self._start_pruner(bucket)
        self._start_firer()
        self._start_alert_sender()
        self._start_rollback_watch()
        self._start_master_watch()
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

    def _start_health(self) -> None:
        s = self.settings
        assert self.runner is not None
        self._health_engine = clients.engine(s, pool_size=1)
        self.health = health.HealthMonitor(
            self._health_engine,
            self.id,
            s.advertise_host,
            self.runner.runs,
            self.runner.kill_as,
            interval=s.health_interval,
            stall_timeout=s.stall_timeout,
            resource_wait_timeout=s.resource_wait_timeout,
        )
        self.health.start()

    def _start_pruner(self, bucket: Any) -> None:
        """Prune job events and shipped logs older than SPARKRING_HISTORY_RETENTION
        about hourly (0: keep them forever, no thread). Housekeeping: a failed pass is
        logged and retried, and this thread's death never stops the server."""
        s = self.settings
        if s.history_retention <= 0:
            return
        # One connection with the server's session limits, so a prune batch can never
        # wait on a lock longer than a renewal may. Not checked here: a PostgreSQL
        # that blinks now only fails the first pass.
        self._prune_engine = database.create_engine(
            s.database_url.get_secret_value(), pool_size=1, limits=clients.server_limits(s)
        )
        engine = self._prune_engine
        self.pruner = retention.Pruner(
            lambda keep_going: retention.run_pass(
                engine,
                bucket,
                s.history_retention,
                batch_size=defaults.HISTORY_PRUNE_BATCH,
                keep_going=keep_going,
            ),
            interval=defaults.HISTORY_PRUNE_INTERVAL_S,
            first_delay=defaults.HISTORY_PRUNE_FIRST_DELAY_S,
            server=self.id,
        )
        self.pruner.start()

    def _start_firer(self) -> None:
        """Fire due schedules on a side thread (scheduler/fires.py). Any server fires:
        the fire's row, committed with its run, makes each fire time happen once."""
        s = self.settings
        self._firer_engine = database.create_engine(
            s.database_url.get_secret_value(), pool_size=1, limits=clients.server_limits(s)
        )
        self.firer = fires.FiringLoop(
            self._firer_engine, self.id, interval=defaults.SCHEDULE_FIRE_INTERVAL_S
        )
        self.firer.start()

    def _start_alert_sender(self) -> None:
        """Send alert deliveries on a side thread (server/alert_sender.py)."""
        s = self.settings
        assert self.http is not None
        self._alert_engine = database.create_engine(
            s.database_url.get_secret_value(), pool_size=2, limits=clients.server_limits(s)
        )
        own = self.own_url()
        self.alert_sender = alert_sender.AlertSender(
            self._alert_engine,
            self.id,
            interval=s.alert_interval,
            console_url=s.console_url or own,
            user_agent=f"sparkring/{VERSION}",
            verify=tls.webhook_context(s.tls_ca if s.alert_trust_cluster_ca else None),
            allow_networks=s.alert_networks(),
        )
        self.alert_sender.start()

    def _start_rollback_watch(self) -> None:
        """Judge auto-rollback watches on a side thread (scheduler/auto_rollback.py)."""
        s = self.settings
        self._watch_engine = database.create_engine(
            s.database_url.get_secret_value(), pool_size=1, limits=clients.server_limits(s)
        )
        self.rollback_watch = auto_rollback.WatchLoop(
            self._watch_engine, self.id, interval=defaults.AUTO_ROLLBACK_INTERVAL_S
        )
        self.rollback_watch.start()

    def _start_master_watch(self) -> None:
        """Probe our Spark masters on a side thread and publish what answers in our
        ZooKeeper node; the gauge reads the last report."""

        def masters() -> list[str]:
            runs = self.runner.runs().values() if self.runner else []
            return [self.settings.spark_master, *(run.master for run in runs)]

        def publish(report: master_watch.Report) -> None:
            if self.registry is not None:
                self.registry.publish(spark_masters=report)

        self.master_watch = master_watch.MasterWatch(masters, publish)
        metrics.REGISTRY.spark_masters_up(self.master_watch.current)
        self.master_watch.start()

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
        loop = self._coordinator
        if loop is not None:
            loop.wake(debounce)

    def _coordinator_changed(self, term: int | None) -> None:
        with self._coordinator_lock:
            if self._coordinator is not None:
                self._coordinator.stop()
                self._coordinator = None
            if term is None or self._stop.is_set():
                return
            s = self.settings
            policy = coordinator.RebalancePolicy(
                epsilon=s.placement_epsilon,
                vnodes=defaults.RING_VNODES,
                debounce=defaults.MEMBERSHIP_DEBOUNCE_S,
                interval=s.poll_interval,
                settle=s.placement_settle,
                # A restarting server's successor re-registers within the settle
                # window after its old session expired; a planned restart within the
                # hand-over window (set it cluster-wide).
                hold=max(s.placement_settle, s.handover_window),
                lapse=s.lease_lapse_grace,
                defer_streak=s.defer_streak,
                defer_window=s.defer_avoid,
                residency=s.min_residency,
                # After an outage of PostgreSQL, its owners' word first (reap).
                reap_hold=s.lease_lapse_grace,
            )
            self._coordinator = coordinator_loop.CoordinatorLoop(
                self.engine,
                self.id,
                term,
                servers=self._server_capacities,
                live=lambda: list(self.registry.members()) if self.registry else [],
                policy=policy,
                on_deposed=self._deposed,
                still_leader=lambda: bool(self.registry and self.registry.confirm_leader()),
            )
            self._coordinator.start()
        log.info("coordinating", extra={"action": "coordinator", "term": term, "server": self.id})

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
        if self.runner is not None and not self.runner.threads_alive():
            return "runner"
        if self.listener is not None and not self.listener.is_alive():
            return "NOTIFY listener"
        if self.registry is not None and not self._stop.is_set():
            if not self.registry.threads_alive():
                return "registry"
        loop = self._coordinator
        if loop is not None and not loop.is_alive():
            return "coordinator"
        if self.firer is not None and not self._stop.is_set() and not self.firer.is_alive():
            return "schedule firer"
        sender = self.alert_sender
        if sender is not None and not self._stop.is_set() and not sender.is_alive():
            return "alert sender"
        watch = self.rollback_watch
        if watch is not None and not self._stop.is_set() and not watch.is_alive():
            return "auto-rollback watch"
        return None

    def shutdown(self, hand_off: bool = True) -> None:
        """Ordered, idempotent: stop claiming, leave, hand off, release, close.

        ``hand_off=False`` (a start-up that failed) stops no driver: the runs this
        process adopted are left to their watchdogs, for the next start to adopt."""
        self._stop.set()
        if self.runner is not None:
            self.runner.stop_claiming()
        with self._coordinator_lock:
            if self._coordinator is not None:
                self._coordinator.stop()
                self._coordinator = None
        if self.pruner is not None:
            self.pruner.stop()  # between two batches: nothing is left half-done
        if self.firer is not None:
            self.firer.stop()  # between two fires: each is one transaction
        if self.alert_sender is not None:
            self.alert_sender.begin_stop()  # no new sends; those in flight end after the hand-over
        if self.rollback_watch is not None:
            self.rollback_watch.stop()  # between two verdicts: each is one transaction
        if self.master_watch is not None:
            self.master_watch.stop()
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
        if self.alert_sender is not None:
            # After the hand-over, which no receiver may delay: what is still in flight
            # is cut and sent again later (at least once, same id).
            self.alert_sender.stop()
        if self.health is not None:
            self.health.stop()
        if self.listener is not None:
            self.listener.stop()
        if self.http is not None:
            self.http.stop()
        if self.api_engine is not None:
            self.api_engine.dispose()
        if self._health_engine is not None:
            self._health_engine.dispose()
        if self._prune_engine is not None:
            self._prune_engine.dispose()
        if self._firer_engine is not None:
            self._firer_engine.dispose()
        if self._alert_engine is not None:
            self._alert_engine.dispose()
        if self._watch_engine is not None:
            self._watch_engine.dispose()
        if self.engine is not None:
            self.engine.dispose()
        if self._work_dir_lock is not None:
            self._work_dir_lock.close()
            self._work_dir_lock = None
        log.info("server stopped", extra={"action": "stopped", "server": self.id})
