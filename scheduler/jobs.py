"""The job catalog: definitions and operator commands (create, update, rollback, start,
stop, restart, delete).

Commands change the *desired* state (``jobs.desired``) and, where no server owns the
job, the run state directly; an owning server reacts to the desired state itself (see
``server/runner.py``). Each command is a guarded statement, so concurrent or duplicate
commands are safe: two ``start`` commands racing on a stopped job make exactly one
generation, the second finds the job already pending and does nothing (at most one start
per generation). Every command appends to ``job_events`` and NOTIFYs the cluster.
One restart is asked by the job's owner rather than an operator: ``restart_run`` (a
stalled run, ``server/health.py``) is fenced like an owner write (owner, incarnation,
epoch) and spends the restart budget a crash spends.

Revisions: a job's definition (main artifact and --py-files pinned to versions, conf,
args, master, max_restarts) is numbered. ``create`` makes revision 1; ``update`` and
``rollback`` add the next one (``job_revisions``) and copy it into the job row, which is
always the current revision. A claim records the revision its run starts from
(``distribution.revision``, ``scheduler/distribution.py``). A new revision of a live
streaming job (wanted running, not at rest) bumps the generation in the same statement,
so its owner stops the driver and the job is claimed again from the new revision: the
same fenced stop-then-start as ``restart``. A live batch job keeps running its revision
unless the caller asks for the restart.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from scheduler import distribution, fires, health_policy, notify, run_health, runs, secrets
from scheduler.schedule import ScheduleError, format_duration, parse_duration
from sql import states, tables
from sql.states import EventKind, JobKind, RunState

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

# Restarts after the job's own driver failed (exited nonzero), per kind, when the
# command gives none: a streaming job is restarted (its checkpoint makes a restart
# safe); a batch job is retried only when asked (``--max-retries``): whether running a
# batch again after it failed half-way is safe, only its author knows. One column,
# ``jobs.max_restarts``, holds both: a batch job's retries are its restarts.
DEFAULT_MAX_RESTARTS: dict[JobKind, int] = {JobKind.STREAMING: 3, JobKind.BATCH: 0}
# A streaming job is FAILED only when more than max_restarts crashes fall inside one
# window of this many seconds (scheduler/distribution.py IN_WINDOW): a crash a month ago
# does not count against one today. An hour: a crash loop (restarts 10-60 s apart with
# backoff) still ends FAILED within minutes; a job that crashes once a day runs for
# ever. 0: every crash since the last start counts. A batch job's retries are counted
# per run, so it has none.
DEFAULT_RESTART_WINDOW_S = 3600.0
MAX_RESTART_WINDOW_S = 366 * 86400.0  # a year: longer is "no window" (0)
# Auto-rollback (scheduler/auto_rollback.py): how long an update of a job with the
# setting on is watched when the command gives no --healthy-within: five minutes, room
# for a Spark cold start (40-90 s here) and a few micro-batches. At most a week.
DEFAULT_HEALTHY_WITHIN_S = 300.0
MAX_HEALTHY_WITHIN_S = 7 * 86400.0


class JobError(Exception):
    """An operator command cannot be done; the message says why in one line."""


class JobNotFound(JobError):
    """No job has that name (the HTTP API answers 404)."""


class JobConflict(JobError):
    """The command clashes with the job's current state or name (the HTTP API: 409)."""


class RestartBudgetSpent(JobConflict):
    """An automatic restart was refused: the run's ``restarts`` reached ``max_restarts``."""


@dataclass(frozen=True)
class JobSpec:
    name: str
    kind: JobKind
    resource_id: int
    py_file_ids: Sequence[int] = ()
    conf: Mapping[str, str] = field(default_factory=dict)
    args: Sequence[str] = ()
    # The driver's environment variables, and those it gets from secrets (variable ->
    # secret name, scheduler/secrets.py).
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict)
    # The zip of the packages it imports (resource_center/deps.py); None: none.
    deps_id: int | None = None
    spark_master: str | None = None
    # None: the kind's default (DEFAULT_MAX_RESTARTS). For a batch job: its retries.
    max_restarts: int | None = None
    # None: the kind's default (DEFAULT_RESTART_WINDOW_S for streaming, 0 for batch).
    restart_window_s: float | None = None
    label: str | None = None  # the spec file's label (sparkring apply)
    # A batch job's schedule (scheduler/schedule.py ``Schedule.as_dict``); None: none.
    schedule: Mapping[str, Any] | None = None
    # Watch every update that rolls the job (streaming only; scheduler/auto_rollback.py)
    # for ``healthy_within_s`` (None: DEFAULT_HEALTHY_WITHIN_S).
    auto_rollback: bool = False
    healthy_within_s: float | None = None


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


