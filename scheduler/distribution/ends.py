"""How a run's end is recorded: a batch finish, a crash (to backoff or failed, spending
the job's restart budget), a deferral (a driver that could not start for a passing
reason: no restart counted).

Each is written by the run's owner, or by the run's watchdog when its server is stalled
or dead at that moment: the ``*_by_watchdog`` writes are the same statements fenced on
the *run* (server and epoch) instead of the owner's incarnation (see
:func:`finish_by_watchdog` for why that is exact). :func:`ended_at` reads which local
runs their watchdogs recorded ended. The budget's SQL (:data:`IN_WINDOW`,
:data:`SPEND`) is shared with the operator's commands in ``scheduler/jobs.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlalchemy as sa

from scheduler.distribution import fencing
from sql import states
from sql.states import EventKind, RunState

# What a run's watchdog leaves a job in when it records its driver's end.
ENDED_BY_WATCHDOG = frozenset({RunState.FINISHED, RunState.BACKOFF, RunState.FAILED})


def ended_at(conn: sa.Connection, epochs: Mapping[int, int]) -> set[int]:
    """Of ``epochs`` (job id -> epoch of a local run that is still running), the jobs
    whose run at that epoch is recorded ended and unowned (:data:`ENDED_BY_WATCHDOG`):
    its watchdog recorded the driver's exit (0: finished; else a crash)."""
    if not epochs:
        return set()
    rows = conn.execute(
        sa.text(
            "SELECT job_id, epoch FROM distribution "
            "WHERE job_id = ANY(:ids) AND state = ANY(:ended) AND owner IS NULL"
        ),
        {"ids": sorted(epochs), "ended": sorted(ENDED_BY_WATCHDOG)},
    )
    return {r.job_id for r in rows if epochs.get(r.job_id) == r.epoch}


def _defer_statement(*, by_watchdog: bool) -> sa.TextClause:
    return fencing.transition(
        EventKind.DEFERRED,
        RunState.BACKOFF,
        """last_error = :error,
           not_before = now() + make_interval(secs => :delay),""",
        release=True,
        detail="jsonb_strip_nulls(jsonb_build_object("
        "'error', CAST(:error AS text), 'cause', CAST(:cause AS text)))",
        # A stop asked while the start was prepared wins: backoff would wait to run a
        # job nobody wants running, unowned and never claimed again, for ever.
        state=fencing.STOP_WINS + "ELSE 'backoff' END",
        by_watchdog=by_watchdog,
        after_reap=True,
    )


_DEFER = _defer_statement(by_watchdog=False)
_DEFER_BY_WATCHDOG = _defer_statement(by_watchdog=True)


def defer(
    conn: sa.Connection,
    job_id: int,
    owner: fencing.Owner,
    epoch: int,
    error: str,
    delay: float,
    *,
    cause: str | None = None,
) -> None:
    """The driver could not be started for a passing reason (S3 unreachable, PostgreSQL
    restarting, no memory for a process, no Spark master answering): release the job
    for ``delay`` seconds without counting a restart. Never FAILED for this. ``cause``
    (e.g. ``spark-master-unreachable``) goes into the event's detail: a cause outside
    this server is not held against it (``coordinator.deferring``)."""
    fencing.fenced(
        conn,
        _DEFER,
        RunState.BACKOFF,
        job_id,
        owner.params(),
        epoch,
        error=error[-2000:],
        delay=delay,
        cause=cause,
    )


def defer_by_watchdog(
    conn: sa.Connection,
    job_id: int,
    server: str,
    epoch: int,
    error: str,
    delay: float,
    *,
    cause: str,
) -> RunState:
    """:func:`defer`, written by the run's watchdog when its driver exited before it
    could register with a Spark master and no master answers (an outage of the cluster
    manager is not the job's failure): fenced on the run (``server`` and ``epoch``) as
    :func:`finish_by_watchdog` is, and for the same reason. No restart is counted."""
    row = fencing.fenced(
        conn,
        _DEFER_BY_WATCHDOG,
        RunState.BACKOFF,
        job_id,
        {"server": server},
        epoch,
        error=error[-2000:],
        delay=delay,
        cause=cause,
    )
    return RunState(row.state)


