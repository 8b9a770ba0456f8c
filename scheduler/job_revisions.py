"""A job's revisions: its definition (main artifact and --py-files pinned to versions,
conf, args, master, max_restarts) is numbered.

``create`` (``scheduler/jobs.py``) makes revision 1; ``update`` and ``rollback`` add the
next one (``job_revisions``) and copy it into the job row, which is always the current
revision. A claim records the revision its run starts from (``distribution.revision``,
``scheduler/distribution/``). A new revision of a live streaming job (wanted running,
not at rest) bumps the generation in the same statement, so its owner stops the driver
and the job is claimed again from the new revision: the same fenced stop-then-start as
``restart``. A live batch job keeps running its revision unless the caller asks for the
restart. ``history`` lists the revisions with their differences, one line each.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from scheduler import fires, job_events, job_spec, job_views, notify, runs
from scheduler.schedule import format_duration
from sql import states, tables
from sql.states import EventKind, JobKind


class Effect(StrEnum):
    """What a new revision does to the job's run (:class:`Revised`)."""

    UNCHANGED = "unchanged"  # nothing differed: no revision was made
    ROLLING = "rolling"  # its owner stops the driver; the job is claimed again from it
    NEXT_CLAIM = "next claim"  # wanted running, no driver now: its next claim uses it
    KEPT = "kept"  # a live batch run keeps its revision; the next run uses the new one
    AT_REST = "at rest"  # not running: the next start uses it


@dataclass(frozen=True)
class Revised:
    """The outcome of ``update`` or ``rollback``."""

    revision: int  # the job's current revision after the command
    previous: int  # the current revision before it
    changed: tuple[str, ...]  # the fields that changed (empty: nothing was done)
    effect: Effect
    run_revision: int | None  # the revision the job's present run was claimed with
    # The deadline of the auto-rollback watch this update started (None: not watched).
    watched_until: datetime | None = None


def insert_revision(
    conn: sa.Connection,
    job_id: int,
    revision: int,
    definition: job_spec.Definition,
    *,
    actor: str | None,
    changed: Sequence[str] = (),
    rollback_of: int | None = None,
) -> None:
    conn.execute(
        sa.insert(tables.job_revisions).values(
            job_id=job_id,
            revision=revision,
            resource_id=definition.resource_id,
            conf=dict(definition.conf),
            args=list(definition.args),
            env=dict(definition.env),
            secret_env=dict(definition.secret_env),
            deps_id=definition.deps_id,
            spark_master=definition.spark_master,
            max_restarts=definition.max_restarts,
            restart_window_s=definition.restart_window_s,
            created_by=actor,
            schedule=dict(definition.schedule) if definition.schedule else None,
            changed=list(changed),
            rollback_of=rollback_of,
        )
    )
    if definition.py_file_ids:
        conn.execute(
            sa.insert(tables.job_revision_py_files),
            [
                {"job_id": job_id, "revision": revision, "position": i, "resource_id": rid}
                for i, rid in enumerate(definition.py_file_ids)
            ],
        )


def _current(conn: sa.Connection, job_id: int) -> tuple[int, job_spec.Definition]:
    """The job's current revision number and definition (the job row is its copy)."""
    j, p = tables.jobs, tables.job_py_files
    row = conn.execute(
        sa.select(
            j.c.revision,
            j.c.resource_id,
            j.c.conf,
            j.c.args,
            j.c.env,
            j.c.secret_env,
            j.c.deps_id,
            j.c.spark_master,
            j.c.max_restarts,
            j.c.restart_window_s,
            j.c.schedule,
        ).where(j.c.id == job_id)
    ).one()
    py_files = conn.execute(
        sa.select(p.c.resource_id).where(p.c.job_id == job_id).order_by(p.c.position)
    ).scalars()
    return row.revision, job_spec.Definition(
        resource_id=row.resource_id,
        py_file_ids=tuple(py_files),
        conf=row.conf,
        args=tuple(row.args),
        env=row.env,
        secret_env=row.secret_env,
        deps_id=row.deps_id,
        spark_master=row.spark_master,
        max_restarts=row.max_restarts,
        restart_window_s=row.restart_window_s,
        schedule=row.schedule,
    )


