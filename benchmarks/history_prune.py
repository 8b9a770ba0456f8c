"""History retention on real PostgreSQL: pruning a large backlog of old job events.

Runs in a throwaway database copied from the migrated test template
(``testing/services.py``) and dropped at the end::

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.history_prune [--events 200000] [--batch-size 1000] [--json]

It inserts ``--events`` events 31-60 days old (``generate_series``) spread over
``--jobs`` existing jobs and as many deleted ones, plus ``--recent`` events of today for
half the jobs (the other half keep their newest old event),
then prunes everything older than 30 days with ``server/retention.prune`` as
``sparkring events prune --events-only`` does. Reported: the prune's wall time, its
batches and the longest single batch transaction (commit included); a second pass with
nothing left to prune (what every hourly pass costs once the backlog is gone); and,
while the big prune runs, the latency of a lease-renewal-like write (one UPDATE of
``distribution`` plus one event INSERT per transaction, every 10 ms from another
connection), against the same writes timed for ``BASELINE_S`` without a prune, to
show that the batches never make renewals wait.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from server import defaults, retention
from sql import database
from testing import factories, services

REPO = Path(__file__).resolve().parent.parent

RETENTION_S = 30 * 86400.0
RENEW_EVERY_S = 0.01
# How long the renewal-like writes are timed without a prune first, seconds.
BASELINE_S = 3.0


def populate(engine: sa.Engine, events: int, jobs: int, recent: int) -> None:
    """``jobs`` jobs owned by one server, ``events`` old events over them and over as
    many deleted jobs, ``recent`` events of today for half the jobs (the other half
    has only old events: a prune keeps the newest of each)."""
    for index in range(jobs):
        factories.job(engine, f"bench-{index:04d}")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE distribution SET owner = 'bench', state = 'running', epoch = 1, "
                "lease_until = now() + interval '1 hour'"
            )
        )
        conn.execute(sa.text("UPDATE job_events SET at = now() - interval '61 days'"))
        ids = list(conn.execute(sa.text("SELECT id FROM jobs ORDER BY id")).scalars())
        # Half the events belong to jobs that exist, half to jobs deleted long ago.
        conn.execute(
            sa.text(
                """
                INSERT INTO job_events (job_id, job_name, kind, server, epoch, at, detail)
                SELECT CASE WHEN g % 2 = 0 THEN (:ids)[1 + g % :jobs] ELSE -(g % :jobs) - 1 END,
                       'bench-' || lpad((g % :jobs)::text, 4, '0'), 'claimed', 'bench', g,
                       now() - interval '60 days' + g * (interval '29 days' / :events),
                       '{"by": "bench"}'
                  FROM generate_series(1, :events) AS g
                """
            ),
            {"ids": ids, "jobs": jobs, "events": events},
        )
        conn.execute(
            sa.text(
                "INSERT INTO job_events (job_id, job_name, kind) "
                "SELECT (:ids)[1 + g % :half], 'recent', 'claimed' "
                "FROM generate_series(1, :recent) AS g"
            ),
            {"ids": ids, "half": max(1, jobs // 2), "recent": recent},
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE job_events"))


class Renewals(threading.Thread):
    """A lease-renewal-like transaction every RENEW_EVERY_S, timed, until stopped."""

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(name="renewals", daemon=True)
        self.engine = engine
        self.samples: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with self.engine.connect() as conn:
            while not self.stop.wait(RENEW_EVERY_S):
                started = time.monotonic()
                conn.execute(
                    sa.text(
                        "UPDATE distribution SET lease_until = now() + interval '8 seconds' "
                        "WHERE owner = 'bench'"
                    )
                )
                conn.execute(
                    sa.text(
                        "INSERT INTO job_events (job_id, job_name, kind, server) "
                        "SELECT min(job_id), 'renewal', 'driver_started', 'bench' "
                        "FROM distribution"
                    )
                )
                conn.commit()
                self.samples.append(time.monotonic() - started)


def _ms(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples) or [0.0]

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return {
        "n": len(samples),
        "p50_ms": round(rank(0.5) * 1000, 3),
        "p99_ms": round(rank(0.99) * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
    }


def _prune(engine: sa.Engine, batch_size: int) -> tuple[retention.Pruned, float]:
    with engine.connect() as conn:
        started = time.monotonic()
        before = retention.cutoff(conn, RETENTION_S)
        pruned = retention.prune(conn, None, before, batch_size=batch_size)
        return pruned, time.monotonic() - started


def measure(database_url: str, events: int, jobs: int, recent: int, batch_size: int) -> dict:
    engine = database.create_engine(database_url, pool_size=2)
    try:
        started = time.monotonic()
        populate(engine, events, jobs, recent)
        setup_s = time.monotonic() - started
        with engine.connect() as conn:
            total = conn.execute(sa.text("SELECT count(*) FROM job_events")).scalar_one()
            expected = conn.execute(
                sa.text("SELECT count(*) FROM job_events WHERE at < now() - interval '30 days'")
            ).scalar_one()
        # The same writes without a prune, for comparison.
        baseline = Renewals(engine)
        baseline.start()
        baseline.stop.wait(BASELINE_S)
        baseline.stop.set()
        baseline.join()
        renewals = Renewals(engine)
        renewals.start()
        try:
            pruned, prune_s = _prune(engine, batch_size)
        finally:
            renewals.stop.set()
            renewals.join()
        idle, idle_s = _prune(engine, batch_size)
        with engine.connect() as conn:
            left_old = conn.execute(
                sa.text("SELECT count(*) FROM job_events WHERE at < now() - interval '30 days'")
            ).scalar_one()
        figures: dict[str, Any] = {
            "events_old": expected,
            "events_total": total,
            "jobs": jobs,
            "batch_size": batch_size,
            "setup_s": round(setup_s, 3),
            "deleted": pruned.events,
            "kept_newest_of_live_jobs": left_old,
            "batches": pruned.event_batches,
            "prune_s": round(prune_s, 3),
            "rows_per_s": round(pruned.events / prune_s) if prune_s else None,
            "longest_batch_ms": round(pruned.longest_batch_s * 1000, 3),
            "mean_batch_ms": round(prune_s / max(1, pruned.event_batches) * 1000, 3),
            "nothing_to_prune_ms": round(idle_s * 1000, 3),
            "nothing_to_prune_deleted": idle.events,
            "renewals_without_prune": _ms(baseline.samples),
            "renewals_during_prune": _ms(renewals.samples),
        }
    finally:
        engine.dispose()
    # Every old event went except the newest of each live job (which may be recent).
    assert pruned.events + left_old == expected, figures
    assert left_old == jobs - max(1, jobs // 2), figures
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000, help="old events (200,000)")
    parser.add_argument("--jobs", type=int, default=100, help="existing jobs (100)")
    parser.add_argument("--recent", type=int, default=10_000, help="events of today (10,000)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=defaults.HISTORY_PRUNE_BATCH,
        help=f"events per transaction ({defaults.HISTORY_PRUNE_BATCH})",
    )
    parser.add_argument("--database-url", help="PostgreSQL server (default: the stack's)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    url = args.database_url or services.stack_env().get("SPARKRING_DATABASE_URL")
    with services.scratch_database(url, prefix="bench_prune") as database_url:
        figures = measure(database_url, args.events, args.jobs, args.recent, args.batch_size)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    renew, base = figures["renewals_during_prune"], figures["renewals_without_prune"]
    print(
        f"pruned {figures['deleted']:,} of {figures['events_old']:,} old events "
        f"({figures['events_total']:,} in the table) in {figures['prune_s']:.2f} s: "
        f"{figures['batches']} batches of {figures['batch_size']}, longest "
        f"{figures['longest_batch_ms']:.1f} ms, mean {figures['mean_batch_ms']:.1f} ms, "
        f"{figures['rows_per_s']:,} rows/s"
    )
    print(f"kept (newest event of a live job): {figures['kept_newest_of_live_jobs']}")
    print(f"a pass with nothing to prune: {figures['nothing_to_prune_ms']:.1f} ms")
    print(
        f"renewal-like writes during the prune: n={renew['n']} p50 {renew['p50_ms']} ms, "
        f"p99 {renew['p99_ms']} ms, max {renew['max_ms']} ms (without a prune: p50 "
        f"{base['p50_ms']} ms, p99 {base['p99_ms']} ms, max {base['max_ms']} ms)"
    )


if __name__ == "__main__":
    main()