def _finish_statement(*, by_watchdog: bool) -> sa.TextClause:
    return fencing.transition(
        EventKind.FINISHED,
        RunState.FINISHED,
        "last_error = NULL,",
        release=True,
        state=fencing.RESTART_WINS + "ELSE 'finished' END",
        detail="jsonb_build_object('exit_code', 0)",
        by_watchdog=by_watchdog,
        after_reap=True,
    )


_FINISH = _finish_statement(by_watchdog=False)
_FINISH_BY_WATCHDOG = _finish_statement(by_watchdog=True)


def finish(conn: sa.Connection, job_id: int, owner: fencing.Owner, epoch: int) -> RunState:
    """A batch driver exited 0: the job is done and is never run again by failover.

    Returns ``finished``, or ``pending`` when a restart was requested while the driver
    ran (the restart's new generation runs)."""
    state = fencing.fenced(conn, _FINISH, RunState.FINISHED, job_id, owner.params(), epoch).state
    return RunState(state)


def finish_by_watchdog(conn: sa.Connection, job_id: int, server: str, epoch: int) -> RunState:
    """:func:`finish`, written by the run's watchdog: fenced on the run (``server`` and
    ``epoch``), not on an incarnation of the server.

    Why that is exact. A watchdog speaks for one run: the driver launched for the claim
    that gave the row ``epoch`` (a claim launches one driver; adoption launches none).
    Every claim increments the epoch. The one write that changes the owner of a lease
    without ending it, :func:`adopt`, keeps the server and the epoch and replaces only
    the incarnation, and a server adopts only the run whose watchdog it found alive in
    its work dir: this very run. So a row owned by ``server`` at ``epoch`` in an owned
    state is still this run's lease, whichever incarnation supervises it now; once the
    run's end is recorded (by its server or by its watchdog), or the lease is released,
    reaped or claimed anew, no row matches and nothing is written. Fenced on the
    incarnation that launched the run, as before, the write of every adopted run was
    refused, and a batch run adopted by a restart whose server then stalled or died as
    it exited 0 ran again (hole H2 of the safety review). The incarnation fence keeps
    two *processes* with one server id from writing each other's leases; a watchdog is
    neither of them, and the end of its driver is a fact whichever of them holds the
    lease."""
    state = fencing.fenced(
        conn, _FINISH_BY_WATCHDOG, RunState.FINISHED, job_id, {"server": server}, epoch
    ).state
    return RunState(state)


# The crashes that count against a job's budget (``j``: its jobs row, ``d``: its
# distribution row): those inside its restart window, by PostgreSQL's clock, for a
# streaming job with a window; else every one since the count was last reset (a
# batch run's retries, a window of 0). ``_KEPT`` is the window's crashes, to which
# the new one is appended. See docs/drivers.md, "The restart window".
_WINDOWED = "j.kind = 'streaming' AND j.restart_window_s > 0"
_KEPT = f"""(CASE WHEN {_WINDOWED}
    THEN ARRAY(SELECT c.at FROM unnest(d.crash_times) AS c(at)
                WHERE c.at > now() - make_interval(secs => j.restart_window_s) ORDER BY c.at)
    ELSE d.crash_times END)"""
IN_WINDOW = f"(CASE WHEN {_WINDOWED} THEN cardinality({_KEPT}) ELSE d.restarts END)"
# A crash counted: ``restarts`` is the count with it, ``crash_times`` the window with it.
SPEND = f"restarts = {IN_WINDOW} + 1, crash_times = {_KEPT} || now(),"


