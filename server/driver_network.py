"""Where a driver listens and the address it gives its executors.

A PySpark driver runs in client mode on its server, and every executor connects back to
it (its RPC endpoint, its block manager, the files it serves). With a ``local[...]``
master the executors live inside the driver's own JVM, so loopback is right and keeps
the driver unreachable from elsewhere. With a cluster master (``spark://...``) the
executors run in other processes, containers or hosts, and a driver that advertises
loopback is never reached: each executor dies with "Connection refused:
localhost/127.0.0.1" and the job waits for resources for ever.

So for a cluster master the driver binds on, and advertises, the server's own address
(``SPARKRING_ADVERTISE_HOST``, the address its peers use, resolved once to an IP so that
an executor does not need the server's host name in its resolver): ``spark.driver.host``
is that address unless the job's ``--conf`` sets one, and Spark's
``spark.driver.bindAddress`` follows it unless the job sets that too. Its UI stays where
``SPARK_LOCAL_IP`` puts it, loopback by default (``server/driver.py``): the server's
health monitor reads it there, and nobody else needs the UI's kill buttons.

The ports stay Spark's (random unless the job pins ``spark.driver.port`` and
``spark.blockManager.port``: docs/deployment.md, "Networking").
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping

LOOPBACK = "127.0.0.1"
DRIVER_HOST_CONF = "spark.driver.host"


def is_local(master: str) -> bool:
    """Whether ``master`` runs the executors inside the driver (``local``, ``local[N]``,
    ``local[N,F]``, ``local-cluster[...]`` is not: its executors are other JVMs)."""
    master = master.strip()
    return master == "local" or master.startswith("local[")


def resolve(host: str) -> str:
    """``host`` as an IP address: itself when it is one, else its first IPv4 (then any)
    address from this machine's resolver, else ``host`` unchanged (Spark resolves it
    then, and the executors must too)."""
    host = host.strip().strip("[]")
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return host
    addresses = [str(info[4][0]) for info in infos]
    ipv4 = [a for a in addresses if ":" not in a]
    return (ipv4 or addresses or [host])[0]


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def driver_conf(master: str, address: str | None, conf: Mapping[str, str]) -> dict[str, str]:
    """The Spark conf a driver of ``master`` needs so that its executors reach it: its
    host, unless ``conf`` (the job's own) names one. Empty for a local master."""
    if is_local(master) or not address or DRIVER_HOST_CONF in conf:
        return {}
    return {DRIVER_HOST_CONF: address}


def free_port(host: str = LOOPBACK) -> int:
    """A port free on ``host`` now, for a driver's UI: the server picks it (Spark moves
    on to the next ones if it is taken meanwhile)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
