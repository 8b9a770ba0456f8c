"""The open endpoints a probe or a scraper reads: ``/healthz`` and ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from server import metrics
from server.web import dependencies

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    summary="200 while healthy, 503 when not (open).",
    responses={
        200: {"description": "This server's status: it is healthy."},
        503: {"description": "The same status: this server is not healthy."},
    },
)
def healthz(backend: dependencies.AppBackend) -> JSONResponse:
    healthy, body = backend.status()
    return JSONResponse(counts_only(body), status_code=200 if healthy else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics (open).",
    response_class=PlainTextResponse,
    responses={
        200: {
            "description": "Every metric in Prometheus' text exposition format.",
            "content": {
                "text/plain": {
                    "schema": {"type": "string"},
                    "example": "# TYPE sparkring_claims counter\nsparkring_claims_total 3\n",
                }
            },
        }
    },
)
def prometheus() -> Response:
    return Response(metrics.REGISTRY.render(), media_type=metrics.CONTENT_TYPE)


def counts_only(status: dict[str, Any]) -> dict[str, Any]:
    """A server's status as the open /healthz shows it: the jobs it runs as a count
    (``running``), never their names."""
    shown = {k: v for k, v in status.items() if k != "jobs"}
    if "jobs" in status:
        shown["running"] = len(status["jobs"])
    return shown