def _stored(conn: sa.Connection, job_id: int, revision: int) -> job_spec.Definition | None:
    r, p = tables.job_revisions, tables.job_revision_py_files
    row = conn.execute(
        sa.select(r).where(r.c.job_id == job_id, r.c.revision == revision)
    ).one_or_none()
    if row is None:
        return None
    py_files = conn.execute(
        sa.select(p.c.resource_id)
        .where(p.c.job_id == job_id, p.c.revision == revision)
        .order_by(p.c.position)
    ).scalars()
    return job_spec.Definition(
        resource_id=row.resource_id,
        py_file_ids=tuple(py_files),
        conf=row.conf,
        args=tuple(row.args),
        env=row.env,
        secret_env=row.secret_env,
        deps_id=row.deps_id,
        spark_master=row.spark_master,
        max_restarts=row.max_restarts,
        restart_window_s=row.restart_window_s,
        schedule=row.schedule,
    )


# The job row becomes the new revision. The generation moves on, in the same statement,
# when the job has a live run that must take it now: a streaming job wanted running and
# not at rest, or any such job when the caller asked for the restart (the owner then
# stops its driver as for ``job restart``: runner.stop_reason). ``revision = :previous``
# guards against a concurrent revision (the job row is locked; zero rows is an error).
_REVISE = sa.text(
    """
    WITH old AS (
        SELECT j.id, j.kind, j.desired, d.state, d.owner,
               d.generation AS run_generation, d.revision AS run_revision,
               (j.desired = 'running' AND (j.kind = 'streaming' OR :restart)
                AND d.state <> ALL(:at_rest)) AS roll
          FROM jobs j JOIN distribution d ON d.job_id = j.id
         WHERE j.id = :job_id
    ), watch AS (
        -- auto-rollback (scheduler/auto_rollback.py): a streaming job whose setting is
        -- on is watched when the update rolls it; a rollback never is. Any earlier
        -- watch ends: this revision supersedes the one it watched.
        SELECT (:may_watch AND j.auto_rollback AND j.kind = 'streaming' AND old.roll) AS watching,
               now() + make_interval(secs => j.healthy_within_s) AS until
          FROM jobs j, old WHERE j.id = old.id
    )
    UPDATE jobs j
       SET resource_id = :resource_id,
           conf = CAST(:conf AS jsonb),
           args = CAST(:args AS jsonb),
           env = CAST(:env AS jsonb),
           secret_env = CAST(:secret_env AS jsonb),
           deps_id = :deps_id,
           spark_master = :spark_master,
           max_restarts = :max_restarts,
           restart_window_s = :restart_window_s,
           schedule = CAST(:schedule AS jsonb),
           -- a schedule removed switches it off (fires.reschedule times a changed one)
           schedule_active = j.schedule_active AND :schedule IS NOT NULL,
           next_fire_at = CASE WHEN :schedule IS NULL THEN NULL ELSE j.next_fire_at END,
           fires_checked_until = CASE WHEN :schedule IS NULL THEN NULL
                                      ELSE j.fires_checked_until END,
           revision = :revision,
           generation = j.generation + CASE WHEN old.roll THEN 1 ELSE 0 END,
           watch_revision = CASE WHEN watch.watching THEN :revision END,
           watch_fallback = CASE WHEN watch.watching THEN :previous END,
           watch_since = CASE WHEN watch.watching THEN now() END,
           watch_until = CASE WHEN watch.watching THEN watch.until END,
           updated_at = now()
      FROM old, watch
     WHERE j.id = old.id AND j.revision = :previous
    RETURNING j.generation, old.roll, old.kind, old.desired, old.state, old.owner,
              old.run_generation, old.run_revision, j.watch_until
    """
)


