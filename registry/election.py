"""Coordinator election among servers whose role is ``both`` or ``coordinator``.

Each candidate holds an ephemeral sequential node ``<root>/election/<id>-<nonce>-<seq>``;
the candidate with the lowest sequence number is the coordinator. Its **term** is the
``czxid`` of its candidate node: the ZooKeeper transaction id that created it.

Why czxid: zxids are totally ordered and only grow for the life of the ensemble (the
high 32 bits are ZooKeeper's own leader epoch), so they survive the election folder being
deleted and recreated, which a sequence number does not. A new coordinator's node was
created after the old coordinator's (lower sequence wins, and the old one was lowest), so
every new term is strictly greater than every earlier one, and a server re-entering
gets a fresh, larger term. The value fits PostgreSQL's ``bigint``: use it as the fencing
token of coordinator writes (``WHERE term <= :term``).

Transitions of one candidate (driven by :mod:`registry.session`)::

    out       -> candidate   join(): node created (found again by nonce after a lost reply)
    candidate -> leader      evaluate(): our node is the lowest
    leader    -> candidate   never while our node lives (nobody can undercut it)
    candidate|leader -> out  leave(), or the session expired (the node is gone)

The nonce in the node name lets a retried create find the node an earlier, unanswered
attempt made, instead of leaving a ghost candidate that would win elections forever.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import WatchedEvent

from registry import connection, servers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Leader:
    """The coordinator as seen in ZooKeeper."""

    server_id: str
    term: int  # czxid of its candidate node
    node: str  # name of its candidate node


def _sequence(name: str) -> int | None:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _candidates(children: list[str]) -> list[str]:
    """Candidate node names, lowest sequence (the coordinator) first."""
    numbered = [(seq, name) for name in children if (seq := _sequence(name)) is not None]
    return [name for _, name in sorted(numbered)]


def leader(client: KazooClient, root: str, timeout: float = 5.0) -> Leader | None:
    """The current coordinator, or None when no candidate exists."""
    path = servers.election_path(root)
    try:
        names = _candidates(connection.wait(client.get_children_async(path), timeout))
    except NoNodeError:
        return None
    for name in names:
        try:
            data, stat = connection.wait(client.get_async(f"{path}/{name}"), timeout)
        except NoNodeError:
            continue  # it left between the listing and the read: the next one leads
        try:
            server_id = str(json.loads(data)["id"])
        except (ValueError, KeyError, TypeError):
            server_id = name.rsplit("-", 2)[0]
        return Leader(server_id=server_id, term=stat.czxid, node=name)
    return None


class Election:
    """One server's candidacy. Not thread-safe: one registry thread drives it.

    Every ZooKeeper call waits at most ``timeout`` seconds and raises on failure
    (``KazooException`` or ``KazooTimeoutError``); the caller retries later.
    """

    def __init__(self, client: KazooClient, root: str, server_id: str, timeout: float) -> None:
        self._client = client
        self._path = servers.election_path(root)
        self._server_id = server_id
        self._timeout = timeout
        # Kept until a join succeeds, so a retry finds the node of an unanswered create.
        self._nonce = uuid.uuid4().hex[:12]
        self.node: str | None = None  # our candidate node's name while we stand
        self.term: int | None = None  # czxid of our node

    def _call(self, result: object) -> object:
        return connection.wait(result, self._timeout)

    def join(self, session_id: str) -> None:
        """Stand as a candidate; a no-op while our node exists."""
        if self.node is not None:
            return
        prefix = f"{self._server_id}-{self._nonce}-"
        children = self._call(self._client.get_children_async(self._path))
        name = next((n for n in children if n.startswith(prefix)), None)
        if name is None:
            data = json.dumps({"id": self._server_id, "session_id": session_id}).encode()
            created = self._call(
                self._client.create_async(
                    f"{self._path}/{prefix}", data, ephemeral=True, sequence=True
                )
            )
            name = str(created).rsplit("/", 1)[1]
        stat = self._call(self._client.exists_async(f"{self._path}/{name}"))
        if stat is None:
            raise NoNodeError(f"candidate node {name} vanished right after creation")
        self.node, self.term = name, stat.czxid
        self._nonce = uuid.uuid4().hex[:12]
        log.info(
            "joined the coordinator election",
            extra={"action": "election_join", "server": self._server_id, "term": self.term},
        )

    def forget(self) -> None:
        """Our session expired: its node is gone with it."""
        self.node, self.term = None, None

    def evaluate(self, watch: Callable[[WatchedEvent], object]) -> int | None:
        """Our term if we lead now, else None; re-arms ``watch`` on the candidates.

        A missing own node (deleted by hand) clears the candidacy: the caller joins again.
        """
        children = self._call(self._client.get_children_async(self._path, watch=watch))
        names = _candidates(list(children))
        if self.node is not None and self.node not in names:
            self.forget()
        if self.node is None or names[0] != self.node:
            return None
        return self.term

    def leave(self) -> None:
        """Stop standing: delete our node (a new coordinator is elected at once).

        The node is forgotten only once deleted: after a failed delete (ZooKeeper
        unreachable) a retry must still find it, or it would stay the lowest candidate
        with nobody acting on it."""
        node = self.node
        if node is None:
            return
        try:
            self._call(self._client.delete_async(f"{self._path}/{node}"))
        except NoNodeError:
            pass
        self.forget()
        log.info(
            "left the coordinator election",
            extra={"action": "election_leave", "server": self._server_id},
        )
