"""The feeds a client polls with ``after``: the cluster's job events and the audit
trail of the writes that are not a job's own."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from scheduler import audit, job_events
from server.web import auth, contract, dependencies

# Event and audit ids are bigint.
After = Annotated[
    int, Query(ge=0, le=contract.BIGINT_MAX, description="Only events with a larger id.")
]


router = APIRouter(responses=contract.errors(*contract.READ, 422))
viewer = Depends(auth.reader)


@router.get(f"{contract.API}/events", tags=["jobs"])
def cluster_events(
    backend: dependencies.AppBackend,
    principal: auth.Caller = viewer,
    after: After = 0,
    limit: contract.PageSize = 100,
) -> list[dict[str, Any]]:
    """The cluster's event feed (every job), oldest first; poll with ``after``."""
    with backend.engine.connect() as conn:
        return contract.plain(job_events.recent_events(conn, after, limit))


@router.get(f"{contract.API}/audit", tags=["auth"])
def audit_events(
    backend: dependencies.AppBackend,
    principal: auth.Caller = viewer,
    after: After = 0,
    limit: contract.PageSize = 100,
) -> list[dict[str, Any]]:
    """The audit trail of writes that are not a job's own (artifact uploads and
    deletes, token creation and revocation, alert creation and deletion), oldest
    first; poll with ``after``.
    Job writes are job events (``detail.by``)."""
    with backend.engine.connect() as conn:
        return contract.plain(audit.recent(conn, after, limit))
