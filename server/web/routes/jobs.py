"""Jobs: reads (list, show, events, revisions, runs) and the commands of ``sparkring
job`` (create, start, stop, restart, run, backfill, update, rollback, delete), each one
transaction through ``scheduler.jobs``."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from resource_center import catalog
from resource_center import errors as resource_errors
from scheduler import fires, job_spec, job_views, jobs, runs, schedule, tokens
from scheduler import job_events as event_log
from scheduler import job_revisions as revision_log
from scheduler.schedule import Concurrency, Misfire
from server.web import auth, contract, dependencies
from sql.states import JobKind, RunState

# How many fire times a job's page lists.
NEXT_FIRES = 5

# A run's state, as ``job runs --state`` takes it.
RunsState = StrEnum("RunsState", {state.upper(): state for state in runs.STATES})
# A schedule's SPEC, zone and grace: short text (the command checks each, 400 naming it).
Spec = Annotated[str, Field(max_length=256, pattern=contract.TEXT_PATTERN)]
Zone = Annotated[str, Field(max_length=64, pattern=contract.TEXT_PATTERN)]
Duration = Annotated[str, Field(max_length=32, pattern=contract.TEXT_PATTERN)]


class ScheduleFields(BaseModel):
    """A batch job's schedule, as ``job create`` and ``job update`` take it
    (docs/schedules.md)."""

    schedule: Spec | None = Field(
        None, description="Batch jobs: a cron SPEC, '@every 5m', '@daily'... (schedules.md)."
    )
    timezone: Zone | None = Field(None, description="IANA zone of the cron fields (UTC).")
    misfire: Misfire | None = Field(None, description="run-once (default) or skip.")
    misfire_grace: Duration | None = Field(None, description="A duration, e.g. 30m (1h).")
    concurrency: Concurrency | None = Field(None, description="forbid (default) or replace.")

    def policies(self) -> tuple[Any, ...]:
        return (self.schedule, self.timezone, self.misfire, self.misfire_grace, self.concurrency)

    def schedule_over(self, current: Any = None) -> dict[str, Any] | None:
        """The schedule these fields give over ``current`` (400 naming the problem)."""
        try:
            return schedule.from_options(
                self.schedule,
                timezone=self.timezone,
                misfire=self.misfire,
                misfire_grace=self.misfire_grace,
                concurrency=self.concurrency,
                current=current,
            )
        except schedule.ScheduleError as exc:
            raise contract.ApiError(400, str(exc)) from None
        except OverflowError:
            raise contract.ApiError(400, "the schedule's period or grace is too long") from None


class JobCreate(ScheduleFields):
    """A new job, as ``sparkring job create`` takes it."""

    # max_retries is a batch job's name for max_restarts: only with kind batch, and
    # never with max_restarts too (job_spec.restart_budget refuses both with a 400).
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "if": {"required": ["max_retries"], "properties": {"max_retries": {"type": "integer"}}},
            "then": {
                "required": ["kind"],
                "properties": {"kind": {"const": "batch"}, "max_restarts": {"type": "null"}},
            },
        },
    )

    name: str = Field(
        pattern=contract.NAME_PATTERN, description=f"Unique job name: {contract.NAME_RULE}."
    )
    resource: contract.BodyReference = Field(
        description="Main artifact as NAME (latest, pinned now) or NAME:VERSION."
    )
    kind: JobKind = JobKind.STREAMING
    py_files: list[contract.BodyReference] = Field(
        default_factory=list, description="Extra artifacts, in order."
    )
    conf: contract.Conf = Field(default_factory=dict, description="Spark conf.")
    args: list[contract.Text] = Field(
        default_factory=list, description="Arguments passed to the job."
    )
    env: contract.Env = Field(
        default_factory=dict,
        description="The driver's environment variables (not SPARKRING_*, PYSPARK_PYTHON, "
        "PYSPARK_DRIVER_PYTHON, SPARK_LOCAL_IP: 400). Stored and shown: a credential goes "
        "in secret_env.",
    )
    secret_env: contract.SecretEnv = Field(
        default_factory=dict,
        description="Variables whose value is a secret's (variable -> secret name; an "
        "unknown secret: 400). Only the job's driver gets the values.",
    )
    deps: contract.BodyReference | None = Field(
        None,
        description="The packages the job imports: a deps artifact NAME[:VERSION], as "
        "'sparkring resource build-deps REQUIREMENTS' prints it (docs/dependencies.md).",
    )
    spark_master: contract.Text | None = None
    max_restarts: contract.Budget | None = Field(
        None,
        description="Restarts after the driver fails (exits nonzero) before the job is "
        "FAILED. Default: 3 for streaming, 0 for batch.",
    )
    max_retries: contract.Budget | None = Field(
        None,
        description="Batch jobs: the same budget under its batch name (give one of the two: "
        "with max_retries, kind is batch and max_restarts is left out).",
    )
    restart_window_s: contract.Window | None = Field(
        None,
        description="Streaming jobs: only crashes inside a window of this many seconds "
        "count against max_restarts; 0: every crash since the last start. Default: 3600 "
        "for streaming; a batch job takes none (400).",
    )
    auto_rollback: bool = Field(
        False,
        description="Streaming jobs (a batch job: 400): watch every later update that rolls "
        "the running job, and roll it back to the revision before it if it crashes, stalls "
        "or is not healthy within healthy_within_s (docs/jobs.md).",
    )
    healthy_within_s: contract.HealthyWithin | None = Field(
        None,
        description="Auto-rollback: how long an update is watched, seconds (default 300). "
        "Healthy: by then the new revision's driver runs and completed a micro-batch.",
    )


class JobUpdate(ScheduleFields):
    """A new revision, as ``sparkring job update`` takes it: fields left out are kept."""

    model_config = ConfigDict(extra="forbid")

    resource: contract.BodyReference | None = Field(
        None, description="Main artifact NAME or NAME:VERSION."
    )
    py_files: list[contract.BodyReference] | None = Field(
        None, description="Replaces the list ([] clears it)."
    )
    conf: contract.Conf = Field(default_factory=dict, description="Keys set (others kept).")
    unset_conf: list[contract.Text] = Field(
        default_factory=list, description="Conf keys removed (each must be set, and not in conf)."
    )
    args: list[contract.Text] | None = Field(None, description="Replaces every argument.")
    env: contract.Env = Field(default_factory=dict, description="Variables set (others kept).")
    unset_env: list[contract.EnvName] = Field(
        default_factory=list, description="Variables removed (each must be set, and not in env)."
    )
    secret_env: contract.SecretEnv = Field(
        default_factory=dict, description="Secret variables set (variable -> secret name)."
    )
    unset_secret_env: list[contract.EnvName] = Field(
        default_factory=list, description="Secret variables removed (each must be set)."
    )
    deps: contract.BodyReference | None = Field(
        None, description="New dependencies: a deps artifact NAME[:VERSION]."
    )
    no_deps: bool = Field(False, description="Remove the job's dependencies.")
    spark_master: contract.Text | None = Field(None, description="'' = the server's default.")
    max_restarts: contract.Budget | None = None
    restart_window_s: contract.Window | None = Field(
        None, description="Streaming jobs: the restart window in seconds (0: none)."
    )
    restart: bool = Field(False, description="Also restart a running batch job now.")
    schedule: Spec | None = Field(None, description="A new SPEC (policies not given kept).")
    no_schedule: bool = Field(False, description="Remove the schedule (switches it off).")
    auto_rollback: bool | None = Field(
        None,
        description="The job's auto-rollback setting: true watches this update (and every "
        "later one that rolls the running job); false turns it off and ends a watch in "
        "progress. Makes no revision by itself. Left out: kept.",
    )
    healthy_within_s: contract.HealthyWithin | None = Field(
        None, description="Auto-rollback: how long an update is watched, seconds. Left out: kept."
    )


# The fire times a backfill may name: PostgreSQL's timestamptz holds them, and a year
# past 9998 would overflow the schedule's arithmetic.
EARLIEST = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
LATEST = datetime.datetime(9000, 1, 1, tzinfo=datetime.UTC)


class Backfill(BaseModel):
    """``job backfill``: the fire times in [from, to] (ISO-8601 with an offset)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    start: AwareDatetime = Field(
        alias="from", description="First fire time considered (ISO-8601 with an offset)."
    )
    end: AwareDatetime = Field(
        alias="to", description="Last fire time considered (ISO-8601 with an offset)."
    )
    dry_run: bool = Field(False, description="Only list the times that would be queued.")


