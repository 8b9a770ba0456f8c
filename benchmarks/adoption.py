"""Drivers outliving their server: restarts of sparkring servers, and what the jobs see.

Runs ``sparkring server run`` processes against the local stack through the chaos
harness (``tests/chaos/trial.py``), with light streaming heartbeat jobs (spark-submit, a
heartbeat every 0.2 s). For each scenario it counts the drivers replaced (a driver
``started`` record of a new epoch for a job that was running) and the largest gap
between two heartbeats of one job over the scenario.

- ``crash``: kill -9 of the server owning the most of 3 jobs, restarted at once with the
  same id: with its work dir (it adopts its drivers), and with a fresh work dir (what
  every restart did before adoption: nothing to adopt, so the jobs fail over).
- ``rolling``: each of 3 servers running 12 jobs restarted in turn by SIGTERM, the next
  only once the cluster settled: with ``SPARKRING_HANDOVER_WINDOW=30`` (a planned
  restart: the successor adopts) and without (the graceful hand-off: each job moves).

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python benchmarks/adoption.py [--only crash,rolling] [--trials 3] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import failover  # noqa: E402

from tests.chaos import trial as trial_module  # noqa: E402

SERVERS = failover.SERVERS


def _beats(t: trial_module.Trial, since: float) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for record in t.cluster.heartbeat_records():
        if record["t"] >= since:
            times.setdefault(record["job"], []).append(record["t"])
    return {job: sorted(values) for job, values in times.items()}


def largest_gap(t: trial_module.Trial, jobs: list[str], since: float, until: float) -> float:
    beats = _beats(t, since)
    gaps = [0.0]
    for job in jobs:
        values = [v for v in beats.get(job, []) if v <= until]
        gaps += [b - a for a, b in itertools.pairwise(values)]
    return max(gaps)


def replaced(t: trial_module.Trial, before: dict[str, int], jobs: list[str]) -> int:
    return sum(
        1
        for record in t.cluster.driver_records()
        if record["event"] == "started"
        and record["job"] in jobs
        and record["epoch"] > before[record["job"]]
    )


def _restart(t: trial_module.Trial, server: str, env: dict[str, str], fresh: bool) -> None:
    if fresh:
        shutil.rmtree(t.cluster.server_dir(server) / "work", ignore_errors=True)
    failover.start_servers(t, (server,), env)


def measure_crash(trials: int, fresh: bool) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"replaced": [], "gap_s": []}
    with failover.environment() as t:
        failover.start_servers(t, SERVERS, {})
        t.populate(3, sentinels=False, prefix="crash")
        for i in range(trials):
            victim = t.busiest_owner()
            jobs = [n for n, o in t.owners().items() if o == victim and n in t.live_jobs]
            before = failover.epochs(t)
            since = time.time()
            t.cluster.kill(victim)
            _restart(t, victim, {}, fresh)
            failover.settle(t)
            until = time.time()
            out["replaced"].append(float(replaced(t, before, jobs)))
            out["gap_s"].append(largest_gap(t, jobs, since, until))
            failover.log(
                f"crash {i + 1}/{trials} ({'fresh work dir' if fresh else 'same work dir'}): "
                f"{victim} owned {len(jobs)}, replaced {out['replaced'][-1]:.0f}, "
                f"largest gap {out['gap_s'][-1]:.2f} s"
            )
    return out


def measure_rolling(window: float) -> dict[str, list[float]]:
    env = {"SPARKRING_HANDOVER_WINDOW": str(window)} if window else {}
    out: dict[str, list[float]] = {"replaced": [], "gap_s": []}
    with failover.environment() as t:
        failover.start_servers(t, SERVERS, env)
        t.populate(12, sentinels=False, prefix="roll")
        jobs = list(t.live_jobs)
        before = failover.epochs(t)
        since = time.time()
        for server in SERVERS:
            t.cluster.terminate(server)
            failover.start_servers(t, (server,), env)
            failover.settle(t)
        until = time.time()
        out["replaced"].append(float(replaced(t, before, jobs)))
        out["gap_s"].append(largest_gap(t, jobs, since, until))
        failover.log(
            f"rolling restart (hand-over window {window:g} s): replaced "
            f"{out['replaced'][-1]:.0f} of {len(jobs)} drivers, largest gap "
            f"{out['gap_s'][-1]:.2f} s"
        )
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
    print(f"{'scenario':<24} {'runs':>4} {'replaced (sum)':>15} {'largest gap (max)':>18}")
    for name, values in result.items():
        print(
            f"{name:<24} {len(values['replaced']):>4} {sum(values['replaced']):>15.0f} "
            f"{max(values['gap_s']):>17.2f}s"
        )


if __name__ == "__main__":
    main()
