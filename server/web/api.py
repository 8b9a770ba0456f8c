"""The HTTP interface of a server: the REST API under ``/api/v1``, the web console,
``/healthz``, ``/metrics`` and ``/logs/<job>``, as one FastAPI application.

Every server serves all of it and any server answers any request: reads come from
PostgreSQL (jobs, events, targets, owners, the coordinator's row) and from this
server's ZooKeeper view of the live members; writes call the same ``scheduler.jobs``
functions as the CLI, in one transaction each, so every guarded statement holds.

Open: ``/healthz`` (compose and load-balancer probes), ``/metrics`` (Prometheus
scrapes), the console's static files and the OpenAPI schema. Everything else needs a
bearer token (``server/web/auth.py``): viewers read, operators also write. ``/logs/<job>``
serves only a driver running *here*; ``/api/v1/jobs/{name}/logs`` finds the run
wherever it is (this server, its owner over HTTP with the cluster credential, or the
log shipped to S3).

Errors are JSON ``{"error": "<one line>"}`` with the CLI's message and a 4xx code
(404 unknown, 409 conflict, 400/422 bad input, 401/403 auth); an unexpected exception
is logged here and answered 500 with no detail, never a stack trace.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import logging
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio.from_thread
import anyio.to_thread
import sqlalchemy as sa
from fastapi import Depends, FastAPI, File, Query, Request, Response, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    StreamingResponse,
)
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import exc as sa_exc
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from registry import servers as registry_servers
from resource_center import catalog, store, validation
from resource_center import errors as resource_errors
from scheduler import coordinator, fires, jobs, placement, ring, runs, schedule
from server import defaults, metrics
from server.web import admission, audit, auth, livelog, tokens
from sql.states import JobKind, RunState

log = logging.getLogger(__name__)

API = "/api/v1"
WEB = Path(__file__).resolve().parent / "static"
# Largest page of jobs one request returns.
MAX_PAGE = 1000
# How long the server list waits for a peer's /healthz, seconds.
PEER_HEALTH_TIMEOUT_S = 1.0
# Jobs drawn on the ring picture at most (the picture is for eyes, not for audits).
RING_JOBS_DRAWN = 2000


@dataclasses.dataclass(frozen=True)
class Backend:
    """What the API needs from its server process, as plain callables."""

    server_id: str
    engine: sa.Engine
    status: Callable[[], tuple[bool, dict[str, Any]]]
    members: Callable[[], dict[str, registry_servers.ServerInfo]]
    log_file: Callable[[str], Path | None]
    # (the job as jobs.show returns it, epoch, lines) -> the tail of that run's log
    # shipped to S3, or None.
    shipped_log: Callable[[dict[str, Any], int, int], str | None]
    placement_epsilon: float
    vnodes: int
    bucket: store.Store | None = None  # the resource center (uploads and deletes)
    max_artifact_bytes: int = defaults.MAX_ARTIFACT_BYTES
    max_json_bytes: int = defaults.MAX_JSON_BODY_BYTES
    # What calls to a peer's listener verify it with (server/tls.py); None: the system's
    # trust store.
    peer_tls: ssl.SSLContext | None = None


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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
    schedule: str | None = Field(
        None, description="Batch jobs: a cron SPEC, '@every 5m', '@daily'... (schedules.md)."
    )
    timezone: str | None = Field(None, description="IANA zone of the cron fields (UTC).")
    misfire: str | None = Field(None, description="run-once (default) or skip.")
    misfire_grace: str | None = Field(None, description="A duration, e.g. 30m (1h).")
    concurrency: str | None = Field(None, description="forbid (default) or replace.")


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
    schedule: str | None = Field(None, description="A new SPEC (policies not given kept).")
    no_schedule: bool = Field(False, description="Remove the schedule (switches it off).")
    timezone: str | None = None
    misfire: str | None = None
    misfire_grace: str | None = None
    concurrency: str | None = None


class Backfill(BaseModel):
    """``job backfill``: the fire times in [from, to] (ISO-8601 with an offset)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    start: datetime.datetime = Field(alias="from")
    end: datetime.datetime = Field(alias="to")
    dry_run: bool = False


