"""The distribution table on real PostgreSQL: rebalance, claim, renew and poll.

Runs in a throwaway database copied from the migrated test template
(``testing/services.py``) and dropped at the end::

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.distribution_db [--jobs 100000] [--servers 100] [--json]

It inserts ``--jobs`` jobs in bulk (one resource, jobs wanted running, distribution rows
pending) and measures, with the statements of ``scheduler/``:

1. ``coordinator.rebalance`` for the jobs on ``--servers`` servers of ample capacity:
   the first pass (every target written), a steady-state pass (nothing changed), and a
   pass after one server leaves and after one joins (medians over ``--repeat``). Read
   (``coordinator.job_rows``) and place (``placement.place``) are timed alone on the same
   state just before each pass; write is the rest of the pass (fence, diff, UPDATE,
   events, NOTIFY); commit is timed apart.
2. ``distribution.claim``: claims/s with 1, 4 and 8 concurrent claimers (threads, each
   with its own connection, one transaction per claim) on distinct jobs targeted at
   them, and 8 claimers racing through the same jobs, in the same order, as one server
   id: every job must be claimed exactly once (checked in the rows and in job_events).
3. ``distribution.renew_leases``: p50/p99 latency of the one statement (with its commit)
   for a server owning 10, 100 and 1,000 jobs; then every server owning jobs/servers
   jobs, renewing back to back (capacity) and paced at one renewal per server every
   ``LEASE_RENEW_INTERVAL_S`` (the production load).
4. ``distribution.poll`` at the full table size: p50/p99 over ``--polls`` calls, and the
   EXPLAIN ANALYZE plan (custom and generic), with whether the target and owner indexes
   are used and how ``jobs`` is joined; the same poll with the planner steered to join
   ``jobs`` by primary key, and a proposed rewrite that does so by itself
   (:data:`PROPOSED_POLL`); plus ``distribution.reap`` with nothing to reap, which the
   coordinator runs every cycle over the whole table.

Counts scale with ``--jobs``: claim blocks hold min(1,000, jobs / 14) jobs and the renew
sizes are capped at jobs / 4, so a small run (``--jobs 200 --servers 5``) exercises
every figure.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa

from scheduler import coordinator, distribution, placement
from server import defaults
from server.cli import console
from sql import database, migrate
from testing import services

REPO = Path(__file__).resolve().parent.parent

T = TypeVar("T")

COORDINATOR = "bench-coordinator"
TERM = 1
CLAIM_BLOCK = 1_000
CLAIMERS = (1, 4, 8)
RENEW_SIZES = (10, 100, 1_000)
# Lease given by the bulk setup, seconds: long, so that a slow setup on a busy machine
# cannot let leases expire before the first renewal (renewals then use the real TTL).
SETUP_LEASE_S = 3600.0
JOINS = ("Nested Loop", "Hash Join", "Merge Join")
# Planner settings that leave it only a nested loop probing jobs' primary key, no
# parallel workers: what the poll would cost if it joined jobs by index (the proposal).
INDEX_JOIN = ("enable_hashjoin", "enable_mergejoin", "max_parallel_workers_per_gather")


def _owner(server: str) -> distribution.Owner:
    """The one incarnation each simulated server has."""
    return distribution.Owner(server, f"{server}-bench")


def _server(index: int) -> str:
    return f"server-{index:03d}"


def _percentiles(samples: Sequence[float]) -> dict[str, float]:
    """Nearest-rank p50 / p99 / max of durations in seconds, as milliseconds."""
    ordered = sorted(samples)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return {
        "p50_ms": round(rank(0.50) * 1000, 3),
        "p99_ms": round(rank(0.99) * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3),
    }


# --- the scratch database ---------------------------------------------------------------


def scratch_database(url: str) -> str:
    """A database of our own copied from the migrated template, at the migration head."""
    admin = services.admin_engine(url)
    with admin.connect() as conn:
        has_template = conn.execute(
            sa.text("SELECT 1 FROM pg_database WHERE datname = :name"),
            {"name": services.TEMPLATE_DATABASE},
        ).scalar_one_or_none()
    admin.dispose()
    # The test session rebuilds the template; only build it when there is none, so a
    # concurrent test run copying it is never disturbed.
    if not has_template:
        services.create_template(url)
    scratch = services.create_test_database(url, prefix="bench")
    engine = database.create_engine(scratch, pool_size=1)
    try:
        if migrate.current(engine) not in migrate.heads():
            migrate.upgrade(engine)  # a template left by an older checkout
    finally:
        engine.dispose()
    return scratch


def populate(engine: sa.Engine, jobs: int) -> list[int]:
    """``jobs`` streaming jobs wanted running, pending, no target; returns their ids."""
    with engine.begin() as conn:
        resource_id = conn.execute(
            sa.text(
                """
                INSERT INTO resources (name, version, sha256, size, object_key, filename)
                VALUES ('bench', 1, repeat('0', 64), 9, 'sha256/bench', 'bench.py')
                RETURNING id
                """
            )
        ).scalar_one()
        conn.execute(
            sa.text(
                """
                INSERT INTO jobs (name, kind, resource_id, desired, max_restarts, generation)
                SELECT 'job-' || lpad(g::text, 6, '0'), 'streaming', :resource_id,
                       'running', 3, 1
                  FROM generate_series(1, :jobs) AS g
                """
            ),
            {"resource_id": resource_id, "jobs": jobs},
        )
        conn.execute(
            sa.text(
                "INSERT INTO distribution (job_id, state, generation) "
                "SELECT id, 'pending', 1 FROM jobs"
            )
        )
        ids = list(conn.execute(sa.text("SELECT job_id FROM distribution ORDER BY 1")).scalars())
        coordinator.become(conn, TERM, COORDINATOR)
    _analyze(engine)
    return ids


def _analyze(engine: sa.Engine) -> None:
    """Fresh planner statistics after a bulk change, as autovacuum would soon provide."""
    with engine.connect() as conn:
        conn.execute(sa.text("ANALYZE jobs, distribution"))
        conn.commit()


def _own(conn: sa.Connection, job_ids: Sequence[int], server: str, ttl: float) -> None:
    """Bulk setup (not a protocol step): ``server`` targets and holds these jobs."""
    conn.execute(
        sa.text(
            """
            UPDATE distribution
               SET target = :server, owner = :server, owner_incarnation = :server || '-bench',
                   epoch = epoch + 1,
                   lease_until = now() + make_interval(secs => :ttl), state = 'running'
             WHERE job_id = ANY(:ids)
            """
        ),
        {"server": server, "ttl": ttl, "ids": list(job_ids)},
    )


def _own_round_robin(engine: sa.Engine, servers: int, ttl: float) -> dict[str, int]:
    """Every job targeted at and held by server-(i mod servers); returns jobs per server."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                UPDATE distribution d
                   SET target = s.name, owner = s.name, owner_incarnation = s.name || '-bench',
                       epoch = d.epoch + 1,
                       lease_until = now() + make_interval(secs => :ttl), state = 'running'
                  FROM (SELECT job_id,
                               'server-' || lpad(((row_number() OVER (ORDER BY job_id) - 1)
                                                  % :servers)::text, 3, '0') AS name
                          FROM distribution) AS s
                 WHERE d.job_id = s.job_id
                """
            ),
            {"servers": servers, "ttl": ttl},
        )
        counts = conn.execute(
            sa.text("SELECT owner, count(*) FROM distribution GROUP BY owner")
        ).all()
    _analyze(engine)
    return {owner: count for owner, count in counts}


def settings_of(engine: sa.Engine) -> dict[str, str]:
    """The server settings that decide what a commit costs, reported with the figures."""
    names = ("server_version", "fsync", "synchronous_commit", "shared_buffers")
    with engine.connect() as conn:
        return {name: conn.execute(sa.text(f"SHOW {name}")).scalar_one() for name in names}


# --- threads with their own connections -------------------------------------------------


def concurrently(
    engine: sa.Engine, tasks: Sequence[Callable[[sa.Connection], T]]
) -> tuple[list[T], float]:
    """Run each task on its own thread and connection, all released together.

    Returns the results in task order and the wall time from the release until the last
    task ended. Connections are opened before the release, so they are not timed.
    """
    barrier = threading.Barrier(len(tasks) + 1)
    results: list[Any] = [None] * len(tasks)
    errors: list[BaseException] = []

    def body(index: int, task: Callable[[sa.Connection], T]) -> None:
        try:
            with engine.connect() as conn:
                barrier.wait(timeout=60)
                results[index] = task(conn)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            barrier.abort()

    threads = [
        threading.Thread(target=body, args=(i, task), name=f"bench-{i}")
        for i, task in enumerate(tasks)
    ]
    for thread in threads:
        thread.start()
    try:
        barrier.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return results, elapsed


# --- 1. rebalance -----------------------------------------------------------------------


@contextlib.contextmanager
def _timing_pieces(times: dict[str, float]) -> Iterator[None]:
    """Time the read and the placement inside the very ``coordinator.rebalance`` pass.

    The real functions run, wrapped by timers for the duration of the pass and restored
    afterwards, so read + place + the rest add up to the pass being measured.
    """
    job_rows, place = coordinator.job_rows, placement.place

    def timed_job_rows(conn: sa.Connection) -> list[sa.Row]:
        started = time.perf_counter()
        try:
            return job_rows(conn)
        finally:
            times["read_s"] += time.perf_counter() - started

    def timed_place(*args: Any, **kwargs: Any) -> placement.Placement:
        started = time.perf_counter()
        try:
            return place(*args, **kwargs)
        finally:
            times["place_s"] += time.perf_counter() - started

    coordinator.job_rows, placement.place = timed_job_rows, timed_place
    try:
        yield
    finally:
        coordinator.job_rows, placement.place = job_rows, place


def _rebalance_step(
    engine: sa.Engine, step: str, servers: Mapping[str, int], epsilon: float, vnodes: int
) -> dict[str, Any]:
    times = {"read_s": 0.0, "place_s": 0.0}
    started = time.perf_counter()
    with _timing_pieces(times), engine.begin() as conn:
        result = coordinator.rebalance(
            conn, TERM, COORDINATOR, servers, epsilon=epsilon, vnodes=vnodes
        )
        committing = time.perf_counter()
    ended = time.perf_counter()
    return {
        "step": step,
        "servers": len(servers),
        "changed": result.changed,
        **times,
        # The rest of the pass: fence, drains, the diff in Python, UPDATE, events, NOTIFY.
        "write_s": result.seconds - times["read_s"] - times["place_s"],
        "rebalance_s": result.seconds,
        "commit_s": ended - committing,
        "total_s": ended - started,
    }


def _median_step(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The pass with the median total (its pieces add up), and every total."""
    ordered = sorted(samples, key=lambda s: s["total_s"])
    return {
        **ordered[(len(ordered) - 1) // 2],
        "totals_s": [s["total_s"] for s in samples],
        "changed_each": [s["changed"] for s in samples],
    }


def bench_rebalance(
    engine: sa.Engine, jobs: int, servers: int, repeat: int, epsilon: float, vnodes: int
) -> list[dict[str, Any]]:
    # Ample capacity (every server could take every job): the bound is bounded loads'.
    live = {_server(i): jobs for i in range(servers)}
    first = _rebalance_step(engine, "first", live, epsilon, vnodes)
    if first["changed"] != jobs:
        raise AssertionError(f"the first rebalance wrote {first['changed']} of {jobs} targets")
    _analyze(engine)
    steady = [_rebalance_step(engine, "steady", live, epsilon, vnodes) for _ in range(repeat)]
    if any(s["changed"] for s in steady):
        raise AssertionError("a steady-state rebalance changed targets")
    leaves, joins = [], []
    for r in range(repeat):
        gone = sorted(live)[(servers // 2 + 7 * r) % len(live)]
        live = {sid: cap for sid, cap in live.items() if sid != gone}
        leaves.append(_rebalance_step(engine, "leave", live, epsilon, vnodes))
        live = {**live, _server(servers + r): jobs}
        joins.append(_rebalance_step(engine, "join", live, epsilon, vnodes))
    return [first, _median_step(steady), _median_step(leaves), _median_step(joins)]


# --- 2. claims --------------------------------------------------------------------------


def _retarget(engine: sa.Engine, job_ids: Sequence[int], server: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE distribution SET target = :server WHERE job_id = ANY(:ids)"),
            {"server": server, "ids": list(job_ids)},
        )


def _claimer(
    server: str, job_ids: Sequence[int], ttl: float
) -> Callable[[sa.Connection], list[int]]:
    def task(conn: sa.Connection) -> list[int]:
        won = []
        for job_id in job_ids:
            try:
                with conn.begin():
                    distribution.claim(conn, job_id, _owner(server), ttl)
            except distribution.NotClaimable:
                continue
            won.append(job_id)
        return won

    return task


def bench_claims(engine: sa.Engine, ids: Sequence[int], ttl: float) -> dict[str, Any]:
    block = min(CLAIM_BLOCK, len(ids) // (sum(CLAIMERS) + 1))
    free = iter(ids)
    distinct = []
    for claimers in CLAIMERS:
        blocks = {
            f"claimer-{claimers}-{i}": [next(free) for _ in range(block)] for i in range(claimers)
        }
        for server, job_ids in blocks.items():
            _retarget(engine, job_ids, server)
        won, elapsed = concurrently(
            engine, [_claimer(server, job_ids, ttl) for server, job_ids in blocks.items()]
        )
        claimed = sum(len(w) for w in won)
        if claimed != claimers * block:
            raise AssertionError(f"{claimed} of {claimers * block} uncontended claims succeeded")
        distinct.append(
            {
                "claimers": claimers,
                "claims": claimed,
                "seconds": elapsed,
                "claims_per_s": claimed / elapsed,
            }
        )

    # Every claimer is the same server id (a restarted server racing its old incarnation,
    # or several claim loops): only the lease decides, so each job is won once.
    contended_ids = [next(free) for _ in range(block)]
    _retarget(engine, contended_ids, "contender")
    claimers = max(CLAIMERS)
    won, elapsed = concurrently(
        engine, [_claimer("contender", contended_ids, ttl) for _ in range(claimers)]
    )
    wins = collections.Counter(job_id for w in won for job_id in w)
    twice = [job_id for job_id, n in wins.items() if n != 1]
    if twice or set(wins) != set(contended_ids):
        raise AssertionError(
            f"contended claims: {len(twice)} jobs won more than once, "
            f"{len(set(contended_ids) - set(wins))} never won"
        )
    with engine.connect() as conn:
        rows_once = conn.execute(
            sa.text(
                "SELECT count(*) FROM distribution "
                "WHERE job_id = ANY(:ids) AND owner = 'contender' AND epoch = 1"
            ),
            {"ids": contended_ids},
        ).scalar_one()
        events = conn.execute(
            sa.text(
                "SELECT count(*), count(DISTINCT job_id) FROM job_events "
                "WHERE kind = 'claimed' AND job_id = ANY(:ids)"
            ),
            {"ids": contended_ids},
        ).one()
    if rows_once != block or tuple(events) != (block, block):
        raise AssertionError(
            f"contended claims: {rows_once} rows at epoch 1, {events[0]} claimed events "
            f"for {events[1]} jobs; expected {block} of each"
        )
    attempts = claimers * block
    return {
        "block": block,
        "distinct": distinct,
        "contended": {
            "claimers": claimers,
            "jobs": block,
            "attempts": attempts,
            "won": sum(wins.values()),
            "rejected": attempts - sum(wins.values()),
            "each_claimed_once": True,
            "seconds": elapsed,
            "attempts_per_s": attempts / elapsed,
            "claims_per_s": block / elapsed,
        },
    }


# --- 3. renewals ------------------------------------------------------------------------


def _renew_once(conn: sa.Connection, server: str, expected: int, ttl: float) -> float:
    started = time.perf_counter()
    with conn.begin():
        renewed = distribution.renew_leases(conn, _owner(server), ttl)
    elapsed = time.perf_counter() - started
    if len(renewed) != expected:
        raise AssertionError(f"{server} renewed {len(renewed)} leases, expected {expected}")
    return elapsed


def _renew_execution_ms(
    engine: sa.Engine, server: str, expected: int, ttl: float, calls: int = 10
) -> float:
    """Median time PostgreSQL itself spends on the renewal (EXPLAIN ANALYZE, rolled back):
    the database's share of a renewal, without the client and the round trip."""
    # The very statement distribution.renew_leases runs.
    sql = f"EXPLAIN (ANALYZE) {distribution.leases._RENEW.text}"
    times = []
    with engine.connect() as conn:
        for _ in range(calls):
            params = {**_owner(server).params(), "ttl": ttl}
            lines = list(conn.execute(sa.text(sql), params).scalars())
            conn.rollback()
            renewed = re.search(r"actual time=\S+ rows=(\d+)", lines[0])
            if renewed is None or int(renewed.group(1)) != expected:
                raise AssertionError(f"EXPLAIN of {server}'s renewal: {lines[0]}")
            times.extend(
                float(line.split(":")[1].split()[0])
                for line in lines
                if line.startswith("Execution Time:")
            )
    return statistics.median(times)


def _update_counts(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relname = 'distribution'"
            )
        ).one()
    return int(row[0]), int(row[1])


def _settled_update_counts(engine: sa.Engine) -> tuple[int, int]:
    """The counters once every earlier session has flushed its statistics: the pooled
    sessions are closed (a backend flushes on exit) and the counters read until two
    reads 0.2 s apart agree (or 5 s pass)."""
    engine.dispose()
    deadline = time.monotonic() + 5.0
    counts = _update_counts(engine)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        again = _update_counts(engine)
        if again == counts:
            break
        counts = again
    return counts


def _hot_fraction(engine: sa.Engine, before: tuple[int, int], updates: int) -> dict[str, Any]:
    """Share of the updates since ``before`` that were HOT (no index entry written).

    A backend flushes its statistics when it exits, so the pooled sessions are closed
    and the counters polled until they show ``updates`` more (or 5 s pass)."""
    engine.dispose()
    deadline = time.monotonic() + 5.0
    while True:
        counted, hot = _update_counts(engine)
        if counted - before[0] >= updates or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    counted, hot = counted - before[0], hot - before[1]
    return {"updates_counted": counted, "hot_fraction": hot / counted if counted else None}


def bench_renew_latency(
    engine: sa.Engine, ids: Sequence[int], calls: int, ttl: float
) -> list[dict[str, Any]]:
    sizes = [min(size, len(ids) // 4) for size in RENEW_SIZES]
    free = iter(ids)
    owners = {}
    with engine.begin() as conn:
        for requested, size in zip(RENEW_SIZES, sizes, strict=True):
            server = f"owner-{requested}"
            _own(conn, [next(free) for _ in range(size)], server, SETUP_LEASE_S)
            owners[server] = (requested, size)
    _analyze(engine)
    figures = []
    with engine.connect() as conn:
        for server, (requested, size) in owners.items():
            samples = [_renew_once(conn, server, size, ttl) for _ in range(calls)]
            figures.append(
                {"requested": requested, "owned": size, "calls": calls, **_percentiles(samples)}
            )
    for figure, server in zip(figures, owners, strict=True):
        figure["server_exec_ms"] = _renew_execution_ms(engine, server, figure["owned"], ttl)
    return figures


def _renew_rounds(
    owners: Mapping[str, int], rounds: int, interval: float | None, ttl: float, workers: int
) -> list[Callable[[sa.Connection], list[tuple[float, float]]]]:
    """Tasks renewing every owner ``rounds`` times: back to back when ``interval`` is
    None, else owner i of n due at ``k * interval + i * interval / n`` (spread evenly)."""
    names = sorted(owners)
    # Sorted by due time, then round: back to back (every due time 0) an owner's next
    # round comes only after every other owner's, so no two workers renew one owner's rows
    # at once (two concurrent renewals of the same rows can deadlock; a server never runs
    # two, its renewals come from one thread).
    due = collections.deque(
        (at, name)
        for at, _, name in sorted(
            (k * (interval or 0.0) + i * (interval or 0.0) / len(names), k, name)
            for k in range(rounds)
            for i, name in enumerate(names)
        )
    )
    lock = threading.Lock()
    origin: list[float] = []

    def task(conn: sa.Connection) -> list[tuple[float, float]]:
        samples = []
        while True:
            with lock:
                if not due:
                    return samples
                at, name = due.popleft()
                if not origin:
                    origin.append(time.monotonic())
            delay = origin[0] + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing the load, not waiting for an event
            samples.append((_renew_once(conn, name, owners[name], ttl), max(0.0, -delay)))

    return [task] * workers


def _wal_position(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text("SELECT pg_current_wal_lsn()")).scalar_one())


def _wal_bytes_since(engine: sa.Engine, position: str) -> int:
    """WAL written since ``position`` (the whole server's: other databases count too)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:at AS pg_lsn))"),
                {"at": position},
            ).scalar_one()
        )


def bench_renew_load(
    engine: sa.Engine, owners: Mapping[str, int], rounds: int, workers: int, ttl: float
) -> dict[str, Any]:
    interval = defaults.LEASE_RENEW_INTERVAL_S
    rows = sum(owners.values())
    counts_before = _settled_update_counts(engine)
    results, elapsed = concurrently(engine, _renew_rounds(owners, rounds, None, ttl, workers))
    capacity = [latency for samples in results for latency, _ in samples]
    statements_per_s = len(capacity) / elapsed
    rows_per_s = rows * rounds / elapsed
    wal_before = _wal_position(engine)
    results, paced_elapsed = concurrently(
        engine, _renew_rounds(owners, rounds, interval, ttl, workers)
    )
    wal_bytes = _wal_bytes_since(engine, wal_before)
    paced = [sample for samples in results for sample in samples]
    in_flight = sum(latency for latency, _ in paced)
    hot = _hot_fraction(engine, counts_before, 2 * rows * rounds)
    # After the HOT count (its rolled-back updates would count too), before the leases
    # renewed last by the paced run expire.
    busiest = max(owners, key=owners.__getitem__)
    server_exec_ms = _renew_execution_ms(engine, busiest, owners[busiest], ttl)
    return {
        "servers": len(owners),
        "jobs_per_server": max(owners.values()),
        "interval_s": interval,
        "workers": workers,
        "required_statements_per_s": len(owners) / interval,
        "required_rows_per_s": rows / interval,
        "capacity_statements_per_s": statements_per_s,
        "capacity_rows_per_s": rows_per_s,
        "capacity_latency": _percentiles(capacity),
        "utilisation": (rows / interval) / rows_per_s,
        "paced_seconds": paced_elapsed,
        "paced_latency": _percentiles([latency for latency, _ in paced]),
        # Mean statements in flight: the sum of latencies over the wall time.
        "paced_in_flight": in_flight / paced_elapsed,
        "paced_wal_mb_per_s": wal_bytes / paced_elapsed / 1e6,
        "paced_wal_bytes_per_row": wal_bytes / (rows * rounds),
        **hot,
        "server_exec_ms": server_exec_ms,
        # Cores PostgreSQL spends executing the required renewals (client side excluded).
        "db_cores_needed": len(owners) / interval * server_exec_ms / 1000,
        "paced_max_late_ms": round(max(late for _, late in paced) * 1000, 3),
    }


# --- 4. poll and reap -------------------------------------------------------------------


def _plan(conn: sa.Connection, sql: str, params: Mapping[str, Any]) -> list[str]:
    return list(conn.execute(sa.text(f"EXPLAIN (ANALYZE, BUFFERS) {sql}"), params).scalars())


def _poll_params(server: str) -> dict[str, Any]:
    """distribution.poll's parameters for ``server`` with no local runs."""
    return {**_owner(server).params(), "also": []}


def _generic_plan(conn: sa.Connection, sql: str, server: str) -> list[str]:
    """The plan a prepared poll settles on once PostgreSQL switches to a generic plan
    (psycopg prepares a statement after five executions)."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", server):
        raise ValueError(f"server name {server!r} cannot be inlined")
    conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
    incarnation = _owner(server).incarnation
    statement = sql.replace(":server", "$1").replace(":incarnation", "$2")
    statement = statement.replace(":also", "$3")
    conn.exec_driver_sql(f"PREPARE bench_poll(text, text, bigint[]) AS {statement}")
    try:
        # EXPLAIN EXECUTE takes no bound parameters; the name is checked above.
        return list(
            conn.exec_driver_sql(
                f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_poll('{server}', '{incarnation}', "
                "'{}')"
            ).scalars()
        )
    finally:
        conn.exec_driver_sql("DEALLOCATE bench_poll")
        conn.exec_driver_sql("RESET plan_cache_mode")


def _plan_summary(lines: Sequence[str]) -> dict[str, Any]:
    text = "\n".join(lines)
    return {
        "seq_scan": "Seq Scan on distribution" in text,
        "uses_target_index": "ix_distribution_target" in text,
        "uses_owner_index": "ix_distribution_owner" in text,
        "seq_scan_jobs": "Seq Scan on jobs" in text,
        "join": next((j for j in JOINS if j in text), None),
        "lines": list(lines),
    }


# A rewrite of the poll proposed to the scheduler (not used by it): the server's own rows
# first, then jobs probed by primary key, so the cost follows the server's jobs and not
# the whole jobs table. Same columns, rows and order as distribution.poll.
PROPOSED_POLL = """
    WITH mine AS MATERIALIZED (
        SELECT * FROM distribution WHERE target = :server OR owner = :server
    )
    SELECT d.job_id, j.name, j.kind, j.desired, j.generation AS job_generation,
           j.max_restarts, d.target, d.owner, d.epoch, d.state, d.generation,
           d.restarts,
           (d.lease_until IS NOT NULL AND d.lease_until < now()) AS lease_expired,
           (d.not_before IS NULL OR d.not_before <= now()) AS claimable_now
      FROM mine d
      JOIN jobs j ON j.id = d.job_id
     WHERE j.id = ANY(ARRAY(SELECT job_id FROM mine))
     ORDER BY d.job_id
"""


def _proposed_poll(
    conn: sa.Connection, server: str, expected: list[sa.Row], calls: int
) -> tuple[list[float], list[str]]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        rows = conn.execute(sa.text(PROPOSED_POLL), {"server": server}).all()
        conn.commit()
        samples.append(time.perf_counter() - started)
        if [r.job_id for r in rows] != [r.job_id for r in expected]:
            raise AssertionError("the proposed poll returned other rows than the poll")
    return samples, _plan(conn, PROPOSED_POLL, {"server": server})


def _poll_latency(conn: sa.Connection, server: str, expected: int, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        rows = distribution.poll(conn, _owner(server))
        conn.commit()
        samples.append(time.perf_counter() - started)
        if len(rows) != expected:
            raise AssertionError(f"poll returned {len(rows)} rows, expected {expected}")
    return samples


def bench_poll(
    engine: sa.Engine, server: str, expected: int, calls: int, live: Sequence[str]
) -> dict[str, Any]:
    # The very statement distribution.poll runs, so the plan cannot drift from it.
    sql = distribution.polling._POLL.text
    with engine.connect() as conn:
        samples = _poll_latency(conn, server, expected, calls)
        custom = _plan(conn, sql, _poll_params(server))
        generic = _generic_plan(conn, sql, server)
        conn.rollback()

        # The same poll joined to jobs by its primary key (planner steered by settings,
        # nothing changed in the schema). DEALLOCATE ALL drops psycopg's prepared poll
        # (psycopg notices and forgets it), so the next calls are planned afresh.
        for setting in INDEX_JOIN:
            conn.exec_driver_sql(f"SET {setting} = 0")
        conn.exec_driver_sql("DEALLOCATE ALL")
        conn.commit()
        try:
            index_join_samples = _poll_latency(conn, server, expected, calls)
            index_join_plan = _plan(conn, sql, _poll_params(server))
        finally:
            conn.rollback()
            for setting in INDEX_JOIN:
                conn.exec_driver_sql(f"RESET {setting}")
            conn.exec_driver_sql("DEALLOCATE ALL")
            conn.commit()

        proposed_samples, proposed_plan = _proposed_poll(
            conn, server, distribution.poll(conn, _owner(server)), calls
        )
        conn.rollback()

        reaps = []
        for _ in range(max(5, calls // 10)):
            started = time.perf_counter()
            with conn.begin():
                reaped = distribution.reap(conn, live, COORDINATOR)
            reaps.append(time.perf_counter() - started)
            if reaped:
                raise AssertionError(f"reap took {len(reaped)} live servers' jobs")
        reap_plan = _plan(
            conn,
            "SELECT job_id FROM distribution "
            "WHERE owner IS NOT NULL AND NOT (owner = ANY(:live)) AND lease_until < now()",
            {"live": list(live)},
        )
        conn.rollback()
        total = conn.execute(sa.text("SELECT count(*) FROM distribution")).scalar_one()
    return {
        "server": server,
        "table_rows": total,
        "rows_returned": expected,
        "calls": calls,
        **_percentiles(samples),
        "plan": _plan_summary(custom),
        "generic_plan": _plan_summary(generic),
        "index_join": {
            "settings": {setting: 0 for setting in INDEX_JOIN},
            **_percentiles(index_join_samples),
            "plan": _plan_summary(index_join_plan),
        },
        "proposed": {**_percentiles(proposed_samples), "plan": _plan_summary(proposed_plan)},
        "reap": {"calls": len(reaps), **_percentiles(reaps), "plan": _plan_summary(reap_plan)},
    }


# --- the run ----------------------------------------------------------------------------


def run(
    url: str,
    jobs: int,
    servers: int,
    *,
    repeat: int,
    renew_calls: int,
    renew_rounds: int,
    renew_workers: int,
    polls: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    ttl = defaults.LEASE_TTL_S
    epsilon, vnodes = defaults.PLACEMENT_EPSILON, defaults.RING_VNODES
    scratch = scratch_database(url)
    engine = database.create_engine(scratch, pool_size=max(*CLAIMERS, renew_workers))
    try:
        started = time.perf_counter()
        ids = populate(engine, jobs)
        figures: dict[str, Any] = {
            "jobs": jobs,
            "servers": servers,
            "epsilon": epsilon,
            "vnodes": vnodes,
            "lease_ttl_s": ttl,
            "postgres": settings_of(engine),
            "populate_s": time.perf_counter() - started,
        }
        progress(f"populated {jobs} jobs in {figures['populate_s']:.1f} s")
        figures["rebalance"] = bench_rebalance(engine, jobs, servers, repeat, epsilon, vnodes)
        progress("rebalance done")
        figures["claims"] = bench_claims(engine, ids, ttl)
        progress("claims done")
        figures["renew"] = bench_renew_latency(engine, ids, renew_calls, ttl)
        owners = _own_round_robin(engine, servers, SETUP_LEASE_S)
        figures["renew_load"] = bench_renew_load(engine, owners, renew_rounds, renew_workers, ttl)
        progress("renewals done")
        figures["poll"] = bench_poll(engine, _server(0), owners[_server(0)], polls, sorted(owners))
    finally:
        engine.dispose()
        services.drop_database(scratch)
    return _rounded(figures)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def print_tables(f: Mapping[str, Any]) -> None:
    pg = f["postgres"]
    print(
        f"{f['jobs']:,} jobs x {f['servers']} servers; epsilon {f['epsilon']}, "
        f"vnodes {f['vnodes']}; PostgreSQL {pg['server_version'].split()[0]}, "
        f"fsync {pg['fsync']}, synchronous_commit {pg['synchronous_commit']}, "
        f"shared_buffers {pg['shared_buffers']}; bulk insert {f['populate_s']:.1f} s"
    )
    console.table(
        ["rebalance", "servers", "changed", "read s", "place s", "write s", "commit s", "total s"],
        [
            [
                s["step"],
                s["servers"],
                s["changed"],
                f"{s['read_s']:.3f}",
                f"{s['place_s']:.3f}",
                f"{s['write_s']:.3f}",
                f"{s['commit_s']:.3f}",
                f"{s['total_s']:.3f}",
            ]
            for s in f["rebalance"]
        ],
        title="1. coordinator.rebalance: first pass (every target written), steady state "
        "(nothing changed), one server left, one joined",
    )
    claims = f["claims"]
    contended = claims["contended"]
    console.table(
        ["claimers", "jobs", "claims", "seconds", "claims/s"],
        [
            [
                c["claimers"],
                "distinct",
                c["claims"],
                f"{c['seconds']:.2f}",
                f"{c['claims_per_s']:,.0f}",
            ]
            for c in claims["distinct"]
        ]
        + [
            [
                contended["claimers"],
                f"same {contended['jobs']:,}",
                f"{contended['won']} won / {contended['attempts']} tried",
                f"{contended['seconds']:.2f}",
                f"{contended['claims_per_s']:,.0f} ({contended['attempts_per_s']:,.0f} tries)",
            ]
        ],
        title=f"2. distribution.claim (each contended job claimed once: "
        f"{contended['each_claimed_once']})",
    )
    console.table(
        ["leases owned", "calls", "p50 ms", "p99 ms", "max ms", "in PostgreSQL ms"],
        [
            [r["owned"], r["calls"], r["p50_ms"], r["p99_ms"], r["max_ms"], r["server_exec_ms"]]
            for r in f["renew"]
        ],
        title="3. distribution.renew_leases, one server (statement + commit; "
        "in PostgreSQL: EXPLAIN ANALYZE execution, median)",
    )
    load = f["renew_load"]
    print(
        f"{load['servers']} servers x {load['jobs_per_server']} leases, renewing every "
        f"{load['interval_s']} s: needs {load['required_statements_per_s']:.0f} statements/s = "
        f"{load['required_rows_per_s']:,.0f} rows/s; back to back ({load['workers']} "
        f"connections) {load['capacity_statements_per_s']:.0f} statements/s = "
        f"{load['capacity_rows_per_s']:,.0f} rows/s (p50 {load['capacity_latency']['p50_ms']} "
        f"ms), so the load uses {load['utilisation']:.0%} of that; paced: p50 "
        f"{load['paced_latency']['p50_ms']} ms, p99 {load['paced_latency']['p99_ms']} ms, "
        f"{load['paced_in_flight']:.2f} in flight, latest start {load['paced_max_late_ms']} ms, "
        f"WAL {load['paced_wal_mb_per_s']:.1f} MB/s ({load['paced_wal_bytes_per_row']:.0f} B/row); "
        f"HOT {load['hot_fraction']}; in PostgreSQL {load['server_exec_ms']} ms a renewal = "
        f"{load['db_cores_needed']:.2f} cores"
    )
    poll = f["poll"]
    print(
        f"4. distribution.poll({poll['server']}) at {poll['table_rows']:,} rows, "
        f"{poll['rows_returned']} returned: p50 {poll['p50_ms']} ms, p99 {poll['p99_ms']} ms "
        f"over {poll['calls']} calls"
    )
    for label, plan in (("custom plan", poll["plan"]), ("generic plan", poll["generic_plan"])):
        print(
            f"   {label}: seq scan {plan['seq_scan']}, target index "
            f"{plan['uses_target_index']}, owner index {plan['uses_owner_index']}, join "
            f"{plan['join']}, seq scan of jobs {plan['seq_scan_jobs']}"
        )
        for line in plan["lines"]:
            print(f"     {line}")
    index_join = poll["index_join"]
    print(
        f"   joined to jobs by primary key ({', '.join(INDEX_JOIN)} = 0): p50 "
        f"{index_join['p50_ms']} ms, p99 {index_join['p99_ms']} ms; join "
        f"{index_join['plan']['join']}, seq scan of jobs {index_join['plan']['seq_scan_jobs']}"
    )
    proposed = poll["proposed"]
    print(
        f"   proposed rewrite (own rows first, jobs by primary key): p50 {proposed['p50_ms']} "
        f"ms, p99 {proposed['p99_ms']} ms; seq scan of jobs {proposed['plan']['seq_scan_jobs']}"
    )
    reap = poll["reap"]
    print(
        f"   distribution.reap (nothing to reap): p50 {reap['p50_ms']} ms, p99 "
        f"{reap['p99_ms']} ms; seq scan {reap['plan']['seq_scan']}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in the table")
    parser.add_argument("--servers", type=int, default=100, help="live servers")
    parser.add_argument("--repeat", type=int, default=3, help="rebalance passes per change")
    parser.add_argument("--renew-calls", type=int, default=200, help="renewals per size")
    parser.add_argument("--renew-rounds", type=int, default=3, help="renewals per server")
    parser.add_argument("--renew-workers", type=int, default=4, help="renewing connections")
    parser.add_argument("--polls", type=int, default=200, help="poll calls timed")
    parser.add_argument(
        "--database-url",
        default=None,
        help="PostgreSQL server to use (default: SPARKRING_DATABASE_URL of the stack)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)
    if not 2 <= args.servers <= 900:
        parser.error("--servers must be between 2 and 900")
    if args.jobs < 10 * args.servers or args.jobs < 100:
        parser.error("--jobs must be at least 100 and 10 per server")
    if min(args.repeat, args.renew_calls, args.renew_rounds, args.renew_workers, args.polls) < 1:
        parser.error("--repeat, --renew-calls, --renew-rounds, --renew-workers, --polls >= 1")
    url = args.database_url or services.stack_env().get("SPARKRING_DATABASE_URL")
    if not url:
        parser.error("no database: set SPARKRING_DATABASE_URL or pass --database-url")
    url = database.parse_url(url).render_as_string(hide_password=False)

    def progress(message: str) -> None:
        if not args.json:
            print(message, file=sys.stderr, flush=True)

    figures = run(
        url,
        args.jobs,
        args.servers,
        repeat=args.repeat,
        renew_calls=args.renew_calls,
        renew_rounds=args.renew_rounds,
        renew_workers=args.renew_workers,
        polls=args.polls,
        progress=progress,
    )
    if args.json:
        console.emit_json(figures)
    else:
        print_tables(figures)


if __name__ == "__main__":
    main()
