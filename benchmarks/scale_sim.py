"""Scale simulation: 100 servers' registry sessions and 10,000 jobs, no JVM.

What is real: 100 ``registry.session.Registry`` objects (ZooKeeper sessions, ephemeral
nodes, membership watches, the coordinator election) against the stack's ZooKeeper;
10,000 jobs in the stack's PostgreSQL; the coordinator is ``server.coordinator_loop.
CoordinatorLoop`` started by the elected registry, as ``server/process.py`` does; every
server claims, renews and releases with the ``scheduler.distribution`` statements the
real runner uses, at the production intervals.

What is simulated (allowed here only): the servers are threads of this process, not
``sparkring server run`` processes, and a driver is a row marked running (no watchdog,
no spark-submit); servers poll the distribution table every poll interval and do not
LISTEN (the real server is woken by NOTIFY, so it reacts sooner than this simulation).
One server, the victim, holds its ZooKeeper session in a child process so that it can be
lost the way a machine is: SIGKILL, the session expires after its timeout.

Measured:

- cold start: from the jobs being wanted running to all 10,000 running;
- convergence after losing a server: SIGKILL of the victim -> every job it owned running
  on another server (with the rebalance time of the coordinator for 10,000 jobs);
- steady-state database load: transactions/s (``pg_stat_database.xact_commit`` of the
  simulation's database) and rows updated/s, over a quiet window.

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.scale_sim [--servers 100] [--jobs 10000] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from kazoo.client import KazooClient
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from registry import servers, session
from scheduler import coordinator, distribution
from server import coordinator_loop, defaults
from sql import migrate, states
from testing import services

REPO = Path(__file__).resolve().parent.parent

VICTIM = """
import os, sys, time
from registry import servers, session
hosts, root, timeout = sys.argv[1:4]
info = servers.ServerInfo(id="victim", host="127.0.0.1", pid=os.getpid(), capacity=200,
                          role="worker", version="sim", started_at=time.time())
reg = session.Registry(hosts, root, info, session_timeout=float(timeout))
reg.start()
print("registered", flush=True)
time.sleep(3600)
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class SimServer:
    """One simulated server's side of the distribution table: the runner's statements,
    with a driver that is only a row."""

    def __init__(self, engine: sa.Engine, server_id: str, ttl: float) -> None:
        self.engine = engine
        self.id = server_id
        self.owner = distribution.Owner(server_id, f"{server_id}-sim")
        self.ttl = ttl
        self.runs: dict[int, int] = {}  # job id -> epoch
        self.alive = True

    def renew(self) -> None:
        with self.engine.begin() as conn:
            renewed = distribution.renew_leases(conn, self.owner, self.ttl)
        for job_id in [j for j, e in self.runs.items() if renewed.get(j) != e]:
            del self.runs[job_id]  # lease lost: the driver would be killed

    def poll(self, may_claim: bool) -> None:
        with self.engine.connect() as conn:
            rows = distribution.poll(conn, self.owner)
        for row in rows:
            mine = self.runs.get(row.job_id)
            if mine is not None:
                if row.owner != self.id or row.epoch != mine:
                    del self.runs[row.job_id]
                elif row.target != self.id or row.desired != "running":
                    with self.engine.begin() as conn:
                        distribution.begin_stop(conn, row.job_id, self.owner, mine, "moved")
                        distribution.release(conn, row.job_id, self.owner, mine)
                    del self.runs[row.job_id]
                continue
            claimable = (
                row.owner is None and row.state in states.CLAIMABLE and row.claimable_now
            ) or (row.owner is not None and row.lease_expired)
            if may_claim and row.target == self.id and row.desired == "running" and claimable:
                try:
                    with self.engine.begin() as conn:
                        claim = distribution.claim(conn, row.job_id, self.owner, self.ttl)
                        distribution.mark_running(conn, row.job_id, self.owner, claim.epoch, 0)
                except distribution.NotClaimable:
                    continue
                self.runs[row.job_id] = claim.epoch


