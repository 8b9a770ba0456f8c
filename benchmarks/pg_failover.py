"""A PostgreSQL failover under sparkring: the primary killed and its synchronous standby
promoted, while a server is SIGKILLed at the same moment.

Starts a PostgreSQL primary with a synchronous standby of its own (``scripts/stack.py up
--only postgresql --pg-standby`` in a temporary folder, free ports:
``testing/chaos/faults.PgPair``) and three ``sparkring server run`` processes on its
multi-host URL (``target_session_attrs=read-write``) through the test harness
(``testing/cluster.py``, its shortened timeouts), with ZooKeeper and S3 from the stack;
``--jobs`` light streaming jobs (the heartbeat driver). Then, ``--trials`` times, at one
moment: SIGKILL of the server owning the most jobs (not the coordinator) and ``stack.py
pg kill`` of the primary, then ``stack.py pg promote`` of the standby, while a client
retries ``job start`` of a new batch job (placed on a survivor) from the kill on. Times
are taken from the watchdogs' lifetime records (a driver's ``started`` record is written
just before it is spawned) and counted from the kill:

- ``promoted``: until the standby took writes (``pg promote`` returned);
- ``start_committed``: until the retried ``job start`` committed;
- ``new_job_started``: until that job's driver started (jobs claimable again);
- ``killed_server_jobs_started``: until each job of the killed server started again on
  a survivor;
- ``survivor_restarts``: claims of the jobs the survivors owned after the kill (the
  failover alone should cost them none);
- ``new_job_targets``: per trial, the servers the coordinator targeted the new job at,
  in order (a first target that is the killed server waits for its session to expire).

Between trials the old primary is copied anew from the new one and started as its
standby (``stack.py pg start``: the URL lists both nodes, so the servers follow
whichever takes writes), the killed server starts again and the cluster settles. A
fault comes only once the standby has run longer than the lease lapse grace (16 s), as
a standby does in production: promoted sooner, it would hold the killed server's
expired leases until its own start plus the grace.

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.pg_failover [--trials 5] [--jobs 6] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DBAPIError

from benchmarks import failover  # benchmarks/failover.py: its measuring and printing
from scheduler import jobs
from server import defaults
from sql.states import JobKind
from testing import services
from testing.chaos import faults
from testing.chaos import trial as trial_module

SERVERS = failover.SERVERS
CAPACITY = 6
# Once promoted, a standby holds the expired leases of other servers for the lease lapse
# grace after its postmaster started (the takeover hold counts from PostgreSQL's start:
# docs/distribution.md). A standby runs long before its primary fails; the one this
# script re-establishes between trials is let run that long before the next fault.
STANDBY_UP_S = defaults.LEASE_LAPSE_GRACE_S + 1
# How often the client retries its ``job start`` while no node takes writes, seconds.
RETRY_S = 0.05
UP_S = 120.0


@contextlib.contextmanager
def environment() -> Iterator[tuple[trial_module.Trial, faults.PgPair]]:
    """A PostgreSQL pair of its own and a cluster on it (ZooKeeper root, bucket, folder)."""
    stack_env = services.stack_env()
    with tempfile.TemporaryDirectory(prefix="sparkring-bench-") as tmp:
        pair = faults.PgPair(Path(tmp) / "pg-pair")
        try:
            pair.start()
            root = Path(tmp) / "cluster"
            root.mkdir()
            t = trial_module.Trial(
                "benchmark",
                1,
                stack_env,
                pair.url,
                f"/sparkring-bench/pgf-{uuid.uuid4().hex[:10]}",
                services.unique_name("bench"),
                root,
            )
            try:
                yield t, pair
            finally:
                t.close()
        finally:
            pair.close()


class RetriedStart(threading.Thread):
    """``job start NAME`` retried until it commits, as a client does through a failover;
    ``committed`` is when it did (wall clock)."""

    def __init__(self, t: trial_module.Trial, name: str) -> None:
        super().__init__(daemon=True)
        self.t = t
        self.name = name
        self.committed: float | None = None

    def run(self) -> None:
        deadline = time.monotonic() + UP_S
        while time.monotonic() < deadline:
            try:
                self.t.command(jobs.start, self.name)
            except DBAPIError:
                time.sleep(RETRY_S)
                continue
            self.committed = time.time()
            return


def victim_of(t: trial_module.Trial) -> str:
    """The server that owns the most jobs, the coordinator left out (its loss would add
    an election to every figure)."""
    coordinator = t.coordinator()
    owned = [o for n, o in t.owners().items() if n in t.live_jobs and o and o != coordinator]
    if not owned:
        raise RuntimeError(f"no server but the coordinator {coordinator} owns a job")
    return max(sorted(set(owned)), key=owned.count)


def probe_name(t: trial_module.Trial, trial: int, survivors: Sequence[str]) -> str:
    """A batch job whose ring place is a survivor: its start waits for PostgreSQL only."""
    capacities = dict.fromkeys(sorted(t.live_servers()), CAPACITY)
    return trial_module.name_placed_on(f"probe{trial}", capacities, survivors[0])


def measure(trials: int, count: int) -> dict[str, Any]:
    raw: dict[str, list[float]] = {
        "promoted": [],
        "start_committed": [],
        "new_job_started": [],
        "killed_server_jobs_started": [],
    }
    survivor_restarts = 0
    targets: list[list[str]] = []
    with environment() as (t, pair):
        failover.start_servers(t, SERVERS, {}, capacity=CAPACITY)
        t.populate(count, sentinels=False, prefix="pgf")
        for i in range(trials):
            victim = victim_of(t)
            owners = t.owners()
            lost = [n for n in t.live_jobs if owners[n] == victim]
            kept = [n for n in t.live_jobs if owners[n] != victim]
            survivors = [s for s in SERVERS if s != victim]
            probe = probe_name(t, i, survivors)
            t.create(probe, kind=JobKind.BATCH, extra=["--run-for", "1"], start=False)
            time.sleep(max(0.0, STANDBY_UP_S - pair.standby_up_s()))  # see STANDBY_UP_S
            before = failover.epochs(t)
            client = RetriedStart(t, probe)
            fault_at = time.time()
            t.cluster.kill(victim)
            pair.kill_primary()
            client.start()
            pair.promote()
            raw["promoted"].append(time.time() - fault_at)
            started = failover.wait_for(
                lambda p=probe, e=before[probe]: failover.started_after(t, p, e),
                UP_S,
                "the new job's driver started",
            )
            client.join(UP_S)
            if client.committed is None:
                raise RuntimeError(f"job start {probe} never committed")
            raw["start_committed"].append(client.committed - fault_at)
            raw["new_job_started"].append(started["t"] - fault_at)
            for name in lost:
                rec = failover.wait_for(
                    lambda n=name, e=before[name]: failover.started_after(t, n, e), UP_S, name
                )
                raw["killed_server_jobs_started"].append(rec["t"] - fault_at)
            t.wait_state(probe, "finished", UP_S)
            now = failover.epochs(t)
            survivor_restarts += sum(1 for n in kept if now[n] != before[n])
            targets.append(
                [
                    e["detail"]["to"]
                    for e in t.events()
                    if e["job_name"] == probe and e["kind"] == "retargeted"
                ]
            )
            pair.restore()
            failover.start_servers(t, (victim,), {}, capacity=CAPACITY)
            failover.settle(t)
            failover.log(
                f"trial {i + 1}/{trials}: {victim} killed with {len(lost)} job(s); promoted "
                f"{raw['promoted'][-1]:.2f} s, new job {raw['new_job_started'][-1]:.2f} s "
                f"(targeted at {targets[-1]}), "
                f"killed server's jobs {raw['killed_server_jobs_started'][-len(lost) :]}"
            )
    return {"raw": raw, "survivor_restarts": survivor_restarts, "new_job_targets": targets}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=6, help="streaming jobs (default 6)")
    parser.add_argument("--json", action="store_true", help="print JSON (with raw samples)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    measured = measure(args.trials, args.jobs)
    result: dict[str, Any] = {
        "trials": args.trials,
        "jobs": args.jobs,
        "session_timeout_s": failover.TIMEOUTS["fast"]["session"],
        "lease_ttl_s": failover.TIMEOUTS["fast"]["lease"],
        **measured,
        "summary": {key: failover.summary(values) for key, values in measured["raw"].items()},
        "seconds": round(time.monotonic() - started, 1),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"PostgreSQL failover with a server killed, {args.trials} trials, {args.jobs} jobs "
        f"(ZooKeeper session {result['session_timeout_s']:g} s, lease "
        f"{result['lease_ttl_s']:g} s); seconds from the kill"
    )
    failover.print_summary(result["summary"])
    print(f"survivor_restarts: {result['survivor_restarts']}")


if __name__ == "__main__":
    main()
