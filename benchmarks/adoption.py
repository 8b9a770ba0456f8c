"""Drivers outliving their server: restarts of sparkring servers, and what the jobs see.

Runs ``sparkring server run`` processes against the local stack through the chaos
harness (``testing/chaos/trial.py``), with light streaming heartbeat jobs (spark-submit, a
heartbeat every 0.2 s). For each scenario it counts the drivers replaced (a driver
``started`` record of a new epoch for a job that was running), the largest gap between
two heartbeats of one job (from its last beat before the fault), and how long the
restarted server took to register again from its start.
Each restart is observed until the restarted server is registered, a lease TTL has
passed (a driver nobody adopted has been killed and replaced by then) and the cluster
settled; every replacement is explained with its job's events (printed on stderr).

- ``crash``: kill -9 of the server owning the most of 3 jobs, restarted at once with the
  same id: with its work dir (it adopts its drivers), and with a fresh work dir (what
  every restart did before adoption: nothing to adopt, so the jobs fail over).
- ``rolling``: each of 3 servers running 12 jobs restarted in turn by SIGTERM, the next
  only once the cluster settled: with ``SPARKRING_HANDOVER_WINDOW=30`` (a planned
  restart: the successor adopts) and without (the graceful hand-off: each job moves).

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.adoption [--only crash,rolling] [--trials 3] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks import failover
from testing.chaos import trial as trial_module

REPO = Path(__file__).resolve().parent.parent

SERVERS = failover.SERVERS


def _beats(t: trial_module.Trial, since: float) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for record in t.cluster.heartbeat_records():
        if record["t"] >= since:
            times.setdefault(record["job"], []).append(record["t"])
    return {job: sorted(values) for job, values in times.items()}


def wait_beating(t: trial_module.Trial, jobs: list[str]) -> None:
    """Wait until every job's driver beats: ``running`` is recorded when the watchdog is
    spawned, and spark-submit's JVM takes seconds more to run the main. A fault before
    that would find no beat to measure a gap from."""
    now = time.time()
    failover.wait_for(lambda: set(jobs) <= set(_beats(t, now)), 120, "every driver beating")


def largest_gap(t: trial_module.Trial, jobs: list[str], since: float, until: float) -> float:
    """The longest time between two beats of one job from the last beat before ``since``
    (the fault) to ``until``."""
    beats = _beats(t, since - 1.0)
    gaps = [0.0]
    for job in jobs:
        values = [v for v in beats.get(job, []) if v <= until]
        gaps += [b - a for a, b in itertools.pairwise(values)]
    return max(gaps)


def replacements(
    t: trial_module.Trial, before: dict[str, int], jobs: list[str]
) -> list[dict[str, Any]]:
    """Driver start records of a new epoch of one of ``jobs``: each a driver replaced."""
    return [
        record
        for record in t.cluster.driver_records()
        if record["event"] == "started"
        and record["job"] in jobs
        and int(record["epoch"]) > before[record["job"]]
    ]


def explain(t: trial_module.Trial, found: list[dict[str, Any]], since: float) -> None:
    """Print, for each replaced driver's job, its events since ``since`` (why it moved)."""
    names = sorted({record["job"] for record in found})
    for event in t.events():
        if event["job_name"] in names and event["at_s"] >= since:
            failover.log(
                f"  {event['at_s'] - since:7.2f} s {event['job_name']:<10} {event['kind']:<15}"
                f" {event['server'] or '-':<4} epoch {event['epoch']} {event['detail'] or ''}"
            )


def observe(t: trial_module.Trial, since: float, server: str) -> float:
    """Wait until the cluster settled with the restarted ``server`` registered and a
    lease's time-to-live has passed since ``since`` (a driver its successor did not
    adopt has been killed by its watchdog and replaced by then). Returns the seconds
    from ``since`` until ``server`` was registered again."""
    pid = t.cluster.servers[server].pid
    registered = failover.wait_for(
        lambda: time.time() if t.member_pid(server) == pid else None,
        120,
        f"{server} registered again",
    )
    ttl = float(t.cluster.env.get("SPARKRING_LEASE_TTL", "8"))
    while time.time() < since + ttl + trial_module.STABLE_S:
        time.sleep(0.2)
    try:
        failover.settle(t)
    except RuntimeError:
        stuck = [{"job": line.split(":")[0]} for line in t.unsettled()]
        failover.log("did not settle; the events of the jobs not at rest:")
        explain(t, stuck, since)
        raise
    return registered - since


