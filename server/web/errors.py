"""How the API answers an error: the one-line JSON body of ``contract.error`` with the
status each exception means (404 unknown, 409 conflict, 400/422 bad input, 401/403 auth,
503 a missing service), and an unexpected exception logged here and answered 500 with no
detail, never a stack trace. Also the methods the API declares on a path
(:class:`Declared`), which a 405's ``Allow`` lists and admission checks writes against.
"""

from __future__ import annotations

import logging
import re
import reprlib

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette import routing
from starlette.exceptions import HTTPException as StarletteHTTPException

from resource_center import errors as resource_errors
from scheduler import alerts, job_spec, ring, secrets
from server.web import auth, contract

log = logging.getLogger(__name__)


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


def install(app: FastAPI, declared: Declared) -> None:
    @app.exception_handler(contract.ApiError)
    def api_error(request: Request, exc: contract.ApiError) -> JSONResponse:
        return contract.error(exc.status, str(exc))

    @app.exception_handler(auth.AuthError)
    def auth_error(request: Request, exc: auth.AuthError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return contract.error(exc.status, str(exc), headers)

    @app.exception_handler(job_spec.JobError)
    def job_error(request: Request, exc: job_spec.JobError) -> JSONResponse:
        if isinstance(exc, job_spec.JobNotFound):
            return contract.error(404, str(exc))
        if isinstance(exc, job_spec.JobConflict):
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