def _effect(row: sa.Row) -> Effect:
    if row.roll:
        return Effect.ROLLING if row.owner is not None else Effect.NEXT_CLAIM
    if row.desired != states.Desired.RUNNING or row.state in states.TERMINAL:
        return Effect.AT_REST
    # A live batch job without the restart: a re-run of its present generation (after
    # its owner was lost) keeps the revision that generation started with.
    if row.owner is not None or (
        row.run_generation == row.generation and row.run_revision is not None
    ):
        return Effect.KEPT
    return Effect.NEXT_CLAIM


def _revise(
    conn: sa.Connection,
    job_id: int,
    name: str,
    target: job_spec.Definition,
    *,
    restart: bool,
    actor: str | None,
    rollback_of: int | None = None,
) -> Revised:
    """Make ``target`` the job's next revision (the job row is locked by the caller)."""
    previous, current = _current(conn, job_id)
    job_spec.check_health_conf(target.conf)
    if (target.env, target.secret_env) != (current.env, current.secret_env):
        job_spec.check_env(conn, target.env, target.secret_env)
    kind = job_views.kind_and_schedule(conn, job_id).kind
    job_spec.check_schedule_kind(kind, target.schedule)
    if target.restart_window_s != current.restart_window_s:
        job_spec.restart_window(kind, target.restart_window_s)  # refuses a window on a batch job
    changed = target.changed_from(current)
    if not changed:
        run_revision = conn.execute(
            sa.select(tables.distribution.c.revision).where(tables.distribution.c.job_id == job_id)
        ).scalar_one()
        return Revised(previous, previous, (), Effect.UNCHANGED, run_revision)
    if _stored(conn, job_id, previous) is None:
        # Created by a release without revisions (a rolling upgrade): keep what it was.
        insert_revision(conn, job_id, previous, current, actor=None)
    revision = previous + 1
    insert_revision(
        conn, job_id, revision, target, actor=actor, changed=changed, rollback_of=rollback_of
    )
    if "schedule" in changed:
        fires.fire_before_change(conn, job_id)  # none of its due fire times is dropped
        fires.close_off_period(conn, job_id)  # stopped: its off period's, recorded
    row = conn.execute(
        _REVISE,
        {
            "job_id": job_id,
            "restart": restart,
            "at_rest": sorted(states.TERMINAL),
            "resource_id": target.resource_id,
            "conf": json.dumps(dict(target.conf)),
            "args": json.dumps(list(target.args)),
            "env": json.dumps(dict(target.env)),
            "secret_env": json.dumps(dict(target.secret_env)),
            "deps_id": target.deps_id,
            "spark_master": target.spark_master,
            "max_restarts": target.max_restarts,
            "restart_window_s": target.restart_window_s,
            "schedule": json.dumps(dict(target.schedule)) if target.schedule else None,
            "revision": revision,
            "previous": previous,
            "may_watch": rollback_of is None,
        },
    ).one_or_none()
    if row is None:
        raise job_spec.JobConflict(f"job {name!r} was revised concurrently; try again")
    p = tables.job_py_files
    conn.execute(sa.delete(p).where(p.c.job_id == job_id))
    if target.py_file_ids:
        conn.execute(
            sa.insert(p),
            [
                {"job_id": job_id, "position": i, "resource_id": rid}
                for i, rid in enumerate(target.py_file_ids)
            ],
        )
    effect = _effect(row)
    detail: dict[str, Any] = {
        "revision": revision,
        "previous": previous,
        "changed": changed,
        "effect": effect.value,
    }
    if rollback_of is not None:
        detail["rollback_of"] = rollback_of
    if row.watch_until is not None:
        detail["watched_until"] = job_views.iso(row.watch_until)
    if row.roll:
        # The generation the roll gave the job, as restart_requested records it: the
        # events alone then tell which generation each claim runs (the chaos checker).
        detail["generation"] = row.generation
        if row.kind == JobKind.BATCH:
            runs.replace_unended(conn, job_id)
            detail["run_id"] = runs.open_run(conn, job_id, row.generation, "manual")
    if "schedule" in changed and (next_fire := fires.reschedule(conn, job_id)) is not None:
        detail["next_fire"] = job_views.iso(next_fire)
    job_events.record(conn, job_id, name, EventKind.REVISED, detail, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)
    return Revised(revision, previous, tuple(changed), effect, row.run_revision, row.watch_until)


