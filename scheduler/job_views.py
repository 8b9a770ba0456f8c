"""What the job catalog shows: a job's listing as the CLI, the API and the console read it,
a frozen :class:`JobView` (``show``, ``get``, ``list_jobs``, ``page`` with a ``Filter``);
what a run's driver is started from, a :class:`RunDefinition`; and the lookups the other
job modules share (a job's id by name, its kind and schedule, timestamps as the API
writes them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from scheduler import distribution, job_spec, run_health
from sql import tables
from sql.states import RunState


def job_id_of(conn: sa.Connection, name: str, *, lock: bool = False) -> int:
    """The job's id. ``lock``: hold its row until the transaction ends.

    Every command locks the job row before it touches the distribution row, and so
    does every owner write that reads ``desired`` (``scheduler/distribution/``): the
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
    """The job's ``kind`` and ``schedule`` (its row exists: the caller found its id)."""
    return conn.execute(
        sa.select(tables.jobs.c.kind, tables.jobs.c.schedule).where(tables.jobs.c.id == job_id)
    ).one()


def iso(at: Any) -> str | None:
    """A timestamp as the API and the events write it: UTC, ISO 8601, ending in ``Z``."""
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


@dataclass(frozen=True)
class JobView:
    """A job as its listing shows it (:func:`show`, :func:`get`, :func:`list_jobs`,
    :func:`page`): the job row, its distribution row, its artifacts, the health of its
    present run, its schedule and auto-rollback setting. :meth:`as_json` is what the API
    returns and ``--json`` prints; the ``*_text`` properties and :attr:`flag` are the
    fields a person reads (the CLI's tables and ``job show``)."""

    id: int
    name: str
    kind: str
    desired: str
    state: str
    owner: str | None
    target: str | None
    epoch: int
    attempt: int
    restarts: int
    max_restarts: int
    # 0: no window (every crash since the last start counts); the crashes counted
    # now (a streaming job's ``restarts`` is the count as of its last crash).
    restart_window_s: float
    crashes_in_window: int
    generation: int
    # The current revision (job history), and the one the present or last run was
    # claimed with (None before the first claim).
    revision: int
    run_revision: int | None
    label: str | None
    resource: Mapping[str, Any]  # id, name, version, sha256, filename
    py_files: list[Mapping[str, Any]]
    conf: Mapping[str, str]
    args: list[str]
    env: Mapping[str, str]
    # Variable -> secret name: the values are never read here.
    secret_env: Mapping[str, str]
    # The packages it imports (resource_center/deps.py), as an artifact; None: none.
    deps: Mapping[str, Any] | None
    spark_master: str | None
    lease_until: datetime | None
    pending_reason: str | None
    last_error: str | None
    not_before: datetime | None
    started_at: datetime | None
    created_at: datetime
    updated_at: datetime
    # What the owner's health monitor last saw of the present run (None: nothing).
    health: Mapping[str, Any] | None
    # The schedule (None: unscheduled), whether it is on, and its next fire time.
    schedule: Mapping[str, Any] | None
    # The newest run that was not skipped (batch jobs): its outcome.
    last_run: Mapping[str, Any] | None
    # The auto-rollback setting, and the update it watches now (None: none).
    auto_rollback: Mapping[str, Any]

    @classmethod
    def from_row(cls, row: sa.Row) -> JobView:
        """The view of one row of the listing query."""
        return cls(
            id=row.id,
            name=row.name,
            kind=row.kind,
            desired=row.desired,
            state=row.state,
            owner=row.owner,
            target=row.target,
            epoch=row.epoch,
            attempt=row.attempt,
            restarts=row.restarts,
            max_restarts=row.max_restarts,
            restart_window_s=row.restart_window_s,
            crashes_in_window=row.crashes_in_window,
            generation=row.job_generation,
            revision=row.revision,
            run_revision=row.run_revision,
            label=row.label,
            resource={
                "id": row.resource_id,
                "name": row.resource_name,
                "version": row.resource_version,
                "sha256": row.resource_sha256,
                "filename": row.resource_filename,
            },
            py_files=row.py_files,
            conf=row.conf,
            args=row.args,
            env=row.env,
            secret_env=row.secret_env,
            deps=row.deps,
            spark_master=row.spark_master,
            lease_until=row.lease_until,
            pending_reason=row.pending_reason,
            last_error=row.last_error,
            not_before=row.not_before,
            started_at=row.started_at,
            created_at=row.created_at,
            updated_at=row.updated_at,
            health=run_health.view(row),
            schedule=(
                {**row.schedule, "active": row.schedule_active, "next_fire": iso(row.next_fire_at)}
                if row.schedule is not None
                else None
            ),
            last_run=row.last_run,
            auto_rollback={
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
        )

    def as_json(self) -> dict[str, Any]:
        """The job as the API answers it and ``--json`` prints it: every field, in order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def flag(self) -> str | None:
        """The health flag of a job whose run is live (an ended run's flag is history)."""
        health = self.health
        if health is None or health["flag"] is None or self.owner is None:
            return None
        return str(health["flag"]).replace("_", " ")

    @property
    def health_text(self) -> str:
        """The ``health`` column: the flag, else the last streaming batch, else the state of
        the Spark application as the owner's health monitor last saw it."""
        health = self.health
        if health is None or self.owner is None:
            return "-"
        if (flag := self.flag) is not None:
            return flag
        if health["last_batch_id"] is not None:
            return f"batch {health['last_batch_id']}"
        return str(health["app_state"])

    @property
    def desired_text(self) -> str:
        """``desired`` as a person reads it. A job wanted running whose run ended for good
        (a batch job finished, a job failed past its budget) waits for nothing: ``-``, as
        the console shows it (``job start`` runs it again). ``--json`` keeps the stored
        value."""
        if self.desired == "running" and self.state in (RunState.FINISHED, RunState.FAILED):
            return "-"
        return self.desired

    @property
    def restarts_text(self) -> str:
        """Restarts used of the budget, ``1/3``: a batch job's retries, a streaming job's
        crashes inside its restart window now (docs/drivers.md, "The restart window")."""
        return f"{self.crashes_in_window}/{self.max_restarts}"


@dataclass(frozen=True)
class RunDefinition:
    """What a run's driver is started from: the job's listing with the definition of the
    revision its claim pinned over it (``jobs.definition_of_run``), or the job row's own
    when that revision is not kept (a job made by a release without revisions)."""

    job_id: int
    name: str
    kind: str
    revision: int  # the revision applied (the job's current one when none was kept)
    resource: Mapping[str, Any]  # id, name, version, sha256, filename
    py_files: list[Mapping[str, Any]]
    deps: Mapping[str, Any] | None  # the packages it imports, as an artifact; None: none
    conf: Mapping[str, str]
    args: list[str]
    env: Mapping[str, str]
    secret_env: Mapping[str, str]  # variable -> secret name
    spark_master: str | None  # None: the server's SPARKRING_SPARK_MASTER
    max_restarts: int

    @classmethod
    def of(cls, listing: JobView, revision: Mapping[str, Any] | None) -> RunDefinition:
        """``listing`` with the kept ``revision`` (``job_revisions.revision_definition``)
        over it; None: the listing's own definition."""
        kept = revision or {}

        def pick(key: str) -> Any:
            return kept[key] if key in kept else getattr(listing, key)

        return cls(
            job_id=listing.id,
            name=listing.name,
            kind=listing.kind,
            revision=pick("revision"),
            resource=pick("resource"),
            py_files=pick("py_files"),
            deps=pick("deps"),
            conf=pick("conf"),
            args=pick("args"),
            env=pick("env"),
            secret_env=pick("secret_env"),
            spark_master=pick("spark_master"),
            max_restarts=pick("max_restarts"),
        )


def show(conn: sa.Connection, name: str) -> JobView:
    row = conn.execute(sa.text(_SHOW + " WHERE j.name = :name"), {"name": name}).one_or_none()
    if row is None:
        raise job_spec.JobNotFound(f"no job named {name!r}")
    return JobView.from_row(row)


def get(conn: sa.Connection, job_id: int) -> JobView:
    row = conn.execute(sa.text(_SHOW + " WHERE j.id = :id"), {"id": job_id}).one_or_none()
    if row is None:
        raise job_spec.JobNotFound(f"no job with id {job_id}")
    return JobView.from_row(row)


def list_jobs(conn: sa.Connection) -> list[JobView]:
    return [JobView.from_row(row) for row in conn.execute(sa.text(_SHOW + " ORDER BY j.name"))]


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
) -> tuple[int, list[JobView]]:
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
    return total, [JobView.from_row(row) for row in rows]
