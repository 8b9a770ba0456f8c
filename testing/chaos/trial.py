"""One fault case of the chaos campaign: a real cluster, a set of jobs, the fault, and
the verdict on S1-S5 with the recovery time.

A :class:`Trial` starts servers (``testing/cluster.py``), populates light heartbeat jobs
whose names are chosen so that every server owns one, plus two *sentinels* (a batch job
that finished and a streaming job that was stopped: S4 says no fault may start them
again), injects the fault, waits for the cluster to settle and checks the invariants.
Its :class:`Outcome` goes to the campaign's summary (``tests/chaos/conftest.py``).

Recovery time is measured from the moment the fault healed (for a kill, the kill
itself) until every job wanted running is running on a live server that is also its
target (the cluster is quiet again).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError

from registry import connection
from resource_center import catalog, deps, store
from scheduler import (
    alerts,
    destinations,
    distribution,
    job_revisions,
    job_spec,
    job_views,
    jobs,
    placement,
    runs,
)
from server import defaults, driver, retention, watchdog
from sql.states import EventKind, JobKind
from testing import factories, waiting
from testing.chaos import faults, invariants
from testing.chaos.invariants import PRUNED
from testing.cluster import HEARTBEAT_JOB, Cluster
from testing.webhook_receiver import Receiver

# Every wanted job must be running again this long after the fault healed (fast timeouts:
# session 4 s, lease 8 s; a light driver starts in ~2-5 s on a busy 2-core machine).
RECOVERY_BOUND_S = 90.0
# A scheduled job's fire must be claimed within the lease TTL (8 s) plus a server's
# loss (session 4 s) and a loaded machine's slack, outside fault windows, seconds (S6).
FIRE_LATENESS_BOUND_S = 20.0
# How long a prune whose outcome is unknown waits for the database to tell which of the
# alert deliveries it copied are gone (a failover, a crash recovery: tens of seconds).
PRUNE_SETTLE_S = 120.0
SENTINELS = ("done", "halted")
# Each server's capacity (start's default), which the harness's name choices assume.
SERVER_CAPACITY = 4
# The events that tell why a job left its server.
_MOVES = frozenset(
    {
        EventKind.RETARGETED,
        EventKind.REAPED,
        EventKind.RELEASED,
        EventKind.DEFERRED,
        EventKind.CRASHED,
    }
)
# The cluster counts as recovered once it stayed settled this long: more than a poll
# interval (1 s) plus the coordinator's debounce (0.5 s), so no pending move is missed.
STABLE_S = 2.5
# The trial's alert (``watch_alerts``): its name, its signing secret, and how long the
# verdict waits for the outbox to empty after recovery (a delivery whose sender was
# killed mid-send is sent again once its lease lapses, server/alert_sender.LEASE_S).
ALERT_NAME = "chaos"
ALERT_SECRET = "chaos-alert-secret-of-24-chars"
ALERT_DRAIN_S = 150.0


@dataclasses.dataclass
class Outcome:
    """One row of the campaign summary."""

    fault: str
    round: int
    injected: int = 0
    jobs: int = 0
    double_runs: int = 0
    stale_writes: int = 0
    lost: int = 0
    resurrected: int = 0
    corrupt_starts: int = 0
    early: int = 0  # leases released or claimed while a driver they fence lived
    batch: int = 0  # batch generations run to their end twice, or re-run unproven
    budget: int = 0  # generations that started a driver after their budget was spent
    restarts: int = 0  # claims after the fault: drivers (re)started by the recovery
    double_restarts: int = 0  # restarts beyond one per fault and job (one fault, one restart)
    master: int = 0  # crashes, restarts or master-less starts a Spark master fault caused (S9)
    fires: int = 0  # fire times missed, doubled, skipped without cause, overlapping, late (S6)
    alerts: int = 0  # alerts not raised by their event, or never delivered (issue 26)
    deliveries: int = 0  # alert deliveries checked (``watch_alerts``), and sent again
    resent: int = 0
    adoptions: int = 0  # ``adopted`` events after the fault: drivers a restart took over
    warm_claims: int = 0  # claims after the fault that took a warm driver (a warm hand-off)
    pruned: int = 0  # job events the harness pruned (kept in its own snapshot first)
    recovery_s: float | None = None
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # what the set-up had to mend
    skipped: str | None = None
    error: str | None = None
    expected: str | None = None  # the xfail reason of a case that reproduces a known hole

    @property
    def violations(self) -> int:
        return (
            self.double_runs + self.early + self.stale_writes + self.lost
            + self.resurrected + self.corrupt_starts + self.batch + self.budget
            + self.double_restarts + self.master + self.fires + self.alerts
        )  # fmt: skip

    @property
    def verdict(self) -> str:
        if self.skipped:
            return "skipped"
        bad = bool(self.error or self.violations)
        if self.expected:
            return "xfail" if bad else "XPASS"
        return "FAIL" if bad else "ok"


@dataclasses.dataclass(frozen=True)
class ScheduleCommand:
    """An operator's command on a scheduled job as the harness sent it, with what its
    transaction read: ``kind`` the event it writes when it commits (``revised``,
    ``stop_requested``, ``start_requested``; a backfill's is ``start_requested`` with
    trigger ``backfill``), ``at`` its transaction's ``now()`` (that event's ``at``),
    ``cursor`` the job's ``fires_checked_until`` after it (a change: the change's
    time; a stop: how far its fires had been handled; a backfill: before it). Whether
    it committed is read from the events at the check (``Trial.schedule_window``): a
    commit whose answer was lost may have taken."""

    job: str
    kind: str
    at: float
    cursor: float | None = None
    revision: int | None = None  # a change's revision
    piece: invariants.Piece | None = None  # a change's new schedule, from ``cursor``
    queued: tuple[float, ...] = ()  # a backfill's fire times
    before: tuple[tuple[float, str], ...] = ()  # a backfill's range's rows before it

    def committed(self, events: Sequence[dict[str, Any]]) -> bool:
        for e in events:
            if e["job_name"] != self.job or e["kind"] != self.kind:
                continue
            if abs(float(e["at_s"]) - self.at) > 1e-6:
                continue
            detail = e.get("detail") or {}
            if self.kind == "revised":
                return detail.get("revision") == self.revision
            if self.queued:
                return detail.get("trigger") == "backfill"
            if self.kind == "start_requested":
                return detail.get("schedule") == "on"
            return True
        return False


_TXN_NOW = sa.text("SELECT CAST(EXTRACT(EPOCH FROM now()) AS double precision)")
_CURSOR = sa.text(
    "SELECT CAST(EXTRACT(EPOCH FROM fires_checked_until) AS double precision) FROM jobs "
    "WHERE name = :name"
)


class Trial:
    def __init__(
        self,
        fault: str,
        round_: int,
        stack_env: dict[str, str],
        database_url: str,
        zk_root: str,
        bucket: str,
        root: Path,
        *,
        fork_servers: bool = False,
    ) -> None:
        """``fork_servers``: the cluster's servers start forked warm where they can
        (``testing.cluster.Cluster``); the campaign's do, the benchmarks' do not."""
        self.outcome = Outcome(fault=fault, round=round_)
        self._fork_servers = fork_servers
        self._args = (stack_env, database_url, zk_root, bucket, root)
        self.stack_env = stack_env
        self.zk_root = zk_root
        self._cluster: Cluster | None = None
        self._zk: KazooClient | None = None
        self.live_jobs: list[str] = []
        self.sentinels: dict[str, dict[str, Any]] = {}
        self.broken_artifacts: list[str] = []  # jobs whose artifact is corrupt or gone
        self.paused: set[str] = set()  # servers under SIGSTOP: not live
        self.killed_watchdogs: list[Path] = []  # run dirs swept at close (hole H1)
        # Freezes of a whole host (server, watchdogs, drivers), on both clocks: the
        # checker excuses their bounded overlap (invariants.FREEZE_THAW_BOUND_S).
        self.freezes: list[invariants.Freeze] = []
        # Cuts of one server from PostgreSQL, on both clocks: a batch exit 0 they kept
        # from being recorded may run again (invariants.CUT_RECORD_BOUND_S).
        self.pg_cuts: list[invariants.Cut] = []
        # Small disks under a server's work dir: unmounted after the cluster's teardown
        # (its processes keep files open there until then).
        self.disks: list[faults.SmallDisk] = []
        self._event_mark = 0
        # Scheduled jobs (schedule_job): name -> its schedule from its switch-on; and the
        # operators' commands on them since (``change_schedule`` ...: S6's windows).
        self.scheduled: dict[str, invariants.Piece] = {}
        self.schedule_commands: list[ScheduleCommand] = []
        self._schedule_lock = threading.Lock()
        # Events the harness pruned (``prune_history``), read before they were deleted:
        # the checker reads the whole history, so a prune must not blind it.
        self._pruned: dict[int, dict[str, Any]] = {}
        # The same for ``runs`` rows (retention prunes ended runs too), by run id, each
        # with its job id: S6 reads every fire's row (``fire_problems``).
        self._pruned_runs: dict[int, tuple[int, dict[str, Any]]] = {}
        # The same for alert deliveries (retention prunes those sent or given up).
        self._pruned_deliveries: dict[str, dict[str, Any]] = {}
        self._prune_lock = threading.Lock()
        # One harness prune at a time (the command threads draw them concurrently): the
        # count of events deleted unseen is exact only when no other prune deletes the
        # copied events between this one's copy and its delete.
        self._prune_pass = threading.Lock()
        self._t_fault: float | None = None
        self._t_healed: float | None = None
        # [injected, over] of each fault on the wall clock (over None: still on), for the
        # one-fault-one-restart check (invariants.restarts_per_fault).
        self._fault_spans: list[list[float | None]] = []
        # Operators' drains (``drain``/``undrain``): [server, asked, undone] on the wall
        # clock (undone None: still drained). Not faults: their moves are planned, and
        # the checker tells them from a fault's restarts (invariants.Drain).
        self._drain_spans: list[list[Any]] = []
        self.resource: catalog.Resource | None = None
        # Spark masters of the trial's own (``use_masters``), the ``spark://`` URL of
        # every job created on them, and each master fault: [masters, killed, back]
        # on the wall clock (back None: still down). Kept apart from the fault spans:
        # a master fault may cost no restart at all (invariants.master_fault_restarts).
        self.masters: faults.SparkMasters | None = None
        self.master_urls: dict[str, str] = {}
        self._master_spans: list[list[Any]] = []
        # The webhook receiver of the trial's alert (``watch_alerts``), and the last
        # event before the alert existed.
        self.receiver: Receiver | None = None
        self._alert_mark = 0

    # ------------------------------------------------------------------ cluster

    @property
    def database_url(self) -> str:
        return self._args[1]

    @property
    def cluster_root(self) -> Path:
        """The cluster's folder (servers/<id>/work are its work dirs), before it starts."""
        return self._args[4]

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            raise RuntimeError("start() the trial's cluster first")
        return self._cluster

    def start(
        self,
        servers: Sequence[str],
        capacity: int = SERVER_CAPACITY,
        extra_env: dict[str, str] | None = None,
        special: dict[str, dict[str, Any]] | None = None,
    ) -> Cluster:
        """Start ``servers`` (``special[id]`` holds start_server keyword arguments for one
        of them) and wait until all are registered."""
        if self._cluster is None:
            self._cluster = Cluster(
                *self._args, extra_env=extra_env, fork_servers=self._fork_servers
            )
        for sid in servers:
            self._cluster.start_server(sid, capacity=capacity, **(special or {}).get(sid, {}))
        self.wait_members(set(self._cluster.servers))
        return self._cluster

    def members(self) -> set[str]:
        if self._zk is None:
            # A server's client, which reconnects for ever: kazoo's default gives up
            # after one failed round, and a ZooKeeper outage then left this client blind
            # to members that had registered again (CI at 837455c).
            self._zk = connection.make_client(
                self.stack_env["SPARKRING_ZK_HOSTS"], session_timeout=5
            )
            self._zk.start(timeout=15)
        path = f"{self.zk_root}/servers"
        try:
            return set(self._zk.get_children(path)) if self._zk.exists(path) else set()
        except (ConnectionLoss, SessionExpiredError):
            # ZooKeeper was the fault, down past this client's session: kazoo opens a
            # new session by itself; the next look sees the members.
            return set()

    def member_pid(self, server: str) -> int | None:
        """The pid in ``server``'s registry node (which process holds the id), or None."""
        self.members()  # opens the client
        assert self._zk is not None
        try:
            data, _ = self._zk.get(f"{self.zk_root}/servers/{server}")
        except (NoNodeError, ConnectionLoss, SessionExpiredError):
            return None
        return json.loads(data).get("pid")

    def wait_members(self, expected: set[str], timeout: float = 45) -> None:
        waiting.wait_until(
            lambda: self.members() == expected,
            timeout,
            interval=0.2,
            message=f"registered servers {sorted(expected)}",
        )

    def live_servers(self) -> set[str]:
        return {
            sid for sid, proc in self.cluster.servers.items() if proc.poll() is None
        } - self.paused

    def close(self) -> None:
        # A killed watchdog's driver processes, if its server left them (hole H1),
        # are orphans that nothing else would end: the harness kills by watchdog.
        for run_dir in self.killed_watchdogs:
            driver.sweep(run_dir)
        if self._zk is not None:
            try:
                self._zk.stop()
                self._zk.close()
            except Exception:  # ZooKeeper may be the thing a failed test left down
                pass
        if self._cluster is not None:
            self._cluster.close()
        if self.masters is not None:
            self.masters.close()
        if self.receiver is not None:
            self.receiver.stop()
        for disk in self.disks:
            disk.close()

    def use_masters(
        self, count: int, *, standby: bool, host: str = "127.0.0.1"
    ) -> faults.SparkMasters:
        """``count`` Spark masters of the trial's own, spawned now (their JVMs start
        while the caller goes on: ``masters.wait_answering()``); with ``standby``, in
        Spark's ZooKeeper recovery mode on the trial's ZooKeeper; listening on ``host``."""
        zk = self.stack_env["SPARKRING_ZK_HOSTS"] if standby else None
        folder = self.cluster_root / "spark-masters"
        self.masters = faults.SparkMasters(folder, count, zk, host)
        self.masters.start()
        return self.masters

    # ------------------------------------------------------------------ jobs

    def bucket(self) -> store.Store:
        env = self.cluster.env
        return store.Store(
            endpoint=env["SPARKRING_S3_ENDPOINT"],
            access_key=env["SPARKRING_S3_ACCESS_KEY"],
            secret_key=env["SPARKRING_S3_SECRET_KEY"],
            bucket=env["SPARKRING_S3_BUCKET"],
        )

    def build_deps(self, requirements: Path) -> catalog.Resource:
        """The deps artifact of ``requirements`` (resource_center/deps.py: pip)."""
        bucket = self.bucket()
        bucket.ensure_bucket()
        resource, _ = deps.ensure(
            self.cluster.engine, bucket, requirements, max_bytes=defaults.MAX_ARTIFACT_BYTES
        )
        return resource

    def upload(self, name: str, path: Path) -> catalog.Resource:
        bucket = self.bucket()
        bucket.ensure_bucket()
        return catalog.upload(
            self.cluster.engine,
            bucket,
            name=name,
            path=path,
            max_bytes=defaults.MAX_ARTIFACT_BYTES,
        )

    def create(
        self,
        name: str,
        *,
        kind: JobKind = JobKind.STREAMING,
        extra: Sequence[str] = (),
        resource: catalog.Resource | None = None,
        start: bool = True,
        max_restarts: int = 3,
        conf: dict[str, str] | None = None,
        master: str | None = None,
        restart_window_s: float | None = None,
        secret_env: dict[str, str] | None = None,
        deps_id: int | None = None,
    ) -> None:
        """Define a heartbeat job (and start it) through the job catalog: the same
        statements the CLI runs, without a process start per command. ``max_restarts``
        is a batch job's ``--max-retries``; ``master`` its ``--master`` (default: the
        servers' ``local[2]``)."""
        if resource is None:
            if self.resource is None:
                self.resource = self.upload("heartbeat", HEARTBEAT_JOB)
            resource = self.resource
        with self.cluster.engine.begin() as conn:
            jobs.create(
                conn,
                job_spec.JobSpec(
                    name=name,
                    kind=kind,
                    resource_id=resource.id,
                    args=[str(self.cluster.heartbeats), *extra],
                    conf=conf or {},
                    max_restarts=max_restarts,
                    restart_window_s=restart_window_s,
                    spark_master=master,
                    secret_env=secret_env or {},
                    deps_id=deps_id,
                ),
            )
            if master is not None:
                self.master_urls[name] = master
            if start:
                jobs.start(conn, name)

    def schedule_job(
        self, name: str, spec: str = "@every 5s", run_for: float = 0.5, timezone: str = "UTC"
    ) -> None:
        """A batch heartbeat job on ``spec`` in ``timezone`` (concurrency forbid),
        switched on now. Its fires are checked by S6 (``invariants.fire_problems``), not
        by S3 or settling: a job that fires every few seconds is never at rest for long."""
        from scheduler import schedule

        if self.resource is None:
            self.resource = self.upload("heartbeat", HEARTBEAT_JOB)
        with self.cluster.engine.begin() as conn:
            jobs.create(
                conn,
                job_spec.JobSpec(
                    name=name,
                    kind=JobKind.BATCH,
                    resource_id=self.resource.id,
                    args=[str(self.cluster.heartbeats), "--run-for", f"{run_for:g}"],
                    max_restarts=0,
                    schedule=schedule.parse(spec, timezone=timezone).as_dict(),
                ),
            )
            jobs.start(conn, name)
            on = conn.execute(_CURSOR, {"name": name}).scalar_one()
        self.scheduled[name] = invariants.Piece(spec, timezone, on)

    # Operators' commands on a scheduled job, each in ``conn``'s transaction (begun by
    # the caller, no statement run yet: its first reads the ``now()`` the command's event
    # gets) and recorded for S6 (ScheduleCommand).

    def _record(self, command: ScheduleCommand) -> None:
        with self._schedule_lock:
            self.schedule_commands.append(command)

    def change_schedule(
        self, conn: sa.Connection, name: str, spec: str, timezone: str = "UTC"
    ) -> str:
        """``job update NAME --schedule SPEC --timezone ZONE``."""
        from scheduler import schedule

        at = conn.execute(_TXN_NOW).scalar_one()
        change = job_spec.Change(schedule=schedule.parse(spec, timezone=timezone).as_dict())
        revised = job_revisions.update(conn, name, change)
        cursor = conn.execute(_CURSOR, {"name": name}).scalar_one()
        piece = invariants.Piece(spec, timezone, cursor)
        self._record(ScheduleCommand(name, "revised", at, cursor, revised.revision, piece))
        return f"revision {revised.revision}: {revised.effect.value}"

    def stop_schedule(self, conn: sa.Connection, name: str) -> str:
        """``job stop NAME`` of a scheduled job: its schedule off."""
        at = conn.execute(_TXN_NOW).scalar_one()
        result = jobs.stop(conn, name)
        cursor = conn.execute(_CURSOR, {"name": name}).scalar_one()
        self._record(ScheduleCommand(name, "stop_requested", at, cursor))
        return result

    def start_schedule(self, conn: sa.Connection, name: str) -> str:
        """``job start NAME`` of a scheduled job: its schedule on again."""
        at = conn.execute(_TXN_NOW).scalar_one()
        result = jobs.start(conn, name)
        self._record(ScheduleCommand(name, "start_requested", at))
        return result

    def backfill(
        self, conn: sa.Connection, name: str, start: datetime.datetime, end: datetime.datetime
    ) -> str:
        """``job backfill NAME --from START --to END``, after reading (the job row
        locked, as the backfill locks it) every row of its range as it was."""
        at = conn.execute(_TXN_NOW).scalar_one()
        job_id = job_views.job_id_of(conn, name)
        cursor = conn.execute(
            sa.text(
                "SELECT CAST(EXTRACT(EPOCH FROM fires_checked_until) AS double precision) "
                "FROM jobs WHERE id = :j FOR UPDATE"
            ),
            {"j": job_id},
        ).scalar_one()
        before = conn.execute(
            sa.text(
                "SELECT CAST(EXTRACT(EPOCH FROM scheduled_time) AS double precision), state "
                "FROM runs WHERE job_id = :j AND scheduled_time BETWEEN :start AND :end"
            ),
            {"j": job_id, "start": start, "end": end},
        ).all()
        queued, taken = jobs.backfill(conn, name, start, end, dry_run=False)
        if queued:
            self._record(
                ScheduleCommand(
                    name,
                    "start_requested",
                    at,
                    cursor,
                    queued=tuple(t.timestamp() for t in queued),
                    before=tuple((float(t), state) for t, state in before),
                )
            )
        return f"queued {len(queued)}, {len(taken)} had a run"

    def schedule_window(
        self, name: str, until: Any, excused: tuple[tuple[float, float], ...]
    ) -> invariants.ScheduleWindow:
        """S6's window of a scheduled job up to ``until``: its schedule's pieces (each
        change that committed starts one), the periods it was off and its backfills."""
        events = self.events()
        with self._schedule_lock:
            mine = [c for c in self.schedule_commands if c.job == name]
        done = sorted((c for c in mine if c.committed(events)), key=lambda c: c.at)
        changes = [c for c in done if c.kind == "revised"]
        pieces = [self.scheduled[name], *(c.piece for c in changes if c.piece is not None)]
        off: list[invariants.OffPeriod] = []
        stop: ScheduleCommand | None = None
        for c in done:
            if c.kind == "stop_requested" and stop is None:
                stop = c
            elif c.kind == "start_requested" and not c.queued and stop is not None:
                off.append(invariants.OffPeriod(stop.at, stop.cursor or stop.at, c.at))
                stop = None
        if stop is not None:
            off.append(invariants.OffPeriod(stop.at, stop.cursor or stop.at))
        backfills = tuple(
            invariants.Backfill(c.at, c.cursor or c.at, c.queued, c.before)
            for c in done
            if c.queued
        )
        return invariants.ScheduleWindow(
            name,
            invariants.piece_fire_times(pieces, until),
            "forbid",
            excused,
            changes=tuple(c.piece.start for c in changes if c.piece is not None),
            off=tuple(off),
            backfills=backfills,
        )

    def _fires_finished(self, name: str) -> int:
        ((count,),) = self.cluster.sql(
            "SELECT count(*) FROM runs r JOIN jobs j ON j.id = r.job_id "
            "WHERE j.name = :name AND r.trigger = 'schedule' AND r.state = 'finished'",
            name=name,
        )
        return int(count)

    def wait_fires_ran(self, name: str, count: int, timeout: float = 120) -> None:
        """Wait until ``count`` more fires of the scheduled job ran to their end (the
        schedule kept firing after the faults)."""
        before = self._fires_finished(name)
        waiting.wait_until(
            lambda: self._fires_finished(name) >= before + count,
            timeout,
            interval=0.5,
            message=f"{count} more fires of {name} finished",
        )

    def wait_backfills_ended(self, stall: float, timeout: float) -> list[str]:
        """Wait until every backfilled run of the scheduled jobs ended (each queued one
        runs once the job has no run in progress: docs/schedules.md "Backfill"), for as
        long as one of them moves on (changes state) at least every ``stall`` s, and
        at most ``timeout`` s (on a loaded machine a 0.5 s driver's run took 45 s: the
        queue drains slowly but drains). Those still waiting then, as problems."""
        query = (
            "SELECT j.name, r.run_id, r.scheduled_time, r.state FROM runs r "
            "JOIN jobs j ON j.id = r.job_id WHERE j.name = ANY(:names) "
            "AND r.trigger = 'backfill' AND r.ended_at IS NULL AND r.state <> 'skipped'"
        )
        names = sorted(self.scheduled)
        deadline = time.monotonic() + timeout
        seen, moved = None, time.monotonic()
        while True:
            left = self.cluster.sql(query, names=names)
            if not left:
                return []
            now = time.monotonic()
            state = {(r.run_id, r.state) for r in left}
            if state != seen:
                seen, moved = state, now
            if now - moved >= stall or now >= deadline:
                break
            time.sleep(1.0)
        return [
            f"{r.name}: backfilled run {r.run_id} ({r.scheduled_time}) still {r.state}: "
            f"none of the queue moved on for {now - moved:.0f} s after the faults"
            for r in left
        ]

    def next_fire(self, name: str) -> float:
        """Seconds until the scheduled job's next fire, by PostgreSQL's clock."""
        ((left,),) = self.cluster.sql(
            "SELECT CAST(EXTRACT(EPOCH FROM next_fire_at - now()) AS double precision) "
            "FROM jobs WHERE name = :name",
            name=name,
        )
        return float(left)

    def fire_problems(self, bound: float) -> list[str]:
        """S6 over every scheduled job, from its switch-on to the last slot handled (or,
        if that is older, to ``FIRE_LATENESS_BOUND_S`` before now), over its runs rows
        and those the harness pruned (``prune_history``); fault windows excuse lateness
        and misfires."""
        excused = tuple((w.start, w.end) for w in self.fault_windows(bound))
        problems = []
        for name in sorted(self.scheduled):
            with self.cluster.engine.connect() as conn:
                job_id, active, checked, now = conn.execute(
                    sa.text(
                        "SELECT id, schedule_active, fires_checked_until, now() FROM jobs "
                        "WHERE name = :n"
                    ),
                    {"n": name},
                ).one()
                rows = runs.list_runs(conn, job_id, limit=1_000_000)
            if not active:
                problems.append(f"{name}: its schedule was switched off")
                continue
            with self._prune_lock:
                kept = {i: r for i, (j, r) in self._pruned_runs.items() if j == job_id}
            rows = list({**kept, **{r["run_id"]: r for r in rows}}.values())
            # Every fire time the cluster handled, and every one older than the bound
            # (PostgreSQL's clock): a firing loop that stopped handling fires for good
            # leaves fires_checked_until behind, and its fires are missed.
            until = max(checked, now - datetime.timedelta(seconds=FIRE_LATENESS_BOUND_S))
            window = self.schedule_window(name, until, excused)
            problems += invariants.fire_problems(
                window, rows, lateness_bound=FIRE_LATENESS_BOUND_S, now=time.time()
            )
        return problems

    def command(self, action: Callable[[sa.Connection, str], str], name: str) -> str:
        with self.cluster.engine.begin() as conn:
            return action(conn, name)

    def populate(
        self,
        live: int | None = None,
        *,
        sentinels: bool = True,
        prefix: str = "job",
        master: str | None = None,
    ) -> list[str]:
        """Start ``live`` streaming heartbeat jobs (default: one per server; on
        ``master``, if given), each server the target of at least one, and the
        sentinels; wait until the live jobs run, the batch sentinel finished and the
        streaming one was stopped."""
        self.wait_ring_members(60)
        servers = sorted(self.live_servers())
        names = covering_names(prefix, servers, live or len(servers), sentinels)
        for name in names:
            self.create(name, master=master)
        if sentinels:
            self.create("done", kind=JobKind.BATCH, extra=["--run-for", "0.5"])
            self.create("halted")
        self.live_jobs += names
        self.wait_running(names, 90)
        if sentinels:
            self.wait_state("halted", "running", 90)
            self.command(jobs.stop, "halted")
            self.wait_state("halted", "stopped", 60)
            self.wait_state("done", "finished", 90)
            self.sentinels = {name: self.cluster.job(name) for name in SENTINELS}
        self.wait_settled(60)
        return names

    def own_a_job(self, server: str, timeout: float = 90) -> list[str]:
        """The live jobs ``server`` owns, after making sure it owns one.

        :meth:`populate` places a live job on every server, but a job can leave its
        server before a case injects its fault: on a loaded CI machine a server's
        ZooKeeper session can expire or a late renewal make it withdraw (a fault the
        case did not inject, and the jobs it lost do not come back: one fault, one
        restart). A case whose fault is about one server's jobs then starts one more
        job whose ring place is that server, and waits until it runs there; the moves
        that left the server empty are noted in the campaign's summary."""
        owned = self.owned_by(server)
        if owned:
            return owned
        moves = [
            f"{e['job_name']} {e['kind']} server={e['server']} {json.dumps(e['detail'])}"
            for e in self.events()
            if e["job_name"] in self.live_jobs and e["kind"] in _MOVES
        ]
        self.outcome.notes.append(
            f"{server} owned no live job after populate; one more was placed on it. "
            f"The moves: {'; '.join(moves) or 'none recorded'}"
        )
        capacities = dict.fromkeys(sorted(self.live_servers()), SERVER_CAPACITY)
        name = name_placed_on(f"on-{server}", capacities, server)
        self.create(name)
        self.live_jobs.append(name)
        self.wait_running([name], timeout)
        self.wait_settled(60)
        owned = self.owned_by(server)
        assert owned, (
            f"{server} owns no live job, even {name} placed on it: {self.job_rows()}; "
            f"the moves before: {moves}"
        )
        return owned

    def owned_by(self, server: str) -> list[str]:
        """The live jobs ``server`` owns now."""
        return sorted(n for n, o in self.owners().items() if o == server and n in self.live_jobs)

    def wait_ring_members(self, timeout: float) -> None:
        """Wait until every live server is a settled member of the ring (its join done).
        The coordinator's view of the members can lag the registry: jobs placed before a
        server entered it go to the others, and move to it only after their residency,
        so a case that needs each server to own a job waits for the joins first (CI,
        2026-11-27: the cut-off server of a partition case owned none after populate)."""

        def settled() -> set[str]:
            rows = self.cluster.sql(
                "SELECT server FROM ring_members WHERE settled AND left_at IS NULL"
            )
            return {r[0] for r in rows}

        waiting.wait_until(
            lambda: self.live_servers() <= settled(),
            timeout,
            interval=0.2,
            message=f"settled ring members {sorted(self.live_servers())}",
        )

    def job_rows(self) -> list[dict[str, Any]]:
        rows = self.cluster.sql(
            """
            SELECT j.name, j.kind, j.desired, j.max_restarts, j.restart_window_s,
                   d.state, d.owner, d.target,
                   d.epoch, d.last_error, j.generation = d.generation AS current,
                   j.schedule_active AS scheduled
              FROM jobs j JOIN distribution d ON d.job_id = j.id ORDER BY j.name
            """
        )
        return [dict(r._mapping) for r in rows]

    def wait_state(self, name: str, state: str, timeout: float) -> dict[str, Any]:
        return self.cluster.wait_job(name, lambda j: j["state"] == state, timeout, state)

    def wait_running(self, names: Iterable[str], timeout: float) -> None:
        names = set(names)

        def running() -> bool:
            rows = [r for r in self.job_rows() if r["name"] in names]
            return len(rows) == len(names) and all(
                r["state"] == "running" and r["owner"] is not None for r in rows
            )

        waiting.wait_until(running, timeout, interval=0.2, message=f"{sorted(names)} running")

    def settled(self) -> bool:
        """Every job wanted running runs on a live server that is its target; others
        (finished, failed with a reason, stopped) are at rest."""
        return not self.unsettled()

    def unsettled(self) -> list[str]:
        """Why the cluster is not settled: one line per job not at rest (empty: settled)."""
        live = self.live_servers()
        drivers = self.live_drivers()
        reasons = []
        for r in self.job_rows():
            if r["scheduled"]:
                continue  # fires every few seconds: checked by S6, never at rest for long
            row = (
                f"{r['name']}: desired {r['desired']}, state {r['state']}, owner {r['owner']}, "
                f"target {r['target']}, epoch {r['epoch']}"
            )
            if r["desired"] == "running" and r["state"] not in ("finished", "failed"):
                at_home = r["owner"] == r["target"] and r["owner"] in live
                alive = (r["name"], r["epoch"], r["owner"]) in drivers
                if not (r["state"] == "running" and at_home and r["current"] and alive):
                    reasons.append(
                        f"{row}; owner live {r['owner'] in live}, current generation "
                        f"{r['current']}, driver under the owner's process {alive}"
                    )
            elif r["desired"] == "stopped" and r["state"] not in ("stopped", "finished", "failed"):
                # A batch run that ended finished (or failed) as a stop arrived is at rest:
                # it ran to its end, there is nothing left to stop.
                reasons.append(row)
        return reasons

    def live_drivers(self) -> set[tuple[str, int, str]]:
        """(job, epoch, server) of every driver that runs under the current process of its
        server: its watchdog recorded its start and not its end, and the watchdog is a
        child of that server process. A row saying 'running' is not enough: after a
        restart with the same id, the old incarnation's driver lives on (until its lease
        deadline) while the new incarnation has yet to replace it."""
        started: dict[tuple[str, int, str], int] = {}
        for r in self.cluster.driver_records():
            key = (r["job"], int(r["epoch"]), r["server"])
            if r["event"] == "started":
                started[key] = r["pid"]
            elif r["event"] == "ended":
                started.pop(key, None)
        servers = self.cluster.servers
        # A driver adopted by the current process (issue 13) keeps its old watchdog, now
        # a child of init: it counts when that process recorded the adoption.
        adopted = {
            (e["job_name"], int(e["epoch"]), e["server"]): e["at_s"]
            for e in self.events()
            if e["kind"] == "adopted"
        }

        def current(key: tuple[str, int, str], pid: int) -> bool:
            if key[2] not in servers:
                return False
            server_pid = servers[key[2]].pid
            if _parent(_parent(pid)) == server_pid:
                return True
            since = _started_at(server_pid)
            return _parent(pid) is not None and since is not None and adopted.get(key, 0) >= since

        return {key for key, pid in started.items() if current(key, pid)}

    def wait_stable(self, start: float, bound: float) -> float | None:
        """Seconds from ``start`` to the beginning of the first period of STABLE_S in
        which the cluster stayed settled (a single look can catch the instant before a
        rebalance), or None if that did not happen within ``bound``."""
        streak: float | None = None
        deadline = start + bound + STABLE_S
        while time.monotonic() < deadline:
            now = time.monotonic()
            if self.settled():
                streak = now if streak is None else streak
                if now - streak >= STABLE_S:
                    return round(streak - start, 2)
            else:
                streak = None
            time.sleep(0.2)
        return None

    def wait_settled(self, timeout: float) -> None:
        """Wait until the cluster stayed settled for STABLE_S (a coordinator whose
        membership view lags a join may settle jobs once, then move them)."""
        if self.wait_stable(time.monotonic(), timeout) is None:
            raise AssertionError(f"cluster not settled in {timeout:g} s; jobs: {self.job_rows()}")

    def coordinator(self) -> str:
        return self.cluster.sql("SELECT server FROM coordinator WHERE id = 1")[0][0]

    def owners(self) -> dict[str, str | None]:
        return {r["name"]: r["owner"] for r in self.job_rows()}

    def busiest_owner(self) -> str:
        owned = [o for n, o in self.owners().items() if n in self.live_jobs and o]
        return max(sorted(set(owned)), key=owned.count)

    # ------------------------------------------------------------------ the fault

    def running_watchdogs(self) -> list[faults.Watchdog]:
        """The live watchdogs of the drivers the rows say are running (job, epoch,
        owner): a watchdog of an old epoch or incarnation is not a running job's."""
        running = {
            (r["name"], r["epoch"], r["owner"]) for r in self.job_rows() if r["state"] == "running"
        }
        return [
            w
            for w in faults.live_watchdogs(self.cluster.root)
            if (w.job, w.epoch, w.server) in running
        ]

    def kill_watchdog(self, target: faults.Watchdog) -> None:
        self.killed_watchdogs.append(target.run_dir)
        faults.kill_watchdog(target)

    _EVENTS = """
        SELECT id, at, CAST(EXTRACT(EPOCH FROM at) AS double precision) AS at_s,
               job_name, kind, server, epoch, detail
          FROM job_events {where} ORDER BY id
    """

    def events(self) -> list[dict[str, Any]]:
        """Every job event of the cluster, oldest first, with its detail: those in the
        table and those the harness pruned from it (``prune_history``)."""
        rows = {r.id: dict(r._mapping) for r in self.cluster.sql(self._EVENTS.format(where=""))}
        with self._prune_lock:
            merged = {**self._pruned, **rows}
        return [merged[i] for i in sorted(merged)]

    def prune_history(self, conn: sa.Connection, older_than: float) -> str:
        """``sparkring events prune --older-than`` (server/cli/events.py, the same
        statements): delete the job events older than ``older_than`` seconds, after
        copying every one of them into the harness's snapshot, which :meth:`events`
        merges back. An event older than the cutoff that commits between the copy and
        the delete (a transaction's ``now()`` is its start: a server paused mid
        transaction) would be deleted unseen: that is counted and fails the run, never
        silently blinds the checker. The harness's prunes run one at a time (a
        concurrent one deleting the copied events would make the count meaningless:
        a negative "unseen"). ``conn`` must not be in a transaction."""
        with self._prune_pass:
            return self._prune_history(conn, older_than)

    def _prune_history(self, conn: sa.Connection, older_than: float) -> str:
        cutoff = retention.cutoff(conn, older_than)  # leaves conn outside a transaction
        with conn.begin():
            doomed = {
                r.id: dict(r._mapping)
                for r in conn.execute(
                    sa.text(self._EVENTS.format(where="WHERE at < :cutoff")), {"cutoff": cutoff}
                )
            }
            doomed_runs = {
                r.run_id: (r.job_id, runs.view(r))
                for r in conn.execute(self._RUNS_BEFORE, {"cutoff": cutoff})
            }
            # Every delivery a prune may delete (sent or given up, written before the
            # cutoff), whatever its status now: one pending now may be sent before the
            # delete. A copy whose row the prune deleted is marked ``pruned``.
            doomed_deliveries = {
                str(r.id): dict(r._mapping)
                for r in conn.execute(
                    sa.text(f"{self._DELIVERIES} WHERE created_at < :cutoff"), {"cutoff": cutoff}
                )
            }
        try:
            pruned = retention.prune(conn, None, cutoff, batch_size=defaults.HISTORY_PRUNE_BATCH)
        except sa.exc.DBAPIError:
            # Its outcome is unknown: a batch may have committed before the error (a
            # failover, a restart). The copies stay (a row still in the table wins over its
            # copy, :meth:`events`); a delivery is marked pruned once its row is known gone.
            self._keep_copies(doomed, doomed_runs, doomed_deliveries, self._kept_deliveries_later)
            raise
        with conn.begin():
            kept = set(
                conn.execute(
                    sa.text("SELECT id FROM job_events WHERE id = ANY(:ids)"), {"ids": list(doomed)}
                ).scalars()
            )
            kept_runs = set(
                conn.execute(
                    sa.text("SELECT run_id FROM runs WHERE run_id = ANY(:ids)"),
                    {"ids": list(doomed_runs)},
                ).scalars()
            )
            kept_deliveries = {
                str(i)
                for i in conn.execute(
                    self._KEPT_DELIVERIES, {"ids": list(doomed_deliveries)}
                ).scalars()
            }
        self._keep_copies(doomed, doomed_runs, doomed_deliveries, lambda ids: kept_deliveries)
        self.outcome.pruned += pruned.events
        for what, deleted, copied, left in (
            ("job events", pruned.events, len(doomed), len(kept)),
            ("runs rows", pruned.runs, len(doomed_runs), len(kept_runs)),
            (
                "alert deliveries",
                pruned.deliveries,
                len(doomed_deliveries),
                len(kept_deliveries),
            ),
        ):
            unseen = deleted - (copied - left)
            if unseen > 0:
                raise AssertionError(f"{unseen} {what} were pruned before the harness saw them")
            if unseen < 0:
                raise AssertionError(
                    f"{-unseen} of the copied {what} were deleted by another prune meanwhile: "
                    "the count cannot tell whether it deleted rows the harness never saw"
                )
        return f"pruned {pruned.events}"

    _KEPT_DELIVERIES = sa.text(
        "SELECT id FROM alert_deliveries WHERE id = ANY(CAST(:ids AS uuid[]))"
    )

    def _keep_copies(
        self,
        doomed: dict[int, dict[str, Any]],
        doomed_runs: dict[int, tuple[int, dict[str, Any]]],
        doomed_deliveries: dict[str, dict[str, Any]],
        kept_deliveries: Callable[[list[str]], set[str]],
    ) -> None:
        """Keep the copies a prune took; ``kept_deliveries(ids)``: those of ``ids`` whose
        row is still there."""
        kept = kept_deliveries(list(doomed_deliveries))
        with self._prune_lock:
            self._pruned.update(doomed)
            self._pruned_runs.update(doomed_runs)
            for did, row in doomed_deliveries.items():
                if did not in kept:
                    self._pruned_deliveries[did] = {**row, "status": PRUNED}

    def _kept_deliveries_later(self, ids: list[str]) -> set[str]:
        """Those of ``ids`` whose row is still there, read on a new connection once the
        database answers again (within PRUNE_SETTLE_S); every one of them if it never
        does (so none is marked pruned unseen)."""
        deadline = time.monotonic() + PRUNE_SETTLE_S
        while True:
            try:
                with self.cluster.engine.connect() as conn:
                    return {
                        str(i) for i in conn.execute(self._KEPT_DELIVERIES, {"ids": ids}).scalars()
                    }
            except sa.exc.DBAPIError:
                if time.monotonic() >= deadline:
                    return set(ids)
                time.sleep(1.0)

    # The runs rows a prune at ``cutoff`` may delete (server/retention.py: ended before
    # it), and some it keeps (unended, a job's newest): read back as they are after it.
    _RUNS_BEFORE = sa.text(
        "SELECT r.job_id, r.run_id, r.scheduled_time, r.trigger, r.state, r.reason, "
        "r.created_at, r.started_at, r.ended_at, r.exit_code, r.server, r.epoch, r.attempts, "
        "r.generation FROM runs r WHERE coalesce(r.ended_at, r.created_at) < :cutoff"
    )

    def _max_event_id(self) -> int:
        return self.cluster.sql("SELECT coalesce(max(id), 0) FROM job_events")[0][0]

    def inject(self, action: Callable[[], object]) -> object:
        """Run the fault; the recovery clock starts here unless ``healed()`` is called."""
        if self._t_fault is None:
            self._event_mark = self._max_event_id()
            self._t_fault = time.monotonic()
        self.outcome.injected += 1
        self._fault_spans.append([time.time(), None])
        return action()

    def inject_master_fault(self, masters: Iterable[int], action: Callable[[], object]) -> None:
        """Run ``action``, which takes masters ``masters`` (of :attr:`masters`) down: a
        fault like :meth:`inject`'s, recorded as a master outage until :meth:`master_back`."""
        assert self.masters is not None, "use_masters() first"
        if self._t_fault is None:
            self._event_mark = self._max_event_id()
            self._t_fault = time.monotonic()
        self.outcome.injected += 1
        down = frozenset(self.masters.endpoint(i) for i in masters)
        self._master_spans.append([down, time.time(), None])
        action()

    def master_back(self, masters: Iterable[int]) -> None:
        """Masters ``masters`` are about to be spawned again: their outage ends here
        (they cannot answer before)."""
        assert self.masters is not None
        back = {self.masters.endpoint(i) for i in masters}
        for span in self._master_spans:
            if span[2] is None and span[0] <= back:
                span[2] = time.time()

    def master_outages(self) -> list[invariants.MasterOutage]:
        now = time.time()
        return [
            invariants.MasterOutage(down, start, now if back is None else back)
            for down, start, back in self._master_spans
        ]

    def fault_over(self) -> None:
        """The faults injected so far are over (a server restarted, a pause ended): a
        restart they cause comes within the recovery bound after this."""
        for span in self._fault_spans:
            if span[1] is None:
                span[1] = time.time()

    def healed(self) -> None:
        self._t_healed = time.monotonic()
        self.fault_over()

    def fault_windows(self, bound: float) -> list[invariants.FaultWindow]:
        """Each fault from its injection to ``bound`` seconds after it was over (a fault
        never declared over lasts until now)."""
        now = time.time()
        return [
            invariants.FaultWindow(start=start, end=(now if over is None else over) + bound)
            for start, over in self._fault_spans
            if start is not None
        ]

    def drain(self, server: str) -> subprocess.CompletedProcess[str]:
        """``sparkring server drain SERVER`` through the CLI (an operator's planned
        move of every job off it), noted first; the CLI's outcome is returned."""
        self._drain_spans.append([server, time.time(), None])
        return self.cluster.cli("server", "drain", server, check=False)

    def undrain(self, server: str) -> subprocess.CompletedProcess[str]:
        """``sparkring server drain SERVER --undo`` through the CLI. The undo is noted
        before it is sent, once (a retry keeps the first time: an attempt may have
        committed before it failed), so that it precedes every move of the join it
        starts."""
        for span in self._drain_spans:
            if span[0] == server and span[2] is None:
                span[2] = time.time()
        return self.cluster.cli("server", "drain", server, "--undo", check=False)

    def drains(self) -> list[invariants.Drain]:
        return [
            invariants.Drain(server, asked, undone) for server, asked, undone in self._drain_spans
        ]

    # ------------------------------------------------------------------ alerts

    def watch_alerts(self, host: str = "127.0.0.1") -> Receiver:
        """A webhook receiver (on ``host``: an address every server reaches, a
        namespace's too) and an alert ``chaos`` of every kind for every job, signed;
        :meth:`verify` then checks that every event after now raised its delivery and
        that each reached the receiver (issue 26)."""
        self.receiver = Receiver(secret=ALERT_SECRET, host=host).start()
        with self.cluster.engine.begin() as conn:
            alerts.create(
                conn, ALERT_NAME, self.receiver.url, secret=ALERT_SECRET, kinds="all",
                allow_networks=(*factories.LOOPBACK, *destinations.parse_networks(host)),
            )  # fmt: skip
            self._alert_mark = conn.execute(
                sa.text("SELECT coalesce(max(id), 0) FROM job_events")
            ).scalar_one()
        return self.receiver

    _DELIVERIES = (
        "SELECT id, alert_name, event_id, kind, job_name, status, attempts, last_error, "
        "created_at FROM alert_deliveries"
    )

    def deliveries(self) -> list[dict[str, Any]]:
        """Every alert delivery, oldest first: those in the table and those the
        harness's prunes deleted (``prune_history``: status ``pruned``)."""
        rows = {str(r.id): dict(r._mapping) for r in self.cluster.sql(self._DELIVERIES)}
        with self._prune_lock:
            merged = {**self._pruned_deliveries, **rows}
        return sorted(merged.values(), key=lambda d: d["created_at"])

    def _alert_checks(self, events: Sequence[dict[str, Any]]) -> list[str]:
        """Wait (up to ALERT_DRAIN_S) until the deliveries of ``events`` (and the test
        deliveries) are no longer pending, then check them; the cluster goes on raising
        new ones meanwhile, which are known but not checked."""
        receiver = self.receiver
        assert receiver is not None
        last = max((e["id"] for e in events), default=0)

        def split() -> tuple[list[dict[str, Any]], list[str]]:
            rows = self.deliveries()
            mine = [d for d in rows if d["event_id"] is None or d["event_id"] <= last]
            return mine, [str(d["id"]) for d in rows if d not in mine]

        waiting.poll_until(
            lambda: not any(d["status"] == "pending" for d in split()[0]),
            ALERT_DRAIN_S,
            interval=1.0,
        )
        checked, later = split()
        self.outcome.deliveries = len(checked)
        ids = [r.id for r in receiver.received]
        self.outcome.resent = len(ids) - len(set(ids))
        problems = invariants.unraised_alerts(events, checked, ALERT_NAME, self._alert_mark)
        problems += invariants.undelivered_alerts(checked, receiver.accepted_ids(), later)
        bad = [r for r in receiver.received if r.signature_ok is not True]
        problems += [f"a delivery's signature did not verify: {r.id}" for r in bad]
        return problems

    # ------------------------------------------------------------------ the verdict

    def verify(self, bound: float = RECOVERY_BOUND_S) -> Outcome:
        """Wait for recovery (up to ``bound`` s), check S1-S5, fill in the outcome."""
        o = self.outcome
        start = self._t_healed or self._t_fault or time.monotonic()
        o.recovery_s = self.wait_stable(start, bound)
        c = self.cluster
        # The rows first, then the evidence behind them: a driver a row names started
        # before the row was read, so its records are in what is read after (S3).
        rows = self.job_rows()
        o.jobs = len(rows)
        scheduled = {r["name"] for r in rows if r["scheduled"]}
        events = self.events()
        since = [e for e in events if e["id"] > self._event_mark]
        lifetimes = c.driver_records()
        heartbeats = c.heartbeat_records()
        now, now_mono = time.time(), watchdog.lease_clock()
        kinds = {r["name"]: r["kind"] for r in rows}
        checks = {
            "S1": invariants.double_runs(heartbeats, lifetimes, freezes=self.freezes),
            "early": invariants.early_handoffs(events, lifetimes, self.freezes)
            + invariants.runs_before_claim(events, lifetimes),
            "S2": invariants.stale_writes(events) + probe_stale_writes(c.engine, events),
            "S3": invariants.lost_jobs(
                [r for r in rows if r["name"] not in scheduled],
                self.live_servers(),
                events,
                lifetimes=lifetimes,
                heartbeats=heartbeats,
                now=now,
                now_mono=now_mono,
            ),
            "S4": invariants.resurrections(
                self.sentinels, {n: c.job(n) for n in self.sentinels}, since
            )
            + invariants.terminal_resurrections(events),
            "S5": invariants.corrupt_starts(self.broken_artifacts, lifetimes, events),
            "batch": invariants.batch_generations(
                kinds, lifetimes, events, self.freezes, self.pg_cuts
            ),
            "budget": invariants.budget_overruns(rows, lifetimes, events, self.pg_cuts),
            "restarts": invariants.restarts_per_fault(
                events, self.fault_windows(bound), self._event_mark, self.drains()
            ),
            "master": self._master_checks(events, bound),
            "S6": self.fire_problems(bound),
        }
        if self.receiver is not None:
            checks["alerts"] = self._alert_checks(events)
        o.double_runs = len(checks["S1"])
        o.early = len(checks["early"])
        o.stale_writes = len(checks["S2"])
        o.lost = len(checks["S3"])
        # Both S4 checks may see one job (a sentinel claimed again): count jobs.
        o.resurrected = len({p.split(":", 1)[0] for p in checks["S4"]})
        o.corrupt_starts = len(checks["S5"])
        o.batch = len(checks["batch"])
        o.budget = len(checks["budget"])
        o.double_restarts = len(checks["restarts"])
        o.master = len(checks["master"])
        o.fires = len(checks["S6"])
        o.alerts = len(checks.get("alerts", []))
        # A scheduled job's claims are its fires' runs, not restarts.
        o.restarts = sum(
            1 for e in since if e["kind"] == "claimed" and e["job_name"] not in scheduled
        )
        o.adoptions = sum(1 for e in since if e["kind"] == "adopted")
        o.warm_claims = sum(
            1 for e in since if e["kind"] == "claimed" and (e.get("detail") or {}).get("warm")
        )
        o.problems = [f"{k} {p}" for k, items in checks.items() for p in items]
        return o

    def _master_checks(self, events: Sequence[dict[str, Any]], bound: float) -> list[str]:
        """S9 for the Spark master: what the master faults cost the jobs on the masters
        (each a job whose driver never fails on its own); another fault's window excuses
        a crash or a restart within it."""
        outages = self.master_outages()
        if not outages:
            return []
        on = invariants.job_masters(self.master_urls)
        others = self.fault_windows(bound)
        mark = self._event_mark
        return (
            invariants.master_fault_costs(events, outages, on, others, bound, mark)
            + invariants.master_fault_restarts(
                events, outages, on, others, bound, mark, self.drains()
            )
            + invariants.started_without_master(events, outages, on, since_id=mark)
        )