def _restart(t: trial_module.Trial, server: str, env: dict[str, str], fresh: bool) -> None:
    if fresh:
        shutil.rmtree(t.cluster.server_dir(server) / "work", ignore_errors=True)
    failover.start_servers(t, (server,), env)


def measure_crash(trials: int, fresh: bool) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"replaced": [], "gap_s": [], "registered_s": []}
    with failover.environment() as t:
        failover.start_servers(t, SERVERS, {})
        t.populate(3, sentinels=False, prefix="crash")
        for i in range(trials):
            victim = t.busiest_owner()
            jobs = [n for n, o in t.owners().items() if o == victim and n in t.live_jobs]
            wait_beating(t, jobs)
            before = failover.epochs(t)
            since = time.time()
            t.cluster.kill(victim)
            started = time.time()
            _restart(t, victim, {}, fresh)
            registered = observe(t, started, victim)
            until = time.time()
            found = replacements(t, before, jobs)
            out["replaced"].append(float(len(found)))
            out["gap_s"].append(largest_gap(t, jobs, since, until))
            out["registered_s"].append(registered)
            failover.log(
                f"crash {i + 1}/{trials} ({'fresh work dir' if fresh else 'same work dir'}): "
                f"{victim} owned {len(jobs)}, registered again after {registered:.2f} s, "
                f"replaced {len(found)}, largest gap {out['gap_s'][-1]:.2f} s"
            )
            explain(t, found, since)
    return out


def measure_rolling(window: float) -> dict[str, list[float]]:
    env = {"SPARKRING_HANDOVER_WINDOW": str(window)} if window else {}
    out: dict[str, list[float]] = {"replaced": [], "gap_s": [], "registered_s": []}
    with failover.environment() as t:
        failover.start_servers(t, SERVERS, env)
        t.populate(12, sentinels=False, prefix="roll")
        jobs = list(t.live_jobs)
        wait_beating(t, jobs)
        before = failover.epochs(t)
        since = time.time()
        for server in SERVERS:
            t.cluster.terminate(server)
            started = time.time()
            failover.start_servers(t, (server,), env)
            out["registered_s"].append(observe(t, started, server))
            wait_beating(t, jobs)  # a replaced driver beats again before the next restart
        until = time.time()
        found = replacements(t, before, jobs)
        out["replaced"].append(float(len(found)))
        out["gap_s"].append(largest_gap(t, jobs, since, until))
        failover.log(
            f"rolling restart (hand-over window {window:g} s): replaced "
            f"{len(found)} of {len(jobs)} drivers, largest gap "
            f"{out['gap_s'][-1]:.2f} s, registered again after "
            f"{max(out['registered_s']):.2f} s at most"
        )
        explain(t, found, since)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--only", default="crash,rolling")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chosen = set(args.only.split(","))
    if chosen - {"crash", "rolling"}:
        parser.error(
            f"--only: unknown scenario(s) {', '.join(sorted(chosen - {'crash', 'rolling'}))}"
        )
    result: dict[str, Any] = {}
    if "crash" in chosen:
        result["crash_same_work_dir"] = measure_crash(args.trials, fresh=False)
        result["crash_fresh_work_dir"] = measure_crash(args.trials, fresh=True)
    if "rolling" in chosen:
        result["rolling_handover_30s"] = measure_rolling(30.0)
        result["rolling_hand_off"] = measure_rolling(0.0)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{'scenario':<24} {'runs':>4} {'replaced (sum)':>15} {'largest gap (max)':>18} "
        f"{'registered again (max)':>23}"
    )
    for name, values in result.items():
        print(
            f"{name:<24} {len(values['replaced']):>4} {sum(values['replaced']):>15.0f} "
            f"{max(values['gap_s']):>17.2f}s {max(values['registered_s']):>22.2f}s"
        )


if __name__ == "__main__":
    main()