def _crash_statements(*, by_watchdog: bool) -> tuple[sa.TextClause, sa.TextClause]:
    """The crash writes: to backoff (a restart left), and to failed."""
    backoff = fencing.transition(
        EventKind.CRASHED,
        RunState.BACKOFF,
        f"""{SPEND}
           last_error = :error,
           not_before = now() + make_interval(
               secs => least(:backoff_max, :backoff_base * power(2, {IN_WINDOW}))),""",
        release=True,
        # next: backoff, or stopped when its operator stopped it meanwhile.
        detail="jsonb_build_object('error', CAST(:error AS text), 'next', d.state)",
        guard=f"AND {IN_WINDOW} < j.max_restarts",
        # The failure counts; a job its operator stopped meanwhile stays stopped.
        state=fencing.STOP_WINS + "ELSE 'backoff' END",
        by_watchdog=by_watchdog,
        after_reap=True,
    )
    failed = fencing.transition(
        EventKind.FAILED,
        RunState.FAILED,
        "last_error = :error,",
        release=True,
        state=fencing.RESTART_WINS + "WHEN j.desired = 'stopped' THEN 'stopped' ELSE 'failed' END",
        detail="jsonb_build_object('error', CAST(:error AS text), 'cause', CAST(:cause AS text),"
        " 'next', d.state)",
        by_watchdog=by_watchdog,
        after_reap=True,
        # ``failed`` only when the job ends FAILED; a restart or a stop asked meanwhile
        # wins (pending, stopped): the run crashed, the job did not fail.
        kind_sql=f"CASE WHEN state = 'failed' THEN '{EventKind.FAILED.value}' "
        f"ELSE '{EventKind.CRASHED.value}' END",
    )
    return backoff, failed


_CRASH = _crash_statements(by_watchdog=False)
_CRASH_BY_WATCHDOG = _crash_statements(by_watchdog=True)


def record_crash(
    conn: sa.Connection,
    job_id: int,
    owner: fencing.Owner,
    epoch: int,
    error: str,
    *,
    retry: bool,
    backoff_base: float,
    backoff_max: float,
    cause: str = "driver",
) -> RunState:
    """A driver exited abnormally, or the job cannot be started (``cause`` says which:
    ``driver`` or ``invalid``); release the job.

    With ``retry`` and restarts left (fewer than ``max_restarts`` crashes counted:
    :data:`IN_WINDOW`) the job goes to ``backoff`` for
    ``min(backoff_max, backoff_base * 2**counted)`` seconds, else to
    ``failed`` with ``last_error`` (``pending`` if a restart was requested meanwhile).
    The choice is made in SQL from the row itself.
    """
    return _record_crash(
        conn,
        _CRASH,
        job_id,
        owner.params(),
        epoch,
        error,
        retry=retry,
        backoff_base=backoff_base,
        backoff_max=backoff_max,
        cause=cause,
    )


def record_crash_by_watchdog(
    conn: sa.Connection,
    job_id: int,
    server: str,
    epoch: int,
    error: str,
    *,
    backoff_base: float,
    backoff_max: float,
) -> RunState:
    """:func:`record_crash` of a driver that exited nonzero (``retry``, ``cause``
    ``driver``), written by the run's watchdog: fenced on the run (``server`` and
    ``epoch``) as :func:`finish_by_watchdog` is, and for the same reason. Once either
    this or the server's own :func:`record_crash` is committed the job is unowned, so
    the other matches no row: a crash is counted once (hole H5 of the safety review:
    a failure while the server was stalled or dead used to be counted by nobody, and
    the job ran again past its budget)."""
    return _record_crash(
        conn,
        _CRASH_BY_WATCHDOG,
        job_id,
        {"server": server},
        epoch,
        error,
        retry=True,
        backoff_base=backoff_base,
        backoff_max=backoff_max,
        cause="driver",
    )


def _record_crash(
    conn: sa.Connection,
    statements: tuple[sa.TextClause, sa.TextClause],
    job_id: int,
    fence: Mapping[str, str],
    epoch: int,
    error: str,
    *,
    retry: bool,
    backoff_base: float,
    backoff_max: float,
    cause: str,
) -> RunState:
    to_backoff, to_failed = statements
    params = {"error": error[-2000:], "backoff_base": backoff_base, "backoff_max": backoff_max}
    if retry:
        try:
            conn.execute(sa.text("SAVEPOINT crash"))
            fencing.fenced(
                conn,
                to_backoff,
                RunState.BACKOFF,
                job_id,
                fence,
                epoch,
                sources=states.CRASH_SOURCES,
                **params,
            )
            conn.execute(sa.text("RELEASE SAVEPOINT crash"))
            return RunState.BACKOFF
        except fencing.FencedError:
            conn.execute(sa.text("ROLLBACK TO SAVEPOINT crash"))
    row = fencing.fenced(
        conn,
        to_failed,
        RunState.FAILED,
        job_id,
        fence,
        epoch,
        sources=states.CRASH_SOURCES,
        error=params["error"],
        cause=cause,
    )
    return RunState(row.state)
