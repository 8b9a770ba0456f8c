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

import dataclasses
import logging
import re
import reprlib
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import exc as sa_exc
from starlette import routing
from starlette.exceptions import HTTPException as StarletteHTTPException

from registry import servers as registry_servers
from resource_center import errors as resource_errors
from resource_center import store
from scheduler import alerts, destinations, jobs, ring, secrets
from server import defaults, metrics
from server.web import admission, auth, contract
from server.web.routes import alerts as alert_routes
from server.web.routes import events, health, logs, resources, servers
from server.web.routes import jobs as job_routes
from server.web.routes import ring as ring_routes
from server.web.routes import secrets as secret_routes

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

log = logging.getLogger(__name__)

WEB = Path(__file__).resolve().parent / "static"


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
    # Networks a webhook may reach although not public (SPARKRING_ALERT_ALLOW_NETWORKS).
    alert_networks: tuple[destinations.Network, ...] = ()
    # SPARKRING_SECRET_KEYS (scheduler/secrets.py): a secret is encrypted with it; None:
    # not set, a secret cannot be created here (503).
    secret_box: MultiFernet | None = None


def create_app(backend: Backend) -> FastAPI:
    app = FastAPI(
        title="sparkring",
        version="1",
        description="HA control plane for PySpark jobs: servers, ring and jobs over HTTP.",
        openapi_url=f"{contract.API}/openapi.json",
        # No browsable page: it would load a third-party script on the console's origin
        # (where the console keeps its token); the schema is enough for any client.
        docs_url=None,
        redoc_url=None,
    )
    authenticator = auth.Authenticator(backend.engine)
    declared = Declared(app)
    _install_error_handlers(app, declared)
    # Inside the request metrics (refusals are counted), before any body is read.
    app.add_middleware(
        admission.Admission,
        authenticator=authenticator,
        max_json_bytes=backend.max_json_bytes,
        max_artifact_bytes=backend.max_artifact_bytes,
        declared=declared,
    )
    _install_metrics_and_headers(app)
    app.include_router(health.router(backend))
    app.include_router(logs.router(backend, authenticator))
    app.include_router(servers.router(backend, authenticator))
    app.include_router(ring_routes.router(backend, authenticator))
    app.include_router(job_routes.router(backend, authenticator))
    app.include_router(events.router(backend, authenticator))
    app.include_router(resources.router(backend, authenticator))
    app.include_router(alert_routes.router(backend, authenticator))
    app.include_router(secret_routes.router(backend, authenticator))

    # ---------------------------------------------------------------- the console

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/console/")

    @app.get("/console/", include_in_schema=False)
    def console_index() -> FileResponse:
        return FileResponse(WEB / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/console", StaticFiles(directory=WEB), name="console")
    return app


# -------------------------------------------------------------------- errors


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
        elif error.get("type") == "string_pattern_mismatch":
            rule = contract.RULES.get(error.get("ctx", {}).get("pattern"), "a value of its pattern")
            if loc and loc[-1] in contract.UNQUOTED_FIELDS:
                problems.append(f"{where}: the value given is not {rule}")
                continue
            # reprlib: a long input is shown cut, the one-line error stays short.
            shown = reprlib.repr(error.get("input"))
            problems.append(f"{where or 'body'}: {shown} is not {rule}")
        else:
            problems.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
    return "; ".join(problems) or "invalid request"


class Declared:
    """The methods the API declares on a path, read from its own OpenAPI document (on
    first use, when every route is in place). A 405's ``Allow`` lists them (Starlette's
    names only the first route's, and each method is a route of its own); admission
    checks the token of exactly the writes among them. A concrete path wins over the
    templates it also matches, as OpenAPI says: ``/alerts/deliveries`` is not an
    ``/alerts/{name}``."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._table: list[tuple[re.Pattern[str], bool, frozenset[str]]] | None = None

    def __call__(self, path: str) -> frozenset[str]:
        if self._table is None:
            self._table = [
                (
                    routing.compile_path(template)[0],
                    "{" not in template,
                    frozenset(m.upper() for m in operations),
                )
                for template, operations in self._app.openapi()["paths"].items()
            ]
        matched = [
            (concrete, methods) for regex, concrete, methods in self._table if regex.match(path)
        ]
        concrete = [methods for is_concrete, methods in matched if is_concrete]
        return frozenset().union(*(concrete or [methods for _, methods in matched]))


def _install_error_handlers(app: FastAPI, declared: Declared) -> None:
    @app.exception_handler(contract.ApiError)
    def api_error(request: Request, exc: contract.ApiError) -> JSONResponse:
        return contract.error(exc.status, str(exc))

    @app.exception_handler(auth.AuthError)
    def auth_error(request: Request, exc: auth.AuthError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return contract.error(exc.status, str(exc), headers)

    @app.exception_handler(jobs.JobError)
    def job_error(request: Request, exc: jobs.JobError) -> JSONResponse:
        if isinstance(exc, jobs.JobNotFound):
            return contract.error(404, str(exc))
        if isinstance(exc, jobs.JobConflict):
            return contract.error(409, str(exc))
        return contract.error(400, str(exc))

    @app.exception_handler(resource_errors.ResourceError)
    def resource_error(request: Request, exc: resource_errors.ResourceError) -> JSONResponse:
        if isinstance(exc, resource_errors.UnknownResource):
            return contract.error(404, str(exc))
        if isinstance(exc, resource_errors.ResourceInUse):
            return contract.error(409, str(exc))
        if isinstance(exc, resource_errors.InvalidResource):
            return contract.error(400, str(exc))
        return contract.error(503, str(exc))

    @app.exception_handler(alerts.AlertError)
    def alert_error(request: Request, exc: alerts.AlertError) -> JSONResponse:
        if isinstance(exc, alerts.AlertNotFound):
            return contract.error(404, str(exc))
        if isinstance(exc, alerts.AlertNameTaken):
            return contract.error(409, str(exc))
        if isinstance(exc, alerts.DestinationRefused):
            return contract.error(400, str(exc))  # a host OpenAPI cannot tell from a good one
        return contract.error(422, str(exc))

    @app.exception_handler(secrets.SecretError)
    def secret_error(request: Request, exc: secrets.SecretError) -> JSONResponse:
        if isinstance(exc, secrets.SecretNotFound):
            return contract.error(404, str(exc))
        if isinstance(exc, secrets.SecretInUse):
            return contract.error(409, str(exc))
        if isinstance(exc, secrets.KeyProblem):
            return contract.error(503, str(exc))
        return contract.error(400, str(exc))

    @app.exception_handler(ring.RingError)
    def ring_error(request: Request, exc: ring.RingError) -> JSONResponse:
        return contract.error(409, str(exc))

    @app.exception_handler(RequestValidationError)
    def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message = _describe_validation(exc)
        return contract.error(400 if message == "request body is not valid JSON" else 422, message)

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such path: {request.url.path}"
        headers = exc.headers
        allowed = declared(request.url.path) if exc.status_code == 405 else None
        if allowed:
            headers = {**(headers or {}), "Allow": ", ".join(sorted(allowed))}
        return contract.error(exc.status_code, message, headers)

    @app.exception_handler(sa_exc.DBAPIError)
    def database_error(request: Request, exc: sa_exc.DBAPIError) -> JSONResponse:
        log.error("database error", extra={"action": "http_error", "path": request.url.path})
        return contract.error(503, "database error; see the server log")

    @app.exception_handler(Exception)
    def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception(
            "HTTP request failed", extra={"action": "http_error", "path": request.url.path}
        )
        return contract.error(500, "internal error; see the server log")


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
