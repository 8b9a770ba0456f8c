"""The job catalog: definitions and operator commands (create, start, stop, restart, delete).

Commands change the *desired* state (``jobs.desired``) and, where no server owns the
job, the run state directly; an owning server reacts to the desired state itself (see
``server/runner.py``). Each command is a guarded statement, so concurrent or duplicate
commands are safe: two ``start`` commands racing on a stopped job make exactly one
generation, the second finds the job already pending and does nothing (at most one start
per generation). Every command appends to ``job_events`` and NOTIFYs the cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from scheduler import notify, states
from scheduler.states import EventKind, JobKind, RunState
from sql import tables

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

# Restarts after the job's own driver failed (exited nonzero), per kind, when the
# command gives none: a streaming job is restarted (its checkpoint makes a restart
# safe); a batch job is retried only when asked (``--max-retries``): whether running a
# batch again after it failed half-way is safe, only its author knows. One column,
# ``jobs.max_restarts``, holds both: a batch job's retries are its restarts.
DEFAULT_MAX_RESTARTS: dict[JobKind, int] = {JobKind.STREAMING: 3, JobKind.BATCH: 0}


class JobError(Exception):
    """An operator command cannot be done; the message says why in one line."""


class JobNotFound(JobError):
    """No job has that name (the HTTP API answers 404)."""


class JobConflict(JobError):
    """The command clashes with the job's current state or name (the HTTP API: 409)."""


@dataclass(frozen=True)
class JobSpec:
    name: str
    kind: JobKind
    resource_id: int
    py_file_ids: Sequence[int] = ()
    conf: Mapping[str, str] = field(default_factory=dict)
    args: Sequence[str] = ()
    spark_master: str | None = None
    # None: the kind's default (DEFAULT_MAX_RESTARTS). For a batch job: its retries.
    max_restarts: int | None = None


def restart_budget(
    kind: JobKind | str, max_restarts: int | None = None, max_retries: int | None = None
) -> int:
    """The ``max_restarts`` a new job gets from the command's options.

    ``--max-retries`` is the batch spelling of the same budget: giving it for a
    streaming job, or giving both, is refused by name (nothing is guessed)."""
    kind = JobKind(kind)
    if max_retries is not None:
        if kind is not JobKind.BATCH:
            raise JobError("--max-retries is for batch jobs; a streaming job takes --max-restarts")
        if max_restarts is not None:
            raise JobError("give --max-retries or --max-restarts, not both (they are one budget)")
        max_restarts = max_retries
    if max_restarts is None:
        return DEFAULT_MAX_RESTARTS[kind]
    if max_restarts < 0:
        option = "--max-retries" if max_retries is not None else "--max-restarts"
        raise JobError(f"{option} must be 0 or more, not {max_restarts}")
    return max_restarts


def parse_conf(pairs: Sequence[str]) -> dict[str, str]:
    """``K=V`` strings to a dict; a malformed pair is refused by name."""
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise JobError(f"--conf {pair!r} is not KEY=VALUE")
        conf[key.strip()] = value
    return conf


def _event(
    conn: sa.Connection,
    job_id: int,
    name: str,
    kind: str,
    detail: dict[str, Any],
    actor: str | None = None,
) -> None:
    """Append to the job's history; ``actor`` (who asked: an API token) goes in ``by``."""
    if actor is not None:
        detail = {**detail, "by": actor}
    conn.execute(
        sa.insert(tables.job_events).values(job_id=job_id, job_name=name, kind=kind, detail=detail)
    )


def _job_id(conn: sa.Connection, name: str, *, lock: bool = False) -> int:
    """The job's id. ``lock``: hold its row until the transaction ends.

    Every command locks the job row before it touches the distribution row, and so
    does every owner write that reads ``desired`` (``scheduler/distribution.py``): the
    two serialize on the job row, in one order, so an owner releasing a job always sees
    a command committed before it, and a command always sees the release (no job left
    ``stopped`` while wanted running)."""
    query = sa.select(tables.jobs.c.id).where(tables.jobs.c.name == name)
    if lock:
        query = query.with_for_update()
    job_id = conn.execute(query).scalar_one_or_none()
    if job_id is None:
        raise JobNotFound(f"no job named {name!r}")
    return job_id


