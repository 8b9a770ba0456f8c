"""Optional TLS of the server's HTTP listener (the API, the console, ``/healthz``) and
of the calls servers and the CLI make to a server's listener (live-log relays, peer
health).

- :class:`ServerTls` is the listener's certificate and key (``SPARKRING_TLS_CERT`` /
  ``SPARKRING_TLS_KEY``), checked once at start-up so that a bad file stops the server
  with an error naming the setting instead of failing in the HTTP thread.
- :func:`client_context` is what every call to a server's listener verifies against:
  ``SPARKRING_TLS_CA`` when set (a private CA, or a self-signed certificate itself),
  else the system's trust store. Host names are checked: a server's certificate must
  name its ``SPARKRING_ADVERTISE_HOST``, the address its peers use.

Neither ever puts a key's content in an error: only the setting's name and the path.
"""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path

from server import settings as settings_module

P = settings_module.ENV_PREFIX


class TlsError(Exception):
    """A TLS file cannot be used; the message names the setting and the path."""


@dataclasses.dataclass(frozen=True)
class ServerTls:
    """The listener's certificate chain and private key (PEM files)."""

    cert: Path
    key: Path


def server_tls(cert: Path | None, key: Path | None) -> ServerTls | None:
    """The listener's TLS from the settings (None: plain HTTP), its files loaded once
    to check them; raise :class:`TlsError` naming the setting that is wrong."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise TlsError(f"{P}TLS_CERT and {P}TLS_KEY go together: set both or neither")
    for name, path in ((f"{P}TLS_CERT", cert), (f"{P}TLS_KEY", key)):
        if not path.is_file():
            raise TlsError(f"{name}: no such file {path}")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        # The reason (e.g. KEY_VALUES_MISMATCH, PEM_LIB) names no content of the files.
        raise TlsError(
            f"{P}TLS_CERT {cert} and {P}TLS_KEY {key} do not load as a PEM certificate "
            f"chain and its private key ({exc.reason or 'unreadable'})"
        ) from None
    except OSError as exc:
        raise TlsError(
            f"{P}TLS_CERT {cert} / {P}TLS_KEY {key}: cannot read ({exc.strerror})"
        ) from None
    return ServerTls(cert=cert, key=key)


def scheme(listener: ServerTls | None) -> str:
    """The scheme of this server's own URL (``health_url``) as its peers use it."""
    return "https" if listener is not None else "http"


def client_context(ca: Path | None) -> ssl.SSLContext:
    """The context calls to a server's listener verify it with: ``ca`` (PEM, a CA or the
    self-signed certificate itself) when given, else the system's trust store."""
    if ca is None:
        return ssl.create_default_context()
    if not ca.is_file():
        raise TlsError(f"{P}TLS_CA: no such file {ca}")
    try:
        return ssl.create_default_context(cafile=str(ca))
    except ssl.SSLError as exc:
        raise TlsError(
            f"{P}TLS_CA {ca} does not load as PEM certificates ({exc.reason or 'unreadable'})"
        ) from None


def webhook_context(cluster_ca: Path | None = None) -> ssl.SSLContext:
    """What alert deliveries verify a receiver with: the system's trust store (a public
    receiver such as Slack or PagerDuty), plus the cluster's CA (``SPARKRING_TLS_CA``)
    only when ``SPARKRING_ALERT_TRUST_CLUSTER_CA`` asks for it. Never the cluster CA
    alone: with it every public receiver failed as "could not connect"."""
    context = ssl.create_default_context()
    if cluster_ca is not None:
        context.load_verify_locations(cafile=str(cluster_ca))
    return context
