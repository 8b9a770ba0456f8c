"""What the API's routes share, below them all: the server's ``Backend`` (its engine, its
view of the members, its logs and settings, as plain values and callables) and the
dependency that hands it to a route.

``api.create_app`` keeps the one ``Backend`` of the app in its state; a route of
``server/web/routes/`` takes it as a parameter (``backend: dependencies.AppBackend``), so
nothing here imports a route or the app.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, Request

from registry import servers as registry_servers
from resource_center import store
from scheduler import destinations, job_views
from server import defaults

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet


@dataclasses.dataclass(frozen=True)
class Backend:
    """What the API needs from its server process, as plain callables."""

    server_id: str
    engine: sa.Engine
    status: Callable[[], tuple[bool, dict[str, Any]]]
    members: Callable[[], dict[str, registry_servers.ServerInfo]]
    log_file: Callable[[str], Path | None]
    # (the job as job_views.show returns it, epoch, lines) -> the tail of that run's log
    # shipped to S3, or None.
    shipped_log: Callable[[job_views.JobView, int, int], str | None]
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


async def get_backend(request: Request) -> Backend:
    """The ``Backend`` of the app serving ``request`` (``api.create_app`` keeps it)."""
    return request.app.state.backend


# A route's parameter: the server's Backend (no input, not in the OpenAPI document).
AppBackend = Annotated[Backend, Depends(get_backend)]
