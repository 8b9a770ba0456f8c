"""What the API promises in ``/api/v1/openapi.json``, declared once for every route:

- the one error body, ``{"error": "<one line>"}`` (:class:`ErrorBody`, raised as
  :class:`ApiError`), and what each error status means (:data:`MEANINGS`);
- the statuses each kind of route can answer (:func:`errors`; the routers take them as
  defaults, a route adds its own 404 or 409);
- the bounds of every input: integers within their PostgreSQL column, names by the
  CLI's rules, free text without NUL (PostgreSQL's text cannot hold it), so a malformed
  request is a 422 naming the field and never reaches the database;
- the links a client (or Schemathesis' stateful phase) follows from a created object.
"""

from __future__ import annotations

import datetime
import json
from typing import Annotated, Any

from fastapi import Path as PathParam
from fastapi import Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from resource_center import validation
from scheduler import alerts, job_spec

API = "/api/v1"

# PostgreSQL's integer and bigint: the largest value of each column type.
INTEGER_MAX = 2**31 - 1
BIGINT_MAX = 2**63 - 1

# The CLI's name rules (jobs and artifacts share them), as JSON Schema patterns.
NAME_PATTERN = job_spec.NAME.pattern
# NAME, or NAME:VERSION with a version that fits resources.version (integer).
REFERENCE_PATTERN = rf"^{validation.NAME_PATTERN.pattern}(:[1-9][0-9]{{0,8}})?$"
NAME_RULE = validation.NAME_RULE
REFERENCE_RULE = f"NAME or NAME:VERSION: NAME of {NAME_RULE}; VERSION a positive integer"
# Free text stored in PostgreSQL (text or jsonb): anything but NUL.
TEXT_PATTERN = r"^[^\x00]*$"
TEXT_RULE = "text without NUL characters"
# An alert's name and job glob (scheduler/alerts.py), and its webhook: an http(s) URL
# whose host is a name or IPv4 address and whose port fits 0-65535; the rest printable
# ASCII (what the store accepts, stated so that a URL matching it is never refused).
ALERT_NAME_PATTERN = alerts.NAME.pattern
ALERT_NAME_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
GLOB_PATTERN = alerts.GLOB.pattern
GLOB_RULE = "letters, digits, '.', '_', '-' and the wildcards '*' and '?'"
_PORT = r"(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?"
WEBHOOK_PATTERN = (
    r"^https?://([A-Za-z0-9._~!$&'()*+,;=:%-]+@)?[A-Za-z0-9._~-]+" + _PORT + r"([/?#][!-~]*)?$"
)
WEBHOOK_RULE = "an http:// or https:// URL with a host name or IPv4 address"
# Body fields whose input a 422 never quotes: a secret, and a webhook URL (its path can
# be a credential, as Slack's are).
UNQUOTED_FIELDS = frozenset({"secret", "webhook"})
# What a 422 says when a pattern did not match, instead of the pattern itself.
RULES = {
    NAME_PATTERN: NAME_RULE,
    REFERENCE_PATTERN: REFERENCE_RULE,
    TEXT_PATTERN: TEXT_RULE,
    ALERT_NAME_PATTERN: ALERT_NAME_RULE,
    GLOB_PATTERN: GLOB_RULE,
    WEBHOOK_PATTERN: WEBHOOK_RULE,
}

