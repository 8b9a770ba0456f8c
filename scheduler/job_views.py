"""What the job catalog shows: a job's listing as the CLI, the API and the console read it
(``show``, ``get``, ``list_jobs``, ``page`` with a ``Filter``), and the lookups the other
job modules share (a job's id by name, its kind and schedule, timestamps as the API
writes them)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC
from typing import Any

import sqlalchemy as sa

from scheduler import distribution, job_spec, run_health
from sql import tables


def job_id_of(conn: sa.Connection, name: str, *, lock: bool = False) -> int:
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
        raise job_spec.JobNotFound(f"no job named {name!r}")
    return job_id


def kind_and_schedule(conn: sa.Connection, job_id: int) -> sa.Row:
    return conn.execute(
        sa.select(tables.jobs.c.kind, tables.jobs.c.schedule).where(tables.jobs.c.id == job_id)
    ).one()


def iso(at: Any) -> str | None:
    return None if at is None else at.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


_SHOW = (
    """
    SELECT j.id, j.name, j.kind, j.desired, j.generation AS job_generation, j.conf, j.args,
           j.env, j.secret_env,
           (SELECT jsonb_build_object('id', dr.id, 'name', dr.name, 'version', dr.version,
                                      'sha256', dr.sha256, 'filename', dr.filename)
              FROM resources dr WHERE dr.id = j.deps_id) AS deps,
           j.spark_master, j.max_restarts, j.restart_window_s, j.created_at, j.revision,
           j.label, d.revision AS run_revision, d.state, d.owner, d.target, d.epoch,
           d.attempt, d.restarts, d.lease_until,
           """
    + distribution.IN_WINDOW
    + """ AS crashes_in_window,
           d.pending_reason, d.last_error, d.started_at, d.updated_at, d.not_before,
           j.schedule, j.schedule_active, j.next_fire_at, j.auto_rollback,
           j.healthy_within_s, j.watch_revision, j.watch_fallback, j.watch_since,
           j.watch_until,
           (SELECT jsonb_build_object('run_id', lr.run_id, 'state', lr.state,
                                      'exit_code', lr.exit_code, 'trigger', lr.trigger,
                                      'ended_at', lr.ended_at)
              FROM runs lr WHERE lr.job_id = j.id AND lr.state <> 'skipped'
             ORDER BY lr.run_id DESC LIMIT 1) AS last_run,
           r.id AS resource_id, r.name AS resource_name, r.version AS resource_version,
           r.sha256 AS resource_sha256, r.filename AS resource_filename,
           COALESCE((SELECT jsonb_agg(jsonb_build_object(
                         'id', pr.id, 'name', pr.name, 'version', pr.version,
                         'sha256', pr.sha256, 'filename', pr.filename) ORDER BY p.position)
                       FROM job_py_files p JOIN resources pr ON pr.id = p.resource_id
                      WHERE p.job_id = j.id), '[]'::jsonb) AS py_files"""
    + run_health.SELECT_COLUMNS
    + """
      FROM jobs j
      JOIN distribution d ON d.job_id = j.id
      JOIN resources r ON r.id = j.resource_id"""
    + run_health.JOIN
    + "\n"
)


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
        # 0: no window (every crash since the last start counts); the crashes counted
        # now (a streaming job's ``restarts`` is the count as of its last crash).
        "restart_window_s": row.restart_window_s,
        "crashes_in_window": row.crashes_in_window,
        "generation": row.job_generation,
        # The current revision (job history), and the one the present or last run was
        # claimed with (None before the first claim).
        "revision": row.revision,
        "run_revision": row.run_revision,
        "label": row.label,
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
        "env": row.env,
        # Variable -> secret name: the values are never read here.
        "secret_env": row.secret_env,
        # The packages it imports (resource_center/deps.py), as an artifact; None: none.
        "deps": row.deps,
        "spark_master": row.spark_master,
        "lease_until": row.lease_until,
        "pending_reason": row.pending_reason,
        "last_error": row.last_error,
        "not_before": row.not_before,
        "started_at": row.started_at,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        # What the owner's health monitor last saw of the present run (None: nothing).
        "health": run_health.view(row),
        # The schedule (None: unscheduled), whether it is on, and its next fire time.
        "schedule": (
            {**row.schedule, "active": row.schedule_active, "next_fire": iso(row.next_fire_at)}
            if row.schedule is not None
            else None
        ),
        # The newest run that was not skipped (batch jobs): its outcome.
        "last_run": row.last_run,
        # The auto-rollback setting, and the update it watches now (None: none).
        "auto_rollback": {
            "enabled": row.auto_rollback,
            "healthy_within_s": row.healthy_within_s,
            "watch": (
                None
                if row.watch_revision is None
                else {
                    "revision": row.watch_revision,
                    "fallback": row.watch_fallback,
                    "since": iso(row.watch_since),
                    "until": iso(row.watch_until),
                }
            ),
        },
    }


def show(conn: sa.Connection, name: str) -> dict[str, Any]:
    row = conn.execute(sa.text(_SHOW + " WHERE j.name = :name"), {"name": name}).one_or_none()
    if row is None:
        raise job_spec.JobNotFound(f"no job named {name!r}")
    return _view(row)


def get(conn: sa.Connection, job_id: int) -> dict[str, Any]:
    row = conn.execute(sa.text(_SHOW + " WHERE j.id = :id"), {"id": job_id}).one_or_none()
    if row is None:
        raise job_spec.JobNotFound(f"no job with id {job_id}")
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