class JobRollback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: int | None = Field(
        None, ge=1, le=contract.INTEGER_MAX, description="Revision to restore (default: previous)."
    )
    restart: bool = Field(False, description="Also restart a running batch job now.")


router = APIRouter(tags=["jobs"], responses=contract.errors(*contract.READ))
viewer = Depends(auth.reader)
operator = Depends(auth.writer)
API = contract.API
# A read of one job, and a command on one (each can find no such job).
one = contract.errors(404, 422)
command = contract.errors(*contract.WRITE, 404)

# ---------------------------------------------------------------- reads


@router.get(f"{API}/jobs", responses=contract.errors(422))
def list_jobs(
    backend: dependencies.AppBackend,
    principal: auth.Caller = viewer,
    state: Annotated[RunState | None, Query(description="Run state.")] = None,
    desired: Annotated[Literal["running", "stopped"] | None, Query()] = None,
    kind: Annotated[JobKind | None, Query()] = None,
    owner: Annotated[
        str | None,
        Query(max_length=256, pattern=contract.TEXT_PATTERN, description="Owning server."),
    ] = None,
    q: Annotated[
        str | None,
        Query(max_length=128, pattern=contract.TEXT_PATTERN, description="Part of the name."),
    ] = None,
    limit: contract.PageSize = 100,
    offset: Annotated[int, Query(ge=0, le=contract.BIGINT_MAX)] = 0,
) -> Response:
    """Jobs by name, filtered and paged: ``total`` counts every match."""
    f = job_views.Filter(
        state=state.value if state else None,
        desired=desired,
        kind=kind.value if kind else None,
        owner=owner,
        search=q or None,
    )
    with backend.engine.connect() as conn:
        total, page = job_views.page(conn, f, limit=limit, offset=offset)
    # Encoded in one pass (the hot path of the console): a 1,000-job page is ~1 MB.
    body = {
        "total": total,
        "limit": limit,
        "offset": offset,
        "jobs": [job.as_json() for job in page],
    }
    return Response(json.dumps(body, default=contract.default), media_type="application/json")


