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
from scheduler import jobs
from server.web import auth, contract, tokens
from sql.states import JobKind, RunState

if TYPE_CHECKING:
    from server.web import api

# Largest page of jobs (or events) one request returns.
MAX_PAGE = 1000


class JobCreate(BaseModel):
    """A new job, as ``sparkring job create`` takes it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Unique job name.")
    resource: str = Field(description="Main artifact as NAME (latest, pinned now) or NAME:VERSION.")
    kind: JobKind = JobKind.STREAMING
    py_files: list[str] = Field(default_factory=list, description="Extra artifacts, in order.")
    conf: dict[str, str] = Field(default_factory=dict, description="Spark conf.")
    args: list[str] = Field(default_factory=list, description="Arguments passed to the job.")
    spark_master: str | None = None
    max_restarts: int | None = Field(
        None,
        ge=0,
        description="Restarts after the driver fails (exits nonzero) before the job is "
        "FAILED. Default: 3 for streaming, 0 for batch.",
    )
    max_retries: int | None = Field(
        None,
        ge=0,
        description="Batch jobs: the same budget under its batch name (give one of the two).",
    )


class JobUpdate(BaseModel):
    """A new revision, as ``sparkring job update`` takes it: fields left out are kept."""

    model_config = ConfigDict(extra="forbid")

    resource: str | None = Field(None, description="Main artifact NAME or NAME:VERSION.")
    py_files: list[str] | None = Field(None, description="Replaces the list ([] clears it).")
    conf: dict[str, str] = Field(default_factory=dict, description="Keys set (others kept).")
    unset_conf: list[str] = Field(default_factory=list, description="Conf keys removed.")
    args: list[str] | None = Field(None, description="Replaces every argument.")
    spark_master: str | None = Field(None, description="'' = the server's default.")
    max_restarts: int | None = Field(None, ge=0)
    restart: bool = Field(False, description="Also restart a running batch job now.")


class JobRollback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: int | None = Field(None, ge=1, description="Revision to restore (default: previous).")
    restart: bool = Field(False, description="Also restart a running batch job now.")


def router(backend: api.Backend, authenticator: auth.Authenticator) -> APIRouter:
    routes = APIRouter(tags=["jobs"])
    viewer = Depends(authenticator.reader)
    operator = Depends(authenticator.writer)
    API = contract.API

    # ---------------------------------------------------------------- reads

    @routes.get(f"{API}/jobs")
    def list_jobs(
        principal: auth.Caller = viewer,
        state: Annotated[RunState | None, Query(description="Run state.")] = None,
        desired: Annotated[Literal["running", "stopped"] | None, Query()] = None,
        kind: Annotated[JobKind | None, Query()] = None,
        owner: Annotated[str | None, Query(description="Owning server.")] = None,
        q: Annotated[str | None, Query(max_length=128, description="Part of the name.")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
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

    @routes.get(f"{API}/jobs/{{name}}")
    def show_job(name: str, principal: auth.Caller = viewer) -> dict[str, Any]:
        with backend.engine.connect() as conn:
            return contract.plain(jobs.show(conn, name))

    @routes.get(f"{API}/jobs/{{name}}/events")
    def job_events(
        name: str,
        principal: auth.Caller = viewer,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    ) -> list[dict[str, Any]]:
        """The job's newest events, oldest first; ``detail.by`` names who asked."""
        with backend.engine.connect() as conn:
            return contract.plain(jobs.events(conn, name, limit))

    # ---------------------------------------------------------------- commands

    @routes.post(f"{API}/jobs", status_code=201)
    def create_job(body: JobCreate, principal: auth.Caller = operator) -> dict[str, Any]:
        """Define a job (stopped); artifact versions are pinned now."""
        conf = {k: str(v) for k, v in body.conf.items()}
        main = catalog.resolve(backend.engine, body.resource)
        extra = [catalog.resolve(backend.engine, ref) for ref in body.py_files]
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

    @routes.post(f"{API}/jobs/{{name}}/start")
    def start_job(name: str, principal: auth.Caller = operator) -> dict[str, str]:
        """Run the job (idempotent). ``outcome``: started, resumed or already running."""
        return _command(name, jobs.start, principal)

    @routes.post(f"{API}/jobs/{{name}}/stop")
    def stop_job(name: str, principal: auth.Caller = operator) -> dict[str, str]:
        """Stop the job gracefully (idempotent). ``outcome``: stopping, stopped or
        already stopped."""
        return _command(name, jobs.stop, principal)

    @routes.post(f"{API}/jobs/{{name}}/restart")
    def restart_job(name: str, principal: auth.Caller = operator) -> dict[str, str]:
        """Stop the current driver and run the job again (a new generation)."""
        return _command(name, jobs.restart, principal)

    @routes.get(f"{API}/jobs/{{name}}/revisions")
    def job_revisions(name: str, principal: auth.Caller = viewer) -> list[dict[str, Any]]:
        """Every revision of the job, oldest first, with ``diff`` from the one before,
        ``current`` and ``running`` marked (docs/jobs.md)."""
        with backend.engine.connect() as conn:
            return contract.plain(jobs.history(conn, name))

    @routes.post(f"{API}/jobs/{{name}}/revisions")
    def update_job(name: str, body: JobUpdate, principal: auth.Caller = operator) -> dict:
        """Make a new revision (``job update``). ``effect``: unchanged (no revision was
        made), rolling, next claim, kept (a running batch run) or at rest."""
        main = catalog.resolve(backend.engine, body.resource) if body.resource else None
        extra = [catalog.resolve(backend.engine, ref) for ref in body.py_files or []]
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

    @routes.post(f"{API}/jobs/{{name}}/rollback")
    def rollback_job(name: str, body: JobRollback, principal: auth.Caller = operator) -> dict:
        """Make an earlier revision current again, as a new revision (``job rollback``)."""
        with backend.engine.begin() as conn:
            revised = jobs.rollback(
                conn, name, body.to, restart=body.restart, actor=principal.actor
            )
        return _revised(name, revised)

    @routes.delete(f"{API}/jobs/{{name}}")
    def delete_job(name: str, principal: auth.Caller = operator) -> dict[str, str]:
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
