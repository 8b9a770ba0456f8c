"""Secrets of jobs' drivers (``sparkring secret``; scheduler/secrets.py, docs/secrets.md):
list, put, delete. Operators only, reads included: a secret's name and the jobs given it
say what a driver can reach. A value is write-only: a request may carry it, no answer,
log line or audit event ever does.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from scheduler import audit, secrets
from server.web import auth, contract, dependencies

log = logging.getLogger(__name__)

SecretName = Annotated[
    str,
    PathParam(
        pattern=contract.SECRET_NAME_PATTERN,
        description="Secret name: 1-64 letters, digits, '.', '_' or '-'.",
    ),
]


class SecretPut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=contract.SECRET_NAME_PATTERN,
        description="Secret name: 1-64 letters, digits, '.', '_' or '-'.",
    )
    value: str = Field(
        max_length=secrets.MAX_VALUE_BYTES,
        pattern=r"^[^\x00]*$",
        json_schema_extra={"writeOnly": True},
        description="The value (UTF-8 text, no NUL, at most 64 KiB). Write-only.",
    )


class SecretOut(BaseModel):
    """A secret as listed: never its value."""

    name: str
    version: int = Field(description="How many values the name has had.")
    created_at: str
    updated_at: str
    updated_by: str | None
    jobs: list[str] = Field(description="The jobs whose definition gives it to their driver.")


class SecretDeleted(BaseModel):
    secret: str
    outcome: str


router = APIRouter(tags=["secrets"], responses=contract.errors(*contract.READ, 403))
operator = Depends(auth.writer)
one = f"{contract.API}/secrets/{{name}}"


@router.get(f"{contract.API}/secrets")
def list_secrets(
    backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> list[SecretOut]:
    """Every secret (``secret list``): names, versions, the jobs given each."""
    with backend.engine.connect() as conn:
        return [SecretOut(**row.as_dict()) for row in secrets.listing(conn)]


@router.post(f"{contract.API}/secrets", status_code=201, responses=contract.errors(*contract.WRITE))
def put_secret(
    body: SecretPut, backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> SecretOut:
    """Create a secret or give it a new value (``secret create``; its ``version``
    counts the values): drivers started from then on get it. 503 when this server
    holds no SPARKRING_SECRET_KEYS."""
    name = body.name
    if backend.secret_box is None:
        raise secrets.KeyProblem(
            f"{secrets.KEYS_SETTING} is not set on this server: it cannot encrypt a secret"
        )
    with backend.engine.begin() as conn:
        version = secrets.put(
            conn, name, body.value.encode("utf-8"), backend.secret_box, principal.actor
        )
        audit.record(conn, principal.actor, audit.Action.SECRET_PUT, name, {"version": version})
        listed = next(row for row in secrets.listing(conn) if row.name == name)
    log.info(
        "secret put over HTTP",
        extra={"action": "secret_put", "secret": name, "by": principal.actor},
    )
    return SecretOut(**listed.as_dict())


@router.delete(one, responses=contract.errors(*contract.WRITE, 404, 409))
def delete_secret(
    name: SecretName, backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> SecretDeleted:
    """Delete a secret (``secret delete``); 409 while a job's definition gives it."""
    with backend.engine.begin() as conn:
        secrets.delete(conn, name)
        audit.record(conn, principal.actor, audit.Action.SECRET_DELETED, name)
    return SecretDeleted(secret=name, outcome="deleted")