def _schedule_of(body: JobCreate | JobUpdate, current: Any = None) -> dict[str, Any] | None:
    """The schedule a request gives (400 naming the problem)."""
    try:
        return schedule.from_options(
            body.schedule,
            timezone=body.timezone,
            misfire=body.misfire,
            misfire_grace=body.misfire_grace,
            concurrency=body.concurrency,
            current=current,
        )
    except schedule.ScheduleError as exc:
        raise ApiError(400, str(exc)) from None


class JobRollback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: int | None = Field(None, ge=1, description="Revision to restore (default: previous).")
    restart: bool = Field(False, description="Also restart a running batch job now.")


def _revised(name: str, revised: Any) -> dict[str, Any]:
    return {
        "job": name,
        "revision": revised.revision,
        "previous": revised.previous,
        "changed": list(revised.changed),
        "effect": revised.effect.value,
        "run_revision": revised.run_revision,
    }


def _default(value: Any) -> str:
    """Datetimes in ISO 8601, as ``--json`` prints them; anything else as text."""
    return value.isoformat() if isinstance(value, datetime.datetime) else str(value)


def _json(data: Any) -> Any:
    """Plain JSON values (datetimes as ISO 8601 strings)."""
    return json.loads(json.dumps(data, default=_default))


def create_app(backend: Backend) -> FastAPI:
    app = FastAPI(
        title="sparkring",
        version="1",
        description="HA control plane for PySpark jobs: servers, ring and jobs over HTTP.",
        openapi_url=f"{API}/openapi.json",
        # No browsable page: it would load a third-party script on the console's origin
        # (where the console keeps its token); the schema is enough for any client.
        docs_url=None,
        redoc_url=None,
    )
    authenticator = auth.Authenticator(backend.engine)
    viewer = Depends(authenticator.reader)
    operator = Depends(authenticator.writer)
    _install_error_handlers(app)
    # Inside the request metrics (refusals are counted), before any body is read.
    app.add_middleware(
        admission.Admission,
        authenticator=authenticator,
        max_json_bytes=backend.max_json_bytes,
        max_artifact_bytes=backend.max_artifact_bytes,
    )
    _install_metrics_and_headers(app)

    # ---------------------------------------------------------------- open endpoints

    @app.get("/healthz", tags=["health"], summary="200 while healthy, 503 when not (open).")
    def healthz() -> JSONResponse:
        healthy, body = backend.status()
        return JSONResponse(_counts_only(body), status_code=200 if healthy else 503)

    @app.get("/metrics", tags=["health"], summary="Prometheus metrics (open).")
    def prometheus() -> Response:
        return Response(metrics.REGISTRY.render(), media_type=metrics.CONTENT_TYPE)

    follows = livelog.FollowGate()

    def _streamed(stream: AsyncIterator[bytes], release: Callable[[], None]) -> Response:
        # The release also runs as a background task: a stream never iterated (the
        # client gone before the first byte) gives its place back too.
        return StreamingResponse(
            livelog.gated(stream, release),
            media_type="text/plain",
            background=BackgroundTask(release),
        )

    def _admit(principal: tokens.Principal) -> Callable[[], None]:
        try:
            return follows.admit(principal.name, counted=principal.role != tokens.Role.CLUSTER)
        except livelog.FollowRefused as exc:
            raise ApiError(429, str(exc)) from None

    @app.get("/logs/{job}", tags=["logs"], response_class=PlainTextResponse)
    async def local_log(
        job: str,
        principal: auth.Caller = viewer,
        lines: Annotated[int, Query(ge=0, le=livelog.MAX_LINES)] = 200,
        follow: Annotated[
            bool, Query(description="Stream until the run ends (bounded: see livelog).")
        ] = False,
    ) -> Response:
        """The tail of a driver log of a job running on this server (``lines=0`` with
        ``follow``: only what is written from now on)."""
        path = backend.log_file(job)
        if path is None or not path.exists():
            raise ApiError(404, f"no run of {job} here")
        if follow:
            release = _admit(principal)
            stream = livelog.follow(path, lines, lambda: backend.log_file(job) == path)
            return _streamed(stream, release)
        text = await anyio.to_thread.run_sync(livelog.tail, path, lines)
        return PlainTextResponse(text)

    # ---------------------------------------------------------------- servers + ring

    @app.get(f"{API}/whoami", tags=["auth"])
    def whoami(principal: auth.Caller = viewer) -> dict[str, Any]:
        """The token's name and role (the console's login check)."""
        return {"name": principal.name, "role": principal.role.value, "server": backend.server_id}

    @app.get(f"{API}/servers", tags=["servers"])
    def list_servers(principal: auth.Caller = viewer) -> list[dict[str, Any]]:
        """Live servers: role, capacity, coordinator, drained, load and health."""
        members = backend.members()
        with backend.engine.connect() as conn:
            coordinator_row = conn.execute(
                sa.text("SELECT server, term FROM coordinator WHERE id = 1")
            ).one_or_none()
            drained = set(conn.execute(sa.text("SELECT server FROM drains")).scalars())
            owned = dict(
                conn.execute(
                    sa.text(
                        "SELECT owner, count(*) FROM distribution "
                        "WHERE owner IS NOT NULL GROUP BY owner"
                    )
                ).all()
            )
            targeted = dict(
                conn.execute(
                    sa.text(
                        "SELECT target, count(*) FROM distribution "
                        "WHERE target IS NOT NULL GROUP BY target"
                    )
                ).all()
            )
        health = _health_of(backend, members)
        now = time.time()
        rows = []
        for sid, info in sorted(members.items()):
            healthy, status = health.get(sid, (None, None))
            rows.append(
                {
                    **info.to_dict(),
                    "coordinator": coordinator_row is not None and coordinator_row.server == sid,
                    "term": coordinator_row.term
                    if coordinator_row is not None and coordinator_row.server == sid
                    else None,
                    "draining": sid in drained,
                    "owned": owned.get(sid, 0),
                    "targeted": targeted.get(sid, 0),
                    "uptime_s": round(max(now - info.started_at, 0.0), 3),
                    "healthy": healthy,
                    "status": status,
                }
            )
        return rows

    @app.get(f"{API}/ring", tags=["ring"])
    def show_ring(principal: auth.Caller = viewer) -> dict[str, Any]:
        """The ring: each live server's arcs (fractions of the circle), capacity, load and
        bound, and where wanted-running jobs sit on it."""
        members = backend.members()
        with backend.engine.connect() as conn:
            rows = coordinator.job_rows(conn)
            placeable = coordinator.placeable(conn, {s.id: s.capacity for s in members.values()})
        active = coordinator.active_jobs(rows)
        built = ring.build(sorted(placeable) or sorted(members), backend.vnodes)
        bounds = _bounds(active, placeable, backend)
        targeted = Counter(r.target for r in rows if r.target)
        owned = Counter(r.owner for r in rows if r.owner)
        ids = sorted(set(members) | set(targeted) | set(owned))
        return {
            "vnodes": backend.vnodes,
            "servers": [
                {
                    "server": sid,
                    "live": sid in members,
                    "capacity": members[sid].capacity if sid in members else None,
                    "placeable": sid in placeable,
                    "targeted": targeted.get(sid, 0),
                    "owned": owned.get(sid, 0),
                    "bound": bounds.get(sid),
                }
                for sid in ids
            ],
            "arcs": _arcs(built),
            "jobs": [
                {
                    "name": r.name,
                    "position": ring.position(r.name) / ring.HASH_SPACE,
                    "target": r.target,
                    "owner": r.owner,
                }
                for r in rows
                if r.name in active
            ][:RING_JOBS_DRAWN],
            "pending": sorted(r.name for r in rows if r.pending_reason),
        }

    @app.get(f"{API}/ring/explain/{{job}}", tags=["ring"])
    def explain(job: str, principal: auth.Caller = viewer) -> dict[str, Any]:
        """Why JOB is placed where it is: ring position, candidates walked, overflow."""
        members = backend.members()
        with backend.engine.connect() as conn:
            rows = coordinator.job_rows(conn)
            placeable = coordinator.placeable(conn, {s.id: s.capacity for s in members.values()})
        if job not in {r.name for r in rows}:
            raise ApiError(404, f"no job named {job!r}")
        active = coordinator.active_jobs(rows)
        if job not in active:
            raise ApiError(409, f"job {job!r} is not wanted running, so it has no target")
        e = placement.explain(
            job, active, placeable, epsilon=backend.placement_epsilon, vnodes=backend.vnodes
        )
        return {
            "job": e.job,
            "ring_position": str(e.ring_position),
            "target": e.target,
            "overflowed": e.overflowed,
            "reason": e.reason,
            "candidates": [
                {"server": c.server, "load": c.load, "bound": c.bound} for c in e.candidates
            ],
        }

    # ---------------------------------------------------------------- jobs: reads

    @app.get(f"{API}/jobs", tags=["jobs"])
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
        return Response(json.dumps(body, default=_default), media_type="application/json")

    @app.get(f"{API}/jobs/{{name}}", tags=["jobs"])
    def show_job(name: str, principal: auth.Caller = viewer) -> dict[str, Any]:
        """The job in full (``job show --json``); a job with an active schedule also
        has ``next_fires``, its next five fire times."""
        with backend.engine.connect() as conn:
            job = jobs.show(conn, name)
        return _json({**job, "next_fires": _next_fires(job["schedule"])})

    @app.get(f"{API}/jobs/{{name}}/events", tags=["jobs"])
    def job_events(
        name: str,
        principal: auth.Caller = viewer,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    ) -> list[dict[str, Any]]:
        """The job's newest events, oldest first; ``detail.by`` names who asked."""
        with backend.engine.connect() as conn:
            return _json(jobs.events(conn, name, limit))

    @app.get(f"{API}/jobs/{{name}}/logs", tags=["jobs"], response_class=PlainTextResponse)
    def job_logs(
        name: str,
        principal: auth.Caller = viewer,
        lines: Annotated[int, Query(ge=0, le=livelog.MAX_LINES)] = 200,
        follow: Annotated[
            bool, Query(description="Stream the current run's log until the run ends.")
        ] = False,
    ) -> Response:
        """The driver log of the current run (wherever it runs) or of the last run.
        With ``follow=true`` and a run live, the response streams what the driver writes
        (an asynchronous stream, at most 4 per token and 32 per server; it ends with a
        line saying why: the run ended, idle for 300 s, or open for an hour)."""
        with backend.engine.begin() as conn:
            job = jobs.show(conn, name)
            secret = tokens.cluster_secret(conn)
        if follow and job["owner"] is not None:
            release = _admit(principal)
            stream = anyio.from_thread.run(_follow, backend, job, lines, secret)
            if stream is not None:
                return _streamed(stream, release)
            release()
        text = _live_log(backend, job, lines, secret)
        if text is None:
            for epoch in range(job["epoch"], max(job["epoch"] - 3, 0), -1):
                text = backend.shipped_log(job, epoch, lines)
                if text is not None:
                    break
        if text is None:
            raise ApiError(404, f"job {name} has no driver log yet")
        return PlainTextResponse(text)

    @app.get(f"{API}/events", tags=["jobs"])
    def cluster_events(
        principal: auth.Caller = viewer,
        after: Annotated[int, Query(ge=0, description="Only events with a larger id.")] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    ) -> list[dict[str, Any]]:
        """The cluster's event feed (every job), oldest first; poll with ``after``."""
        with backend.engine.connect() as conn:
            return _json(jobs.recent_events(conn, after, limit))

    @app.get(f"{API}/audit", tags=["auth"])
    def audit_events(
        principal: auth.Caller = viewer,
        after: Annotated[int, Query(ge=0, description="Only events with a larger id.")] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    ) -> list[dict[str, Any]]:
        """The audit trail of writes that are not a job's own (artifact uploads and
        deletes, token creation and revocation), oldest first; poll with ``after``.
        Job writes are job events (``detail.by``)."""
        with backend.engine.connect() as conn:
            return _json(audit.recent(conn, after, limit))

    # ---------------------------------------------------------------- jobs: commands

    @app.post(f"{API}/jobs", tags=["jobs"], status_code=201)
    def create_job(body: JobCreate, principal: auth.Caller = operator) -> dict[str, Any]:
        """Define a job (stopped); artifact versions are pinned now."""
        conf = {k: str(v) for k, v in body.conf.items()}
        the_schedule = _schedule_of(body)
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
                    schedule=the_schedule,
                ),
                actor=principal.actor,
            )
            return _json(jobs.get(conn, job_id))

    def _command(name: str, action: Callable[..., str], principal: tokens.Principal) -> dict:
        with backend.engine.begin() as conn:
            outcome = action(conn, name, actor=principal.actor)
        return {"job": name, "outcome": outcome}

    @app.post(f"{API}/jobs/{{name}}/start", tags=["jobs"])
    def start_job(name: str, principal: auth.Caller = operator) -> dict[str, str]:
        """Run the job (idempotent). ``outcome``: started, resumed or already running."""
        return _command(name, jobs.start, principal)

    @app.post(f"{API}/jobs/{{name}}/stop", tags=["jobs"])
    def stop_job(name: str, principal: auth.Caller = operator) -> dict[str, str]:
        """Stop the job gracefully (idempotent). ``outcome``: stopping, stopped or
        already stopped."""
        return _command(name, jobs.stop, principal)

    @app.post(f"{API}/jobs/{{name}}/restart", tags=["jobs"])
    def restart_job(name: str, principal: auth.Caller = operator) -> dict[str, str]:
        """Stop the current driver and run the job again (a new generation)."""
        return _command(name, jobs.restart, principal)

    @app.post(f"{API}/jobs/{{name}}/run", tags=["jobs"])
    def run_job(name: str, principal: auth.Caller = operator) -> dict[str, Any]:
        """Run a batch job once now, outside its schedule (``job run``); 409 while a
        run is in progress."""
        with backend.engine.begin() as conn:
            return {"job": name, "run_id": jobs.run_now(conn, name, actor=principal.actor)}

    @app.get(f"{API}/jobs/{{name}}/runs", tags=["jobs"])
    def job_runs(
        name: str,
        principal: auth.Caller = viewer,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
        state: str | None = None,
    ) -> list[dict[str, Any]]:
        """The job's runs, newest first (``job runs``; docs/schedules.md)."""
        if state is not None and state not in runs.STATES:
            raise ApiError(400, f"state {state!r} is not one of {', '.join(runs.STATES)}")
        with backend.engine.connect() as conn:
            job_id = jobs.job_id_of(conn, name)
            return _json(runs.list_runs(conn, job_id, limit=limit, state=state))

    @app.post(f"{API}/jobs/{{name}}/backfill", tags=["jobs"])
    def backfill_job(name: str, body: Backfill, principal: auth.Caller = operator) -> dict:
        """Queue each fire time of the schedule in [from, to] once, oldest first
        (``job backfill``); ``queued``: the times (with dry_run: that would be)."""
        if body.start.tzinfo is None or body.end.tzinfo is None:
            raise ApiError(400, "from and to need an offset (e.g. Z)")
        if body.end < body.start:
            raise ApiError(400, "to is before from")
        with backend.engine.begin() as conn:
            try:
                queued, taken = jobs.backfill(
                    conn, name, body.start, body.end, dry_run=body.dry_run, actor=principal.actor
                )
            except fires.ScheduleMissing:
                raise ApiError(409, f"job {name!r} has no schedule") from None
            except ValueError as exc:
                raise ApiError(400, str(exc)) from None
        return {
            "job": name,
            "queued": [schedule.iso(at) for at in queued],
            "already": [schedule.iso(at) for at in taken],
            "dry_run": body.dry_run,
        }

    @app.get(f"{API}/jobs/{{name}}/revisions", tags=["jobs"])
    def job_revisions(name: str, principal: auth.Caller = viewer) -> list[dict[str, Any]]:
        """Every revision of the job, oldest first, with ``diff`` from the one before,
        ``current`` and ``running`` marked (docs/jobs.md)."""
        with backend.engine.connect() as conn:
            return _json(jobs.history(conn, name))

    @app.post(f"{API}/jobs/{{name}}/revisions", tags=["jobs"])
    def update_job(name: str, body: JobUpdate, principal: auth.Caller = operator) -> dict:
        """Make a new revision (``job update``). ``effect``: unchanged (no revision was
        made), rolling, next claim, kept (a running batch run) or at rest."""
        new_schedule = None
        policies = (body.schedule, body.timezone, body.misfire, body.misfire_grace)
        if body.no_schedule and any(p is not None for p in (*policies, body.concurrency)):
            raise ApiError(400, "no_schedule excludes schedule and its policies")
        if any(p is not None for p in (*policies, body.concurrency)):
            with backend.engine.connect() as conn:
                current = jobs.show(conn, name)["schedule"]
            kept = {k: v for k, v in (current or {}).items() if k not in ("active", "next_fire")}
            new_schedule = _schedule_of(body, kept)
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
            schedule=new_schedule,
            clear_schedule=body.no_schedule,
        )
        with backend.engine.begin() as conn:
            revised = jobs.update(conn, name, change, restart=body.restart, actor=principal.actor)
        return _revised(name, revised)

    @app.post(f"{API}/jobs/{{name}}/rollback", tags=["jobs"])
    def rollback_job(name: str, body: JobRollback, principal: auth.Caller = operator) -> dict:
        """Make an earlier revision current again, as a new revision (``job rollback``)."""
        with backend.engine.begin() as conn:
            revised = jobs.rollback(
                conn, name, body.to, restart=body.restart, actor=principal.actor
            )
        return _revised(name, revised)

    @app.delete(f"{API}/jobs/{{name}}", tags=["jobs"])
    def delete_job(name: str, principal: auth.Caller = operator) -> dict[str, str]:
        """Delete a stopped job (its events are kept)."""
        with backend.engine.begin() as conn:
            jobs.delete(conn, name, actor=principal.actor)
        return {"job": name, "outcome": "deleted"}

    # ---------------------------------------------------------------- resources: reads

    @app.get(f"{API}/resources", tags=["resources"])
    def list_resources(principal: auth.Caller = viewer) -> list[dict[str, Any]]:
        """Every artifact version (name, version, sha256, size, file name)."""
        return [_json(dataclasses.asdict(r)) for r in catalog.list_resources(backend.engine)]

    @app.get(f"{API}/resources/{{reference}}", tags=["resources"])
    def show_resource(reference: str, principal: auth.Caller = viewer) -> dict[str, Any]:
        """One artifact version (NAME for the latest, or NAME:VERSION) and its users."""
        resource = catalog.resolve(backend.engine, reference)
        return {
            **_json(dataclasses.asdict(resource)),
            "jobs": catalog.referencing_jobs(backend.engine, resource),
        }

    # ---------------------------------------------------------------- resources: writes

    def _bucket() -> store.Store:
        if backend.bucket is None:
            raise ApiError(503, "this server has no resource center configured")
        return backend.bucket

    @app.post(f"{API}/resources/{{name}}", tags=["resources"], status_code=201)
    def upload_resource(
        name: str,
        file: Annotated[UploadFile, File(description="The artifact (.py, .zip, .egg, .jar).")],
        principal: auth.Caller = operator,
    ) -> dict[str, Any]:
        """Store a file as the next version of NAME (multipart form field ``file``), with
        the validation of ``sparkring resource upload``: name, kind, size, checksum.
        Content already stored under NAME as its latest version is not stored again."""
        validation.check_name(name)
        filename = Path(file.filename or "").name
        if not filename or filename in (".", ".."):
            raise ApiError(400, "the upload has no file name (multipart field 'file')")
        if file.size is not None and file.size > backend.max_artifact_bytes:
            raise ApiError(
                413,
                f"{filename} is {file.size} bytes, above the limit of "
                f"{backend.max_artifact_bytes} (SPARKRING_MAX_ARTIFACT_BYTES)",
            )
        before = {r.id for r in catalog.list_resources(backend.engine, name)}
        with tempfile.TemporaryDirectory(prefix="sparkring-upload-") as folder:
            path = Path(folder) / filename
            with path.open("wb") as out:
                shutil.copyfileobj(file.file, out, 1024 * 1024)
            resource = catalog.upload(
                backend.engine,
                _bucket(),
                name=name,
                path=path,
                max_bytes=backend.max_artifact_bytes,
            )
        created = resource.id not in before
        audit.record_alone(
            backend.engine,
            principal.actor,
            audit.Action.RESOURCE_UPLOADED,
            resource.reference,
            {"sha256": resource.sha256, "size": resource.size, "created": created},
        )
        log.info(
            "resource uploaded over HTTP",
            extra={"action": "upload", "resource": resource.reference, "by": principal.actor},
        )
        return _json(dataclasses.asdict(resource))

    @app.delete(f"{API}/resources/{{reference}}", tags=["resources"])
    def delete_resource(reference: str, principal: auth.Caller = operator) -> dict[str, Any]:
        """Delete NAME:VERSION, or every version of NAME; refused (409, naming the jobs)
        while a job references a version to delete."""
        deleted = catalog.delete(backend.engine, _bucket(), reference)
        audit.record_alone(
            backend.engine,
            principal.actor,
            audit.Action.RESOURCE_DELETED,
            reference,
            {"deleted": [r.reference for r in deleted]},
        )
        return {"deleted": [r.reference for r in deleted]}

    # ---------------------------------------------------------------- the console

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/console/")

    @app.get("/console/", include_in_schema=False)
    def console_index() -> FileResponse:
        return FileResponse(WEB / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/console", StaticFiles(directory=WEB), name="console")
    return app


# -------------------------------------------------------------------- helpers


# How many fire times a job's page lists.
NEXT_FIRES = 5


def _next_fires(value: dict[str, Any] | None) -> list[str]:
    """The next fire times of an active schedule (ISO-8601 UTC), from its next fire."""
    if not value or not value.get("active") or not value.get("next_fire"):
        return []
    the_schedule = schedule.Schedule.from_dict(value)
    start = datetime.datetime.fromisoformat(str(value["next_fire"]).replace("Z", "+00:00"))
    found = []
    for slot in schedule.slots(the_schedule, start):
        if slot.at is not None:
            found.append(schedule.iso(slot.at))
        if len(found) == NEXT_FIRES:
            break
    return found


def _health_of(
    backend: Backend, members: dict[str, registry_servers.ServerInfo]
) -> dict[str, tuple[bool | None, dict[str, Any] | None]]:
    """Each member's /healthz (this server's own status directly), fetched in parallel."""

    def probe(info: registry_servers.ServerInfo) -> tuple[bool | None, dict[str, Any] | None]:
        if info.id == backend.server_id:
            healthy, body = backend.status()
            return healthy, _counts_only(body)
        if not info.health_url:
            return None, None
        try:
            with urllib.request.urlopen(
                f"{info.health_url}/healthz",
                timeout=PEER_HEALTH_TIMEOUT_S,
                context=backend.peer_tls,
            ) as reply:
                return True, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            try:
                return False, json.loads(exc.read())
            except ValueError:
                return False, None
            finally:
                exc.close()
        except (OSError, ValueError):
            return None, None

    if not members:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(members))) as pool:
        futures = {sid: pool.submit(probe, info) for sid, info in members.items()}
        return {sid: future.result() for sid, future in futures.items()}