def update(
    conn: sa.Connection,
    name: str,
    change: job_spec.Change,
    *,
    restart: bool = False,
    actor: str | None = None,
    auto_rollback: bool | None = None,
    healthy_within_s: float | None = None,
) -> Revised:
    """Make the job's definition with ``change`` applied its next revision.

    Nothing changes (no revision, no event) when the result equals the current one. A
    live streaming job rolls to the new revision (stop, then a claim from it; the same
    checkpoint); a live batch run keeps its revision unless ``restart``; a job at rest
    uses it at its next start. See :class:`Effect`.

    ``auto_rollback`` and ``healthy_within_s`` (None: kept) set the job's auto-rollback
    setting first (no revision by themselves), so the update they come with is watched
    (``scheduler/auto_rollback.py``) when the setting is then on and the update rolls
    the job.
    """
    job_id = job_views.job_id_of(conn, name, lock=True)
    _, current = _current(conn, job_id)
    _set_auto_rollback(conn, job_id, auto_rollback, healthy_within_s)
    return _revise(conn, job_id, name, change.applied_to(current), restart=restart, actor=actor)


def _set_auto_rollback(
    conn: sa.Connection, job_id: int, enabled: bool | None, healthy_within_s: float | None
) -> None:
    """Set the job's auto-rollback setting (the job row is locked by the caller); turning
    it off also ends a watch in progress: nothing is rolled back after that."""
    if enabled is None and healthy_within_s is None:
        return
    job_spec.check_auto_rollback(
        job_views.kind_and_schedule(conn, job_id).kind, enabled, healthy_within_s
    )
    j = tables.jobs
    values: dict[str, Any] = {}
    if enabled is not None:
        values["auto_rollback"] = enabled
    if healthy_within_s is not None:
        values["healthy_within_s"] = float(healthy_within_s)
    if enabled is False:
        values.update(watch_revision=None, watch_fallback=None, watch_since=None, watch_until=None)
    if conn.execute(sa.update(j).where(j.c.id == job_id).values(**values)).rowcount != 1:
        raise job_spec.JobNotFound(f"no job with id {job_id}")


def revise(
    conn: sa.Connection,
    name: str,
    definition: job_spec.Definition,
    *,
    restart: bool = False,
    actor: str | None = None,
    auto_rollback: bool | None = None,
    healthy_within_s: float | None = None,
) -> Revised:
    """Make ``definition``, as a whole, the job's next revision (``sparkring apply``);
    applied as :func:`update` is, auto-rollback setting included."""
    job_id = job_views.job_id_of(conn, name, lock=True)
    _set_auto_rollback(conn, job_id, auto_rollback, healthy_within_s)
    return _revise(conn, job_id, name, definition, restart=restart, actor=actor)


def set_label(conn: sa.Connection, name: str, label: str | None) -> bool:
    """Mark the job as defined by the spec file of ``label``; True if it changed."""
    return bool(
        conn.execute(
            sa.update(tables.jobs)
            .where(tables.jobs.c.name == name, tables.jobs.c.label.is_distinct_from(label))
            .values(label=label, updated_at=sa.func.now())
        ).rowcount
    )


