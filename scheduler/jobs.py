"""A job's life: the operator commands that create, start, stop, restart, run, backfill
and delete it. Its definition is ``scheduler/job_spec.py``, its revisions
``scheduler/job_revisions.py``, its listing ``scheduler/job_views.py``.

Commands change the *desired* state (``jobs.desired``) and, where no server owns the
job, the run state directly; an owning server reacts to the desired state itself (see
``server/runner.py``). Each command is a guarded statement, so concurrent or duplicate
commands are safe: two ``start`` commands racing on a stopped job make exactly one
generation, the second finds the job already pending and does nothing (at most one start
per generation). Every command appends to ``job_events`` and NOTIFYs the cluster.
One restart is asked by the job's owner rather than an operator: ``restart_run`` (a
stalled run, ``server/health.py``) is fenced like an owner write (owner, incarnation,
epoch) and spends the restart budget a crash spends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from scheduler import (
    distribution,
    fires,
    job_events,
    job_revisions,
    job_spec,
    job_views,
    notify,
    runs,
)
from sql import states, tables
from sql.states import EventKind, JobKind, RunState


def create(conn: sa.Connection, spec: job_spec.JobSpec, actor: str | None = None) -> int:
    """Define a job (desired stopped). Its distribution row is created with it."""
    if not job_spec.NAME.match(spec.name):
        raise job_spec.JobError(
            f"job name {spec.name!r} must be 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    max_restarts = job_spec.restart_budget(spec.kind, spec.max_restarts)
    window = job_spec.restart_window(spec.kind, spec.restart_window_s)
    job_spec.check_auto_rollback(spec.kind, spec.auto_rollback, spec.healthy_within_s)
    job_spec.check_health_conf(spec.conf)
    job_spec.check_env(conn, spec.env, spec.secret_env)
    job_spec.check_schedule_kind(spec.kind, spec.schedule)
    inserted = conn.execute(
        sa.text(
            """
            INSERT INTO jobs (name, kind, resource_id, conf, args, env, secret_env, deps_id,
                              spark_master, max_restarts, restart_window_s, label, schedule,
                              auto_rollback, healthy_within_s)
            VALUES (:name, :kind, :resource_id, CAST(:conf AS jsonb), CAST(:args AS jsonb),
                    CAST(:env AS jsonb), CAST(:secret_env AS jsonb), :deps_id, :spark_master,
                    :max_restarts, :restart_window_s, :label, CAST(:schedule AS jsonb),
                    :auto_rollback, :healthy_within_s)
            ON CONFLICT (name) DO NOTHING
            RETURNING id
            """
        ),
        {
            "name": spec.name,
            "kind": JobKind(spec.kind).value,
            "resource_id": spec.resource_id,
            "conf": json.dumps(dict(spec.conf)),
            "args": json.dumps(list(spec.args)),
            "env": json.dumps(dict(spec.env)),
            "secret_env": json.dumps(dict(spec.secret_env)),
            "deps_id": spec.deps_id,
            "spark_master": spec.spark_master,
            "max_restarts": max_restarts,
            "restart_window_s": window,
            "label": spec.label,
            "schedule": json.dumps(dict(spec.schedule)) if spec.schedule else None,
            "auto_rollback": spec.auto_rollback,
            "healthy_within_s": (
                job_spec.DEFAULT_HEALTHY_WITHIN_S
                if spec.healthy_within_s is None
                else float(spec.healthy_within_s)
            ),
        },
    ).scalar_one_or_none()
    if inserted is None:
        raise job_spec.JobConflict(f"a job named {spec.name!r} already exists")
    if spec.py_file_ids:
        conn.execute(
            sa.insert(tables.job_py_files),
            [
                {"job_id": inserted, "position": i, "resource_id": rid}
                for i, rid in enumerate(spec.py_file_ids)
            ],
        )
    conn.execute(sa.insert(tables.distribution).values(job_id=inserted, state="stopped"))
    job_revisions.insert_revision(conn, inserted, 1, job_spec.Definition.of(spec), actor=actor)
    job_events.record(
        conn, inserted, spec.name, EventKind.CREATED, {"kind": JobKind(spec.kind).value}, actor
    )
    notify.notify(conn, notify.JOBS_CHANNEL, spec.name)
    return inserted


def _rerun(conn: sa.Connection, job_id: int) -> int | None:
    """Terminal (stopped, finished, failed) and unowned -> pending with a new generation."""
    return runs.rerun(conn, job_id)


def start(conn: sa.Connection, name: str, actor: str | None = None) -> str:
    """Ask for the job to run. Returns what happened: 'started', 'resumed' or 'already running'.

    A stopped, finished or failed job gets a new generation and becomes pending. A job
    still stopping after a stop command is simply wanted again (its owner releases it
    to pending instead of stopped). A job already wanted running is left alone, which is
    what makes a double click harmless.
    """
    job_id = job_views.job_id_of(conn, name, lock=True)
    job = job_views.kind_and_schedule(conn, job_id)
    if job.schedule is not None:
        next_fire = fires.switch_on(conn, job_id)
        if next_fire is None:
            return "schedule already on"
        at = job_views.iso(next_fire)
        job_events.record(
            conn,
            job_id,
            name,
            EventKind.START_REQUESTED,
            {"schedule": "on", "next_fire": at},
            actor,
        )
        notify.notify(conn, notify.JOBS_CHANNEL, name)
        return f"schedule on (next fire {at})"
    if (generation := _rerun(conn, job_id)) is not None:
        outcome, detail = "started", {"generation": generation}
        if job.kind == JobKind.BATCH:
            detail["run_id"] = runs.open_run(conn, job_id, generation, "manual")
    elif conn.execute(
        sa.update(tables.jobs)
        .where(tables.jobs.c.id == job_id, tables.jobs.c.desired == "stopped")
        .values(desired="running", updated_at=sa.func.now())
    ).rowcount:
        outcome, detail = "resumed", {}
    else:
        return "already running"
    job_events.record(conn, job_id, name, EventKind.START_REQUESTED, detail, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)
    return outcome


def stop(conn: sa.Connection, name: str, actor: str | None = None) -> str:
    """Ask for the job to stop. Returns 'stopping', 'stopped', 'stopped (failed: no
    driver runs)' (or finished) or 'already stopped'.

    Without an owner the run state goes straight to stopped; with one, the owner stops
    its driver gracefully and releases the job as stopped.
    """
    job_id = job_views.job_id_of(conn, name, lock=True)
    schedule_was_on = fires.switch_off(conn, job_id)
    changed = conn.execute(
        sa.update(tables.jobs)
        .where(tables.jobs.c.id == job_id, tables.jobs.c.desired == "running")
        .values(desired="stopped", updated_at=sa.func.now())
    ).rowcount or int(schedule_was_on)
    unowned = conn.execute(
        sa.update(tables.distribution)
        .where(
            tables.distribution.c.job_id == job_id,
            tables.distribution.c.owner.is_(None),
            tables.distribution.c.state.in_(states.sources(RunState.STOPPED)),
        )
        .values(state="stopped", updated_at=sa.func.now())
    ).rowcount
    if not changed and not unowned:
        return "already stopped"
    job_events.record(conn, job_id, name, EventKind.STOP_REQUESTED, {}, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)
    if unowned:
        return "stopped"
    owner, state = conn.execute(
        sa.select(tables.distribution.c.owner, tables.distribution.c.state).where(
            tables.distribution.c.job_id == job_id
        )
    ).one()
    if owner is None and state == RunState.STOPPED:
        return "stopped"  # a schedule switched off while no run was in progress
    if owner is None and state in (RunState.FINISHED, RunState.FAILED):
        # Nothing runs and nothing will: the job keeps its final state.
        return f"stopped ({state}: no driver runs)"
    return "stopping"


def restart(conn: sa.Connection, name: str, actor: str | None = None) -> str:
    """Run the job again with a new generation: its owner stops the current driver and
    the job is claimed afresh (possibly elsewhere). Returns 'started' or 'restarting'."""
    job_id = job_views.job_id_of(conn, name, lock=True)
    batch = job_views.kind_and_schedule(conn, job_id).kind == JobKind.BATCH
    reset = False
    if (generation := _rerun(conn, job_id)) is not None:
        outcome = "started"
    else:
        if batch:
            runs.replace_unended(conn, job_id)
            reset = runs.fresh_retries(conn, job_id)
        generation = conn.execute(
            sa.update(tables.jobs)
            .where(tables.jobs.c.id == job_id)
            .values(
                desired="running",
                generation=tables.jobs.c.generation + 1,
                updated_at=sa.func.now(),
            )
            .returning(tables.jobs.c.generation)
        ).scalar_one()
        outcome = "restarting"
    # ``rerun``: the job was at rest and its restart count went back to 0 (``_RERUN``); a
    # restart of a live run keeps the count. The chaos checker counts a FAILED job's
    # driver failures since the last reset (testing/chaos/invariants.py).
    detail: dict[str, Any] = {"generation": generation, "rerun": outcome == "started"}
    if reset:
        detail["retries_reset"] = True
    if batch:
        detail["run_id"] = runs.open_run(conn, job_id, generation, "manual")
    job_events.record(conn, job_id, name, EventKind.RESTART_REQUESTED, detail, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)
    return outcome


def run_now(conn: sa.Connection, name: str, actor: str | None = None) -> int:
    """``job run``: one run of a batch job now, outside its schedule (if any). Refused
    while a run is in progress. Returns the run id."""
    job_id = job_views.job_id_of(conn, name, lock=True)
    if job_views.kind_and_schedule(conn, job_id).kind != JobKind.BATCH:
        raise job_spec.JobError(f"job {name!r} is a streaming job: job run is for batch jobs")
    generation = _rerun(conn, job_id)
    if generation is None:
        raise job_spec.JobConflict(f"job {name!r} has a run in progress; wait for it or stop it")
    run_id = runs.open_run(conn, job_id, generation, "manual")
    detail = {"generation": generation, "run_id": run_id, "trigger": "manual"}
    job_events.record(conn, job_id, name, EventKind.START_REQUESTED, detail, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)
    return run_id


def backfill(
    conn: sa.Connection,
    name: str,
    start: datetime,
    end: datetime,
    *,
    dry_run: bool,
    actor: str | None = None,
) -> tuple[list[datetime], list[datetime]]:
    """``job backfill``: queue each fire time of the job's schedule in [start, end]
    (``fires.backfill``: queued, those that have a run). Recorded like the other operator
    commands, as a ``start_requested`` event with trigger ``backfill`` naming what was
    queued and who asked; a dry run, or one that queued nothing, writes nothing."""
    job_id = job_views.job_id_of(conn, name, lock=True)
    queued, taken = fires.backfill(conn, job_id, start, end, dry_run=dry_run)
    if queued and not dry_run:
        detail = {
            "trigger": "backfill",
            "from": job_views.iso(start),
            "to": job_views.iso(end),
            "queued": len(queued),
            "first": job_views.iso(queued[0]),
            "last": job_views.iso(queued[-1]),
            "already_recorded": len(taken),
        }
        job_events.record(conn, job_id, name, EventKind.START_REQUESTED, detail, actor)
    return queued, taken


# A restart asked by the run's own owner (the health monitor's restart on stall): fenced
# like an owner write, and paid from the restart budget crashes use. The job row is
# locked first (the docstring of scheduler/distribution/__init__.py); the distribution row is
# the UPDATE's target, so its guard is checked again on the row's latest version.
_RESTART_RUN = sa.text(
    f"""
    WITH j AS (
        SELECT id, name, kind, generation, max_restarts, restart_window_s FROM jobs
         WHERE id = :job_id AND desired = 'running'
           FOR UPDATE
    ), spent AS (
        UPDATE distribution d
           SET {distribution.SPEND} updated_at = now()
          FROM j
         WHERE d.job_id = j.id
           AND d.owner = :server
           AND d.owner_incarnation = :incarnation
           AND d.epoch = :epoch
           AND d.state = 'running'
           AND d.lease_until > now()
           AND d.generation = j.generation
           AND {distribution.IN_WINDOW} < j.max_restarts
        RETURNING d.job_id, j.name, d.epoch, d.restarts, j.max_restarts
    ), changed AS (
        UPDATE jobs
           SET generation = jobs.generation + 1, updated_at = now()
          FROM spent
         WHERE jobs.id = spent.job_id
        RETURNING jobs.id AS job_id, spent.name, spent.epoch, jobs.generation,
                  spent.restarts, spent.max_restarts
    ), event AS (
        INSERT INTO job_events (job_id, job_name, kind, server, epoch, detail)
        SELECT job_id, name, 'restart_requested', :server, epoch,
               jsonb_build_object('generation', generation, 'restarts', restarts,
                                  'max_restarts', max_restarts,
                                  'by', CAST(:reason AS text))
          FROM changed
    )
    SELECT name, generation, restarts, max_restarts FROM changed
    """
)

# Why a restart of a run matched no row (read after the fact, for the message only).
_RUN_NOW = sa.text(
    f"""
    SELECT j.desired, j.generation AS job_generation, j.max_restarts, d.owner,
           d.owner_incarnation, d.epoch, d.state, d.generation,
           {distribution.IN_WINDOW} AS restarts,
           (d.lease_until IS NOT NULL AND d.lease_until > now()) AS live
      FROM jobs j JOIN distribution d ON d.job_id = j.id
     WHERE j.id = :job_id
    """
)


@dataclass(frozen=True)
class RunRestarted:
    """A run restarted by :func:`restart_run`."""

    name: str
    generation: int  # the job's new generation
    restarts: int  # the run's restarts, this one included
    max_restarts: int


def restart_run(
    conn: sa.Connection,
    job_id: int,
    owner: distribution.Owner,
    epoch: int,
    reason: str,
) -> RunRestarted:
    """Restart the job (a new generation, as :func:`restart` does) only if its row still
    names ``owner`` (this incarnation) at ``epoch``, running under a live lease, in the
    job's current generation, and the run has restarts left (fewer than
    ``max_restarts`` counted: :data:`distribution.IN_WINDOW`, the budget
    :func:`distribution.record_crash` spends too: the restart spends one). One
    statement; ``reason`` goes in the event's ``by``.

    Zero rows matched changes nothing and raises: :class:`RestartBudgetSpent` when only
    the budget stood in the way, else :class:`distribution.FencedError` (the run moved
    on: another owner or epoch, an expired lease, a restart or stop already asked).
    Asking twice for one run restarts it once: the first restart moved the generation.
    """
    row = conn.execute(
        _RESTART_RUN, {"job_id": job_id, **owner.params(), "epoch": epoch, "reason": reason}
    ).one_or_none()
    if row is not None:
        notify.notify(conn, notify.JOBS_CHANNEL, row.name)
        return RunRestarted(row.name, row.generation, row.restarts, row.max_restarts)
    now = conn.execute(_RUN_NOW, {"job_id": job_id}).one_or_none()
    if now is None:
        raise job_spec.JobNotFound(f"no job with id {job_id}")
    ours = (
        now.owner == owner.server
        and now.owner_incarnation == owner.incarnation
        and now.epoch == epoch
        and now.state == RunState.RUNNING
        and now.live
        and now.desired == "running"
        and now.generation == now.job_generation
    )
    if ours and now.restarts >= now.max_restarts:
        raise job_spec.RestartBudgetSpent(
            f"job {job_id}: restart budget spent ({now.restarts} of {now.max_restarts} restarts)"
        )
    raise distribution.FencedError(
        f"job {job_id}: the run of {owner.server} at epoch {epoch} is not restarted: the row "
        f"names {now.owner} at epoch {now.epoch} ({now.state}, generation {now.generation} "
        f"of {now.job_generation}, desired {now.desired}, lease "
        f"{'live' if now.live else 'expired or none'})"
    )


def delete(conn: sa.Connection, name: str, actor: str | None = None) -> None:
    """Remove a stopped job that no server owns (its events stay)."""
    job_id = job_views.job_id_of(conn, name, lock=True)
    deleted = conn.execute(
        sa.text(
            """
            DELETE FROM jobs j
             WHERE j.id = :job_id AND j.desired = 'stopped'
               AND NOT EXISTS (
                   SELECT 1 FROM distribution d WHERE d.job_id = j.id AND d.owner IS NOT NULL)
            """
        ),
        {"job_id": job_id},
    ).rowcount
    if not deleted:
        raise job_spec.JobConflict(f"job {name!r} is running or still stopping; stop it first")
    job_events.record(conn, job_id, name, EventKind.DELETED, {}, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)


def definition_of_run(
    conn: sa.Connection, job_id: int, revision: int | None
) -> job_views.RunDefinition:
    """What a driver of a run of ``revision`` is started from: the job's listing
    (``job_views.get``) with the revision's definition over it, or the job row alone when
    ``revision`` is None or not kept. Raises JobNotFound."""
    return job_views.RunDefinition.of(*_listing_and_revision(conn, job_id, revision))


def _listing_and_revision(
    conn: sa.Connection, job_id: int, revision: int | None
) -> tuple[job_views.JobView, dict[str, Any] | None]:
    listing = job_views.get(conn, job_id)
    if revision is None:
        return listing, None
    return listing, job_revisions.revision_definition(conn, job_id, revision)


def count_by_state(conn: sa.Connection) -> dict[str, int]:
    """Jobs per run state (every state present, zeros included)."""
    counts = dict.fromkeys((s.value for s in RunState), 0)
    for state, count in conn.execute(
        sa.text("SELECT state, count(*) FROM distribution GROUP BY state")
    ):
        counts[state] = count
    return counts
