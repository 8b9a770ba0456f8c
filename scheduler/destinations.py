"""Where a server may send a webhook: the destination policy of alerts.

An operator names a webhook URL; every server then POSTs to it and records the answer's
status, which any viewer reads back. Left open, that makes the servers a proxy into the
cluster's own network: the cloud's metadata service (169.254.169.254), PostgreSQL on
127.0.0.1:5432, a Spark master's ``/app/kill/``. So, as GitLab and Grafana do, a
webhook's host must resolve only to public addresses: loopback, link-local, private,
shared (100.64/10), multicast, reserved and unspecified addresses are refused unless an
allowed network (``SPARKRING_ALERT_ALLOW_NETWORKS``, CIDRs) holds them. The check runs
when an alert is created or changed (the CLI, the API) and again before every send
(a name may resolve elsewhere later).

Pure but for :func:`resolve` (the host's addresses from this machine's resolver).
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Iterable, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class DestinationError(ValueError):
    """The webhook's destination is refused; the message names the host, never the URL
    (whose path or query may hold a credential)."""


class Unresolved(DestinationError):
    """The webhook's host does not resolve here (now): nothing to judge yet."""


def parse_networks(value: str | Iterable[str]) -> tuple[Network, ...]:
    """CIDRs (``10.0.0.0/8``) or single addresses, comma-separated or a list; ValueError
    naming the one that is not."""
    items = value.split(",") if isinstance(value, str) else list(value)
    networks = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an address or a CIDR network") from None
    return tuple(networks)


def is_public(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def refused(addresses: Iterable[Address], allow: Sequence[Network]) -> list[Address]:
    """Of ``addresses``, those neither public nor in an allowed network."""
    return [a for a in addresses if not is_public(a) and not any(a in network for network in allow)]


def resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to here (a literal address: itself)."""
    host = host.strip("[]")
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise Unresolved(f"the webhook's host {host} does not resolve ({exc})") from None
    return sorted({ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos}, key=str)


def check(url: str, allow: Sequence[Network]) -> None:
    """Raise :class:`DestinationError` unless every address of ``url``'s host is public
    or allowed (:class:`Unresolved` when it has none here)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    try:
        host.encode("idna")
    except UnicodeError:
        raise DestinationError("the webhook's host is not a valid host name") from None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    bad = refused(resolve(host, port), allow)
    if bad:
        raise DestinationError(
            f"the webhook's host {host} resolves to {', '.join(map(str, bad))}: loopback, "
            "link-local, private and reserved addresses are refused unless "
            "SPARKRING_ALERT_ALLOW_NETWORKS allows them (docs/alerts.md)"
        )
