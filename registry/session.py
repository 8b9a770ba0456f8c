"""The :class:`Registry` a server process runs: one ZooKeeper session holding this
server's node, the membership view, the coordinator candidacy and the connection-state
policy (``docs/registry.md``).

Threads: kazoo's threads only enqueue (state listener, watches). One registry thread
(``sparkring-registry-session``) owns every reaction: it registers again after LOST,
joins and evaluates the election, steps down, and calls ``on_state`` and
``on_coordinator``. The membership thread calls ``on_members``. Callbacks therefore never
run on kazoo's threads, and a slow callback delays only the registry, never ZooKeeper.

Connection-state policy (states and transitions in :mod:`registry.connection`):

- SUSPENDED: safe mode (``safe_mode`` is True: claim and start nothing new). Our node and
  candidacy may survive. A coordinator suspended longer than ``step_down_after`` steps
  down (``on_coordinator(None)``); if it reconnects with the same session and its node is
  still the lowest, it resumes with the same term (nobody else could have been elected).
- LOST: the session and its nodes are gone. Safe mode; a coordinator steps down at once;
  on the fresh session kazoo opens, the server registers again and re-enters the
  election with a new, higher term.
- REFUSED: while we were away another live server registered our id; we never register
  again. The server process should exit.
- A ZooKeeper outage alone never stops running drivers: the PostgreSQL lease decides.
- Withdrawn (:meth:`Registry.withdraw`, asked by a server that cannot renew its
  leases: cut off from PostgreSQL only): the session stays, but our node and our
  candidacy are deleted (a coordinator steps down first), so peers see a departure,
  place our jobs elsewhere and elect another coordinator. Nothing registers again
  until the withdrawal is lifted; then the node is created again (refused, as after
  LOST, if another live server took our id meanwhile) and we stand again.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState, WatchedEvent
from kazoo.security import ACL, OPEN_ACL_UNSAFE

from registry import connection, election, errors, membership, servers

log = logging.getLogger(__name__)

State = connection.State
# A holder of our id whose node outlives one session timeout plus this is alive, seconds.
HOLDER_GRACE_S = 2.0
# Pause before retrying a failed registry operation, seconds.
RETRY_S = 0.5

ZK_ERRORS = (KazooException, KazooTimeoutError)
# The fields of our record a server may change while registered (publish()); the others
# say who the server is and stay as registered.
PUBLISHABLE = frozenset({"spark_masters"})


class Registry:
    """This server's presence in ZooKeeper. ``start()`` once, ``stop()`` any number of times."""

    def __init__(
        self,
        hosts: str,
        root: str,
        info: servers.ServerInfo,
        session_timeout: float = 6.0,
        auth: str = "",
        previous_auth: str = "",
        on_members: membership.MembersCallback | None = None,
        on_coordinator: Callable[[int | None], None] | None = None,
        on_state: Callable[[connection.State], None] | None = None,
        debounce: float = 0.5,
        step_down_after: float | None = None,
    ) -> None:
        if session_timeout <= 0 or debounce < 0:
            raise errors.InvalidServer("session_timeout must be > 0 and debounce >= 0")
        self._hosts = hosts
        self._root = servers.validate_root(root)
        self._info = info
        self._session_timeout = session_timeout
        # The ACL of every node under the root; None: open (no SPARKRING_ZK_AUTH).
        self._acl = connection.acl(auth, previous_auth)
        self._on_coordinator = on_coordinator
        self._on_state = on_state
        # A quarter of the session timeout: long enough to ride through a ZooKeeper
        # leader election (~0.4 s), short enough to step down well before the session
        # can expire and another candidate be elected (kazoo notices a dead connection
        # about 2/3 of a timeout after the last reply, the server expires it at 3/3).
        self._step_down_after = session_timeout / 4 if step_down_after is None else step_down_after
        # Bound of each ZooKeeper call made by our threads, seconds.
        self._call_timeout = max(self._step_down_after, 1.0)
        self._client: KazooClient = connection.make_client(
            hosts, auth, session_timeout, previous_auth
        )
        self._membership = membership.Membership(
            self._client, self._root, on_members, debounce, self._call_timeout
        )
        self._election = (
            election.Election(self._client, self._root, info.id, self._call_timeout)
            if info.electable
            else None
        )
        self._lock = threading.Lock()
        self._state = State.CONNECTING
        self._term: int | None = None  # our term while we are the coordinator
        self._session_id: int | None = None  # the session owning our server node
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._started = False
        self._stopped = False
        # Work the session thread still owes, retried until done.
        self._must_register = False
        self._election_dirty = True
        self._step_down_at: float | None = None
        self._retry_at: float | None = None
        self._withdrawn = False  # asked (withdraw()): stay out of membership and election
        self._out = False  # done (session thread only): our node and candidacy are deleted
        self._must_publish = False  # our node's data is older than self._info (publish())

    # ------------------------------------------------------------------ public view

    @property
    def state(self) -> connection.State:
        with self._lock:
            return self._state

    @property
    def safe_mode(self) -> bool:
        """True while this server must claim and start nothing new."""
        return self.state in connection.SAFE_MODE

    @property
    def withdrawn(self) -> bool:
        """True while :meth:`withdraw` asks us to stay out of membership and election."""
        with self._lock:
            return self._withdrawn

    def withdraw(self, withdrawn: bool) -> None:
        """Leave membership and the election while ``withdrawn`` (keeping the session),
        or come back. Idempotent; done by the registry's thread, retried until done."""
        with self._lock:
            if self._withdrawn == withdrawn:
                return
            self._withdrawn = withdrawn
        self._events.put(("withdraw", withdrawn))

    @property
    def is_coordinator(self) -> bool:
        return self._term is not None

    def confirm_leader(self) -> bool:
        """Ask ZooKeeper now (not the cached view) whether our node leads the election."""
        term = self._term
        if term is None or self.state != connection.State.CONNECTED:
            return False
        try:
            current = election.leader(self._client, self._root)
        except Exception:  # unreachable or changing: not confirmed
            return False
        return current is not None and current.term == term

    @property
    def term(self) -> int | None:
        """Our coordinator term (a fencing token) while we are the coordinator."""
        return self._term

    @property
    def info(self) -> servers.ServerInfo:
        """Our record as last registered (``session_id`` filled in)."""
        return self._info

    def publish(self, **details: Any) -> None:
        """Change details of our record (:data:`PUBLISHABLE`: ``spark_masters``) and
        rewrite our node with them. Returns at once: the session thread writes the node
        (retrying until done), and a later registration carries the latest details."""
        unknown = set(details) - PUBLISHABLE
        if unknown:
            raise errors.InvalidServer(
                f"cannot publish {', '.join(sorted(unknown))}: only "
                f"{', '.join(sorted(PUBLISHABLE))} may change while registered"
            )
        with self._lock:
            self._info = dataclasses.replace(self._info, **details)
            self._must_publish = True
        self._events.put(("publish", None))

    def members(self) -> dict[str, servers.ServerInfo]:
        """The live servers, by id, as last read (at most one debounce window old)."""
        return self._membership.current()

    # ------------------------------------------------------------------ life cycle

    def start(self, timeout: float = 10.0) -> None:
        """Connect (within ``timeout`` seconds), register and start watching; raise a
        :class:`~registry.errors.RegistryError` on failure.

        An old incarnation's node is waited for a session timeout plus a grace from the
        moment ZooKeeper answered, whatever is left of ``timeout`` then."""
        with self._lock:
            if self._started:
                raise errors.RegistryError("this registry was already started")
            self._started = True
        connection.start(self._client, self._hosts, timeout)
        try:
            self._client.add_listener(self._on_kazoo_state)
            self._ensure_paths()
            session_id = self._current_session()
            # A dead predecessor's node goes within its session timeout; one that
            # outlives that by a margin belongs to a live server. Counted from now, not
            # from the start: an ensemble back from an outage gives every old session a
            # full timeout again, so a successor that reached it late (a planned restart
            # during the outage) must still wait that long.
            wait_until = time.monotonic() + self._session_timeout + HOLDER_GRACE_S
            self._register(session_id, wait_until)
            self._membership.start()
        except NoAuthError:
            self._abort()
            raise errors.RegistryError(
                "ZooKeeper refused access to the registry: check SPARKRING_ZK_AUTH"
            ) from None
        except ZK_ERRORS as exc:
            self._abort()
            raise errors.ZooKeeperUnreachable(
                f"ZooKeeper at {self._hosts} failed during registration ({type(exc).__name__})"
            ) from None
        except BaseException:
            self._abort()
            raise
        with self._lock:
            self._state = State.CONNECTED
        self._thread = threading.Thread(
            target=self._run, name="sparkring-registry-session", daemon=True
        )
        self._thread.start()

    def threads_alive(self) -> bool:
        """The session loop and the membership watcher both run (after ``start``)."""
        thread = self._thread
        return thread is not None and thread.is_alive() and self._membership.is_alive()

    def stop(self) -> None:
        """Leave the election, delete our node, close the session. Idempotent.

        Called from one of our own callbacks, it only asks and returns at once.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        thread = self._thread
        if thread is None:
            self._abort()
            return
        self._events.put(("stop", None))
        if thread is not threading.current_thread():
            thread.join()

    def expire_session(self) -> None:
        """Fault injection (tests, benchmarks, chaos): expire our session from outside."""
        client_id = self._client.client_id
        if client_id is None:
            raise errors.RegistryError("no live session to expire")
        connection.force_expire(self._hosts, client_id[0], client_id[1])

    # ------------------------------------------------------------------ kazoo side

    def _on_kazoo_state(self, state: KazooState) -> None:
        # kazoo's connection thread: enqueue only.
        self._events.put(("kazoo", state))

    def _on_election_event(self, event: WatchedEvent) -> None:
        self._events.put(("election", None))

    # ------------------------------------------------------------------ registration

    def _call(self, result: Any) -> Any:
        return connection.wait(result, self._call_timeout)

    def _current_session(self) -> int:
        client_id = self._client.client_id
        if client_id is None:
            raise KazooTimeoutError("no session")
        return int(client_id[0])

    def _ensure_paths(self) -> None:
        parent = self._root.rsplit("/", 1)[0]
        if self._acl is not None and parent:
            # Folders above our root stay open: protecting them is the operator's
            # business, and other clusters may share them.
            self._call(self._client.ensure_path_async(parent, acl=OPEN_ACL_UNSAFE))
        folders = (self._root, servers.servers_path(self._root), servers.election_path(self._root))
        for path in folders[1:]:
            self._call(self._client.ensure_path_async(path))
        if self._acl is not None:
            for path in folders:
                self._protect(path, self._acl)

    def _protect(self, path: str, acl: list[ACL]) -> None:
        """Give a folder of the root exactly ``acl``: one made before the cluster had
        a credential (open), or under the previous credential while it is rotated
        (``docs/security.md``). Ephemeral nodes need nothing: they go with their session."""
        current, _ = self._call(self._client.get_acls_async(path))
        if set(current) != set(acl):
            self._call(self._client.set_acls_async(path, acl))
            log.info("set the ACL of a registry folder", extra={"action": "acl", "path": path})

    def _register(self, session_id: int, wait_until: float | None) -> None:
        """Create our ephemeral node for ``session_id``.

        A node of our own session (an earlier create whose reply was lost) counts as
        done. A node of another session is waited for until ``wait_until`` (None: not
        at all), then refused with :class:`~registry.errors.ServerIdTaken`.
        """
        info = dataclasses.replace(self._info, session_id=connection.session_hex(session_id))
        path = servers.server_path(self._root, info.id)
        while True:
            try:
                self._call(self._client.create_async(path, info.to_bytes(), ephemeral=True))
                break
            except NodeExistsError:
                pass
            try:
                data, stat = self._call(self._client.get_async(path))
            except NoNodeError:
                continue
            if stat.ephemeralOwner == session_id:
                break
            holder = _describe_holder(data, stat.ephemeralOwner)
            now = time.monotonic()
            if wait_until is None or now >= wait_until:
                raise errors.ServerIdTaken(
                    f"server id {info.id!r} is held by another live server ({holder}); "
                    "if that server is dead, retry after its session timeout"
                )
            gone = threading.Event()
            watch = _setter(gone)
            if self._call(self._client.exists_async(path, watch=watch)):
                log.info(
                    "waiting for an earlier holder of our id to go",
                    extra={"action": "register_wait", "server": info.id, "holder": holder},
                )
                gone.wait(max(0.0, wait_until - now))
        with self._lock:
            # Details published while we registered are kept (and written next step).
            self._must_publish = self._info.spark_masters != info.spark_masters
            self._info = dataclasses.replace(self._info, session_id=info.session_id)
        self._session_id = session_id
        log.info(
            "registered",
            extra={"action": "register", "server": info.id, "session": info.session_id},
        )

    def _write_details(self) -> None:
        """Rewrite our node with our record as last published, if our session owns it
        (a node gone or of another session is registration's business, not ours)."""
        with self._lock:
            info, self._must_publish = self._info, False
        path = servers.server_path(self._root, info.id)
        try:
            _, stat = self._call(self._client.get_async(path))
            if stat.ephemeralOwner != self._session_id:
                return
            self._call(self._client.set_async(path, info.to_bytes(), version=stat.version))
        except NoNodeError:
            return
        except ZK_ERRORS:
            with self._lock:
                self._must_publish = True  # retried after RETRY_S (see _step)
            raise

    def _deregister(self) -> None:
        """Delete our node, but only if our session owns it (never a successor's)."""
        path = servers.server_path(self._root, self._info.id)
        try:
            _, stat = self._call(self._client.get_async(path))
            if stat.ephemeralOwner == self._session_id:
                self._call(self._client.delete_async(path, version=stat.version))
        except (NoNodeError, BadVersionError):
            pass

    def _abort(self) -> None:
        self._client.remove_listener(self._on_kazoo_state)
        self._client.stop()
        self._client.close()
        with self._lock:
            self._state = State.CLOSED

    # ------------------------------------------------------------------ session thread

    def _run(self) -> None:
        self._emit_state(State.CONNECTED)
        while True:
            self._step()
            try:
                kind, value = self._events.get(timeout=self._next_wakeup())
            except queue.Empty:
                continue
            if kind == "stop":
                self._shutdown()
                return
            if kind == "kazoo":
                self._on_connection(value)
            elif kind == "election":
                self._election_dirty = True

    def _next_wakeup(self) -> float | None:
        deadlines = [t for t in (self._step_down_at, self._retry_at) if t is not None]
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def _on_connection(self, kazoo_state: KazooState) -> None:
        if self.state in (State.REFUSED, State.CLOSED):
            return
        if kazoo_state == KazooState.SUSPENDED:
            if self.state == State.CONNECTED:
                self._set_state(State.SUSPENDED)
            if self._term is not None and self._step_down_at is None:
                self._step_down_at = time.monotonic() + self._step_down_after
        elif kazoo_state == KazooState.LOST:
            self._session_lost()
        elif kazoo_state == KazooState.CONNECTED:
            client_id = self._client.client_id
            if client_id is None:
                return  # dropped again already; a later event follows
            if client_id[0] != self._session_id:
                # A fresh session: the old one expired even if no LOST was seen.
                self._session_lost()
                return
            self._step_down_at = None
            if self.state == State.SUSPENDED:
                self._set_state(State.CONNECTED)
            self._membership.refresh()
            self._election_dirty = True

    def _session_lost(self) -> None:
        if self.state != State.LOST:
            self._set_state(State.LOST)
        self._step_down("session lost")
        self._step_down_at = None
        if self._election is not None:
            self._election.forget()
        self._must_register = True

    def _step(self) -> None:
        now = time.monotonic()
        if self._step_down_at is not None and now >= self._step_down_at:
            self._step_down_at = None
            if self.state != State.CONNECTED:
                self._step_down(f"suspended for more than {self._step_down_after:g} s")
        if self._retry_at is not None and now < self._retry_at:
            return
        self._retry_at = None
        if not self._client.connected or self.state in (State.REFUSED, State.CLOSED):
            return  # a state event will wake us
        try:
            withdrawn = self.withdrawn
            if withdrawn and not self._out:
                self._leave()
            elif not withdrawn and self._out:
                self._out = False
                self._must_register = True
            if self._must_register and not self._out:
                self._register_again()
            if self._must_publish and not (self._out or self._must_register):
                self._write_details()
            if self.state == State.CONNECTED and self._election is not None and not self._out:
                if self._election_dirty:
                    self._election_dirty = False
                    self._evaluate()
        except ZK_ERRORS as exc:
            if self._election is not None:
                self._election_dirty = True
            self._retry_at = time.monotonic() + RETRY_S
            log.warning(
                "registry operation failed; retrying",
                extra={"action": "retry", "server": self._info.id, "error": type(exc).__name__},
            )

    def _leave(self) -> None:
        """Withdraw: step down, leave the election, delete our node; the session stays."""
        self._step_down("withdrawn")
        if self._election is not None:
            self._election.leave()
        self._deregister()
        self._out = True
        log.warning(
            "withdrawn from membership and the election",
            extra={"action": "withdraw", "server": self._info.id},
        )

    def _register_again(self) -> None:
        session_id = self._current_session()
        try:
            self._register(session_id, wait_until=None)
        except errors.ServerIdTaken as exc:
            self._must_register = False
            log.error(
                "another server took our id while our session was lost; not registering",
                extra={"action": "refused", "server": self._info.id, "error": str(exc)},
            )
            self._set_state(State.REFUSED)
            return
        self._must_register = False
        self._set_state(State.CONNECTED)
        self._membership.refresh()
        self._election_dirty = True

    def _evaluate(self) -> None:
        assert self._election is not None
        session = connection.session_hex(self._current_session())
        self._election.join(session)
        term = self._election.evaluate(self._on_election_event)
        if self._election.node is None:  # our node was deleted under us: stand again
            self._election.join(session)
            term = self._election.evaluate(self._on_election_event)
        if term is None:
            self._step_down("another candidate leads")
        elif term != self._term:
            self._term = term
            log.info(
                "became the coordinator",
                extra={"action": "coordinator", "server": self._info.id, "term": term},
            )
            self._callback(self._on_coordinator, term)

    def _step_down(self, reason: str) -> None:
        if self._term is None:
            return
        term, self._term = self._term, None
        log.warning(
            "stepped down as coordinator",
            extra={"action": "step_down", "server": self._info.id, "term": term, "reason": reason},
        )
        self._callback(self._on_coordinator, None)

    def _shutdown(self) -> None:
        self._membership.stop()
        self._step_down("stopping")
        if self._client.connected and self.state not in (State.LOST, State.REFUSED):
            try:
                if self._election is not None:
                    self._election.leave()
                self._deregister()
            except ZK_ERRORS:
                pass  # closing the session below removes our nodes anyway
        self._client.remove_listener(self._on_kazoo_state)
        self._client.stop()
        self._client.close()
        self._set_state(State.CLOSED)
        log.info("deregistered", extra={"action": "deregister", "server": self._info.id})

    def _set_state(self, new: connection.State) -> None:
        with self._lock:
            old = self._state
            if old == new:
                return
            if not connection.allowed(old, new):
                log.error(
                    "illegal registry state change ignored",
                    extra={"action": "state", "from": str(old), "to": str(new)},
                )
                return
            self._state = new
        log.info(
            "registry state changed",
            extra={"action": "state", "server": self._info.id, "from": str(old), "to": str(new)},
        )
        self._emit_state(new)

    def _emit_state(self, state: connection.State) -> None:
        self._callback(self._on_state, state)

    def _callback(self, callback: Callable[[Any], None] | None, value: Any) -> None:
        if callback is None:
            return
        try:
            callback(value)
        except Exception:  # a callback bug must not stop the registry
            log.exception("registry callback failed", extra={"action": "callback"})


def _setter(event: threading.Event) -> Callable[[WatchedEvent], None]:
    """A watch that only sets ``event`` (it runs on kazoo's event thread)."""

    def watch(_event: WatchedEvent) -> None:
        event.set()

    return watch


def _describe_holder(data: bytes, owner: int) -> str:
    try:
        holder = servers.ServerInfo.from_bytes(data)
    except errors.InvalidServer:
        return f"session {connection.session_hex(owner)}"
    return (
        f"host {holder.host}, pid {holder.pid}, session {connection.session_hex(owner)}, "
        f"started at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder.started_at))}"
    )
