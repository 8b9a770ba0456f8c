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
is logged and answered 500 with no detail, never a stack trace (``server/web/errors.py``).
The routes are in ``server/web/routes/``, one router per noun; what they share (the
server's ``Backend``) is in ``server/web/dependencies.py``, below them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from server import metrics
from server.web import admission, auth, contract, dependencies, errors, livelog
from server.web.routes import alerts as alert_routes
from server.web.routes import events, health, logs, resources, servers
from server.web.routes import jobs as job_routes
from server.web.routes import ring as ring_routes
from server.web.routes import secrets as secret_routes

WEB = Path(__file__).resolve().parent / "static"


def create_app(backend: dependencies.Backend) -> FastAPI:
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
    # What the routes' dependencies read (dependencies.get_backend, auth.reader/writer).
    app.state.backend = backend
    app.state.authenticator = authenticator
    app.state.follows = livelog.FollowGate()  # open log follows (routes/logs.py)
    declared = errors.Declared(app)
    errors.install(app, declared)
    # Inside the request metrics (refusals are counted), before any body is read.
    app.add_middleware(
        admission.Admission,
        authenticator=authenticator,
        max_json_bytes=backend.max_json_bytes,
        max_artifact_bytes=backend.max_artifact_bytes,
        declared=declared,
    )
    _install_metrics_and_headers(app)
    app.include_router(health.router)
    app.include_router(logs.router)
    app.include_router(servers.router)
    app.include_router(ring_routes.router)
    app.include_router(job_routes.router)
    app.include_router(events.router)
    app.include_router(resources.router)
    app.include_router(alert_routes.router)
    app.include_router(secret_routes.router)

    # ---------------------------------------------------------------- the console

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/console/")

    @app.get("/console/", include_in_schema=False)
    def console_index() -> FileResponse:
        return FileResponse(WEB / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/console", StaticFiles(directory=WEB), name="console")
    return app


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
