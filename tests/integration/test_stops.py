"""The old owner's bounded wait of a warm hand-off (server/stops.await_warm), on the
real PostgreSQL: it stops waiting when the target is ready, when the offer no longer
stands, and after warm_ready_wait in any case."""

from __future__ import annotations

import threading
import time
import types

import sqlalchemy as sa

from scheduler import distribution, jobs
from server import reconcile, runs, stops, watchdog
from testing import factories
from testing.factories import owner

S1 = owner("s1")


def _offering(engine: sa.Engine) -> runs.Run:
    """A run of s1 stopping for a move to s2, a warm hand-off offered at its epoch."""
    job_id, epoch = factories.warm_offer(engine)
    now = watchdog.lease_clock()
    return runs.Run(job_id, "stream", "streaming", epoch, 1, now, now + 20, S1)


def _context(engine: sa.Engine, wait: float) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        engine=engine,
        config=types.SimpleNamespace(warm_ready_wait=wait),
        stop=threading.Event(),
        shutting_down=threading.Event(),
    )


def test_the_old_owner_stops_waiting_once_the_target_is_warm(engine: sa.Engine) -> None:
    run = _offering(engine)
    ready = threading.Timer(
        0.5,
        lambda: _mark_ready(engine, run),
    )
    ready.start()
    started = time.monotonic()
    assert stops.await_warm(_context(engine, 30.0), run) is reconcile.WarmWait.READY
    assert time.monotonic() - started < 5


def _mark_ready(engine: sa.Engine, run: runs.Run) -> None:
    with engine.begin() as conn:
        distribution.mark_warm_ready(conn, run.job_id, "s2", run.epoch)


def test_a_target_that_never_gets_warm_is_waited_for_a_bounded_time(engine: sa.Engine) -> None:
    run = _offering(engine)
    started = time.monotonic()
    assert stops.await_warm(_context(engine, 1.5), run) is reconcile.WarmWait.GIVE_UP
    assert 1.5 <= time.monotonic() - started < 5


def test_an_offer_withdrawn_meanwhile_ends_the_wait(engine: sa.Engine) -> None:
    run = _offering(engine)

    def stop_the_job() -> None:
        with engine.begin() as conn:
            jobs.stop(conn, "stream")

    threading.Timer(0.5, stop_the_job).start()
    started = time.monotonic()
    assert stops.await_warm(_context(engine, 30.0), run) is reconcile.WarmWait.GIVE_UP
    assert time.monotonic() - started < 5


def test_a_shutdown_does_not_wait_for_the_target(engine: sa.Engine) -> None:
    run = _offering(engine)
    ctx = _context(engine, 30.0)
    ctx.shutting_down.set()
    started = time.monotonic()
    assert stops.await_warm(ctx, run) is reconcile.WarmWait.GIVE_UP
    assert time.monotonic() - started < 2
