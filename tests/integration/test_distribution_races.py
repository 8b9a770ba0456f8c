"""Interleavings of owner writes and operator commands, each forced with two connections
on the real PostgreSQL (issue "Run once, never lost, never resurrected", holes 1, 4, 6).

Each test holds one transaction open at the exact point where the race bites, runs the
other side in a thread, then lets the first commit: the final row must be one from which
the job still runs (S3) or stays ended (S4).
"""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from scheduler import distribution, jobs
from server import defaults
from sql import database
from sql.states import JobKind, RunState
from testing import factories
from testing.factories import owner

TTL = 10.0
# What a server process's engine gets (server/clients.server_limits).
SERVER_LIMITS = database.SessionLimits(
    lock_timeout=defaults.DB_LOCK_TIMEOUT_S,
    idle_in_transaction_timeout=defaults.DB_IDLE_IN_TRANSACTION_TIMEOUT_S,
    statement_timeout=defaults.DB_STATEMENT_TIMEOUT_S,
)


def _owned(engine: sa.Engine, name: str, server: str = "s1", **kind: JobKind) -> tuple[int, int]:
    job_id = factories.job(engine, name, **kind)
    factories.target(engine, job_id, server)
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, owner(server), TTL)
        distribution.mark_running(conn, job_id, owner(server), claim.epoch, pid=1)
    return job_id, claim.epoch


def _in_thread(action: object) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            action()  # type: ignore[operator]
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_start_committed_while_the_owner_releases_a_stopping_job_is_not_lost(
    engine: sa.Engine,
) -> None:
    job_id, epoch = _owned(engine, "a")
    with engine.begin() as conn:
        jobs.stop(conn, "a")
        distribution.begin_stop(conn, job_id, owner("s1"), epoch, "stop requested")
    # The operator starts the job again while its owner is releasing it.
    with engine.connect() as starter:
        starter.begin()
        assert jobs.start(starter, "a") in ("started", "resumed")

        def release() -> None:
            with engine.begin() as conn:
                distribution.release(conn, job_id, owner("s1"), epoch)

        thread, errors = _in_thread(release)
        thread.join(0.5)  # the release either waits for the start or decides without it
        starter.commit()
    thread.join(10)
    assert not errors, errors
    row = factories.row(engine, job_id)
    with engine.connect() as conn:
        desired = conn.execute(sa.text("SELECT desired FROM jobs WHERE id = :j"), {"j": job_id})
        assert desired.scalar_one() == "running"
    # Wanted running and unowned: it must be claimable again, never parked in 'stopped'.
    assert (row.owner, row.state) == (None, "pending")


def test_start_committed_while_a_departed_owner_is_reaped_is_not_lost(engine: sa.Engine) -> None:
    job_id, _ = _owned(engine, "a")
    with engine.begin() as conn:
        jobs.stop(conn, "a")
    factories.expire_lease(engine, job_id)
    with engine.connect() as starter:
        starter.begin()
        jobs.start(starter, "a")

        def reap() -> None:
            with engine.begin() as conn:
                distribution.reap(conn, live=[], server="coord")

        thread, errors = _in_thread(reap)
        thread.join(0.5)
        starter.commit()
    thread.join(10)
    assert not errors, errors
    row = factories.row(engine, job_id)
    assert (row.owner, row.state) == (None, "pending")


def test_restart_committed_while_a_batch_driver_finishes_runs_the_job_again(
    engine: sa.Engine,
) -> None:
    job_id, epoch = _owned(engine, "b", kind=JobKind.BATCH)
    with engine.connect() as restarter:
        restarter.begin()
        jobs.restart(restarter, "b")

        def finish() -> None:
            with engine.begin() as conn:
                distribution.finish(conn, job_id, owner("s1"), epoch)

        thread, errors = _in_thread(finish)
        thread.join(0.5)
        restarter.commit()
    thread.join(10)
    assert not errors, errors
    row = factories.row(engine, job_id)
    # The restart asked for a new run of a new generation: it must not end 'finished'.
    assert (row.owner, row.state) == (None, "pending")


def test_a_batch_driver_that_ended_before_running_was_recorded_can_finish(
    engine: sa.Engine,
) -> None:
    # mark_running failed (PostgreSQL restarting); the driver then exited 0.
    job_id = factories.job(engine, "b", kind=JobKind.BATCH)
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, owner("s1"), TTL)
    with engine.begin() as conn:
        distribution.finish(conn, job_id, owner("s1"), claim.epoch)
    assert factories.row(engine, job_id).state == RunState.FINISHED