def create(conn: sa.Connection, spec: JobSpec, actor: str | None = None) -> int:
    """Define a job (desired stopped). Its distribution row is created with it."""
    if not NAME.match(spec.name):
        raise JobError(
            f"job name {spec.name!r} must be 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    max_restarts = restart_budget(spec.kind, spec.max_restarts)
    inserted = conn.execute(
        sa.text(
            """
            INSERT INTO jobs (name, kind, resource_id, conf, args, spark_master, max_restarts)
            VALUES (:name, :kind, :resource_id, CAST(:conf AS jsonb), CAST(:args AS jsonb),
                    :spark_master, :max_restarts)
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
            "spark_master": spec.spark_master,
            "max_restarts": max_restarts,
        },
    ).scalar_one_or_none()
    if inserted is None:
        raise JobConflict(f"a job named {spec.name!r} already exists")
    if spec.py_file_ids:
        conn.execute(
            sa.insert(tables.job_py_files),
            [
                {"job_id": inserted, "position": i, "resource_id": rid}
                for i, rid in enumerate(spec.py_file_ids)
            ],
        )
    conn.execute(sa.insert(tables.distribution).values(job_id=inserted, state="stopped"))
    _event(conn, inserted, spec.name, EventKind.CREATED, {"kind": JobKind(spec.kind).value}, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, spec.name)
    return inserted


_RERUN = sa.text(
    """
    WITH d AS (
        UPDATE distribution
           SET state = 'pending', restarts = 0, last_error = NULL, not_before = NULL,
               updated_at = now()
         WHERE job_id = :job_id AND owner IS NULL AND state = ANY(:terminal)
        RETURNING job_id
    )
    UPDATE jobs SET desired = 'running', generation = generation + 1, updated_at = now()
      FROM d
     WHERE jobs.id = d.job_id
    RETURNING jobs.generation
    """
)


def _rerun(conn: sa.Connection, job_id: int) -> int | None:
    """Terminal (stopped, finished, failed) and unowned -> pending with a new generation."""
    return conn.execute(
        _RERUN, {"job_id": job_id, "terminal": sorted(states.TERMINAL)}
    ).scalar_one_or_none()


def start(conn: sa.Connection, name: str, actor: str | None = None) -> str:
    """Ask for the job to run. Returns what happened: 'started', 'resumed' or 'already running'.

    A stopped, finished or failed job gets a new generation and becomes pending. A job
    still stopping after a stop command is simply wanted again (its owner releases it
    to pending instead of stopped). A job already wanted running is left alone, which is
    what makes a double click harmless.
    """
    job_id = _job_id(conn, name, lock=True)
    if (generation := _rerun(conn, job_id)) is not None:
        outcome, detail = "started", {"generation": generation}
    elif conn.execute(
        sa.update(tables.jobs)
        .where(tables.jobs.c.id == job_id, tables.jobs.c.desired == "stopped")
        .values(desired="running", updated_at=sa.func.now())
    ).rowcount:
        outcome, detail = "resumed", {}
    else:
        return "already running"
    _event(conn, job_id, name, EventKind.START_REQUESTED, detail, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)
    return outcome


def stop(conn: sa.Connection, name: str, actor: str | None = None) -> str:
    """Ask for the job to stop. Returns 'stopping', 'stopped' or 'already stopped'.

    Without an owner the run state goes straight to stopped; with one, the owner stops
    its driver gracefully and releases the job as stopped.
    """
    job_id = _job_id(conn, name, lock=True)
    changed = conn.execute(
        sa.update(tables.jobs)
        .where(tables.jobs.c.id == job_id, tables.jobs.c.desired == "running")
        .values(desired="stopped", updated_at=sa.func.now())
    ).rowcount
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
    _event(conn, job_id, name, EventKind.STOP_REQUESTED, {}, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)
    return "stopped" if unowned else "stopping"


def restart(conn: sa.Connection, name: str, actor: str | None = None) -> str:
    """Run the job again with a new generation: its owner stops the current driver and
    the job is claimed afresh (possibly elsewhere). Returns 'started' or 'restarting'."""
    job_id = _job_id(conn, name, lock=True)
    if (generation := _rerun(conn, job_id)) is not None:
        outcome = "started"
    else:
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
    _event(conn, job_id, name, EventKind.RESTART_REQUESTED, {"generation": generation}, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)
    return outcome


def delete(conn: sa.Connection, name: str, actor: str | None = None) -> None:
    """Remove a stopped job that no server owns (its events stay)."""
    job_id = _job_id(conn, name, lock=True)
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
        raise JobConflict(f"job {name!r} is running or still stopping; stop it first")
    _event(conn, job_id, name, EventKind.DELETED, {}, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)


_SHOW = """
    SELECT j.id, j.name, j.kind, j.desired, j.generation AS job_generation, j.conf, j.args,
           j.spark_master, j.max_restarts, j.created_at,
           d.state, d.owner, d.target, d.epoch, d.attempt, d.restarts, d.lease_until,
           d.pending_reason, d.last_error, d.started_at, d.updated_at, d.not_before,
           r.id AS resource_id, r.name AS resource_name, r.version AS resource_version,
           r.sha256 AS resource_sha256, r.filename AS resource_filename,
           COALESCE((SELECT jsonb_agg(jsonb_build_object(
                         'id', pr.id, 'name', pr.name, 'version', pr.version,
                         'sha256', pr.sha256, 'filename', pr.filename) ORDER BY p.position)
                       FROM job_py_files p JOIN resources pr ON pr.id = p.resource_id
                      WHERE p.job_id = j.id), '[]'::jsonb) AS py_files
      FROM jobs j
      JOIN distribution d ON d.job_id = j.id
      JOIN resources r ON r.id = j.resource_id
"""


def _view(row: sa.Row) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "kind": row.kind,
        "desired": row.desired,
        "state": row.state,
        "owner": row.owner,
        "target": row.target,
        "epoch": row.epoch,
        "attempt": row.attempt,
        "restarts": row.restarts,
        "max_restarts": row.max_restarts,
        "generation": row.job_generation,
        "resource": {
            "id": row.resource_id,
            "name": row.resource_name,
            "version": row.resource_version,
            "sha256": row.resource_sha256,
            "filename": row.resource_filename,
        },
        "py_files": row.py_files,
        "conf": row.conf,
        "args": row.args,
        "spark_master": row.spark_master,
        "lease_until": row.lease_until,
        "pending_reason": row.pending_reason,
        "last_error": row.last_error,
        "not_before": row.not_before,
        "started_at": row.started_at,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    }


def show(conn: sa.Connection, name: str) -> dict[str, Any]:
    row = conn.execute(sa.text(_SHOW + " WHERE j.name = :name"), {"name": name}).one_or_none()
    if row is None:
        raise JobNotFound(f"no job named {name!r}")
    return _view(row)


def get(conn: sa.Connection, job_id: int) -> dict[str, Any]:
    row = conn.execute(sa.text(_SHOW + " WHERE j.id = :id"), {"id": job_id}).one_or_none()
    if row is None:
        raise JobNotFound(f"no job with id {job_id}")
    return _view(row)


def list_jobs(conn: sa.Connection) -> list[dict[str, Any]]:
    return [_view(row) for row in conn.execute(sa.text(_SHOW + " ORDER BY j.name"))]


@dataclass(frozen=True)
class Filter:
    """Which jobs a listing shows; None means any. ``search`` matches part of the name."""

    state: str | None = None
    desired: str | None = None
    kind: str | None = None
    owner: str | None = None
    search: str | None = None


def _where(f: Filter) -> tuple[str, dict[str, Any]]:
    clauses, params = [], {}
    for column, value in (
        ("d.state", f.state),
        ("j.desired", f.desired),
        ("j.kind", f.kind),
        ("d.owner", f.owner),
    ):
        if value is not None:
            key = column.replace(".", "_")
            clauses.append(f"{column} = :{key}")
            params[key] = value
    if f.search:
        clauses.append("strpos(lower(j.name), lower(:search)) > 0")
        params["search"] = f.search
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def page(
    conn: sa.Connection, f: Filter, limit: int = 100, offset: int = 0
) -> tuple[int, list[dict[str, Any]]]:
    """One page of jobs matching ``f``, by name, and how many match in all."""
    where, params = _where(f)
    total = conn.execute(
        sa.text("SELECT count(*) FROM jobs j JOIN distribution d ON d.job_id = j.id" + where),
        params,
    ).scalar_one()
    rows = conn.execute(
        sa.text(_SHOW + where + " ORDER BY j.name LIMIT :limit OFFSET :offset"),
        {**params, "limit": limit, "offset": offset},
    )
    return total, [_view(row) for row in rows]


def count_by_state(conn: sa.Connection) -> dict[str, int]:
    """Jobs per run state (every state present, zeros included)."""
    counts = dict.fromkeys((s.value for s in RunState), 0)
    for state, count in conn.execute(
        sa.text("SELECT state, count(*) FROM distribution GROUP BY state")
    ):
        counts[state] = count
    return counts


def recent_events(conn: sa.Connection, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
    """The cluster's events newer than id ``after``: the newest ``limit``, oldest first."""
    rows = conn.execute(
        sa.text(
            """
            SELECT * FROM (
                SELECT id, at, job_name, kind, server, epoch, detail FROM job_events
                 WHERE id > :after ORDER BY id DESC LIMIT :limit
            ) newest ORDER BY id
            """
        ),
        {"after": after, "limit": limit},
    ).all()
    return [
        {
            "id": r.id,
            "at": r.at,
            "job": r.job_name,
            "kind": r.kind,
            "server": r.server,
            "epoch": r.epoch,
            "detail": r.detail,
        }
        for r in rows
    ]


def events(conn: sa.Connection, name: str, limit: int = 100) -> list[dict[str, Any]]:
    """The job's newest ``limit`` events, oldest first (events outlive a deleted job)."""
    rows = conn.execute(
        sa.text(
            """
            SELECT * FROM (
                SELECT id, at, kind, server, epoch, detail FROM job_events
                 WHERE job_name = :name ORDER BY id DESC LIMIT :limit
            ) newest ORDER BY id
            """
        ),
        {"name": name, "limit": limit},
    ).all()
    if not rows:
        _job_id(conn, name)
    return [
        {
            "id": r.id,
            "at": r.at,
            "kind": r.kind,
            "server": r.server,
            "epoch": r.epoch,
            "detail": r.detail,
        }
        for r in rows
    ]