def parse_window(text: str) -> float:
    """A restart window as typed (``--restart-window``, a spec's ``restart_window``): a
    duration such as ``1h`` or ``30m``, or ``0`` for none."""
    if text.strip() in ("0", "0s"):
        return 0.0
    try:
        return parse_duration(text)
    except ScheduleError as exc:
        raise JobError(str(exc)) from None


def parse_healthy_within(text: str) -> float:
    """An auto-rollback deadline as typed (``--healthy-within``, a spec's
    ``healthy_within``): a duration such as ``5m``; refused out of range."""
    try:
        seconds = parse_duration(text)
    except ScheduleError as exc:
        raise JobError(str(exc)) from None
    check_auto_rollback(JobKind.STREAMING, None, seconds)
    return seconds


def restart_window(kind: JobKind | str, seconds: float | None) -> float:
    """The ``restart_window_s`` a job of ``kind`` gets: the default for None; a window
    on a batch job, or a negative one, is refused by name."""
    kind = JobKind(kind)
    if seconds is None:
        return DEFAULT_RESTART_WINDOW_S if kind is JobKind.STREAMING else 0.0
    if not 0 <= seconds <= MAX_RESTART_WINDOW_S:
        raise JobError(
            f"--restart-window must be 0 (none) to {MAX_RESTART_WINDOW_S:g} s (a year), "
            f"not {seconds:g} s"
        )
    if kind is JobKind.BATCH and seconds > 0:
        raise JobError(
            "--restart-window is for streaming jobs: a batch job's retries are counted per run"
        )
    return float(seconds)


def check_auto_rollback(
    kind: JobKind | str, enabled: bool | None, healthy_within_s: float | None
) -> None:
    """Refuse auto-rollback on a batch job (a batch run that ends is not a revision that
    proved unhealthy: its retries are the remedy) and a deadline out of range, by name."""
    if enabled and JobKind(kind) is not JobKind.STREAMING:
        raise JobError(
            "--auto-rollback is for streaming jobs: a batch run is retried "
            "(--max-retries), and 'job rollback' undoes its update by hand"
        )
    if healthy_within_s is not None and not 0 < healthy_within_s <= MAX_HEALTHY_WITHIN_S:
        raise JobError(
            "--healthy-within must be more than 0 and at most "
            f"{format_duration(MAX_HEALTHY_WITHIN_S)}, not {healthy_within_s:g} s"
        )


def parse_conf(pairs: Sequence[str]) -> dict[str, str]:
    """``K=V`` strings to a dict; a malformed pair is refused by name."""
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise JobError(f"--conf {pair!r} is not KEY=VALUE")
        conf[key.strip()] = value
    return conf


def parse_env(pairs: Sequence[str], option: str) -> dict[str, str]:
    """``--env`` or ``--secret-env`` pairs to a dict; refused by name (never a value)."""
    try:
        return secrets.parse_pairs(pairs, option)
    except secrets.SecretError as exc:
        raise JobError(str(exc)) from None


# A revision's fields, in the order history and diffs name them.
FIELDS = (
    "resource",
    "py_files",
    "conf",
    "args",
    "env",
    "secret_env",
    "requirements",
    "master",
    "max_restarts",
    "restart_window",
    "schedule",
)


