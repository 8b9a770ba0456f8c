"""Jobs: reads (list, show, events, revisions) and the commands of ``sparkring job``
(create, start, stop, restart, update, rollback, delete), each one transaction through
``scheduler.jobs``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from resource_center import catalog
from resource_center import errors as resource_errors
from scheduler import jobs
from server.web import auth, contract, tokens
from sql.states import JobKind, RunState

if TYPE_CHECKING:
    from server.web import api

# Largest page of jobs (or events) one request returns.
MAX_PAGE = 1000


class JobCreate(BaseModel):
    """A new job, as ``sparkring job create`` takes it."""

    # max_retries is a batch job's name for max_restarts: only with kind batch, and
    # never with max_restarts too (jobs.restart_budget refuses both with a 400).
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


class JobUpdate(BaseModel):
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
    spark_master: contract.Text | None = Field(None, description="'' = the server's default.")
    max_restarts: contract.Budget | None = None
    restart: bool = Field(False, description="Also restart a running batch job now.")


class JobRollback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: int | None = Field(
        None, ge=1, le=contract.INTEGER_MAX, description="Revision to restore (default: previous)."
    )
    restart: bool = Field(False, description="Also restart a running batch job now.")


def router(backend: api.Backend, authenticator: auth.Authenticator) -> APIRouter:
    routes = APIRouter(tags=["jobs"], responses=contract.errors(*contract.READ))
    viewer = Depends(authenticator.reader)
    operator = Depends(authenticator.writer)
    API = contract.API
    # A read of one job, and a command on one (each can find no such job).
    one = contract.errors(404, 422)
    command = contract.errors(*contract.WRITE, 404)

    # ---------------------------------------------------------------- reads

    @routes.get(f"{API}/jobs", responses=contract.errors(422))
    def list_jobs(
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
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        offset: Annotated[int, Query(ge=0, le=contract.BIGINT_MAX)] = 0,
    ) -> Response:
        """Jobs by name, filtered and paged: ``total`` counts every match."""
        f = jobs.Filter(
            state=state.value if state else None,
            desired=desired,
            kind=kind.value if kind else None,
            owner=owner,
            search=q or None,
        )
        with backend.engine.connect() as conn:
            total, page = jobs.page(conn, f, limit=limit, offset=offset)
        # Encoded in one pass (the hot path of the console): a 1,000-job page is ~1 MB.
        body = {"total": total, "limit": limit, "offset": offset, "jobs": page}
        return Response(json.dumps(body, default=contract.default), media_type="application/json")

    @routes.get(f"{API}/jobs/{{name}}", responses=one)
    def show_job(name: contract.JobName, principal: auth.Caller = viewer) -> dict[str, Any]:
        with backend.engine.connect() as conn:
            return contract.plain(jobs.show(conn, name))

    @routes.get(f"{API}/jobs/{{name}}/events", responses=one)
    def job_events(
        name: contract.JobName,
        principal: auth.Caller = viewer,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    ) -> list[dict[str, Any]]:
        """The job's newest events, oldest first; ``detail.by`` names who asked."""
        with backend.engine.connect() as conn:
            return contract.plain(jobs.events(conn, name, limit))

    # ---------------------------------------------------------------- commands

    def _artifact(reference: str) -> catalog.Resource:
        """An artifact a body names. One that does not exist is a 409: a 404 from
        ``/jobs/<name>/revisions`` would say the job is missing (Schemathesis' stateful
        phase read it so: 'created resource not found')."""
        try:
            return catalog.resolve(backend.engine, reference)
        except resource_errors.UnknownResource as exc:
            raise contract.ApiError(409, str(exc)) from None

    job = f"{API}/jobs/{{name}}"
    by_name = {"name": "$response.body#/name"}

    @routes.post(
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
                delete=("DELETE", job, by_name),
            ),
        },
    )
    def create_job(body: JobCreate, principal: auth.Caller = operator) -> dict[str, Any]:
        """Define a job (stopped); artifact versions are pinned now."""
        conf = {k: str(v) for k, v in body.conf.items()}
        main = _artifact(body.resource)
        extra = [_artifact(ref) for ref in body.py_files]
        with backend.engine.begin() as conn:
            job_id = jobs.create(
                conn,
                jobs.JobSpec(
                    name=body.name,
                    kind=body.kind,
                    resource_id=main.id,
                    py_file_ids=[r.id for r in extra],
                    conf=conf,
                    args=body.args,
                    spark_master=body.spark_master,
                    max_restarts=jobs.restart_budget(
                        body.kind, body.max_restarts, body.max_retries
                    ),
                ),
                actor=principal.actor,
            )
            return contract.plain(jobs.get(conn, job_id))

    def _command(name: str, action: Callable[..., str], principal: tokens.Principal) -> dict:
        with backend.engine.begin() as conn:
            outcome = action(conn, name, actor=principal.actor)
        return {"job": name, "outcome": outcome}

    @routes.post(f"{job}/start", responses=command)
    def start_job(name: contract.JobName, principal: auth.Caller = operator) -> dict[str, str]:
        """Run the job (idempotent). ``outcome``: started, resumed or already running."""
        return _command(name, jobs.start, principal)

    @routes.post(f"{job}/stop", responses=command)
    def stop_job(name: contract.JobName, principal: auth.Caller = operator) -> dict[str, str]:
        """Stop the job gracefully (idempotent). ``outcome``: stopping, stopped or
        already stopped."""
        return _command(name, jobs.stop, principal)

    @routes.post(f"{job}/restart", responses=command)
    def restart_job(name: contract.JobName, principal: auth.Caller = operator) -> dict[str, str]:
        """Stop the current driver and run the job again (a new generation)."""
        return _command(name, jobs.restart, principal)

    @routes.get(f"{job}/revisions", responses=one)
    def job_revisions(
        name: contract.JobName, principal: auth.Caller = viewer
    ) -> list[dict[str, Any]]:
        """Every revision of the job, oldest first, with ``diff`` from the one before,
        ``current`` and ``running`` marked (docs/jobs.md)."""
        with backend.engine.connect() as conn:
            return contract.plain(jobs.history(conn, name))

    @routes.post(f"{job}/revisions", responses=contract.errors(*contract.WRITE, 404, 409))
    def update_job(
        name: contract.JobName, body: JobUpdate, principal: auth.Caller = operator
    ) -> dict:
        """Make a new revision (``job update``). ``effect``: unchanged (no revision was
        made), rolling, next claim, kept (a running batch run) or at rest."""
        main = _artifact(body.resource) if body.resource else None
        extra = [_artifact(ref) for ref in body.py_files or []]
        change = jobs.Change(
            resource_id=main.id if main is not None else None,
            py_file_ids=None if body.py_files is None else [r.id for r in extra],
            conf=body.conf,
            unset_conf=body.unset_conf,
            args=body.args,
            spark_master=body.spark_master,
            max_restarts=body.max_restarts,
        )
        with backend.engine.begin() as conn:
            revised = jobs.update(conn, name, change, restart=body.restart, actor=principal.actor)
        return _revised(name, revised)

    @routes.post(f"{job}/rollback", responses=contract.errors(*contract.WRITE, 404, 409))
    def rollback_job(
        name: contract.JobName, body: JobRollback, principal: auth.Caller = operator
    ) -> dict:
        """Make an earlier revision current again, as a new revision (``job rollback``)."""
        with backend.engine.begin() as conn:
            revised = jobs.rollback(
                conn, name, body.to, restart=body.restart, actor=principal.actor
            )
        return _revised(name, revised)

    @routes.delete(job, responses=contract.errors(*contract.WRITE, 404, 409))
    def delete_job(name: contract.JobName, principal: auth.Caller = operator) -> dict[str, str]:
        """Delete a stopped job (its events are kept)."""
        with backend.engine.begin() as conn:
            jobs.delete(conn, name, actor=principal.actor)
        return {"job": name, "outcome": "deleted"}

    return routes


def _revised(name: str, revised: Any) -> dict[str, Any]:
    return {
        "job": name,
        "revision": revised.revision,
        "previous": revised.previous,
        "changed": list(revised.changed),
        "effect": revised.effect.value,
        "run_revision": revised.run_revision,
    }
