"""The live servers (``/api/v1/servers``) and who is asking (``/api/v1/whoami``)."""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends

from registry import servers as registry_servers
from server.web import auth, contract
from server.web.routes import health

if TYPE_CHECKING:
    from server.web import api

# How long the server list waits for a peer's /healthz, seconds.
PEER_HEALTH_TIMEOUT_S = 1.0


def router(backend: api.Backend, authenticator: auth.Authenticator) -> APIRouter:
    routes = APIRouter(responses=contract.errors(*contract.READ))
    viewer = Depends(authenticator.reader)

    @routes.get(f"{contract.API}/whoami", tags=["auth"])
    def whoami(principal: auth.Caller = viewer) -> dict[str, Any]:
        """The token's name and role (the console's login check)."""
        return {"name": principal.name, "role": principal.role.value, "server": backend.server_id}

    @routes.get(f"{contract.API}/servers", tags=["servers"])
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

    return routes


def health_of(
    backend: api.Backend, members: dict[str, registry_servers.ServerInfo]
) -> dict[str, tuple[bool | None, dict[str, Any] | None]]:
    """Each member's /healthz (this server's own status directly), fetched in parallel."""

    def probe(info: registry_servers.ServerInfo) -> tuple[bool | None, dict[str, Any] | None]:
        if info.id == backend.server_id:
            healthy, body = backend.status()
            return healthy, health.counts_only(body)
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