def _counts_only(status: dict[str, Any]) -> dict[str, Any]:
    """A server's status as the open /healthz shows it: the jobs it runs as a count
    (``running``), never their names."""
    shown = {k: v for k, v in status.items() if k != "jobs"}
    if "jobs" in status:
        shown["running"] = len(status["jobs"])
    return shown


def _arcs(built: ring.Ring) -> list[dict[str, Any]]:
    """The circle as arcs [start, end) in fractions of a turn, each owned by the server
    whose vnode ends it (a key maps to the next vnode clockwise); adjacent arcs of one
    server merged."""
    points, owners = built.points, built.owners
    if not points:
        return []
    arcs: list[dict[str, Any]] = []
    # The arc ending at points[0] starts at the last point (wrapping past the top).
    previous = points[-1] - ring.HASH_SPACE
    for point, owner in zip(points, owners, strict=True):
        start, end = previous / ring.HASH_SPACE, point / ring.HASH_SPACE
        if arcs and arcs[-1]["server"] == owner:
            arcs[-1]["end"] = end
        else:
            arcs.append({"server": owner, "start": start, "end": end})
        previous = point
    return arcs


def _bounds(active: list[str], placeable: dict[str, int], backend: Backend) -> dict[str, int]:
    """Each placeable server's bounded-load cap for the current number of active jobs."""
    if not placeable:
        return {}
    result = placement.place(
        active, placeable, epsilon=backend.placement_epsilon, vnodes=backend.vnodes
    )
    return dict(result.bounds)


