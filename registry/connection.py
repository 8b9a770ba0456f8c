"""ZooKeeper clients of the registry: how they are built (timeouts, retries, digest ACLs)
and the connection states a registry reports.

States and their legal transitions (:data:`TRANSITIONS`, the one source of truth)::

    CONNECTING -> CONNECTED    first session established and this server registered
    CONNECTED  -> SUSPENDED    connection to ZooKeeper lost; the session may still live
    SUSPENDED  -> CONNECTED    reconnected within the session timeout: same session
    CONNECTED|SUSPENDED -> LOST  the session expired: its ephemeral nodes are gone
    LOST       -> CONNECTED    a fresh session is established and this server registered again
    LOST       -> REFUSED      while we were away another live server took our id
    any        -> CLOSED       stop() was called (or start() failed)

``kazoo``'s own states (CONNECTED, SUSPENDED, LOST) are mapped onto these by
:mod:`registry.session`; CONNECTED is only reported once the server node exists, so a
server never leaves safe mode before it is visible to its peers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

from kazoo import security
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import Auth
from kazoo.security import ACL

from registry import errors


class _RedactAuth(logging.Filter):
    """kazoo logs every request it sends at DEBUG, the digest credential included."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, Auth) for a in record.args):
            record.args = tuple(
                f"Auth(scheme={a.scheme!r}, auth=<redacted>)" if isinstance(a, Auth) else a
                for a in record.args
            )
        return True


# kazoo's connection logs through its client's logger, "kazoo.client" by default.
logging.getLogger("kazoo.client").addFilter(_RedactAuth())


class State(StrEnum):
    CONNECTING = "connecting"  # start() in progress: no session yet
    CONNECTED = "connected"  # session live and this server registered: normal operation
    SUSPENDED = "suspended"  # connection lost, session may live: safe mode
    LOST = "lost"  # session expired: safe mode, registering again with a fresh session
    REFUSED = "refused"  # another live server took our id meanwhile: never registers again
    CLOSED = "closed"  # stopped: node deleted, session closed


S = State
# state -> the states it may move to.
TRANSITIONS: dict[State, frozenset[State]] = {
    S.CONNECTING: frozenset({S.CONNECTED, S.CLOSED}),
    S.CONNECTED: frozenset({S.SUSPENDED, S.LOST, S.CLOSED}),
    S.SUSPENDED: frozenset({S.CONNECTED, S.LOST, S.CLOSED}),
    S.LOST: frozenset({S.CONNECTED, S.REFUSED, S.CLOSED}),
    S.REFUSED: frozenset({S.CLOSED}),
    S.CLOSED: frozenset(),
}

# States in which a server claims and starts nothing new (it keeps renewing leases).
SAFE_MODE: frozenset[State] = frozenset({S.CONNECTING, S.SUSPENDED, S.LOST, S.REFUSED, S.CLOSED})


def allowed(current: State, target: State) -> bool:
    return target in TRANSITIONS[current]


def parse_auth(auth: str) -> tuple[str, str] | None:
    """``"user:password"`` -> ``(user, password)``; ``""`` -> None (no ACLs)."""
    if not auth:
        return None
    user, sep, password = auth.partition(":")
    if not sep or not user or not password:
        # Never echo the value: it is a credential.
        raise errors.InvalidServer("ZooKeeper auth must look like 'user:password'")
    return user, password


def identities(auth: str, previous_auth: str = "") -> list[tuple[str, str]]:
    """The digest identities a client holds: ``auth`` and, while the credential is being
    rotated, ``previous_auth`` (``docs/security.md``); none: open ACLs."""
    current, previous = parse_auth(auth), parse_auth(previous_auth)
    if previous is not None and current is None:
        raise errors.InvalidServer("a previous ZooKeeper auth needs a current one")
    if current is None:
        return []
    return [current] if previous is None or previous == current else [current, previous]


def acl(auth: str, previous_auth: str = "") -> list[ACL] | None:
    """The ACL of every node under the root: all permissions to each identity (the
    previous one too while rotating, so that servers on either credential see each
    other); None: open, as ZooKeeper's default."""
    held = identities(auth, previous_auth)
    if not held:
        return None
    return [security.make_digest_acl(user, password, all=True) for user, password in held]


def make_client(
    hosts: str, auth: str = "", session_timeout: float = 6.0, previous_auth: str = ""
) -> KazooClient:
    """A client that reconnects quickly and, with ``auth``, creates digest-protected nodes.

    Nodes created with ``auth`` grant every permission to that digest identity only (and
    to ``previous_auth``'s while rotating); the credentials travel in ``auth_data`` and
    are never logged by us.
    """
    options: dict[str, object] = {}
    held = identities(auth, previous_auth)
    if held:
        options["auth_data"] = [("digest", f"{user}:{password}") for user, password in held]
        options["default_acl"] = acl(auth, previous_auth)
    return KazooClient(
        hosts=hosts,
        timeout=session_timeout,
        # Retry connecting forever, but never wait long between attempts: a session
        # outlives a short outage only if we come back within its timeout.
        connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
        command_retry={"max_tries": 3, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
        **options,
    )


def start(client: KazooClient, hosts: str, timeout: float) -> None:
    """Open the client's session or raise :class:`ZooKeeperUnreachable`."""
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError:
        client.stop()
        client.close()
        raise errors.ZooKeeperUnreachable(
            f"cannot reach ZooKeeper at {hosts} within {timeout:g} s"
        ) from None


@contextlib.contextmanager
def opened(
    hosts: str, auth: str = "", timeout: float = 5.0, previous_auth: str = ""
) -> Iterator[KazooClient]:
    """A short-lived client for one-shot reads (the CLI); closed on exit."""
    client = make_client(
        hosts, auth, session_timeout=max(timeout, 2.0), previous_auth=previous_auth
    )
    start(client, hosts, timeout)
    try:
        yield client
    except NoAuthError:
        raise errors.RegistryError(
            "ZooKeeper refused access to the registry: check SPARKRING_ZK_AUTH"
        ) from None
    except (KazooException, KazooTimeoutError) as exc:
        raise errors.RegistryError(
            f"ZooKeeper at {hosts} failed the request ({type(exc).__name__})"
        ) from None
    finally:
        client.stop()
        client.close()


def wait(result: Any, timeout: float) -> Any:
    """The value of a kazoo ``*_async`` call, or ``KazooTimeoutError`` after ``timeout`` s.

    A synchronous kazoo call issued while the connection is down waits until it comes
    back, however long; the registry's threads must keep their own deadlines (stepping
    down as coordinator), so every call they make is bounded.
    """
    return result.get(timeout=timeout)


def session_hex(session_id: int) -> str:
    """ZooKeeper's own spelling of a session id (as in its logs): ``0x`` + hex."""
    return f"0x{session_id:x}"


def force_expire(hosts: str, session_id: int, password: bytes, timeout: float = 10.0) -> None:
    """Expire a live session from outside, as a fault injection (tests, benchmarks).

    A second client attaches to the same session (id and password) and closes it: the
    server ends the session and deletes its ephemeral nodes at once, and the original
    client learns on its next contact that its session expired.
    """
    twin = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=timeout)
    start(twin, hosts, timeout)
    twin.stop()  # stop() sends closeSession for the shared session
    twin.close()
