"""Alert delivery latency on real PostgreSQL and real HTTP receivers: many alerts raised
at once, sent by the servers' alert senders (``server/alert_sender.py``, the production
code), a share of them to a receiver that keeps failing.

Runs in a throwaway database copied from the migrated test template
(``testing/services.py``) and dropped at the end::

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.alert_delivery [--alerts 1000] [--failing 0.1] \\
        [--servers 3] [--json]

Two alerts listen to ``failed``: one for jobs ``ok-*`` to a receiver that answers 200,
one for jobs ``bad-*`` to a receiver that answers 503 every time. ``--alerts`` job
events of kind ``failed`` are inserted in one transaction (``--failing`` of them for
``bad-*`` jobs), so the database's trigger writes one delivery each; ``--servers``
``AlertSender`` loops (threads of this process, each with its own pool, as each server
has, polling every second as servers do) send them. It reports, for the healthy
receiver's deliveries, the latency from the event's commit to the receiver's receipt
(p50, p99, max), and for the failing one how many attempts were made and that none was
given up; and that every healthy delivery arrived exactly once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from scheduler import alerts
from server import defaults
from server.alert_sender import AlertSender
from sql import database
from testing import services
from testing.factories import LOOPBACK
from testing.webhook_receiver import Receiver

DELIVER_TIMEOUT_S = 300.0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(database_url: str, count: int, failing: float, servers: int) -> dict[str, Any]:
    good, bad = Receiver().start(), Receiver().start()
    bad.script = [503] * (count * 100)
    engine = database.create_engine(database_url, pool_size=2)
    pools = [database.create_engine(database_url, pool_size=2) for _ in range(servers)]
    senders = [
        AlertSender(
            pools[i],
            f"s{i}",
            interval=defaults.ALERT_INTERVAL_S,
            console_url="http://console.example",
            user_agent="sparkring-bench",
            allow_networks=LOOPBACK,
        )
        for i in range(servers)
    ]
    n_bad = round(count * failing)
    n_good = count - n_bad
    try:
        with engine.begin() as conn:
            alerts.create(
                conn, "healthy", good.url, kinds="failed", job_glob="ok-*", allow_networks=LOOPBACK
            )
            alerts.create(
                conn, "failing", bad.url, kinds="failed", job_glob="bad-*", allow_networks=LOOPBACK
            )
        for sender in senders:
            sender.start()
        time.sleep(1.5)  # the loops are asleep between passes, as on a quiet cluster
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO job_events (job_id, job_name, kind, server, epoch, detail) "
                    "SELECT i, CASE WHEN i <= :bad THEN 'bad-' ELSE 'ok-' END || i, 'failed', "
                    "'s0', 1, '{}' FROM generate_series(1, :n) AS i"
                ),
                {"bad": n_bad, "n": count},
            )
        committed = time.time()
        arrived = good.wait_for(
            lambda got: len({r.id for r in got}) >= n_good, timeout=DELIVER_TIMEOUT_S
        )
        done = time.time()
        bad_attempts = len(bad.received)
    finally:
        for sender in senders:
            sender.stop()
        for pool in pools:
            pool.dispose()
        good.stop()
        bad.stop()
    with engine.connect() as conn:
        rows = {
            r.status: r.n
            for r in conn.execute(
                sa.text(
                    "SELECT status, count(*) AS n FROM alert_deliveries "
                    "WHERE alert_name = 'healthy' GROUP BY status"
                )
            )
        }
        failing_rows = {
            r.status: r.n
            for r in conn.execute(
                sa.text(
                    "SELECT status, count(*) AS n FROM alert_deliveries "
                    "WHERE alert_name = 'failing' GROUP BY status"
                )
            )
        }
    engine.dispose()
    first: dict[str, float] = {}
    for r in good.received:
        if r.id is not None:
            first.setdefault(r.id, r.wall)
    latencies = [t - committed for t in first.values()]
    return {
        "alerts": count,
        "healthy": n_good,
        "failing": n_bad,
        "servers": servers,
        "all_arrived": arrived,
        "healthy_received": len(good.received),
        "healthy_distinct": len(first),
        "healthy_rows": rows,
        "latency_p50_s": round(_pct(latencies, 0.50), 3) if latencies else None,
        "latency_p99_s": round(_pct(latencies, 0.99), 3) if latencies else None,
        "latency_max_s": round(max(latencies), 3) if latencies else None,
        "latency_mean_s": round(statistics.fmean(latencies), 3) if latencies else None,
        "all_sent_in_s": round(done - committed, 3),
        "failing_attempts": bad_attempts,
        "failing_rows": failing_rows,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=1000, help="alerts raised at once (1,000)")
    parser.add_argument(
        "--failing", type=float, default=0.1, help="share to a failing receiver (0.1)"
    )
    parser.add_argument("--servers", type=int, default=3, help="alert senders (3)")
    parser.add_argument("--database-url", help="PostgreSQL server (default: the stack's)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    url = args.database_url or services.stack_env().get("SPARKRING_DATABASE_URL")
    with services.scratch_database(url, prefix="bench_alerts") as database_url:
        figures = measure(database_url, args.alerts, args.failing, args.servers)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"{figures['healthy']:,} alerts to a healthy receiver and {figures['failing']:,} to "
        f"one answering 503, sent by {figures['servers']} servers: event commit -> receipt "
        f"p50 {figures['latency_p50_s']} s, p99 {figures['latency_p99_s']} s, max "
        f"{figures['latency_max_s']} s; all {figures['healthy_distinct']:,} arrived "
        f"({figures['healthy_received']:,} requests) in {figures['all_sent_in_s']} s; the "
        f"failing receiver got {figures['failing_attempts']:,} attempts, its deliveries "
        f"{figures['failing_rows']}"
    )


if __name__ == "__main__":
    main()