JobName = Annotated[str, PathParam(pattern=NAME_PATTERN, description=f"Job name: {NAME_RULE}.")]
# An upload's NAME, on the path of its NAME[:VERSION] reads and deletes.
ResourceName = Annotated[
    str,
    PathParam(
        alias="reference",
        pattern=NAME_PATTERN,
        description=f"Artifact name (an upload takes no version): {NAME_RULE}.",
    ),
]
AlertName = Annotated[
    str, PathParam(pattern=ALERT_NAME_PATTERN, description=f"Alert name: {ALERT_NAME_RULE}.")
]
Reference = Annotated[
    str, PathParam(pattern=REFERENCE_PATTERN, description=f"Artifact: {REFERENCE_RULE}.")
]
# In a body: a reference, free text, a count of restarts (jobs.max_restarts is integer).
BodyReference = Annotated[str, Field(pattern=REFERENCE_PATTERN)]
Text = Annotated[str, Field(pattern=TEXT_PATTERN)]
Budget = Annotated[int, Field(ge=0, le=INTEGER_MAX)]
# A restart window in seconds (scheduler/job_spec.py restart_window): 0 for none.
Window = Annotated[float, Field(ge=0, le=job_spec.MAX_RESTART_WINDOW_S)]
# An auto-rollback deadline in seconds (scheduler/job_spec.py check_auto_rollback).
HealthyWithin = Annotated[float, Field(gt=0, le=job_spec.MAX_HEALTHY_WITHIN_S)]
# Spark conf: its keys are free text too (stated as propertyNames for the schema's readers).
Conf = Annotated[
    dict[Text, Text], Field(json_schema_extra={"propertyNames": {"pattern": TEXT_PATTERN}})
]
# A job's environment (scheduler/secrets.py): variable names as a shell takes them; the
# values of ``env`` free text, those of ``secret_env`` a secret's name.
VARIABLE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
SECRET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
EnvName = Annotated[str, Field(pattern=VARIABLE_PATTERN)]
SecretName = Annotated[str, Field(pattern=SECRET_NAME_PATTERN)]
Env = Annotated[
    dict[EnvName, Text], Field(json_schema_extra={"propertyNames": {"pattern": VARIABLE_PATTERN}})
]
SecretEnv = Annotated[
    dict[EnvName, SecretName],
    Field(json_schema_extra={"propertyNames": {"pattern": VARIABLE_PATTERN}}),
]

# Largest page of jobs (or events) one request returns.
MAX_PAGE = 1000
# A page size parameter (limit) of a listing.
PageSize = Annotated[int, Query(ge=1, le=MAX_PAGE)]


class ErrorBody(BaseModel):
    """Every refusal the API answers."""

    error: str = Field(
        description="What is wrong, in one line (the CLI's message).",
        examples=["no job named 'etl'"],
    )


MEANINGS = {
    400: "Malformed request: the body is not JSON or its Content-Length is not a number; "
    "or the command refuses the input (the CLI's message).",
    401: "No bearer token, or an unknown, revoked or expired one.",
    403: "A viewer token asking to write: writes need an operator token.",
    404: "No such job, artifact, run log or alert.",
    409: "The request clashes with the current state (a name taken, a job still running, "
    "an artifact in use or, named in a job's body, missing; no such revision to roll "
    "back to).",
    413: "The request body is above its limit.",
    422: "An input breaks its declared bounds, type or rule; the message names the field.",
    429: "Too many live log follows open (4 per token, 32 per server).",
    503: "PostgreSQL (or, for artifacts, S3) is unavailable.",
}

# Every route behind a token: the token is looked up in PostgreSQL.
READ = (401, 503)
# Every write: checked before its body is read (server/web/admission.py), then validated.
WRITE = (400, 401, 403, 413, 422, 503)


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` for these error statuses, each with :class:`ErrorBody`."""
    return {status: {"model": ErrorBody, "description": MEANINGS[status]} for status in statuses}


def errors_beside_text(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """:func:`errors` for a route that answers plain text: FastAPI would file a model's
    errors under the route's text/plain, so these name :class:`ErrorBody` as JSON (its
    schema is in the document through the other routes)."""
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    return {status: {"description": MEANINGS[status], "content": body} for status in statuses}


def linked(status: int, **links: tuple[str, str, dict[str, str]]) -> dict[int | str, Any]:
    """FastAPI ``responses=`` declaring OpenAPI links from the answer ``status``:
    ``name=(method, path, {parameter: runtime expression})``."""
    return {
        status: {
            "links": {
                name: {
                    "operationRef": "#/paths/"
                    + path.replace("~", "~0").replace("/", "~1")
                    + f"/{method.lower()}",
                    "parameters": parameters,
                }
                for name, (method, path, parameters) in links.items()
            }
        }
    }


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def default(value: Any) -> str:
    """Datetimes in ISO 8601, as ``--json`` prints them; anything else as text."""
    return value.isoformat() if isinstance(value, datetime.datetime) else str(value)


def plain(data: Any) -> Any:
    """Plain JSON values (datetimes as ISO 8601 strings)."""
    return json.loads(json.dumps(data, default=default))
