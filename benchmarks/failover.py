"""Failover, hand-off and reaction times of real sparkring servers and drivers.

Runs ``sparkring server run`` processes against the local stack (ZooKeeper, PostgreSQL,
S3) through the test harness (``testing/cluster.py``), with the light heartbeat driver
(spark-submit, no SparkSession) unless said otherwise. Every time below is taken from
the watchdogs' lifetime records (``docs/drivers.md``): a driver's ``started`` record is
written just before it is spawned, its ``ended`` record once it and its descendants
are gone.

- ``kill``: kill -9 of a server that owns jobs -> each of its jobs' new driver
  ``started`` elsewhere. The killed server is then started again (same id) and the
  cluster left to settle before the next trial.
- ``join``: a fourth server joins three that run K jobs -> jobs moved against the ideal
  K/(N+1), and each move's hand-off gap (old driver ``ended`` -> new driver
  ``started``); then the fourth server leaves by SIGTERM (graceful hand-off), whose gaps
  are reported too.
- ``start``: ``sparkring job start`` -> driver ``started`` (from the command's return,
  and from its invocation: the CLI process's own start-up is ~0.6 s of Python imports).
- ``rss``: VmRSS of one server process, idle and with 10 jobs (the server only, not its
  watchdogs and drivers).
- ``streaming``: kill -9 of the owner of a real Structured Streaming job
  (examples/jobs/streaming_counter.py, local[1]) -> new driver started, and -> its
  first micro-batch committed.

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.failover [--trials 20] [--timeouts fast|production]
        [--only kill,join,start,rss,streaming] [--streaming-trials 3] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from scheduler import job_spec, jobs
from server import defaults
from sql import migrate
from sql.states import JobKind
from testing import cluster as cluster_module
from testing import services, sink, waiting
from testing.chaos import trial as trial_module

REPO = Path(__file__).resolve().parent.parent

STREAMING_JOB = REPO / "examples" / "jobs" / "streaming_counter.py"
TIMEOUTS = {
    # testing/cluster.py's shortened timeouts (the proportions of production).
    "fast": {
        "session": float(cluster_module.FAST_TIMEOUTS["SPARKRING_ZK_SESSION_TIMEOUT"]),
        "lease": float(cluster_module.FAST_TIMEOUTS["SPARKRING_LEASE_TTL"]),
        "env": {},
    },
    # server/defaults.py, whatever they are today.
    "production": {
        "session": defaults.ZK_SESSION_TIMEOUT_S,
        "lease": defaults.LEASE_TTL_S,
        "env": {
            "SPARKRING_ZK_SESSION_TIMEOUT": str(defaults.ZK_SESSION_TIMEOUT_S),
            "SPARKRING_LEASE_TTL": str(defaults.LEASE_TTL_S),
            "SPARKRING_WATCHDOG_MARGIN": str(defaults.WATCHDOG_MARGIN_S),
            "SPARKRING_LEASE_RENEW_INTERVAL": str(defaults.LEASE_RENEW_INTERVAL_S),
            "SPARKRING_POLL_INTERVAL": str(defaults.POLL_INTERVAL_S),
        },
    },
}
SERVERS = ("s1", "s2", "s3")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- environment


@contextlib.contextmanager
def environment() -> Iterator[trial_module.Trial]:
    """A cluster of its own: a fresh migrated database, ZooKeeper root, bucket, folder."""
    stack_env = services.stack_env()
    url = sa.make_url(stack_env["SPARKRING_DATABASE_URL"])
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = services.admin_engine(url.render_as_string(hide_password=False))
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    database_url = url.set(database=name).render_as_string(hide_password=False)
    engine = sa.create_engine(database_url, poolclass=NullPool)
    migrate.upgrade(engine)
    engine.dispose()
    with tempfile.TemporaryDirectory(prefix="sparkring-bench-") as tmp:
        t = trial_module.Trial(
            "benchmark",
            1,
            stack_env,
            database_url,
            f"/sparkring-bench/{name}",
            services.unique_name("bench"),
            Path(tmp),
        )
        try:
            yield t
        finally:
            t.close()
            services.drop_database(database_url)


def start_servers(
    t: trial_module.Trial, ids: tuple[str, ...], env: dict[str, str], capacity: int = 6
) -> None:
    t.start(ids, capacity=capacity, extra_env=env)


def records(t: trial_module.Trial, job: str, event: str) -> list[dict[str, Any]]:
    return [r for r in t.cluster.driver_records() if r["job"] == job and r["event"] == event]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    found: list[Any] = []

    def check() -> bool:
        value = predicate()
        if value:
            found.append(value)
        return bool(value)

    waiting.wait_until(check, timeout, interval=0.05, message=what)
    return found[-1]


def started_after(t: trial_module.Trial, job: str, epoch: int) -> dict[str, Any] | None:
    newer = [r for r in records(t, job, "started") if r["epoch"] > epoch]
    return min(newer, key=lambda r: r["t"]) if newer else None


def epochs(t: trial_module.Trial) -> dict[str, int]:
    return {r["name"]: r["epoch"] for r in t.job_rows()}


def settle(t: trial_module.Trial, timeout: float = 120) -> None:
    if t.wait_stable(time.monotonic(), timeout) is None:
        raise RuntimeError("the cluster did not settle:\n" + "\n".join(t.unsettled()))


# ---------------------------------------------------------------- measurements


def measure_kill(trials: int, extra_env: dict[str, str]) -> list[float]:
    samples: list[float] = []
    with environment() as t:
        start_servers(t, SERVERS, extra_env)
        t.populate(6, sentinels=False, prefix="kill")
        for i in range(trials):
            owners = t.owners()
            victim = SERVERS[i % len(SERVERS)]
            lost = [n for n in t.live_jobs if owners[n] == victim]
            before = epochs(t)
            killed_at = time.time()
            t.cluster.kill(victim)
            for name in lost:
                rec = wait_for(
                    lambda n=name, e=before[name]: started_after(t, n, e), 120, "new driver"
                )
                samples.append(rec["t"] - killed_at)
            log(f"kill {i + 1}/{trials}: {victim} owned {len(lost)}: {samples[-len(lost) :]}")
            start_servers(t, (victim,), extra_env)
            settle(t)
    return samples


def measure_join(trials: int, extra_env: dict[str, str]) -> dict[str, list[float]]:
    moved_ratio: list[float] = []
    join_gaps: list[float] = []
    leave_gaps: list[float] = []
    k = 9
    with environment() as t:
        start_servers(t, SERVERS, extra_env)
        t.populate(k, sentinels=False, prefix="join")

        def gaps(before: dict[str, int], owners_before: dict[str, str | None]) -> list[float]:
            out = []
            now = epochs(t)
            for name in t.live_jobs:
                if now[name] == before[name]:
                    continue
                ended = [r for r in records(t, name, "ended") if r["epoch"] == before[name]]
                started = started_after(t, name, before[name])
                if ended and started:
                    out.append(started["t"] - ended[0]["t"])
            return out

        for i in range(trials):
            before, owners = epochs(t), t.owners()
            start_servers(t, ("s4",), extra_env)
            settle(t)
            after = t.owners()
            moved = [n for n in t.live_jobs if after[n] != owners[n]]
            moved_ratio.append(len(moved) / (k / (len(SERVERS) + 1)))
            join_gaps += gaps(before, owners)
            before, owners = epochs(t), t.owners()
            t.cluster.terminate("s4")
            t.wait_members(set(SERVERS))
            settle(t)
            leave_gaps += gaps(before, owners)
            log(f"join {i + 1}/{trials}: moved {len(moved)} (ideal {k / 4:.2f})")
    return {"moved_over_ideal": moved_ratio, "join_gap": join_gaps, "leave_gap": leave_gaps}


def measure_start(trials: int, extra_env: dict[str, str]) -> dict[str, list[float]]:
    from_return: list[float] = []
    from_invocation: list[float] = []
    from_commit: list[float] = []
    with environment() as t:
        start_servers(t, SERVERS, extra_env)
        t.create("react", start=False)
        for i in range(trials):
            # Through the CLI, as an operator does (a process start of ~0.6 s included).
            epoch = epochs(t)["react"]
            invoked = time.time()
            t.cluster.cli("job", "start", "react")
            returned = time.time()
            rec = wait_for(lambda e=epoch: started_after(t, "react", e), 60, "driver started")
            from_return.append(rec["t"] - returned)
            from_invocation.append(rec["t"] - invoked)
            t.cluster.cli("job", "stop", "react")
            t.wait_state("react", "stopped", 60)
            # The same statement in-process: from its commit (the NOTIFY is sent then).
            epoch = epochs(t)["react"]
            t.command(jobs.start, "react")
            committed = time.time()
            rec = wait_for(lambda e=epoch: started_after(t, "react", e), 60, "driver started")
            from_commit.append(rec["t"] - committed)
            t.command(jobs.stop, "react")
            t.wait_state("react", "stopped", 60)
            log(
                f"start {i + 1}/{trials}: {from_return[-1]:.3f} s after the command returned, "
                f"{from_commit[-1]:.3f} s after the commit"
            )
    return {
        "from_return": from_return,
        "from_invocation": from_invocation,
        "from_commit": from_commit,
    }


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _rss_sampled(pid: int, seconds: float = 5.0) -> float:
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(_rss_kib(pid))
        time.sleep(0.5)
    return statistics.median(samples) / 1024


def measure_rss(extra_env: dict[str, str]) -> dict[str, float]:
    with environment() as t:
        start_servers(t, ("r1",), extra_env, capacity=10)
        pid = t.cluster.pid("r1")
        time.sleep(3)  # let start-up allocations settle before sampling
        idle = _rss_sampled(pid)
        for i in range(10):
            t.create(f"rss-{i}")
        t.live_jobs += [f"rss-{i}" for i in range(10)]
        t.wait_running(t.live_jobs, 180)
        time.sleep(3)
        busy = _rss_sampled(pid)
    log(f"rss: idle {idle:.1f} MiB, with 10 jobs {busy:.1f} MiB")
    return {"idle_mib": round(idle, 1), "ten_jobs_mib": round(busy, 1)}


def measure_streaming(trials: int, extra_env: dict[str, str]) -> dict[str, list[float]]:
    spawned: list[float] = []
    first_batch: list[float] = []
    with environment() as t:
        start_servers(t, SERVERS, extra_env)
        output = t.cluster.root / "stream-out"
        resource = t.upload("counter", STREAMING_JOB)
        with t.cluster.engine.begin() as conn:
            jobs.create(
                conn,
                job_spec.JobSpec(
                    name="stream",
                    kind=JobKind.STREAMING,
                    resource_id=resource.id,
                    args=[str(output), f"--heartbeats={t.cluster.heartbeats}"],
                ),
            )
            jobs.start(conn, "stream")
        t.live_jobs.append("stream")
        for i in range(trials):
            settle(t, 180)
            waiting.wait_until(lambda: sink.committed_batches(output) >= 2, 120, interval=0.2)
            before = epochs(t)["stream"]
            victim = t.owners()["stream"]
            killed_at = time.time()
            t.cluster.kill(victim)
            rec = wait_for(lambda e=before: started_after(t, "stream", e), 120, "new driver")
            spawned.append(rec["t"] - killed_at)
            # The old driver goes on committing until its watchdog kills it at the lease
            # deadline: wait for a committed row written by the new epoch.
            new_epoch = str(rec["epoch"])
            wait_for(lambda e=new_epoch: e in committed_epochs(output), 180, "a new batch")
            first_batch.append(time.time() - killed_at)
            log(
                f"streaming {i + 1}/{trials}: spawned {spawned[-1]:.2f} s, "
                f"first batch {first_batch[-1]:.2f} s"
            )
            start_servers(t, (victim,), extra_env)
    return {"spawned": spawned, "first_batch": first_batch}


def committed_epochs(output: Path) -> set[str]:
    """Epochs of the drivers that wrote the rows the file sink committed (its
    _spark_metadata log lists the committed files)."""
    log_dir = output / "_spark_metadata"
    files: set[str] = set()
    for entry in log_dir.iterdir() if log_dir.exists() else ():
        if entry.name.startswith("."):
            continue
        for line in entry.read_text().splitlines()[1:]:
            record = json.loads(line)
            if record["action"] == "add":
                files.add(record["path"].removeprefix("file://"))
    found: set[str] = set()
    for path in files:
        with open(path) as handle:
            found |= {json.loads(line)["epoch"] for line in handle if line.strip()}
    return found


# ---------------------------------------------------------------- report


def summary(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]

    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "p90": round(pct(0.9), 3),
        "max": round(ordered[-1], 3),
        "min": round(ordered[0], 3),
    }


def print_summary(summaries: dict[str, dict[str, Any]]) -> None:
    """One row per measurement that has samples: n, p50, p90 and max (:func:`summary`)."""
    print(f"{'measurement':<28} {'n':>4} {'p50':>8} {'p90':>8} {'max':>8}")
    for key, s in summaries.items():
        if s["n"]:
            print(f"{key:<28} {s['n']:>4} {s['p50']:>8.3f} {s['p90']:>8.3f} {s['max']:>8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--streaming-trials", type=int, default=3)
    parser.add_argument("--timeouts", choices=sorted(TIMEOUTS), default="fast")
    parser.add_argument("--only", default="kill,join,start,rss,streaming")
    parser.add_argument("--json", action="store_true", help="print JSON (with raw samples)")
    args = parser.parse_args()
    chosen = set(args.only.split(","))
    unknown = chosen - {"kill", "join", "start", "rss", "streaming"}
    if unknown:
        parser.error(f"--only: unknown measurement(s) {', '.join(sorted(unknown))}")
    timeouts = TIMEOUTS[args.timeouts]
    env = timeouts["env"]
    result: dict[str, Any] = {
        "timeouts": args.timeouts,
        "session_timeout_s": timeouts["session"],
        "lease_ttl_s": timeouts["lease"],
        "env": timeouts["env"],
        "trials": args.trials,
        "raw": {},
    }
    started = time.monotonic()
    if "kill" in chosen:
        result["raw"]["kill_to_new_driver"] = measure_kill(args.trials, env)
    if "join" in chosen:
        for key, values in measure_join(args.trials, env).items():
            result["raw"][key] = values
    if "start" in chosen:
        for key, values in measure_start(args.trials, env).items():
            result["raw"][f"start_{key}"] = values
    if "rss" in chosen:
        result["rss"] = measure_rss(env)
    if "streaming" in chosen:
        for key, values in measure_streaming(args.streaming_trials, env).items():
            result["raw"][f"streaming_{key}"] = values
    result["summary"] = {key: summary(values) for key, values in result["raw"].items()}
    result["seconds"] = round(time.monotonic() - started, 1)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"timeouts: {args.timeouts} (ZooKeeper session {timeouts['session']:g} s, "
        f"lease {timeouts['lease']:g} s)"
    )
    print_summary(result["summary"])
    if "rss" in result:
        print(
            f"server RSS: idle {result['rss']['idle_mib']} MiB, "
            f"with 10 jobs {result['rss']['ten_jobs_mib']} MiB"
        )


if __name__ == "__main__":
    main()
