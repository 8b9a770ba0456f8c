"""The Spark standalone master a job's driver registers with: where it listens, whether
any of its masters answers, and whether a driver got as far as registering.

An outage of the cluster manager is never the job's failure (DESIGN S9): before a driver
is launched, and when a driver exits before its SparkContext registered, its server (or
its watchdog) asks :func:`unreachable`; a job whose masters all fail to answer is
deferred (``distribution.defer``, cause :data:`CAUSE`) instead of crashing. Only
``spark://`` URLs are checked: ``local[...]`` and other cluster managers have nothing
here to wait for.

Pure parsing plus a TCP connect per master; no state of sparkring's own.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from server import driver_error
from sql import states

# The standalone master's default RPC port (a spark:// host given without one).
DEFAULT_PORT = 7077
# How long one master may take to accept a TCP connection, seconds.
PROBE_TIMEOUT_S = 2.0
# The deferral's cause, in its event and in the coordinator's streak filter.
CAUSE = states.DeferCause.SPARK_MASTER_UNREACHABLE
# StandaloneSchedulerBackend, once the master accepted the application (INFO, logged
# while the SparkContext starts, before a job can lower the log level).
_REGISTERED = "Connected to Spark cluster with app ID"
# StandaloneAppClient's give-up (ERROR): no master answered any of its registration
# attempts (3, 20 s apart). A standby master may answer by the time the server looks.
_GAVE_UP = "All masters are unresponsive! Giving up."
_HOST_PORT = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))(?::(?P<port>\d+))?$"
)


class MasterURLError(ValueError):
    """A ``spark://`` URL that names no usable ``host:port``."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def endpoints(master: str) -> list[Endpoint]:
    """The masters of a ``spark://h1:p1,h2:p2`` URL, in order; ``[]`` for any other
    master (``local[...]``, ``yarn``, ``k8s://...``): nothing to check. Raises
    :class:`MasterURLError` for a ``spark://`` URL with a bad or empty entry."""
    if not master.startswith("spark://"):
        return []
    found = []
    for entry in master[len("spark://") :].rstrip("/").split(","):
        match = _HOST_PORT.match(entry.strip())
        if match is None:
            raise MasterURLError(f"Spark master {master!r}: {entry!r} is not host[:port]")
        port = int(match["port"] or DEFAULT_PORT)
        if not 0 < port < 65536:
            raise MasterURLError(f"Spark master {master!r}: port {port} is out of range")
        found.append(Endpoint(match["v6"] or match["host"], port))
    return found


def answers(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when ``endpoint`` accepts a TCP connection within ``timeout`` seconds."""
    try:
        socket.create_connection((endpoint.host, endpoint.port), timeout).close()
    except OSError:
        return False
    return True


def unreachable(
    master: str,
    *,
    probe: Callable[[Endpoint], bool] = answers,
) -> bool:
    """True when ``master`` is a ``spark://`` URL none of whose masters answers: a
    driver started now could not register, through no fault of the job's. False for a
    master that answers, and for any non-standalone master."""
    found = endpoints(master)
    return bool(found) and not any(probe(endpoint) for endpoint in found)


def registered(log: str) -> bool:
    """Whether a driver log shows that its SparkContext registered with a master."""
    return _REGISTERED in log


def lost_to_outage(
    master: str, log_file: Path, *, probe: Callable[[Endpoint], bool] = answers
) -> bool:
    """A driver of ``master`` that ended with an error was the master's victim, not the
    job's: its log never shows the registration, and either no master answers now, or
    Spark itself gave up on every master (a standby that took over after the driver's
    last attempt answers now: Spark tries for about 60 s, a takeover after kill -9 takes
    ZooKeeper's session timeout, up to 60 s). Never for a non-standalone master, nor for
    a malformed URL (the job's own error)."""
    try:
        if not endpoints(master):
            return False
    except MasterURLError:
        return False
    log = driver_error.read_log(log_file)
    if registered(log):
        return False
    return _GAVE_UP in log or unreachable(master, probe=probe)


def wait_before_retry(deferrals: int, base: float, cap: float) -> float:
    """Seconds to wait before the ``deferrals``-th consecutive look at a master that did
    not answer (0: the first deferral): ``base`` doubling, at most ``cap``. The same
    doubling paces a start deferred for any other passing reason (``outcomes.defer``)."""
    if deferrals < 0 or base < 0 or cap < 0:
        raise ValueError("deferrals, base and cap must not be negative")
    return min(cap, base * 2 ** min(deferrals, 32))


def detail(master: str) -> str:
    """The deferral's error: its cause and the master, one line."""
    return f"cause={CAUSE} master={master}"