@router.get(f"{API}/jobs/{{name}}", responses=one)
def show_job(
    name: contract.JobName, backend: dependencies.AppBackend, principal: auth.Caller = viewer
) -> dict[str, Any]:
    """The job in full (``job show --json``); a job with an active schedule also
    has ``next_fires``, its next five fire times."""
    with backend.engine.connect() as conn:
        job = job_views.show(conn, name)
    return contract.plain({**job.as_json(), "next_fires": _next_fires(job.schedule)})


@router.get(f"{API}/jobs/{{name}}/events", responses=one)
def job_events(
    name: contract.JobName,
    backend: dependencies.AppBackend,
    principal: auth.Caller = viewer,
    limit: contract.PageSize = 100,
) -> list[dict[str, Any]]:
    """The job's newest events, oldest first; ``detail.by`` names who asked. A 404
    once no job has the name: a deleted job's history stays in ``/api/v1/events``
    and ``sparkring job events NAME``."""
    with backend.engine.connect() as conn:
        job_views.job_id_of(conn, name)
        return contract.plain(event_log.events(conn, name, limit))


@router.get(f"{API}/jobs/{{name}}/runs", responses=one)
def job_runs(
    name: contract.JobName,
    backend: dependencies.AppBackend,
    principal: auth.Caller = viewer,
    limit: contract.PageSize = 20,
    state: Annotated[RunsState | None, Query(description="Only runs in this state.")] = None,
) -> list[dict[str, Any]]:
    """The job's runs, newest first (``job runs``; docs/schedules.md)."""
    with backend.engine.connect() as conn:
        job_id = job_views.job_id_of(conn, name)
        return contract.plain(
            runs.list_runs(conn, job_id, limit=limit, state=state.value if state else None)
        )


# ---------------------------------------------------------------- commands


def _artifact(backend: dependencies.Backend, reference: str) -> catalog.Resource:
    """An artifact a body names. One that does not exist is a 409: a 404 from
    ``/jobs/<name>/revisions`` would say the job is missing (Schemathesis' stateful
    phase read it so: 'created resource not found')."""
    try:
        return catalog.resolve(backend.engine, reference)
    except resource_errors.UnknownResource as exc:
        raise contract.ApiError(409, str(exc)) from None


job = f"{API}/jobs/{{name}}"
by_name = {"name": "$response.body#/name"}