def _live_log(backend: Backend, job: dict[str, Any], lines: int, secret: str) -> str | None:
    owner = job["owner"]
    if owner is None:
        return None
    if owner == backend.server_id:
        path = backend.log_file(job["name"])
        return livelog.tail(path, lines) if path is not None and path.exists() else None
    info = backend.members().get(owner)
    if info is None or not info.health_url:
        return None
    return livelog.fetch(info.health_url, job["name"], lines, secret, verify=backend.peer_tls)


async def _follow(
    backend: Backend, job: dict[str, Any], lines: int, secret: str
) -> AsyncIterator[bytes] | None:
    owner, name = job["owner"], job["name"]
    if owner is None:
        return None
    if owner == backend.server_id:
        path = backend.log_file(name)
        if path is None or not path.exists():
            return None
        return livelog.follow(path, lines, lambda: backend.log_file(name) == path)
    info = backend.members().get(owner)
    if info is None or not info.health_url:
        return None
    return await livelog.follow_remote_async(
        info.health_url, name, lines, secret, verify=backend.peer_tls
    )


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _describe_validation(exc: RequestValidationError) -> str:
    problems = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ()) if part not in ("body", "query", "path")]
        where = ".".join(loc)
        if error.get("type") == "json_invalid":
            return "request body is not valid JSON"
        if error.get("type") == "extra_forbidden":
            problems.append(f"unknown field {where!r}")
        elif error.get("type") == "missing":
            problems.append(f"{where or 'body'} is required")
        else:
            problems.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
    return "; ".join(problems) or "invalid request"


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(auth.AuthError)
    def auth_error(request: Request, exc: auth.AuthError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _error(exc.status, str(exc), headers)

    @app.exception_handler(jobs.JobError)
    def job_error(request: Request, exc: jobs.JobError) -> JSONResponse:
        if isinstance(exc, jobs.JobNotFound):
            return _error(404, str(exc))
        if isinstance(exc, jobs.JobConflict):
            return _error(409, str(exc))
        return _error(400, str(exc))

    @app.exception_handler(resource_errors.ResourceError)
    def resource_error(request: Request, exc: resource_errors.ResourceError) -> JSONResponse:
        if isinstance(exc, resource_errors.UnknownResource):
            return _error(404, str(exc))
        if isinstance(exc, resource_errors.ResourceInUse):
            return _error(409, str(exc))
        if isinstance(exc, resource_errors.InvalidResource):
            return _error(400, str(exc))
        return _error(503, str(exc))

    @app.exception_handler(ring.RingError)
    def ring_error(request: Request, exc: ring.RingError) -> JSONResponse:
        return _error(409, str(exc))

    @app.exception_handler(RequestValidationError)
    def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message = _describe_validation(exc)
        return _error(400 if message == "request body is not valid JSON" else 422, message)

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such path: {request.url.path}"
        return _error(exc.status_code, message)

    @app.exception_handler(sa_exc.DBAPIError)
    def database_error(request: Request, exc: sa_exc.DBAPIError) -> JSONResponse:
        log.error("database error", extra={"action": "http_error", "path": request.url.path})
        return _error(503, "database error; see the server log")

    @app.exception_handler(Exception)
    def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception(
            "HTTP request failed", extra={"action": "http_error", "path": request.url.path}
        )
        return _error(500, "internal error; see the server log")


# Sent with every answer: the console loads only its own script, style and data, draws
# no plugin, and may not be framed (its buttons cannot be clickjacked).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _install_metrics_and_headers(app: FastAPI) -> None:
    @app.middleware("http")
    async def count(request: Request, call_next: Callable[[Request], Any]) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        metrics.REGISTRY.http_requests.labels(request.method, str(response.status_code)).inc()
        metrics.REGISTRY.http_latency.observe(time.perf_counter() - started)
        return response