class Simulation:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stack_env = services.stack_env()
        self.hosts = self.stack_env["SPARKRING_ZK_HOSTS"]
        self.root = f"/sparkring-sim/{uuid.uuid4().hex[:10]}"
        url = sa.make_url(self.stack_env["SPARKRING_DATABASE_URL"])
        self.database = f"sim_{uuid.uuid4().hex[:10]}"
        self.url = url.set(database=self.database).render_as_string(hide_password=False)
        self.registries: dict[str, session.Registry] = {}
        self.sims: dict[str, SimServer] = {}
        self.stop = threading.Event()
        self.loop: coordinator_loop.CoordinatorLoop | None = None
        self.rebalances: list[tuple[float, coordinator.Rebalance]] = []
        self.victim: subprocess.Popen[str] | None = None
        self.engine: sa.Engine | None = None

    # ------------------------------------------------------------------ set-up

    def create_database(self) -> None:
        admin = services.admin_engine(self.stack_env["SPARKRING_DATABASE_URL"])
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {self.database}"))
        admin.dispose()
        engine = sa.create_engine(self.url, poolclass=NullPool)
        migrate.upgrade(engine)
        engine.dispose()
        self.engine = sa.create_engine(self.url, pool_size=24, max_overflow=0)
        with self.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO resources (name, version, sha256, size, object_key, filename) "
                    "VALUES ('sim', 1, repeat('0', 64), 1, 'objects/sim', 'sim.py')"
                )
            )
            conn.execute(
                sa.text(
                    """
                    INSERT INTO jobs (name, kind, resource_id, desired, max_restarts, generation)
                    SELECT 'job-' || lpad(i::text, 5, '0'), 'streaming',
                           (SELECT id FROM resources), 'stopped', 3, 0
                      FROM generate_series(0, :n - 1) AS i
                    """
                ),
                {"n": self.args.jobs},
            )
            conn.execute(
                sa.text("INSERT INTO distribution (job_id, state) SELECT id, 'stopped' FROM jobs")
            )

    def want_all_running(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE jobs SET desired = 'running', generation = generation + 1, "
                    "updated_at = now()"
                )
            )
            conn.execute(sa.text("UPDATE distribution SET state = 'pending' WHERE owner IS NULL"))

    def _on_coordinator(self, server_id: str, term: int | None) -> None:
        if self.loop is not None:
            self.loop.stop()
            self.loop = None
        if term is None:
            return
        reg = self.registries[server_id]
        self.loop = coordinator_loop.CoordinatorLoop(
            self.engine,
            server_id,
            term,
            servers=lambda: {sid: info.capacity for sid, info in reg.members().items()},
            live=lambda: list(reg.members()),
            policy=coordinator.RebalancePolicy(
                epsilon=defaults.PLACEMENT_EPSILON,
                vnodes=defaults.RING_VNODES,
                debounce=defaults.MEMBERSHIP_DEBOUNCE_S,
                interval=self.args.poll_interval,
            ),
            on_rebalance=self._rebalanced,
        )
        self.loop.start()

    def _rebalanced(self, result: coordinator.Rebalance) -> None:
        if result.changed:
            self.rebalances.append((time.monotonic(), result))

    def _wake(self, _view: Any) -> None:
        if self.loop is not None:
            self.loop.wake()

    def register(self) -> None:
        ids = [f"sim-{i:03d}" for i in range(self.args.servers - 1)]

        def start(sid: str) -> None:
            info = servers.ServerInfo(
                id=sid,
                host="127.0.0.1",
                pid=os.getpid(),
                capacity=self.args.capacity,
                role="both",
                version="sim",
                started_at=time.time(),
            )
            reg = session.Registry(
                self.hosts,
                self.root,
                info,
                session_timeout=self.args.session_timeout,
                on_members=self._wake,
                on_coordinator=lambda term, sid=sid: self._on_coordinator(sid, term),
                debounce=defaults.MEMBERSHIP_DEBOUNCE_S,
            )
            self.registries[sid] = reg
            reg.start(timeout=60)

        # The first one alone, so that it is the coordinator (a plain member is lost).
        start(ids[0])
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(start, ids[1:]))
        for sid in ids:
            self.sims[sid] = SimServer(self.engine, sid, self.args.lease_ttl)
        self.victim = subprocess.Popen(
            [sys.executable, "-c", VICTIM, self.hosts, self.root, str(self.args.session_timeout)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self.victim.stdout is not None
        if self.victim.stdout.readline().strip() != "registered":
            raise RuntimeError("the victim did not register")
        self.sims["victim"] = SimServer(self.engine, "victim", self.args.lease_ttl)

    # ------------------------------------------------------------------ loops

    def _server_loop(self, sim: SimServer) -> None:
        # Spread the servers over the interval, as independent machines would be.
        self.stop.wait(self.args.poll_interval * random.random())
        reg = self.registries.get(sim.id)
        while not self.stop.is_set() and sim.alive:
            try:
                sim.renew()
                sim.poll(may_claim=reg is None or not reg.safe_mode)
            except (DBAPIError, distribution.FencedError) as exc:
                log(f"{sim.id}: {type(exc).__name__}")
            self.stop.wait(self.args.poll_interval)

    def start_loops(self) -> None:
        for sim in self.sims.values():
            threading.Thread(target=self._server_loop, args=(sim,), daemon=True).start()

    # ------------------------------------------------------------------ measures

    def counts(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT state, count(*) FROM distribution GROUP BY state")
            ).all()
        return dict(rows)

    def wait(self, predicate, timeout: float, what: str) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if predicate():
                return time.monotonic() - started
            time.sleep(0.2)
        raise RuntimeError(f"{what} not reached in {timeout:g} s: {self.counts()}")

    def db_load(self, seconds: float) -> dict[str, float]:
        query = sa.text(
            "SELECT xact_commit + xact_rollback, tup_updated, tup_fetched, tup_inserted "
            "FROM pg_stat_database WHERE datname = :db"
        )
        admin = services.admin_engine(self.stack_env["SPARKRING_DATABASE_URL"])
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            a = conn.execute(query, {"db": self.database}).one()
            t0 = time.monotonic()
            time.sleep(seconds)
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            b = conn.execute(query, {"db": self.database}).one()
            elapsed = time.monotonic() - t0
        admin.dispose()
        return {
            "transactions_per_s": round((b[0] - a[0]) / elapsed, 1),
            "rows_updated_per_s": round((b[1] - a[1]) / elapsed, 1),
            "rows_fetched_per_s": round((b[2] - a[2]) / elapsed, 1),
            "rows_inserted_per_s": round((b[3] - a[3]) / elapsed, 1),
            "window_s": round(elapsed, 1),
        }

    def run(self) -> dict[str, Any]:
        a = self.args
        result: dict[str, Any] = {
            "servers": a.servers,
            "jobs": a.jobs,
            "session_timeout_s": a.session_timeout,
            "lease_ttl_s": a.lease_ttl,
            "poll_and_renew_interval_s": a.poll_interval,
        }
        t = time.monotonic()
        self.create_database()
        log(f"database with {a.jobs} jobs: {time.monotonic() - t:.1f} s")
        t = time.monotonic()
        self.register()
        result["register_s"] = round(time.monotonic() - t, 1)
        log(f"{a.servers} registry sessions: {result['register_s']} s")
        self.start_loops()
        self.want_all_running()
        result["cold_start_s"] = round(
            self.wait(lambda: self.counts().get("running", 0) == a.jobs, 600, "cold start"), 1
        )
        log(f"cold start, every job running: {result['cold_start_s']} s")
        self.wait(lambda: not self._moving(), 120, "quiet")
        time.sleep(2 * a.poll_interval)
        result["steady_state"] = self.db_load(a.load_window)
        log(f"steady state: {result['steady_state']}")
        owned = self._owned_by("victim")
        self.rebalances.clear()
        # A plain client watches the victim's node: when ZooKeeper itself expired it.
        watcher = KazooClient(hosts=self.hosts, timeout=10)
        watcher.start(timeout=30)
        node_gone: list[float] = []
        watcher.exists(
            f"{self.root}/servers/victim", watch=lambda _event: node_gone.append(time.monotonic())
        )
        killed = time.monotonic()
        self.victim.send_signal(signal.SIGKILL)
        self.victim.wait()
        self.sims["victim"].alive = False

        def converged() -> bool:
            with self.engine.connect() as conn:
                left = conn.execute(
                    sa.text(
                        "SELECT count(*) FROM distribution WHERE job_id = ANY(:ids) "
                        "AND NOT (state = 'running' AND owner <> 'victim')"
                    ),
                    {"ids": owned},
                ).scalar_one()
            return left == 0

        result["victim_jobs"] = len(owned)
        result["converge_after_loss_s"] = round(self.wait(converged, 300, "convergence"), 1)
        # When the coordinator retargeted the victim's jobs (the session expired, the
        # membership view changed, the debounces passed): the rest is lease expiry + claims.
        result["node_expired_after_s"] = round(node_gone[0] - killed, 1) if node_gone else None
        watcher.stop()
        watcher.close()
        result["retargeted_after_s"] = [round(at - killed, 1) for at, _ in self.rebalances]
        result["rebalance_s"] = [round(r.seconds, 3) for _, r in self.rebalances]
        result["moved_by_rebalance"] = [r.changed for _, r in self.rebalances]
        log(
            f"lost a server with {len(owned)} jobs: "
            f"converged in {result['converge_after_loss_s']} s"
        )
        loads = self._loads()
        result["jobs_per_server"] = {
            "min": min(loads),
            "max": max(loads),
            "mean": round(statistics.mean(loads), 1),
        }
        return result

    def _moving(self) -> bool:
        with self.engine.connect() as conn:
            return bool(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM distribution "
                        "WHERE state <> 'running' OR owner IS DISTINCT FROM target"
                    )
                ).scalar_one()
            )

    def _owned_by(self, server: str) -> list[int]:
        with self.engine.connect() as conn:
            return list(
                conn.execute(
                    sa.text("SELECT job_id FROM distribution WHERE owner = :s"), {"s": server}
                ).scalars()
            )

    def _loads(self) -> list[int]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT owner, count(*) FROM distribution GROUP BY owner")
            ).all()
        return [n for owner, n in rows if owner is not None]

    def close(self) -> None:
        self.stop.set()
        if self.loop is not None:
            self.loop.stop()
        if self.victim is not None and self.victim.poll() is None:
            self.victim.kill()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda reg: reg.stop(), self.registries.values()))
        if self.engine is not None:
            self.engine.dispose()
        services.drop_database(self.url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--capacity", type=int, default=200, help="drivers per server")
    parser.add_argument("--session-timeout", type=float, default=defaults.ZK_SESSION_TIMEOUT_S)
    parser.add_argument("--lease-ttl", type=float, default=defaults.LEASE_TTL_S)
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=defaults.POLL_INTERVAL_S,
        help="each server's poll and renew interval, and the coordinator's, seconds",
    )
    parser.add_argument("--load-window", type=float, default=30.0, help="seconds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sim = Simulation(args)
    try:
        result = sim.run()
    finally:
        sim.close()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        print(f"{key:<28} {value}")


if __name__ == "__main__":
    main()