@router.post(
    f"{API}/jobs",
    status_code=201,
    responses={
        **contract.errors(*contract.WRITE, 409),
        **contract.linked(
            201,
            show=("GET", job, by_name),
            start=("POST", f"{job}/start", by_name),
            stop=("POST", f"{job}/stop", by_name),
            revisions=("GET", f"{job}/revisions", by_name),
            events=("GET", f"{job}/events", by_name),
            logs=("GET", f"{job}/logs", by_name),
            runs=("GET", f"{job}/runs", by_name),
            run=("POST", f"{job}/run", by_name),
            backfill=("POST", f"{job}/backfill", by_name),
            delete=("DELETE", job, by_name),
        ),
    },
)
def create_job(
    body: JobCreate, backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> dict[str, Any]:
    """Define a job (stopped); artifact versions are pinned now."""
    conf = {k: str(v) for k, v in body.conf.items()}
    the_schedule = body.schedule_over()
    main = _artifact(backend, body.resource)
    extra = [_artifact(backend, ref) for ref in body.py_files]
    deps = _artifact(backend, body.deps) if body.deps else None
    with backend.engine.begin() as conn:
        job_id = jobs.create(
            conn,
            job_spec.JobSpec(
                name=body.name,
                kind=body.kind,
                resource_id=main.id,
                py_file_ids=[r.id for r in extra],
                conf=conf,
                args=body.args,
                env=body.env,
                secret_env=body.secret_env,
                deps_id=deps.id if deps else None,
                spark_master=body.spark_master,
                max_restarts=job_spec.restart_budget(
                    body.kind, body.max_restarts, body.max_retries
                ),
                restart_window_s=body.restart_window_s,
                auto_rollback=body.auto_rollback,
                healthy_within_s=body.healthy_within_s,
                schedule=the_schedule,
            ),
            actor=principal.actor,
        )
        return contract.plain(job_views.get(conn, job_id).as_json())


def _command(
    backend: dependencies.Backend,
    name: str,
    action: Callable[..., str],
    principal: tokens.Principal,
) -> dict:
    with backend.engine.begin() as conn:
        outcome = action(conn, name, actor=principal.actor)
    return {"job": name, "outcome": outcome}


@router.post(f"{job}/start", responses=command)
def start_job(
    name: contract.JobName, backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> dict[str, str]:
    """Run the job (idempotent). ``outcome``: started, resumed or already running."""
    return _command(backend, name, jobs.start, principal)


@router.post(f"{job}/stop", responses=command)
def stop_job(
    name: contract.JobName, backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> dict[str, str]:
    """Stop the job gracefully (idempotent). ``outcome``: stopping, stopped or
    already stopped."""
    return _command(backend, name, jobs.stop, principal)


@router.post(f"{job}/restart", responses=command)
def restart_job(
    name: contract.JobName, backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> dict[str, str]:
    """Stop the current driver and run the job again (a new generation)."""
    return _command(backend, name, jobs.restart, principal)


@router.post(f"{job}/run", responses=contract.errors(*contract.WRITE, 404, 409))
def run_job(
    name: contract.JobName, backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> dict[str, Any]:
    """Run a batch job once now, outside its schedule (``job run``); 409 while a
    run is in progress."""
    with backend.engine.begin() as conn:
        return {"job": name, "run_id": jobs.run_now(conn, name, actor=principal.actor)}


@router.post(f"{job}/backfill", responses=contract.errors(*contract.WRITE, 404, 409))
def backfill_job(
    name: contract.JobName,
    body: Backfill,
    backend: dependencies.AppBackend,
    principal: auth.Caller = operator,
) -> dict[str, Any]:
    """Queue each fire time of the schedule in [from, to] that never ran (no run,
    or recorded skipped), oldest first (``job backfill``); ``queued``: the times
    (with dry_run: that would be), ``already``: those that have a run. 409 for a
    job without a schedule; 400 for a range out of order, outside 1970-9000 or
    holding more than 1,000 fire times (what OpenAPI cannot state: the command
    refuses it, naming the field)."""
    for field, at in (("from", body.start), ("to", body.end)):
        if not EARLIEST <= at <= LATEST:
            raise contract.ApiError(400, f"{field}: {at.isoformat()} is not between 1970 and 9000")
    if body.end < body.start:
        raise contract.ApiError(400, "to: is before from")
    with backend.engine.begin() as conn:
        try:
            queued, taken = jobs.backfill(
                conn, name, body.start, body.end, dry_run=body.dry_run, actor=principal.actor
            )
        except fires.ScheduleMissing:
            raise contract.ApiError(409, f"job {name!r} has no schedule") from None
        except runs.RunConflict as exc:
            raise contract.ApiError(409, str(exc)) from None
        except ValueError as exc:
            raise contract.ApiError(400, str(exc)) from None
    return {
        "job": name,
        "queued": [schedule.iso(at) for at in queued],
        "already": [schedule.iso(at) for at in taken],
        "dry_run": body.dry_run,
    }


@router.get(f"{job}/revisions", responses=one)
def job_revisions(
    name: contract.JobName, backend: dependencies.AppBackend, principal: auth.Caller = viewer
) -> list[dict[str, Any]]:
    """Every revision of the job, oldest first, with ``diff`` from the one before,
    ``current`` and ``running`` marked (docs/jobs.md)."""
    with backend.engine.connect() as conn:
        return contract.plain(revision_log.history(conn, name))


@router.post(f"{job}/revisions", responses=contract.errors(*contract.WRITE, 404, 409))
def update_job(
    name: contract.JobName,
    body: JobUpdate,
    backend: dependencies.AppBackend,
    principal: auth.Caller = operator,
) -> dict:
    """Make a new revision (``job update``). ``effect``: unchanged (no revision was
    made), rolling, next claim, kept (a running batch run) or at rest.
    ``watched_until``: the deadline of the auto-rollback watch it started, if any."""
    new_schedule = None
    given = any(p is not None for p in body.policies())
    if body.no_schedule and given:
        raise contract.ApiError(400, "no_schedule excludes schedule and its policies")
    if given:
        with backend.engine.connect() as conn:
            current = job_views.show(conn, name).schedule
        kept = {k: v for k, v in (current or {}).items() if k not in ("active", "next_fire")}
        new_schedule = body.schedule_over(kept)
    main = _artifact(backend, body.resource) if body.resource else None
    extra = [_artifact(backend, ref) for ref in body.py_files or []]
    deps = _artifact(backend, body.deps) if body.deps else None
    change = job_spec.Change(
        resource_id=main.id if main is not None else None,
        py_file_ids=None if body.py_files is None else [r.id for r in extra],
        conf=body.conf,
        unset_conf=body.unset_conf,
        args=body.args,
        env=body.env,
        unset_env=body.unset_env,
        secret_env=body.secret_env,
        unset_secret_env=body.unset_secret_env,
        deps_id=deps.id if deps else None,
        clear_deps=body.no_deps,
        spark_master=body.spark_master,
        max_restarts=body.max_restarts,
        restart_window_s=body.restart_window_s,
        schedule=new_schedule,
        clear_schedule=body.no_schedule,
    )
    with backend.engine.begin() as conn:
        revised = revision_log.update(
            conn,
            name,
            change,
            restart=body.restart,
            actor=principal.actor,
            auto_rollback=body.auto_rollback,
            healthy_within_s=body.healthy_within_s,
        )
    return _revised(name, revised)


@router.post(f"{job}/rollback", responses=contract.errors(*contract.WRITE, 404, 409))
def rollback_job(
    name: contract.JobName,
    body: JobRollback,
    backend: dependencies.AppBackend,
    principal: auth.Caller = operator,
) -> dict:
    """Make an earlier revision current again, as a new revision (``job rollback``)."""
    with backend.engine.begin() as conn:
        revised = revision_log.rollback(
            conn, name, body.to, restart=body.restart, actor=principal.actor
        )
    return _revised(name, revised)


@router.delete(job, responses=contract.errors(*contract.WRITE, 404, 409))
def delete_job(
    name: contract.JobName, backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> dict[str, str]:
    """Delete a stopped job (its events are kept)."""
    with backend.engine.begin() as conn:
        jobs.delete(conn, name, actor=principal.actor)
    return {"job": name, "outcome": "deleted"}


def _revised(name: str, revised: Any) -> dict[str, Any]:
    return {
        "job": name,
        "revision": revised.revision,
        "previous": revised.previous,
        "changed": list(revised.changed),
        "effect": revised.effect.value,
        "run_revision": revised.run_revision,
        # The deadline of the auto-rollback watch this update started (None: unwatched).
        "watched_until": contract.plain(revised.watched_until),
    }


def _next_fires(value: dict[str, Any] | None) -> list[str]:
    """The next fire times of an active schedule (ISO-8601 UTC), from its next fire."""
    if not value or not value.get("active") or not value.get("next_fire"):
        return []
    the_schedule = schedule.Schedule.from_dict(value)
    start = datetime.datetime.fromisoformat(str(value["next_fire"]).replace("Z", "+00:00"))
    found = []
    for slot in schedule.slots(the_schedule, start):
        if not slot.gap:
            found.append(schedule.iso(slot.at))
        if len(found) == NEXT_FIRES:
            break
    return found
