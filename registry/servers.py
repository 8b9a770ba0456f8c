"""The registration record of a server and the registry's znode layout.

Layout under the cluster root (``SPARKRING_ZK_ROOT``, default ``/sparkring``)::

    <root>/servers/<id>              ephemeral; JSON of :class:`ServerInfo` (its details
                                 rewritten in place by its own session)
    <root>/election/<id>-<nonce>-<seq>  ephemeral sequential; a coordinator candidate

A server node is owned by the ZooKeeper session that created it (its
``ephemeralOwner``), and the record repeats that session id, so a restarted server is
told apart from its old incarnation by session, never by id alone.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from registry import connection, errors

log = logging.getLogger(__name__)

ROLES = frozenset({"both", "coordinator", "worker"})
# Roles that stand for coordinator election ("worker" never coordinates).
ELECTABLE_ROLES = frozenset({"both", "coordinator"})
_ID_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


@dataclass(frozen=True)
class ServerInfo:
    """What a server publishes about itself in its ephemeral node."""

    id: str
    host: str
    pid: int
    capacity: int  # maximum concurrent drivers
    role: str  # "both", "coordinator" or "worker"
    version: str
    started_at: float  # epoch seconds
    health_url: str = ""
    session_id: str = ""  # "0x..." of the session owning the node; set on registration
    # The OS user its drivers run as ("" from a server before it was published), and
    # whether that is a user of their own (False: the server's own user, no sandbox).
    driver_user: str = ""
    driver_user_isolated: bool = False
    # Whether each Spark master this server uses answers, by "host:port" ({} from a
    # server before it was published, or with no spark:// master). Updated in place
    # (Registry.publish); not part of the member's identity: a master that flips is no
    # membership change.
    spark_masters: dict[str, bool] = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        validate_id(self.id)
        if str(self.role) not in ROLES:
            raise errors.InvalidServer(
                f"server role {self.role!r} is not one of {', '.join(sorted(ROLES))}"
            )
        # A StrEnum from the settings is stored as its plain value.
        object.__setattr__(self, "role", str(self.role))
        if self.capacity < 0:
            raise errors.InvalidServer(f"server capacity {self.capacity} is negative")
        if not isinstance(self.spark_masters, dict) or not all(
            isinstance(k, str) and isinstance(v, bool) for k, v in self.spark_masters.items()
        ):
            raise errors.InvalidServer(
                f"server spark_masters {self.spark_masters!r}: not a map of host:port to true/false"
            )

    @property
    def electable(self) -> bool:
        return self.role in ELECTABLE_ROLES

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ServerInfo:
        try:
            raw = json.loads(data)
            fields = {f.name for f in dataclasses.fields(cls)}
            # Unknown keys come from newer versions: ignore them, keep rolling upgrades.
            return cls(**{k: v for k, v in raw.items() if k in fields})
        except (ValueError, TypeError) as exc:
            raise errors.InvalidServer(f"malformed server record: {exc}") from None


def validate_id(server_id: str) -> str:
    if not server_id or len(server_id) > 64 or not set(server_id) <= _ID_CHARACTERS:
        raise errors.InvalidServer(
            f"server id {server_id!r} must be 1-64 characters of letters, digits, '-', '_' or '.'"
        )
    return server_id


def validate_root(root: str) -> str:
    if not root.startswith("/") or root.endswith("/") or "//" in root:
        raise errors.InvalidServer(
            f"ZooKeeper root {root!r} must be an absolute path like /sparkring"
        )
    return root


def servers_path(root: str) -> str:
    return f"{root}/servers"


def server_path(root: str, server_id: str) -> str:
    return f"{servers_path(root)}/{server_id}"


def election_path(root: str) -> str:
    return f"{root}/election"


def read_all(
    client: KazooClient, root: str, timeout: float = 5.0, watch: Callable[..., object] | None = None
) -> dict[str, ServerInfo]:
    """Every registered server, by id; malformed records are logged and skipped.

    ``watch`` is armed on the listing and on each node (a server that publishes new
    details changes its node's data, not the listing); each call waits at most
    ``timeout`` seconds.
    """
    try:
        children = connection.wait(
            client.get_children_async(servers_path(root), watch=watch), timeout
        )
    except NoNodeError:
        return {}
    found: dict[str, ServerInfo] = {}
    for name in sorted(children):
        try:
            data, _ = connection.wait(
                client.get_async(server_path(root, name), watch=watch), timeout
            )
        except NoNodeError:
            continue  # left between the listing and the read
        try:
            found[name] = ServerInfo.from_bytes(data)
        except errors.InvalidServer as exc:
            log.warning(
                "skipping a malformed server node",
                extra={"action": "read_servers", "server": name, "error": str(exc)},
            )
    return found


def list_servers(
    hosts: str, root: str, auth: str = "", timeout: float = 5.0, previous_auth: str = ""
) -> list[ServerInfo]:
    """The live servers now, sorted by id: one short session, for the CLI."""
    validate_root(root)
    with connection.opened(hosts, auth, timeout, previous_auth) as client:
        return sorted(read_all(client, root, timeout).values(), key=lambda info: info.id)
