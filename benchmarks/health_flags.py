"""Health flags on real Spark: from a streaming query's last completed batch to its
``stalled`` flag, and from resuming to the flag being cleared.

One server on the local stack runs testing/jobs/stallable_stream.py (a `rate` source,
one batch a second) on the standalone cluster. Each trial touches the job's STALL file
(the batch in progress then waits inside foreachBatch, as with a hung sink), waits for
the ``health_flagged`` event, removes the file and waits for ``health_cleared``.
Printed per trial, and as median and max:

- flag latency: the event's time minus the last completed batch's (the flag's
  ``last_batch_at``), which is the stall timeout plus the monitor's delay;
- beyond timeout: that latency minus the stall timeout (bounded by the health interval
  plus one pass);
- clear latency: removing the file to the ``health_cleared`` event (the batch finishes,
  Spark logs its progress, the next pass reads it).

    python -m benchmarks.health_flags [--trials 5] [--stall-timeout 10] [--interval 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import failover
from scheduler import job_events, job_spec, job_views, jobs
from testing import services

STALLABLE_JOB = Path(__file__).resolve().parents[1] / "testing" / "jobs" / "stallable_stream.py"


def _health_events(t: Any, after: int) -> list[dict[str, Any]]:
    with t.cluster.engine.connect() as conn:
        return [
            e
            for e in job_events.events(conn, "stalls", limit=1000)
            if e["id"] > after and e["kind"].startswith("health_")
        ]


def _last_event_id(t: Any) -> int:
    with t.cluster.engine.connect() as conn:
        return max((e["id"] for e in job_events.events(conn, "stalls", limit=1000)), default=0)


def _wait_event(t: Any, kind: str, after: int, timeout: float) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        return next((e for e in _health_events(t, after) if e["kind"] == kind), None)

    return failover.wait_for(found, timeout, kind)


def measure(trials: int, stall_timeout: float, interval: float, master: str) -> list[dict]:
    out = []
    with failover.environment() as t:
        failover.start_servers(t, ("s1",), {"SPARKRING_HEALTH_INTERVAL": str(interval)})
        stall = t.cluster.root / "STALL"
        resource = t.upload("stallable", STALLABLE_JOB)
        with t.cluster.engine.begin() as conn:
            jobs.create(
                conn,
                job_spec.JobSpec(
                    name="stalls",
                    kind="streaming",
                    resource_id=resource.id,
                    args=[str(stall)],
                    spark_master=master,
                    conf={
                        "spark.cores.max": "1",
                        "spark.executor.cores": "1",
                        "sparkring.health.stallTimeout": str(stall_timeout),
                    },
                ),
            )
            jobs.start(conn, "stalls")

        def batches() -> bool:
            with t.cluster.engine.connect() as conn:
                health = job_views.show(conn, "stalls").as_json()["health"] or {}
            return (health.get("last_batch_id") or 0) >= 3

        failover.wait_for(batches, 180, "three batches")
        for trial in range(1, trials + 1):
            after = _last_event_id(t)
            stall.touch()
            flagged = _wait_event(t, "health_flagged", after, stall_timeout + 4 * interval + 60)
            last_batch_at = dt.datetime.fromisoformat(flagged["detail"]["last_batch_at"])
            latency = (flagged["at"] - last_batch_at).total_seconds()
            resumed = time.time()
            stall.unlink()
            cleared = _wait_event(t, "health_cleared", after, 4 * interval + 60)
            clear = cleared["at"].timestamp() - resumed
            out.append({"flag_s": latency, "beyond_s": latency - stall_timeout, "clear_s": clear})
            failover.log(
                f"trial {trial}: flagged {latency:.2f} s after the last batch "
                f"({latency - stall_timeout:.2f} s beyond the timeout), cleared "
                f"{clear:.2f} s after resuming"
            )
            time.sleep(2 * interval)  # a few batches before the next stall
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--stall-timeout", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=5.0, help="SPARKRING_HEALTH_INTERVAL")
    args = parser.parse_args()
    master = services.stack_env().get("SPARKRING_STACK_SPARK_MASTER_URL")
    if not master:
        parser.error("the local stack's Spark master is not running: scripts/stack.py up")
    rows = measure(args.trials, args.stall_timeout, args.interval, master)
    print(f"stall timeout {args.stall_timeout:g} s, health interval {args.interval:g} s")
    for key, label in (
        ("flag_s", "flag latency"),
        ("beyond_s", "beyond timeout"),
        ("clear_s", "clear latency"),
    ):
        values = [row[key] for row in rows]
        print(
            f"{label:<15} n={len(values)} median {statistics.median(values):.2f} s, "
            f"max {max(values):.2f} s"
        )


if __name__ == "__main__":
    main()