@dataclass(frozen=True)
class Definition:
    """One revision of a job: what its driver is started from, and its restart budget."""

    resource_id: int
    py_file_ids: tuple[int, ...] = ()
    conf: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict)
    deps_id: int | None = None
    spark_master: str | None = None
    max_restarts: int = 3
    restart_window_s: float = DEFAULT_RESTART_WINDOW_S
    schedule: Mapping[str, Any] | None = None  # Schedule.as_dict(); None: unscheduled

    @classmethod
    def of(cls, spec: JobSpec) -> Definition:
        return cls(
            resource_id=spec.resource_id,
            py_file_ids=tuple(spec.py_file_ids),
            conf=dict(spec.conf),
            args=tuple(spec.args),
            env=dict(spec.env),
            secret_env=dict(spec.secret_env),
            deps_id=spec.deps_id,
            spark_master=spec.spark_master,
            max_restarts=restart_budget(spec.kind, spec.max_restarts),
            restart_window_s=restart_window(spec.kind, spec.restart_window_s),
            schedule=dict(spec.schedule) if spec.schedule else None,
        )

    def changed_from(self, before: Definition) -> list[str]:
        """The names (of :data:`FIELDS`) of the fields that differ from ``before``."""
        pairs = {
            "resource": (self.resource_id, before.resource_id),
            "py_files": (tuple(self.py_file_ids), tuple(before.py_file_ids)),
            "conf": (dict(self.conf), dict(before.conf)),
            "args": (tuple(self.args), tuple(before.args)),
            "env": (dict(self.env), dict(before.env)),
            "secret_env": (dict(self.secret_env), dict(before.secret_env)),
            "requirements": (self.deps_id, before.deps_id),
            "master": (self.spark_master, before.spark_master),
            "max_restarts": (self.max_restarts, before.max_restarts),
            "restart_window": (self.restart_window_s, before.restart_window_s),
            "schedule": (self.schedule, before.schedule),
        }
        return [name for name in FIELDS if pairs[name][0] != pairs[name][1]]


@dataclass(frozen=True)
class Change:
    """What ``job update`` changes; a field left ``None`` stays as it is."""

    resource_id: int | None = None
    py_file_ids: Sequence[int] | None = None  # replaces the list; () clears it
    conf: Mapping[str, str] = field(default_factory=dict)  # keys set (others kept)
    unset_conf: Sequence[str] = ()  # keys removed
    args: Sequence[str] | None = None  # replaces the list; () clears it
    env: Mapping[str, str] = field(default_factory=dict)  # variables set (others kept)
    unset_env: Sequence[str] = ()  # variables removed
    secret_env: Mapping[str, str] = field(default_factory=dict)  # variable -> secret name
    unset_secret_env: Sequence[str] = ()
    deps_id: int | None = None  # new dependencies (a deps zip's resource id)
    clear_deps: bool = False  # --no-requirements
    spark_master: str | None = None  # "" = back to the server's SPARKRING_SPARK_MASTER
    max_restarts: int | None = None
    restart_window_s: float | None = None
    schedule: Mapping[str, Any] | None = None  # a new schedule (Schedule.as_dict())
    clear_schedule: bool = False  # --no-schedule

    def applied_to(self, current: Definition) -> Definition:
        """``current`` with this change; a key to unset that is not set is refused."""
        if self.max_restarts is not None and self.max_restarts < 0:
            raise JobError("--max-restarts must be 0 or more")
        if self.restart_window_s is not None and not (
            0 <= self.restart_window_s <= MAX_RESTART_WINDOW_S
        ):
            raise JobError(
                f"--restart-window must be 0 (none) to {MAX_RESTART_WINDOW_S:g} s (a year), "
                f"not {self.restart_window_s:g} s"
            )
        conf = _merged(current.conf, self.conf, self.unset_conf, "conf key")
        env = _merged(current.env, self.env, self.unset_env, "--env variable")
        secret_env = _merged(
            current.secret_env, self.secret_env, self.unset_secret_env, "--secret-env variable"
        )
        if self.clear_schedule and self.schedule is not None:
            raise JobError("give --schedule or --no-schedule, not both")
        if self.clear_deps and self.deps_id is not None:
            raise JobError("give --requirements or --no-requirements, not both")
        deps_id = None if self.clear_deps else (self.deps_id or current.deps_id)
        schedule = current.schedule
        if self.clear_schedule:
            schedule = None
        elif self.schedule is not None:
            schedule = dict(self.schedule)
        master = current.spark_master
        if self.spark_master is not None:
            master = self.spark_master or None
        return Definition(
            resource_id=current.resource_id if self.resource_id is None else self.resource_id,
            py_file_ids=(
                current.py_file_ids if self.py_file_ids is None else tuple(self.py_file_ids)
            ),
            conf=conf,
            args=current.args if self.args is None else tuple(self.args),
            env=env,
            secret_env=secret_env,
            deps_id=deps_id,
            spark_master=master,
            max_restarts=current.max_restarts if self.max_restarts is None else self.max_restarts,
            restart_window_s=(
                current.restart_window_s
                if self.restart_window_s is None
                else float(self.restart_window_s)
            ),
            schedule=schedule,
        )