def test_a_held_row_lock_cannot_stall_a_lease_renewal(database_url: str) -> None:
    engine = database.create_engine(database_url, limits=SERVER_LIMITS)
    try:
        job_id, _ = _owned(engine, "a")
        with engine.connect() as holder:
            holder.begin()
            # A coordinator paused inside its target update holds the row.
            holder.execute(
                sa.text("SELECT 1 FROM distribution WHERE job_id = :j FOR UPDATE"), {"j": job_id}
            )
            started = time.monotonic()
            outcome: list[object] = []

            def renew() -> None:
                try:
                    with engine.begin() as conn:
                        outcome.append(distribution.renew_leases(conn, owner("s1"), TTL))
                except DBAPIError as exc:
                    outcome.append(exc)

            thread, _ = _in_thread(renew)
            thread.join(TTL)
            waited = time.monotonic() - started
            holder.rollback()
        thread.join(10)
        # The renewal gave up (lock_timeout) well before the watchdog deadline
        # (TTL - margin), so the next renewal can try again instead of hanging.
        assert waited < TTL and outcome and isinstance(outcome[0], DBAPIError), (waited, outcome)
    finally:
        engine.dispose()


@pytest.mark.parametrize("setting", ["lock_timeout", "idle_in_transaction_session_timeout"])
def test_server_sessions_have_timeouts_below_the_lease(database_url: str, setting: str) -> None:
    engine = database.create_engine(database_url, limits=SERVER_LIMITS)
    try:
        with engine.connect() as conn:
            value = conn.execute(sa.text(f"SHOW {setting}")).scalar_one()
    finally:
        engine.dispose()
    assert value not in ("0", "0ms"), f"{setting} is not set"


def test_a_paused_transaction_holding_a_row_is_ended_so_renewals_resume(
    database_url: str,
) -> None:
    engine = database.create_engine(database_url, limits=SERVER_LIMITS)
    try:
        _owned(engine, "a")
        holder = engine.connect()
        holder.begin()
        holder.execute(sa.text("UPDATE distribution SET ring_generation = ring_generation + 1"))
        # The holder now sits idle in its transaction, as a paused coordinator would.
        deadline = time.monotonic() + TTL
        renewed: dict[int, int] = {}
        while not renewed and time.monotonic() < deadline:
            try:
                with engine.begin() as conn:
                    renewed = distribution.renew_leases(conn, owner("s1"), TTL)
            except DBAPIError:
                pass
        waited = TTL - (deadline - time.monotonic())
        assert renewed, "renewals stayed blocked behind the idle transaction"
        assert waited < defaults.LEASE_TTL_S - defaults.WATCHDOG_MARGIN_S, waited
        with pytest.raises(DBAPIError):
            holder.execute(sa.text("SELECT 1"))  # PostgreSQL ended the idle transaction
        holder.close()
    finally:
        engine.dispose()


@pytest.mark.parametrize("by_watchdog", [True, False])
@pytest.mark.parametrize(
    ("max_restarts", "then", "state"),
    [
        (0, "resume", RunState.FAILED),  # wanted running again, no restart left
        (1, "resume", RunState.BACKOFF),  # a restart left: retried after its backoff
        (1, "stop", RunState.STOPPED),  # the operator's stop wins; the failure counts
    ],
)
def test_a_failure_just_before_a_stop_began_is_counted(
    engine: sa.Engine, by_watchdog: bool, max_restarts: int, then: str, state: RunState
) -> None:
    """CHAOS_SEED=593937538: bf0 (batch, --max-retries 0, always exits 3) exited 3; its
    watchdog, slow to record it under load, found the row already 'stopping' (a stop,
    then a start, came 2 s after the exit), its crash write matched no row, the server
    released the run as pending and the job ran again past its budget. A failure that
    came before the stop is the job's own: counted from 'stopping' too."""
    job_id = factories.job(engine, "bf", kind=JobKind.BATCH, max_restarts=max_restarts)
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        claim = distribution.claim(conn, job_id, owner("s1"), TTL)
        distribution.mark_running(conn, job_id, owner("s1"), claim.epoch, pid=1)
    with engine.begin() as conn:
        jobs.stop(conn, "bf")
        distribution.begin_stop(conn, job_id, owner("s1"), claim.epoch, "stop requested")
        if then == "resume":
            jobs.start(conn, "bf")
    with engine.begin() as conn:
        if by_watchdog:
            distribution.record_crash_by_watchdog(
                conn, job_id, "s1", claim.epoch, "exit 3", backoff_base=1.0, backoff_max=2.0
            )
        else:
            distribution.record_crash(
                conn,
                job_id,
                owner("s1"),
                claim.epoch,
                "exit 3",
                retry=True,
                backoff_base=1.0,
                backoff_max=2.0,
            )
    row = factories.row(engine, job_id)
    assert (row.owner, row.state) == (None, state)
    with engine.connect() as conn:
        restarts = conn.execute(
            sa.text("SELECT restarts FROM distribution WHERE job_id = :j"), {"j": job_id}
        ).scalar_one()
    assert restarts == (1 if state != RunState.FAILED else 0)