def rollback(
    conn: sa.Connection,
    name: str,
    to: int | None = None,
    *,
    restart: bool = False,
    actor: str | None = None,
) -> Revised:
    """Make revision ``to`` (default: the one before the current) the job's next
    revision: history only grows, so a rollback is itself a revision. Applied to the
    run as :func:`update` is."""
    job_id = job_views.job_id_of(conn, name, lock=True)
    current, _ = _current(conn, job_id)
    if to is None:
        if current == 1:
            raise job_spec.JobConflict(f"job {name!r} has only revision 1: nothing to roll back to")
        to = current - 1
    definition = _stored(conn, job_id, to) if 0 < to <= current else None
    if definition is None:
        raise job_spec.JobConflict(
            f"job {name!r} has no revision {to} (its revisions: 1 to {current})"
        )
    return _revise(conn, job_id, name, definition, restart=restart, actor=actor, rollback_of=to)


_HISTORY = """
    SELECT r.revision, r.created_at, r.created_by, r.changed, r.rollback_of, r.conf, r.args,
           r.env, r.secret_env, r.spark_master,
           (SELECT jsonb_build_object('id', dr.id, 'name', dr.name, 'version', dr.version,
                                      'sha256', dr.sha256, 'filename', dr.filename)
              FROM resources dr WHERE dr.id = r.deps_id) AS deps,
           r.max_restarts, r.restart_window_s, r.schedule,
           jsonb_build_object('id', res.id, 'name', res.name, 'version', res.version,
                              'sha256', res.sha256, 'filename', res.filename) AS resource,
           COALESCE((SELECT jsonb_agg(jsonb_build_object(
                         'id', pr.id, 'name', pr.name, 'version', pr.version,
                         'sha256', pr.sha256, 'filename', pr.filename) ORDER BY p.position)
                       FROM job_revision_py_files p JOIN resources pr ON pr.id = p.resource_id
                      WHERE p.job_id = r.job_id AND p.revision = r.revision),
                    '[]'::jsonb) AS py_files
      FROM job_revisions r
      JOIN resources res ON res.id = r.resource_id
"""


def _revision_view(row: sa.Row) -> dict[str, Any]:
    return {
        "revision": row.revision,
        "created_at": row.created_at,
        "created_by": row.created_by,
        "changed": row.changed,
        "rollback_of": row.rollback_of,
        "resource": row.resource,
        "py_files": row.py_files,
        "conf": row.conf,
        "args": row.args,
        "env": row.env,
        "secret_env": row.secret_env,
        "deps": row.deps,
        "spark_master": row.spark_master,
        "max_restarts": row.max_restarts,
        "restart_window_s": row.restart_window_s,
        "schedule": row.schedule,
    }


def revision_definition(conn: sa.Connection, job_id: int, revision: int) -> dict[str, Any] | None:
    """What a driver of ``revision`` is started from (resource and py_files with their
    file names, conf, args, spark_master, max_restarts), or None if no such revision is
    kept (a job made by a release without revisions: its job row is the definition)."""
    row = conn.execute(
        sa.text(_HISTORY + " WHERE r.job_id = :job_id AND r.revision = :revision"),
        {"job_id": job_id, "revision": revision},
    ).one_or_none()
    return None if row is None else _revision_view(row)


def reference(resource: Mapping[str, Any]) -> str:
    """An artifact as ``NAME:VERSION``."""
    return f"{resource['name']}:{resource['version']}"


def window_text(seconds: float | None) -> str:
    """A restart window as ``job show`` and ``history`` print it."""
    if seconds is None:
        return "(none)"
    if seconds == 0:
        return "none"
    return format_duration(seconds)


