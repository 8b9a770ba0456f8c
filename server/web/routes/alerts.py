"""Webhook alerts (``sparkring alert``; scheduler/alerts.py, docs/alerts.md): list,
show, create, delete, queue a test delivery, and the deliveries.

The secret is write-only: a request may carry it, no answer ever does (an alert says
``has_secret``), and a webhook URL is answered as its scheme and host. Creations and
deletions are in the audit trail; a test delivery names its token in its detail.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from scheduler import alerts, audit
from server.web import auth, contract, dependencies
from sql.states import AlertFormat, DeliveryStatus

log = logging.getLogger(__name__)

# The largest page of deliveries one request returns.
MAX_DELIVERIES = 1000
# What ``on`` may list: a kind, or ``all`` for every kind.
OnKind = StrEnum("OnKind", {k.value.upper(): k.value for k in alerts.LISTENABLE} | {"ALL": "all"})


class AlertCreate(BaseModel):
    """A new alert, as ``sparkring alert create`` takes it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=contract.ALERT_NAME_PATTERN,
        description=f"Unique alert name: {contract.ALERT_NAME_RULE}.",
    )
    webhook: str = Field(
        max_length=alerts.MAX_URL,
        pattern=contract.WEBHOOK_PATTERN,
        description="The URL each delivery is POSTed to. Never answered back beyond its "
        "scheme and host (a path can be a credential).",
    )
    secret: str | None = Field(
        None,
        min_length=alerts.MIN_SECRET,
        max_length=alerts.MAX_SECRET,
        pattern=contract.TEXT_PATTERN,
        json_schema_extra={"writeOnly": True},
        description="Signs each delivery (Standard Webhooks: webhook-signature: v1,<base64 "
        "HMAC-SHA256 of id.timestamp.body>; and X-Sparkring-Signature: sha256=<hex HMAC of "
        "the body>). Write-only: no answer carries it.",
    )
    format: AlertFormat = Field(
        AlertFormat.JSON, description="json: the alert's fields; slack: a Slack message."
    )
    on: list[OnKind] | None = Field(
        None,
        min_length=1,
        max_length=len(OnKind),
        description="Kinds to alert on, or 'all'. Default: failed, stalled, "
        "waiting_for_resources, rolled_back.",
    )
    job: str = Field(
        "*",
        pattern=contract.GLOB_PATTERN,
        max_length=200,
        description="Jobs whose name matches: '*' any run of characters, '?' one.",
    )


class AlertOut(BaseModel):
    """An alert as shown: no secret, the webhook's scheme and host only."""

    name: str
    webhook: str = Field(description="Scheme and host; '/…' when the URL has more.")
    has_secret: bool
    format: AlertFormat
    on: list[str]
    job: str
    created_at: str
    created_by: str | None


class DeliveryOut(BaseModel):
    """One delivery of an alert: what was raised and how sending it went."""

    id: str = Field(description="The body's id: the same on every retry.")
    alert: str
    kind: str
    job: str | None
    at: str | None = Field(description="When the event happened.")
    status: DeliveryStatus
    attempts: int
    next_attempt_at: str | None = Field(description="While pending: the next attempt.")
    last_status: int | None = Field(description="The receiver's last HTTP status.")
    last_error: str | None
    delivered_at: str | None


class AlertDeleted(BaseModel):
    alert: str
    outcome: str
    deliveries: int = Field(description="Deliveries deleted with it (never sent, if pending).")


class TestQueued(BaseModel):
    alert: str
    delivery: str = Field(description="The id of the test delivery queued.")


router = APIRouter(tags=["alerts"], responses=contract.errors(*contract.READ))
viewer = Depends(auth.reader)
operator = Depends(auth.writer)
API = contract.API
one = f"{API}/alerts/{{name}}"
by_name = {"name": "$response.body#/name"}


