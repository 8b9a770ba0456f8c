"""Scheduled fires on real PostgreSQL: many jobs due at one instant, fired by the
servers' firing loops (``scheduler/fires.py``, the production code).

Runs in a throwaway database copied from the migrated test template
(``testing/services.py``) and dropped at the end::

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.schedule_fires [--jobs 10000] [--servers 10] [--json]

It inserts ``--jobs`` batch jobs on ``@every 1m`` in bulk, every one due at the same
minute boundary (so ``@every 1m`` over many jobs is the worst case: they all fire at
the same second), starts ``--servers`` ``fires.FiringLoop`` instances (threads of this
process, each with its own one-connection pool, as each server has) and waits until
every job fired once. From the ``runs`` rows (PostgreSQL's times) it reports:

- lateness of each fire: the fire transaction's start (``runs.created_at``) minus the
  fire time, p50/p99/max;
- fires per second sustained: fires over the span from the fire time to the last one;
- PostgreSQL's CPU over that span: the user+system ticks of the stack's postmaster and
  its backends (``/proc``), in cores;
- that each job has exactly one run row for the instant (the fence held).

No server claims the jobs: a fire ends when its run is pending, which is the part the
firing loop owns (the claim is the distribution benchmark's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from scheduler import fires, schedule
from sql import database
from testing import factories, services

REPO = Path(__file__).resolve().parent.parent

# The fire instant is at least this far ahead of the end of the bulk insert, seconds:
# the loops must be started and asleep before it.
LEAD_S = 8.0
# How long the loops get to fire every job, seconds.
FIRE_TIMEOUT_S = 300.0


def populate(engine: sa.Engine, jobs: int, every: str, lead: float) -> Any:
    """``jobs`` batch jobs on ``every``, switched on, all due at its next fire time at
    least ``lead`` seconds ahead; returns that instant (PostgreSQL's)."""
    the_schedule = schedule.parse(every)
    spec = json.dumps(the_schedule.as_dict())
    with engine.begin() as conn:
        resource_id = factories.resource(conn, "bench")
        conn.execute(
            sa.text(
                """
                INSERT INTO jobs (name, kind, resource_id, max_restarts, schedule)
                SELECT 'bench-' || lpad(i::text, 6, '0'), 'batch', :resource, 0,
                       CAST(:spec AS jsonb)
                  FROM generate_series(1, :jobs) AS i
                """
            ),
            {"resource": resource_id, "spec": spec, "jobs": jobs},
        )
        conn.execute(
            sa.text("INSERT INTO distribution (job_id, state) SELECT id, 'stopped' FROM jobs")
        )
    with engine.begin() as conn:
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        at = schedule.next_fire(the_schedule, now + timedelta(seconds=lead))
        conn.execute(
            sa.text(
                "UPDATE jobs SET schedule_active = true, next_fire_at = :at, "
                "fires_checked_until = :at - interval '1 second'"
            ),
            {"at": at},
        )
    return at


def _postgres_ticks(engine: sa.Engine) -> int | None:
    """User+system clock ticks of the stack's postmaster and its children, or None
    when they cannot be read here (another host, no /proc)."""
    with engine.connect() as conn:
        try:
            data_dir = conn.execute(sa.text("SHOW data_directory")).scalar_one()
        except sa.exc.DBAPIError:
            return None
    pid_file = Path(data_dir) / "postmaster.pid"
    try:
        postmaster = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        pid, ppid = int(entry.name), int(fields[1])
        if pid == postmaster or ppid == postmaster:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def measure(
    database_url: str, jobs: int, servers: int, every: str = "@every 1m", lead: float = LEAD_S
) -> dict[str, Any]:
    engine = database.create_engine(database_url, pool_size=2)
    loops: list[fires.FiringLoop] = []
    engines: list[sa.Engine] = []
    try:
        at = populate(engine, jobs, every, lead)
        for index in range(servers):
            loop_engine = database.create_engine(database_url, pool_size=1)
            engines.append(loop_engine)
            loops.append(fires.FiringLoop(loop_engine, f"s{index}", interval=1.0))
        for loop in loops:
            loop.start()
        # PostgreSQL's CPU is counted from just before the instant to the last fire.
        while True:
            with engine.connect() as conn:
                left = conn.execute(
                    sa.text("SELECT EXTRACT(EPOCH FROM :at - now())"), {"at": at}
                ).scalar_one()
            if left <= 0.1:
                break
            time.sleep(min(float(left) - 0.1, 1.0))
        ticks_before, counted_from = _postgres_ticks(engine), time.monotonic()
        deadline = time.monotonic() + FIRE_TIMEOUT_S
        fired = 0
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                fired = conn.execute(
                    sa.text("SELECT count(*) FROM runs WHERE scheduled_time = :at"), {"at": at}
                ).scalar_one()
            if fired >= jobs:
                break
            time.sleep(0.2)
        ticks_after, counted_for = _postgres_ticks(engine), time.monotonic() - counted_from
    finally:
        for loop in loops:
            loop.stop()
        for loop_engine in engines:
            loop_engine.dispose()
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT job_id, EXTRACT(EPOCH FROM created_at - scheduled_time) AS late "
                "FROM runs WHERE scheduled_time = :at"
            ),
            {"at": at},
        ).all()
        per_job = conn.execute(
            sa.text("SELECT max(n) FROM (SELECT count(*) AS n FROM runs GROUP BY job_id) AS c")
        ).scalar_one()
    engine.dispose()
    late = [float(r.late) for r in rows]
    span = max(late) if late else 0.0
    hz = os.sysconf("SC_CLK_TCK")
    cpu = None
    if ticks_before is not None and ticks_after is not None and counted_for > 0:
        # Includes the last 0.1 s before the instant and the 0.2 s polls of this count.
        cpu = round((ticks_after - ticks_before) / hz / counted_for, 2)
    return {
        "every": every,
        "jobs": jobs,
        "servers": servers,
        "fired": len(rows),
        "max_runs_per_job": per_job,
        "lateness_p50_s": round(_percentile(late, 0.5), 3) if late else None,
        "lateness_p99_s": round(_percentile(late, 0.99), 3) if late else None,
        "lateness_max_s": round(span, 3),
        "lateness_mean_s": round(statistics.fmean(late), 3) if late else None,
        "fires_per_s": round(len(rows) / span, 1) if span > 0 else None,
        "postgres_cpu_cores": cpu,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs due at once (10,000)")
    parser.add_argument("--servers", type=int, default=10, help="firing loops (10)")
    parser.add_argument("--every", default="@every 1m", help="the jobs' schedule (@every 1m)")
    parser.add_argument(
        "--lead", type=float, default=LEAD_S, help=f"seconds before the instant ({LEAD_S:g})"
    )
    parser.add_argument("--database-url", help="PostgreSQL server (default: the stack's)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    url = args.database_url or services.stack_env().get("SPARKRING_DATABASE_URL")
    with services.scratch_database(url, prefix="bench_fires") as database_url:
        figures = measure(database_url, args.jobs, args.servers, args.every, args.lead)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"{figures['fired']:,} of {figures['jobs']:,} jobs fired by {figures['servers']} "
        f"firing loops (at most {figures['max_runs_per_job']} run per job): lateness p50 "
        f"{figures['lateness_p50_s']} s, p99 {figures['lateness_p99_s']} s, max "
        f"{figures['lateness_max_s']} s; {figures['fires_per_s']} fires/s; PostgreSQL CPU "
        f"{figures['postgres_cpu_cores']} cores"
    )


if __name__ == "__main__":
    main()