def _merged(
    current: Mapping[str, str], setting: Mapping[str, str], unsetting: Sequence[str], what: str
) -> dict[str, str]:
    """``current`` with ``setting`` set and ``unsetting`` removed (``--conf`` and
    ``--unset-conf``, ``--env`` and ``--unset-env``, the secret ones); a key to unset that
    is not set is refused, naming ``what`` it is."""
    merged = dict(current)
    for key in unsetting:
        if key in setting:
            raise JobError(f"{what} {key!r} is both set and unset")
        if merged.pop(key, None) is None:
            raise JobConflict(f"{what} {key!r} is not set, so it cannot be unset")
    merged.update(setting)
    return merged


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


def _insert_revision(
    conn: sa.Connection,
    job_id: int,
    revision: int,
    definition: Definition,
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


def _check_health_conf(conf: Mapping[str, str]) -> None:
    try:
        health_policy.check(conf)
    except health_policy.PolicyError as exc:
        raise JobError(str(exc)) from None


def _check_env(conn: sa.Connection, env: Mapping[str, str], secret_env: Mapping[str, str]) -> None:
    """Refuse variables a job may not set and secrets that do not exist, by name."""
    try:
        secrets.check_env(env, secret_env)
    except secrets.SecretError as exc:
        raise JobError(str(exc)) from None
    absent = secrets.missing(conn, secret_env.values())
    if absent:
        raise JobError(
            f"no secret named {', '.join(map(repr, absent))} "
            "(create it first: sparkring secret create NAME --from-file FILE)"
        )


def create(conn: sa.Connection, spec: JobSpec, actor: str | None = None) -> int:
    """Define a job (desired stopped). Its distribution row is created with it."""
    if not NAME.match(spec.name):
        raise JobError(
            f"job name {spec.name!r} must be 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    max_restarts = restart_budget(spec.kind, spec.max_restarts)
    window = restart_window(spec.kind, spec.restart_window_s)
    check_auto_rollback(spec.kind, spec.auto_rollback, spec.healthy_within_s)
    _check_health_conf(spec.conf)
    _check_env(conn, spec.env, spec.secret_env)
    _check_schedule_kind(spec.kind, spec.schedule)
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
                DEFAULT_HEALTHY_WITHIN_S
                if spec.healthy_within_s is None
                else float(spec.healthy_within_s)
            ),
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
    _insert_revision(conn, inserted, 1, Definition.of(spec), actor=actor)
    _event(conn, inserted, spec.name, EventKind.CREATED, {"kind": JobKind(spec.kind).value}, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, spec.name)
    return inserted


def _check_schedule_kind(kind: JobKind | str, schedule: Mapping[str, Any] | None) -> None:
    if schedule is not None and JobKind(kind) is not JobKind.BATCH:
        raise JobError("a schedule is for batch jobs; a streaming job runs until stopped")


def _rerun(conn: sa.Connection, job_id: int) -> int | None:
    """Terminal (stopped, finished, failed) and unowned -> pending with a new generation."""
    return runs.rerun(conn, job_id)


def _kind_and_schedule(conn: sa.Connection, job_id: int) -> sa.Row:
    return conn.execute(
        sa.select(tables.jobs.c.kind, tables.jobs.c.schedule).where(tables.jobs.c.id == job_id)
    ).one()


def start(conn: sa.Connection, name: str, actor: str | None = None) -> str:
    """Ask for the job to run. Returns what happened: 'started', 'resumed' or 'already running'.

    A stopped, finished or failed job gets a new generation and becomes pending. A job
    still stopping after a stop command is simply wanted again (its owner releases it
    to pending instead of stopped). A job already wanted running is left alone, which is
    what makes a double click harmless.
    """
    job_id = _job_id(conn, name, lock=True)
    job = _kind_and_schedule(conn, job_id)
    if job.schedule is not None:
        next_fire = fires.switch_on(conn, job_id)
        if next_fire is None:
            return "schedule already on"
        at = _iso(next_fire)
        _event(
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
    _event(conn, job_id, name, EventKind.START_REQUESTED, detail, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)
    return outcome


def stop(conn: sa.Connection, name: str, actor: str | None = None) -> str:
    """Ask for the job to stop. Returns 'stopping', 'stopped', 'stopped (failed: no
    driver runs)' (or finished) or 'already stopped'.

    Without an owner the run state goes straight to stopped; with one, the owner stops
    its driver gracefully and releases the job as stopped.
    """
    job_id = _job_id(conn, name, lock=True)
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
    _event(conn, job_id, name, EventKind.STOP_REQUESTED, {}, actor)
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
    job_id = _job_id(conn, name, lock=True)
    batch = _kind_and_schedule(conn, job_id).kind == JobKind.BATCH
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
    # driver failures since the last reset (tests/chaos/invariants.py).
    detail: dict[str, Any] = {"generation": generation, "rerun": outcome == "started"}
    if reset:
        detail["retries_reset"] = True
    if batch:
        detail["run_id"] = runs.open_run(conn, job_id, generation, "manual")
    _event(conn, job_id, name, EventKind.RESTART_REQUESTED, detail, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)
    return outcome


def run_now(conn: sa.Connection, name: str, actor: str | None = None) -> int:
    """``job run``: one run of a batch job now, outside its schedule (if any). Refused
    while a run is in progress. Returns the run id."""
    job_id = _job_id(conn, name, lock=True)
    if _kind_and_schedule(conn, job_id).kind != JobKind.BATCH:
        raise JobError(f"job {name!r} is a streaming job: job run is for batch jobs")
    generation = _rerun(conn, job_id)
    if generation is None:
        raise JobConflict(f"job {name!r} has a run in progress; wait for it or stop it")
    run_id = runs.open_run(conn, job_id, generation, "manual")
    detail = {"generation": generation, "run_id": run_id, "trigger": "manual"}
    _event(conn, job_id, name, EventKind.START_REQUESTED, detail, actor)
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
    job_id = _job_id(conn, name, lock=True)
    queued, taken = fires.backfill(conn, job_id, start, end, dry_run=dry_run)
    if queued and not dry_run:
        detail = {
            "trigger": "backfill",
            "from": _iso(start),
            "to": _iso(end),
            "queued": len(queued),
            "first": _iso(queued[0]),
            "last": _iso(queued[-1]),
            "already_recorded": len(taken),
        }
        _event(conn, job_id, name, EventKind.START_REQUESTED, detail, actor)
    return queued, taken


def job_id_of(conn: sa.Connection, name: str) -> int:
    """The id of the job named ``name`` (JobNotFound if none)."""
    return _job_id(conn, name)


def _iso(at: Any) -> str | None:
    return None if at is None else at.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


# A restart asked by the run's own owner (the health monitor's restart on stall): fenced
# like an owner write, and paid from the restart budget crashes use. The job row is
# locked first (module docstring of scheduler/distribution.py); the distribution row is
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
        raise JobNotFound(f"no job with id {job_id}")
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
        raise RestartBudgetSpent(
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


def _current(conn: sa.Connection, job_id: int) -> tuple[int, Definition]:
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
    return row.revision, Definition(
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


def _stored(conn: sa.Connection, job_id: int, revision: int) -> Definition | None:
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
    return Definition(
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
    target: Definition,
    *,
    restart: bool,
    actor: str | None,
    rollback_of: int | None = None,
) -> Revised:
    """Make ``target`` the job's next revision (the job row is locked by the caller)."""
    previous, current = _current(conn, job_id)
    _check_health_conf(target.conf)
    if (target.env, target.secret_env) != (current.env, current.secret_env):
        _check_env(conn, target.env, target.secret_env)
    kind = _kind_and_schedule(conn, job_id).kind
    _check_schedule_kind(kind, target.schedule)
    if target.restart_window_s != current.restart_window_s:
        restart_window(kind, target.restart_window_s)  # refuses a window on a batch job
    changed = target.changed_from(current)
    if not changed:
        run_revision = conn.execute(
            sa.select(tables.distribution.c.revision).where(tables.distribution.c.job_id == job_id)
        ).scalar_one()
        return Revised(previous, previous, (), Effect.UNCHANGED, run_revision)
    if _stored(conn, job_id, previous) is None:
        # Created by a release without revisions (a rolling upgrade): keep what it was.
        _insert_revision(conn, job_id, previous, current, actor=None)
    revision = previous + 1
    _insert_revision(
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
        raise JobConflict(f"job {name!r} was revised concurrently; try again")
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
        detail["watched_until"] = _iso(row.watch_until)
    if row.roll:
        # The generation the roll gave the job, as restart_requested records it: the
        # events alone then tell which generation each claim runs (the chaos checker).
        detail["generation"] = row.generation
        if row.kind == JobKind.BATCH:
            runs.replace_unended(conn, job_id)
            detail["run_id"] = runs.open_run(conn, job_id, row.generation, "manual")
    if "schedule" in changed and (next_fire := fires.reschedule(conn, job_id)) is not None:
        detail["next_fire"] = _iso(next_fire)
    _event(conn, job_id, name, EventKind.REVISED, detail, actor)
    notify.notify(conn, notify.JOBS_CHANNEL, name)
    return Revised(revision, previous, tuple(changed), effect, row.run_revision, row.watch_until)


def update(
    conn: sa.Connection,
    name: str,
    change: Change,
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
    job_id = _job_id(conn, name, lock=True)
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
    check_auto_rollback(_kind_and_schedule(conn, job_id).kind, enabled, healthy_within_s)
    j = tables.jobs
    values: dict[str, Any] = {}
    if enabled is not None:
        values["auto_rollback"] = enabled
    if healthy_within_s is not None:
        values["healthy_within_s"] = float(healthy_within_s)
    if enabled is False:
        values.update(watch_revision=None, watch_fallback=None, watch_since=None, watch_until=None)
    if conn.execute(sa.update(j).where(j.c.id == job_id).values(**values)).rowcount != 1:
        raise JobNotFound(f"no job with id {job_id}")


def revise(
    conn: sa.Connection,
    name: str,
    definition: Definition,
    *,
    restart: bool = False,
    actor: str | None = None,
    auto_rollback: bool | None = None,
    healthy_within_s: float | None = None,
) -> Revised:
    """Make ``definition``, as a whole, the job's next revision (``sparkring apply``);
    applied as :func:`update` is, auto-rollback setting included."""
    job_id = _job_id(conn, name, lock=True)
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
    job_id = _job_id(conn, name, lock=True)
    current, _ = _current(conn, job_id)
    if to is None:
        if current == 1:
            raise JobConflict(f"job {name!r} has only revision 1: nothing to roll back to")
        to = current - 1
    definition = _stored(conn, job_id, to) if 0 < to <= current else None
    if definition is None:
        raise JobConflict(f"job {name!r} has no revision {to} (its revisions: 1 to {current})")
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


def run_definition(conn: sa.Connection, job_id: int, revision: int | None) -> dict[str, Any]:
    """The job as a run of ``revision`` is started from: its listing (:func:`get`) with
    the revision's definition over it, or the job row alone when ``revision`` is None or
    not kept. Raises JobNotFound."""
    job = get(conn, job_id)
    if revision is not None:
        job = {**job, **(revision_definition(conn, job_id, revision) or {})}
    return job


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
        raise JobNotFound(f"no job named {name!r}")
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
            {**row.schedule, "active": row.schedule_active, "next_fire": _iso(row.next_fire_at)}
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
                    "since": _iso(row.watch_since),
                    "until": _iso(row.watch_until),
                }
            ),
        },
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
