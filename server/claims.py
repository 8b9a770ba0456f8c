"""Claims and renewals: how this server takes a job's lease, keeps it, and hands it on.

- :func:`claim` (the poll thread): the atomic claim of a free job targeted here
  (``distribution.claim``), then a :class:`runs.Run` in ``starting`` and its start task
  (``launch.start``);
- :func:`renew` (the renew thread): every lease of this incarnation in one statement,
  then each renewed run's new ``deadline`` (``t_sent + ttl - margin``, ``t_sent`` the
  lease-clock time just before the statement) confirmed to its watchdog
  (:func:`confirm`), so that a driver is dead before its lease can expire in
  PostgreSQL; a driver whose lease was not renewed is killed at once;
- :func:`hand_over` (the shutdown of a planned restart): every lease extended to the
  hand-over window, for the next incarnation to adopt (``adoption.clean_orphan``).
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy.exc import DBAPIError

from scheduler import distribution
from server import launch, metrics, run_context, run_table, rundir, runs, watchdog

log = logging.getLogger(__name__)

# Pause between two tries of a hand-over's lease extension (seconds).
HAND_OVER_RETRY_S = 0.25


def _not_ended(ctx: run_context.Context, lost: list[runs.Run]) -> list[runs.Run]:
    """``lost`` (not renewed) but those whose watchdog recorded the driver's exit
    just now (it is exiting: the poll reaps it). If that cannot be read, all of them:
    a run is lost unless PostgreSQL says otherwise."""
    if not lost:
        return lost
    try:
        with ctx.engine.connect() as conn:
            ended = distribution.ended_at(conn, {r.job_id: r.epoch for r in lost})
    except DBAPIError:
        return lost
    return [run for run in lost if run.job_id not in ended]


def renew(table: run_table.RunTable, ctx: run_context.Context) -> bool:
    cfg = ctx.config
    # Only the leases of local runs (of this incarnation): a lease this process holds
    # without a run (a claim whose commit answer was lost) must expire. A run added
    # after this list is judged by the next renewal, not this one.
    sent = {run.job_id for run in table.owned_by(ctx.owner)}
    t_sent = watchdog.lease_clock()
    started = time.perf_counter()
    try:
        with ctx.engine.begin() as conn:
            renewed = distribution.renew_leases(conn, ctx.owner, cfg.lease_ttl, sent)
    except DBAPIError as exc:
        metrics.REGISTRY.inc("sparkring_lease_renew_errors_total")
        log.warning(
            "lease renewal failed; drivers die at their deadline unless it recovers",
            extra={"action": "renew_failed", "error": type(exc.orig).__name__},
        )
        return False
    metrics.REGISTRY.observe("sparkring_lease_renew_seconds", time.perf_counter() - started)
    ctx.renewed(watchdog.lease_clock())
    deadline = t_sent + cfg.lease_ttl - cfg.watchdog_margin
    lost = table.renewed(ctx.owner, sent, renewed, deadline, t_sent)
    lost = _not_ended(ctx, lost)
    for run in lost:
        table.remove(run)
    for run in lost:
        log.error(
            "lease lost; killing the driver",
            extra={"action": "lease_lost", "job": run.name, "epoch": run.epoch},
        )
        if run.driver is not None:
            # In a task: a kill can take tens of seconds (a hung driver), and the
            # other jobs' leases must keep being renewed meanwhile. The watchdog kills
            # the driver at its deadline anyway, before the lease can be claimed; a
            # starved watchdog may wake late, so this server does not claim the job
            # again before the kill is over (the poll skips ``RunTable.dying``).
            table.add_dying(run.job_id)
            try:
                ctx.submit(_kill_lost, table, ctx, run)
            except RuntimeError:  # the pool is shut down: the process is stopping
                _kill_lost(table, ctx, run)
    return True


def _kill_lost(table: run_table.RunTable, ctx: run_context.Context, run: runs.Run) -> None:
    """Kill the driver of a lost run; only then may this server claim its job again."""
    assert run.driver is not None
    try:
        run.driver.kill()
    finally:
        table.discard_dying(run.job_id)
        ctx.wake()


def hand_over(table: run_table.RunTable, ctx: run_context.Context, window: float) -> list[str]:
    """A planned restart: extend the lease of every local run of this incarnation to
    ``window`` seconds and give each watchdog the matching deadline, then leave the drivers
    running for the successor to adopt (``adoption.clean_orphan``). Call after
    ``Runner.stop_loops`` (a renewal must not shorten the extended leases again), and
    before waiting for the tasks: a driver stop in flight can take the stop grace
    and more, and no lease is renewed meanwhile. Returns
    the jobs handed over; if PostgreSQL cannot be reached, nothing is extended and
    the drivers die at their current deadlines (then fail over as after a crash)."""
    cfg = ctx.config
    # The extension is idempotent: tried again while the drivers' current deadlines
    # leave time. A commit whose answer was lost may have extended the leases, and
    # giving up then would make the jobs wait out the whole window.
    local = table.owned_by(ctx.owner)
    give_up = min((run.deadline for run in local), default=watchdog.lease_clock())
    give_up = max(give_up, watchdog.lease_clock() + HAND_OVER_RETRY_S)
    while True:
        t_sent = watchdog.lease_clock()
        try:
            with ctx.engine.begin() as conn:
                # Only the leases of local runs: one held without a run (a claim whose
                # commit answer was lost) has no driver to adopt and must expire.
                extended = distribution.renew_leases(
                    conn, ctx.owner, window, {run.job_id for run in local}
                )
            break
        except DBAPIError as exc:
            if watchdog.lease_clock() + HAND_OVER_RETRY_S < give_up:
                log.warning(
                    "hand-over failed; trying again",
                    extra={"action": "hand_over", "error": type(exc.orig).__name__},
                )
                threading.Event().wait(HAND_OVER_RETRY_S)
                continue
            log.error(
                "hand-over failed: PostgreSQL unreachable; drivers die at their deadlines",
                extra={"action": "hand_over", "error": type(exc.orig).__name__},
            )
            return []
    deadline = t_sent + window - cfg.watchdog_margin
    handed = table.confirm_extended(extended, deadline)
    log.info(
        "leases handed over to the next incarnation",
        extra={"action": "hand_over", "jobs": sorted(handed), "window": window},
    )
    return sorted(handed)


def claim(table: run_table.RunTable, ctx: run_context.Context, row: distribution.Row) -> None:
    cfg = ctx.config
    try:
        # Before the claim: a successor that finds this directory knows that no run
        # of the job here is in the older code's layout (rundir.run_trace).
        rundir.job_dir(cfg.work_dir, row.job_id).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning(
            "cannot create the job's run directory: not claimed",
            extra={"action": "claim", "job": row.name, "error": str(exc)},
        )
        return
    t_sent = watchdog.lease_clock()
    try:
        with ctx.engine.begin() as conn:
            claim = distribution.claim(
                conn,
                row.job_id,
                ctx.owner,
                cfg.lease_ttl,
                hold=cfg.takeover_hold,
                warm=table.has_warm(row.job_id),
            )
    except distribution.NotClaimable:
        return
    metrics.REGISTRY.inc("sparkring_claims_total")
    metrics.REGISTRY.observe("sparkring_claim_seconds", watchdog.lease_clock() - t_sent)
    if row.owner is not None and row.due_in is not None:
        # Claimed over a lost owner's expired lease: how long it had been expired
        # (as the poll saw it) is what failover added beyond the lease itself.
        metrics.REGISTRY.observe("sparkring_failover_seconds", max(0.0, -row.due_in))
    run = runs.Run(
        job_id=claim.job_id,
        name=claim.name,
        kind=row.kind,
        epoch=claim.epoch,
        attempt=claim.attempt,
        claimed_at=watchdog.lease_clock(),
        # From the time before the claim was sent: PostgreSQL's lease ends later.
        deadline=t_sent + cfg.lease_ttl - cfg.watchdog_margin,
        owner=ctx.owner,
        revision=claim.revision,
    )
    table.add(run)
    log.info(
        "claimed",
        extra={
            "action": "claim",
            "job": run.name,
            "epoch": run.epoch,
            "attempt": run.attempt,
            "revision": run.revision,
        },
    )
    ctx.submit(launch.start, table, ctx, run)