# Before /alerts/{name}: "deliveries" is no alert's name (alerts.RESERVED_NAMES).
@router.get(f"{API}/alerts/deliveries", responses=contract.errors(404, 422))
def list_deliveries(
    backend: dependencies.AppBackend,
    principal: auth.Caller = viewer,
    alert: Annotated[
        str | None,
        Query(pattern=contract.ALERT_NAME_PATTERN, description="Only this alert's."),
    ] = None,
    status: Annotated[DeliveryStatus | None, Query(description="Only this status.")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_DELIVERIES)] = 100,
) -> list[DeliveryOut]:
    """Deliveries, newest first (``alert deliveries``): status, attempts, the
    receiver's last answer; 404 for an alert that does not exist."""
    with backend.engine.connect() as conn:
        found = alerts.deliveries(
            conn, alert=alert, status=status.value if status else None, limit=limit
        )
    return [DeliveryOut(**d.as_dict()) for d in found]


# A concrete path wins over a template (errors.Declared): a DELETE of
# /alerts/deliveries is a 405, not a delete of an alert named "deliveries".
@router.delete(f"{API}/alerts/deliveries", include_in_schema=False)
def no_delete_of_deliveries() -> None:
    raise StarletteHTTPException(405, "Method Not Allowed")


@router.get(f"{API}/alerts")
def list_alerts(
    backend: dependencies.AppBackend, principal: auth.Caller = viewer
) -> list[AlertOut]:
    """Every alert, by name (``alert list``)."""
    with backend.engine.connect() as conn:
        return [AlertOut(**a.as_dict()) for a in alerts.list_alerts(conn)]


@router.get(one, responses=contract.errors(404, 422))
def show_alert(
    name: contract.AlertName, backend: dependencies.AppBackend, principal: auth.Caller = viewer
) -> AlertOut:
    """One alert (``alert show``)."""
    with backend.engine.connect() as conn:
        return AlertOut(**alerts.get(conn, name).as_dict())


@router.post(
    f"{API}/alerts",
    status_code=201,
    responses={
        **contract.errors(*contract.WRITE, 409),
        **contract.linked(
            201,
            show=("GET", one, by_name),
            test=("POST", f"{one}/test", by_name),
            delete=("DELETE", one, by_name),
            deliveries=("GET", f"{API}/alerts/deliveries", {"alert": "$response.body#/name"}),
        ),
    },
)
def create_alert(
    body: AlertCreate, backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> AlertOut:
    """Create an alert (``alert create``); 409 when the name is taken."""
    with backend.engine.begin() as conn:
        alert = alerts.create(
            conn,
            body.name,
            body.webhook,
            secret=body.secret,
            format=body.format.value,
            kinds=None if body.on is None else [k.value for k in body.on],
            job_glob=body.job,
            actor=principal.actor,
            allow_networks=backend.alert_networks,
        )
        audit.record(conn, principal.actor, audit.Action.ALERT_CREATED, alert.name, alert.as_dict())
    # Its name and who made it: never its webhook (a credential) or its secret.
    log.info(
        "alert created over HTTP",
        extra={"action": "alert_created", "alert": alert.name, "by": principal.actor},
    )
    return AlertOut(**alert.as_dict())


@router.delete(one, responses=contract.errors(*contract.WRITE, 404))
def delete_alert(
    name: contract.AlertName, backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> AlertDeleted:
    """Delete an alert and its deliveries (``alert delete``): those pending are
    never sent."""
    with backend.engine.begin() as conn:
        gone = alerts.delete(conn, name)
        audit.record(conn, principal.actor, audit.Action.ALERT_DELETED, name, {"deliveries": gone})
    log.info(
        "alert deleted over HTTP",
        extra={"action": "alert_deleted", "alert": name, "by": principal.actor},
    )
    return AlertDeleted(alert=name, outcome="deleted", deliveries=gone)


@router.post(f"{one}/test", status_code=202, responses=contract.errors(*contract.WRITE, 404))
def test_alert(
    name: contract.AlertName, backend: dependencies.AppBackend, principal: auth.Caller = operator
) -> TestQueued:
    """Queue a ``test`` delivery (``alert test``); a live server sends it like any
    other. Follow it in ``/api/v1/alerts/deliveries?alert=NAME``."""
    with backend.engine.begin() as conn:
        delivery_id = alerts.test(conn, name, actor=principal.actor)
    return TestQueued(alert=name, delivery=delivery_id)