def describe_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The differences between two revisions (:func:`history` entries), one line each,
    artifacts by ``NAME:VERSION``, conf key by key."""
    lines = []
    if reference(before["resource"]) != reference(after["resource"]):
        lines.append(f"resource {reference(before['resource'])} -> {reference(after['resource'])}")
    old_py = ",".join(reference(r) for r in before["py_files"]) or "(none)"
    new_py = ",".join(reference(r) for r in after["py_files"]) or "(none)"
    if old_py != new_py:
        lines.append(f"py_files {old_py} -> {new_py}")
    lines += _pair_changes("conf", before["conf"], after["conf"])
    if list(before["args"]) != list(after["args"]):
        lines.append(f"args {shlex.join(before['args'])!r} -> {shlex.join(after['args'])!r}")
    lines += _pair_changes("env", before.get("env") or {}, after.get("env") or {})
    old_deps, new_deps = before.get("deps"), after.get("deps")
    if (old_deps and reference(old_deps)) != (new_deps and reference(new_deps)):
        lines.append(
            f"requirements {reference(old_deps) if old_deps else '(none)'} -> "
            f"{reference(new_deps) if new_deps else '(none)'}"
        )
    lines += _pair_changes(
        "secret_env", before.get("secret_env") or {}, after.get("secret_env") or {}
    )
    if before["spark_master"] != after["spark_master"]:
        lines.append(
            f"master {before['spark_master'] or '(server default)'} -> "
            f"{after['spark_master'] or '(server default)'}"
        )
    if before["max_restarts"] != after["max_restarts"]:
        lines.append(f"max_restarts {before['max_restarts']} -> {after['max_restarts']}")
    old_window, new_window = before.get("restart_window_s"), after.get("restart_window_s")
    if old_window != new_window:
        lines.append(f"restart_window {window_text(old_window)} -> {window_text(new_window)}")
    old_schedule, new_schedule = (
        schedule_text(before.get("schedule")),
        schedule_text(after.get("schedule")),
    )
    if old_schedule != new_schedule:
        lines.append(f"schedule {old_schedule} -> {new_schedule}")
    return lines


def _pair_changes(field: str, old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """Key by key: conf and ``env`` values (not secret), ``secret_env`` secret names."""
    lines = []
    for key in sorted(set(old) | set(new)):
        if key not in new:
            lines.append(f"{field} {key} unset (was {old[key]!r})")
        elif key not in old:
            lines.append(f"{field} {key}={new[key]!r} added")
        elif old[key] != new[key]:
            lines.append(f"{field} {key} {old[key]!r} -> {new[key]!r}")
    return lines


def schedule_text(value: Mapping[str, Any] | None) -> str:
    """A schedule as revisions compare it: its spec and policies (not whether it is on)."""
    if not value:
        return "(none)"
    return (
        f"{value['spec']!r} {value['timezone']}, misfire {value['misfire']} "
        f"(grace {float(value['misfire_grace_s']):g} s), concurrency {value['concurrency']}"
    )


def history(conn: sa.Connection, name: str) -> list[dict[str, Any]]:
    """Every revision of the job, oldest first, each with ``diff`` (its differences from
    the revision before it), ``current`` (the job's definition now) and ``running``
    (the revision of the run its owner holds now, if any)."""
    job = conn.execute(
        sa.text(
            """
            SELECT j.id, j.revision, d.revision AS run_revision, d.owner
              FROM jobs j JOIN distribution d ON d.job_id = j.id WHERE j.name = :name
            """
        ),
        {"name": name},
    ).one_or_none()
    if job is None:
        raise job_spec.JobNotFound(f"no job named {name!r}")
    rows = conn.execute(
        sa.text(_HISTORY + " WHERE r.job_id = :job_id ORDER BY r.revision"), {"job_id": job.id}
    ).all()
    out: list[dict[str, Any]] = []
    for row in rows:
        entry = _revision_view(row)
        before = out[-1] if out and out[-1]["revision"] == row.revision - 1 else None
        entry["diff"] = describe_changes(before, entry) if before else []
        entry["current"] = row.revision == job.revision
        entry["running"] = job.owner is not None and row.revision == job.run_revision
        out.append(entry)
    return out
