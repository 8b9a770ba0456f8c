"""The live view of registered servers: watched in ZooKeeper, debounced, delivered from
a thread of our own.

How a change travels::

    child watch fires (kazoo's event thread)  -> only sets the dirty flag
    dirty -> wait ``debounce`` seconds         -> the membership thread reads every node
    read  -> re-arms the watch                -> on_members(view) if the view changed

The watch is not re-armed until the read, so however often a member flaps, the thread
reads (and may notify) at most once per ``debounce`` window: over ``T`` seconds of
flapping there are at most ``T / debounce + 1`` notifications, and none when the view
comes back to what was last delivered. The view is always re-read whole, never patched
from events, so a late event about an old incarnation cannot remove a new one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import WatchedEvent

from registry import servers

log = logging.getLogger(__name__)

MembersCallback = Callable[[dict[str, servers.ServerInfo]], None]


class Membership:
    """A watched, debounced view of ``<root>/servers``."""

    def __init__(
        self,
        client: KazooClient,
        root: str,
        on_members: MembersCallback | None,
        debounce: float,
        timeout: float = 5.0,
    ) -> None:
        self._client = client
        self._root = root
        self._on_members = on_members
        self._debounce = debounce
        self._timeout = timeout  # bound of each ZooKeeper call, seconds
        self._lock = threading.Lock()
        self._current: dict[str, servers.ServerInfo] = {}
        self._dirty = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Read the view once (so ``current()`` is right at once), then watch it."""
        view = self._read()
        with self._lock:
            self._current = view
        self._thread = threading.Thread(
            target=self._run, name="sparkring-registry-membership", daemon=True
        )
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def current(self) -> dict[str, servers.ServerInfo]:
        with self._lock:
            return dict(self._current)

    def refresh(self) -> None:
        """Ask for a re-read (after a reconnection: watches may have been lost)."""
        self._dirty.set()

    def stop(self) -> None:
        self._stopped.set()
        self._dirty.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def _on_event(self, event: WatchedEvent) -> None:
        # kazoo's event thread: never block here.
        self._dirty.set()

    def _read(self) -> dict[str, servers.ServerInfo]:
        return servers.read_all(self._client, self._root, self._timeout, watch=self._on_event)

    def _run(self) -> None:
        delivered: dict[str, servers.ServerInfo] | None = None
        with self._lock:
            view = dict(self._current)
        while not self._stopped.is_set():
            if view != delivered:
                self._deliver(view)
                delivered = view
            self._dirty.wait()
            # The debounce window (and the back-off after a failed read).
            if self._stopped.wait(self._debounce):
                return
            self._dirty.clear()
            try:
                view = self._read()
            except (KazooException, KazooTimeoutError) as exc:
                # Disconnected or expired: keep the last view, try again next window.
                log.debug(
                    "membership read failed",
                    extra={"action": "read_members", "error": type(exc).__name__},
                )
                self._dirty.set()
                view = delivered if delivered is not None else {}
                continue
            with self._lock:
                self._current = view

    def _deliver(self, view: dict[str, servers.ServerInfo]) -> None:
        log.info(
            "membership changed",
            extra={"action": "members", "servers": sorted(view)},
        )
        if self._on_members is None:
            return
        try:
            self._on_members(dict(view))
        except Exception:  # a callback bug must not end membership tracking
            log.exception("on_members callback failed", extra={"action": "members"})