def covering_names(
    prefix: str, servers: Sequence[str], count: int, sentinels: bool, tries: int = 500
) -> list[str]:
    """``count`` job names that the coordinator's placement spreads over every server
    (as evenly as possible), and to the same servers whether or not the sentinels are
    active, so that populating never moves a job."""
    capacities = dict.fromkeys(servers, SERVER_CAPACITY)

    def place(names: list[str]) -> dict[str, str]:
        return placement.place(
            names, capacities, epsilon=defaults.PLACEMENT_EPSILON, vnodes=defaults.RING_VNODES
        ).targets

    for seed in range(tries):
        names = [f"{prefix}{seed}-{i}" for i in range(count)]
        alone = place(names)
        loads = [list(alone.values()).count(s) for s in servers]
        if max(loads) - min(loads) > 1 or (min(loads) == 0 and count >= len(servers)):
            continue
        if sentinels:
            together = place([*names, *SENTINELS])
            if any(together[n] != alone[n] for n in names):
                continue
        return names
    raise AssertionError(f"no {count} names over {servers} found in {tries} tries")


def name_placed_on(prefix: str, capacities: dict[str, int], server: str, tries: int = 500) -> str:
    """A job name whose ring successor among ``capacities`` is ``server``: placed alone
    it goes there, and so it does beside jobs that stay on the other servers."""
    for i in range(tries):
        name = f"{prefix}-{i}"
        alone = placement.place(
            [name], capacities, epsilon=defaults.PLACEMENT_EPSILON, vnodes=defaults.RING_VNODES
        ).targets
        if alone.get(name) == server:
            return name
    raise AssertionError(f"no name placed on {server} over {sorted(capacities)} in {tries} tries")


