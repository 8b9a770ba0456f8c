"""The live servers (``/api/v1/servers``) and who is asking (``/api/v1/whoami``)."""

from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends

from registry import servers as registry_servers
from server import bounded_http
from server.web import auth, contract, dependencies
from server.web.routes import health

# How long the server list waits for a peer's /healthz, seconds.
PEER_HEALTH_TIMEOUT_S = 1.0
PEER_HEALTH_MAX_BYTES = 256 * 1024  # a peer's /healthz: counts and states, a few KB


router = APIRouter(responses=contract.errors(*contract.READ))
viewer = Depends(auth.reader)


@router.get(f"{contract.API}/whoami", tags=["auth"])
def whoami(backend: dependencies.AppBackend, principal: auth.Caller = viewer) -> dict[str, Any]:
    """The token's name and role (the console's login check)."""
    return {"name": principal.name, "role": principal.role.value, "server": backend.server_id}


@router.get(f"{contract.API}/servers", tags=["servers"])
def list_servers(
    backend: dependencies.AppBackend, principal: auth.Caller = viewer
) -> list[dict[str, Any]]:
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
    health_by_id = health_of(backend, members)
    now = time.time()
    rows = []
    for sid, info in sorted(members.items()):
        healthy, status = health_by_id.get(sid, (None, None))
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


def health_of(
    backend: dependencies.Backend, members: dict[str, registry_servers.ServerInfo]
) -> dict[str, tuple[bool | None, dict[str, Any] | None]]:
    """Each member's /healthz (this server's own status directly), fetched in parallel."""

    def probe(info: registry_servers.ServerInfo) -> tuple[bool | None, dict[str, Any] | None]:
        if info.id == backend.server_id:
            healthy, body = backend.status()
            return healthy, health.counts_only(body)
        if not info.health_url:
            return None, None
        verify = backend.peer_tls if backend.peer_tls is not None else True
        try:
            with bounded_http.client(verify, timeout=PEER_HEALTH_TIMEOUT_S) as http:
                answer = bounded_http.request(
                    http,
                    "GET",
                    f"{info.health_url}/healthz",
                    deadline_s=PEER_HEALTH_TIMEOUT_S,
                    max_bytes=PEER_HEALTH_MAX_BYTES,
                )
        except bounded_http.FetchError:
            return None, None
        try:
            body = json.loads(answer.body) if answer.complete else None
        except ValueError:
            body = None
        if 200 <= answer.status < 300:
            return (True, body) if body is not None else (None, None)
        return False, body

    if not members:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(members))) as pool:
        futures = {sid: pool.submit(probe, info) for sid, info in members.items()}
        return {sid: future.result() for sid, future in futures.items()}
