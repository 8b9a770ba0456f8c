"""The HTTP endpoint of one server process: the API and console app over the server's
state, behind the server's listener. ``sparkring server run`` hands :func:`open` to
``process.Server``, which calls it once at start-up with what it has built
(``process.EndpointPlace``): so the process floor never imports the web."""

from __future__ import annotations

from scheduler import job_views
from server import defaults, log_shipping, process
from server.web import api, dependencies, httpd, livelog


def open(place: process.EndpointPlace) -> httpd.HttpServer:
    """The listener, bound (its port known) but not yet serving. Raises OSError when
    the port cannot be bound."""
    server = place.server
    s = server.settings

    def shipped_log(job: job_views.JobView, epoch: int, lines: int) -> str | None:
        return livelog.shipped_run(
            place.bucket,
            log_shipping.log_key(job.name, job.id, epoch),
            log_shipping.legacy_log_key(job.name, epoch),
            job.created_at,
            lines,
        )

    backend = dependencies.Backend(
        server_id=server.id,
        engine=place.engine,
        status=server.status,
        members=lambda: server.registry.members() if server.registry else {},
        log_file=server.log_file,
        shipped_log=shipped_log,
        placement_epsilon=s.placement_epsilon,
        vnodes=defaults.RING_VNODES,
        bucket=place.bucket,
        max_artifact_bytes=s.max_artifact_bytes,
        peer_tls=place.peer_tls,
        alert_networks=s.alert_networks(),
        secret_box=s.secret_box(),
    )
    return httpd.HttpServer(api.create_app(backend), s.health_port, listener_tls=place.listener_tls)