def probe_stale_writes(engine: sa.Engine, events: Sequence[dict[str, Any]]) -> list[str]:
    """S2, actively: replay a write as every past owner of every job, with its old
    epoch, inside a transaction that is rolled back. PostgreSQL must reject each one."""
    claims: dict[str, list[tuple[int, str]]] = {}
    for e in events:
        if e["kind"] == "claimed":
            claims.setdefault(e["job_name"], []).append((e["epoch"], e["server"]))
    accepted = []
    with engine.connect() as conn:
        ids = dict(conn.execute(sa.text("SELECT name, id FROM jobs")).all())
        conn.rollback()
        for name, items in claims.items():
            if name not in ids:
                continue
            newest = max(epoch for epoch, _ in items)
            for epoch, server in items:
                if epoch == newest:
                    continue
                tx = conn.begin()
                try:
                    # Whatever incarnation the probe names: a stale epoch must be refused
                    # on the epoch alone, so use the row's current one (the strongest).
                    incarnation = conn.execute(
                        sa.text("SELECT owner_incarnation FROM distribution WHERE job_id = :j"),
                        {"j": ids[name]},
                    ).scalar_one()
                    owner = distribution.Owner(server, incarnation or "")
                    distribution.begin_stop(conn, ids[name], owner, epoch, "chaos probe")
                    accepted.append(f"{name}: stale write by {server} at epoch {epoch} accepted")
                except distribution.FencedError:
                    pass
                finally:
                    tx.rollback()
    return accepted


def _started_at(pid: int) -> float | None:
    """When a live process started, in wall-clock seconds (None if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return None
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def _parent(pid: int | None) -> int | None:
    """The parent of a live process (None if it is gone)."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])
