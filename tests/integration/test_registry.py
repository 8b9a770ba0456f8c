"""The registry against the stack's real ZooKeeper: each test in its own chroot.

Connection faults for one client are made with a TCP proxy the test controls (a
partition of that client alone), so the shared ensemble is never disturbed here; the
ZooKeeper-leader kill lives in ``test_registry_ensemble.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from registry import connection, errors, servers, session
from testing import services
from testing.waiting import wait_until

State = connection.State


def server_info(server_id: str, role: str = "both", host: str = "127.0.0.1") -> servers.ServerInfo:
    return servers.ServerInfo(
        id=server_id,
        host=host,
        pid=os.getpid(),
        capacity=4,
        role=role,
        version="0.1.0",
        started_at=time.time(),
        health_url="http://127.0.0.1:1",
    )


class Recorder:
    """Every callback a registry made, in order, with when it came."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.states: list[State] = []
        self.terms: list[tuple[float, int | None]] = []
        self.views: list[tuple[float, dict[str, servers.ServerInfo]]] = []
        self.threads: set[str] = set()

    def on_state(self, state: State) -> None:
        with self.lock:
            self.states.append(state)
            self.threads.add(threading.current_thread().name)

    def on_coordinator(self, term: int | None) -> None:
        with self.lock:
            self.terms.append((time.monotonic(), term))
            self.threads.add(threading.current_thread().name)

    def on_members(self, view: dict[str, servers.ServerInfo]) -> None:
        with self.lock:
            self.views.append((time.monotonic(), view))
            self.threads.add(threading.current_thread().name)

    def last_term(self) -> int | None:
        with self.lock:
            return self.terms[-1][1] if self.terms else None

    def last_view(self) -> dict[str, servers.ServerInfo]:
        with self.lock:
            return self.views[-1][1] if self.views else {}


Factory = Callable[..., tuple[session.Registry, Recorder]]


def registries(hosts: str, root: str) -> Iterator[Factory]:
    made: list[session.Registry] = []

    def make(
        server_id: str,
        role: str = "both",
        hosts_override: str | None = None,
        host: str = "127.0.0.1",
        session_timeout: float = 3.0,
        debounce: float = 0.1,
        **options: Any,
    ) -> tuple[session.Registry, Recorder]:
        recorder = Recorder()
        registry = session.Registry(
            hosts_override or hosts,
            root,
            server_info(server_id, role, host),
            session_timeout=session_timeout,
            on_members=recorder.on_members,
            on_coordinator=recorder.on_coordinator,
            on_state=recorder.on_state,
            debounce=debounce,
            **options,
        )
        made.append(registry)
        return registry, recorder

    yield make
    for registry in made:
        registry.stop()


@pytest.fixture
def make(zk_hosts: str, zk_root: str) -> Iterator[Factory]:
    yield from registries(zk_hosts, zk_root)


@pytest.fixture
def zk(zk_hosts: str) -> Iterator[KazooClient]:
    """A plain client for looking at the znodes behind the registry's back."""
    client = KazooClient(hosts=zk_hosts, timeout=5)
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def owner(zk: KazooClient, root: str, server_id: str) -> str | None:
    """The session owning ``server_id``'s node, as of now: the ZooKeeper server this
    client reads from may be a follower behind a write made through another one (a
    fresh registration read as missing, suite on 3 workers, 2026-11-27), so it syncs first."""
    path = servers.server_path(root, server_id)
    zk.sync(path)
    stat = zk.exists(path)
    return connection.session_hex(stat.ephemeralOwner) if stat else None


def assert_legal(states: list[State]) -> None:
    path = [State.CONNECTING, *states]
    for old, new in itertools.pairwise(path):
        assert connection.allowed(old, new), f"illegal transition {old} -> {new} in {states}"


class Proxy:
    """A TCP proxy to one ZooKeeper server that a test can cut and heal: the client
    behind it loses its connection (SUSPENDED, then LOST past the session timeout)
    while ZooKeeper and every other client carry on."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="zk-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            if not self._open.is_set():
                downstream.close()
                continue
            try:
                upstream = socket.create_connection(self._upstream, 2)
            except OSError:
                downstream.close()
                continue
            with self._lock:
                self._sockets += [downstream, upstream]
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self._open.clear()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def heal(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._listener.close()
        self.cut()


@pytest.fixture
def proxy(zk_hosts: str) -> Iterator[Proxy]:
    upstream = next(h for h in zk_hosts.split(",") if services.reachable(h))
    p = Proxy(upstream)
    yield p
    p.close()


# ---------------------------------------------------------------- registration


def test_register_and_deregister(
    make: Factory, zk: KazooClient, zk_hosts: str, zk_root: str
) -> None:
    a, a_events = make("a")
    b, b_events = make("b", role="worker")
    a.start()
    b.start()

    record = json.loads(zk.get(servers.server_path(zk_root, "a"))[0])
    assert record["id"] == "a" and record["capacity"] == 4 and record["role"] == "both"
    assert record["session_id"] == owner(zk, zk_root, "a") == a.info.session_id
    assert [s.id for s in servers.list_servers(zk_hosts, zk_root)] == ["a", "b"]
    wait_until(lambda: set(b_events.last_view()) == {"a", "b"}, 5, message="b never saw a")
    wait_until(lambda: set(a.members()) == {"a", "b"}, 5, message="a never saw b")
    assert a.state == State.CONNECTED and not a.safe_mode

    a.stop()
    a.stop()  # idempotent
    assert a.state == State.CLOSED and a_events.states == [State.CONNECTED, State.CLOSED]
    assert zk.exists(servers.server_path(zk_root, "a")) is None
    wait_until(lambda: set(b_events.last_view()) == {"b"}, 5, message="b still lists a")
    # Callbacks come from the registry's own threads, never kazoo's.
    assert a_events.threads | b_events.threads <= {
        "sparkring-registry-session",
        "sparkring-registry-membership",
    }


def test_same_id_is_refused_while_its_holder_lives(
    make: Factory, zk: KazooClient, zk_root: str
) -> None:
    first, _ = make("a", session_timeout=2.0)
    first.start()
    second, _ = make("a", session_timeout=2.0)
    began = time.monotonic()
    with pytest.raises(errors.ServerIdTaken, match=r"server id 'a' is held by another live server"):
        second.start(timeout=10)
    # Refused once the holder outlived a session timeout plus the grace: it is alive.
    assert 2.0 <= time.monotonic() - began < 10
    assert second.state == State.CLOSED
    assert owner(zk, zk_root, "a") == first.info.session_id
    assert first.state == State.CONNECTED


def test_unreachable_zookeeper_is_a_clear_error(make: Factory) -> None:
    registry, _ = make("a", hosts_override="127.0.0.1:1")
    with pytest.raises(
        errors.ZooKeeperUnreachable, match=r"cannot reach ZooKeeper at 127\.0\.0\.1:1"
    ):
        registry.start(timeout=1)


def test_forced_session_expiry_registers_again(
    make: Factory, zk: KazooClient, zk_root: str
) -> None:
    a, events = make("a")
    observer, seen = make("o", role="worker")
    a.start()
    observer.start()
    old = a.info.session_id

    a.expire_session()
    wait_until(lambda: a.state == State.CONNECTED and a.info.session_id != old, 10)
    assert owner(zk, zk_root, "a") == a.info.session_id
    assert State.LOST in events.states and events.states[-1] == State.CONNECTED
    assert_legal(events.states)
    wait_until(
        lambda: seen.last_view().get("a", server_info("x")).session_id == a.info.session_id, 5
    )


def test_published_details_reach_peers_and_outlive_a_new_session(
    make: Factory, zk: KazooClient, zk_hosts: str, zk_root: str
) -> None:
    """A server publishes what it sees of its Spark masters into its own node; peers'
    views follow without a membership notification (nothing about the member changed),
    and a session lost and opened again registers the latest details."""
    a, _ = make("a")
    observer, seen = make("o", role="worker")
    a.start()
    observer.start()
    wait_until(lambda: set(observer.members()) == {"a", "o"}, 5, message="o never saw a")
    notifications = len(seen.views)
    reported = {"m1:7077": False, "m2:7077": True}

    a.publish(spark_masters=reported)
    wait_until(
        lambda: observer.members()["a"].spark_masters == reported, 5, message="o never saw it"
    )
    record = json.loads(zk.get(servers.server_path(zk_root, "a"))[0])
    assert record["spark_masters"] == reported
    assert record["session_id"] == a.info.session_id
    assert {s.id: s.spark_masters for s in servers.list_servers(zk_hosts, zk_root)}["a"] == reported
    assert len(seen.views) == notifications

    old = a.info.session_id
    a.expire_session()
    wait_until(lambda: a.state == State.CONNECTED and a.info.session_id != old, 10)
    record = json.loads(zk.get(servers.server_path(zk_root, "a"))[0])
    assert record["spark_masters"] == reported and record["session_id"] == a.info.session_id


def test_cut_off_past_the_session_timeout_registers_again_with_a_fresh_session(
    make: Factory, proxy: Proxy, zk: KazooClient, zk_root: str
) -> None:
    a, events = make("a", hosts_override=proxy.address, session_timeout=2.0)
    observer, seen = make("o", role="worker")
    a.start()
    observer.start()
    old = a.info.session_id

    proxy.cut()
    wait_until(lambda: a.state == State.SUSPENDED, 5)
    assert a.safe_mode
    wait_until(lambda: "a" not in seen.last_view(), 10, message="a's node outlived its session")
    proxy.heal()
    wait_until(lambda: a.state == State.CONNECTED and a.info.session_id != old, 15)
    assert events.states == [State.CONNECTED, State.SUSPENDED, State.LOST, State.CONNECTED]
    assert owner(zk, zk_root, "a") == a.info.session_id
    wait_until(
        lambda: seen.last_view().get("a", server_info("x")).session_id == a.info.session_id, 5
    )


# A server process in a subprocess: registers, reports its states as JSON lines, stops
# on "stop" from stdin.
CHILD = """
import json, os, sys, threading, time
from registry import servers, session
hosts, root, server_id, host, timeout = sys.argv[1:6]
lock = threading.Lock()
def say(**kw):
    with lock:  # two threads report: one whole line each
        sys.stdout.write(json.dumps(kw) + "\\n")
        sys.stdout.flush()
info = servers.ServerInfo(id=server_id, host=host, pid=os.getpid(), capacity=1, role="both",
                          version="old", started_at=time.time())
reg = session.Registry(hosts, root, info, session_timeout=float(timeout),
                       on_state=lambda s: say(state=str(s)))
reg.start()
say(registered=reg.info.session_id)
for line in sys.stdin:
    if line.strip() == "stop":
        reg.stop()
        say(stopped=True)
        break
"""


class Child:
    def __init__(self, hosts: str, root: str, server_id: str, host: str, timeout: float) -> None:
        self.lines: list[dict[str, Any]] = []
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, hosts, root, server_id, host, str(timeout)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=services.REPO,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    def said(self, key: str, value: Any = None) -> bool:
        return any(key in line and (value is None or line[key] == value) for line in self.lines)

    def session(self) -> str:
        return next(line["registered"] for line in self.lines if "registered" in line)

    def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        try:
            os.kill(child.process.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        child.kill()


def test_restart_with_the_same_id_before_the_old_session_expired(
    make: Factory, children: list[Child], zk: KazooClient, zk_hosts: str, zk_root: str
) -> None:
    old = Child(zk_hosts, zk_root, "a", "127.0.0.1", 2.0)
    children.append(old)
    wait_until(lambda: old.said("registered"), 20, message="the old incarnation never registered")
    observer, seen = make("o", role="worker")
    observer.start()
    wait_until(lambda: "a" in seen.last_view(), 5)

    old.kill()  # kill -9: its session lives on until the timeout
    new, events = make("a")
    new.start(timeout=10)  # waits for the old incarnation's node to expire
    assert new.info.session_id != old.session()
    assert owner(zk, zk_root, "a") == new.info.session_id
    wait_until(
        lambda: seen.last_view().get("a", server_info("x")).session_id == new.info.session_id, 5
    )
    # No late removal of the old incarnation takes the new one out.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert owner(zk, zk_root, "a") == new.info.session_id
        assert seen.last_view()["a"].session_id == new.info.session_id
        time.sleep(0.1)
    assert events.states == [State.CONNECTED]


def test_the_wait_for_an_old_incarnations_node_is_not_cut_short_by_the_start_up_timeout(
    make: Factory, children: list[Child], zk: KazooClient, zk_hosts: str, zk_root: str
) -> None:
    """The start-up timeout bounds reaching ZooKeeper. An old incarnation's node is then
    waited for a session timeout (plus a grace) from that moment, however little of the
    start-up timeout is left: after a planned restart during a ZooKeeper outage the
    successor reaches ZooKeeper late, when the ensemble is back and has given every old
    session a full timeout again. Refusing then (exit 78, start-up refused: its
    supervisor gives up) moved every job the successor had adopted."""
    old = Child(zk_hosts, zk_root, "a", "127.0.0.1", 4.0)
    children.append(old)
    wait_until(lambda: old.said("registered"), 20, message="the old incarnation never registered")
    old.kill()  # kill -9: its node lives on for 3-5 s (its last ping, ZooKeeper's tick)
    new, events = make("a", session_timeout=4.0)
    new.start(timeout=1.5)  # ZooKeeper answers at once; the old node outlives 1.5 s
    assert owner(zk, zk_root, "a") == new.info.session_id != old.session()
    assert events.states == [State.CONNECTED]


def test_a_zombie_incarnation_never_unregisters_its_successor(
    make: Factory, children: list[Child], zk: KazooClient, zk_hosts: str, zk_root: str
) -> None:
    zombie = Child(zk_hosts, zk_root, "a", "10.0.0.9", 2.0)
    children.append(zombie)
    wait_until(
        lambda: zombie.said("registered"), 20, message="the old incarnation never registered"
    )
    os.kill(zombie.process.pid, signal.SIGSTOP)  # a stalled server: its session expires

    new, _ = make("a")
    new.start(timeout=10)
    os.kill(zombie.process.pid, signal.SIGCONT)
    wait_until(lambda: zombie.said("state", "refused"), 15, message="the zombie did not stand down")
    zombie.send("stop")
    wait_until(lambda: zombie.said("stopped"), 10)
    assert owner(zk, zk_root, "a") == new.info.session_id
    assert new.state == State.CONNECTED and "a" in new.members()


# ---------------------------------------------------------------- coordinator


def test_coordinator_session_expiry_elects_a_new_one_with_a_higher_term(
    make: Factory, zk: KazooClient, zk_root: str
) -> None:
    a, a_events = make("a")
    b, b_events = make("b", role="coordinator")
    w, w_events = make("w", role="worker")
    # A registry joins the election from its event thread after start() returns: started
    # one after the other, b could stand first (CI: a was never elected). a leads first.
    a.start()
    wait_until(lambda: a.is_coordinator, 10, message="the first candidate was not elected")
    for registry in (b, w):
        registry.start()
    first = a.term
    assert first is not None and not b.is_coordinator and b.term is None
    # ZooKeeper itself confirms the leader (the check before a coordinator takes over a
    # term recorded by a lost ZooKeeper history).
    assert a.confirm_leader() and not b.confirm_leader() and not w.confirm_leader()

    expired = a.info.session_id
    a.expire_session()
    wait_until(lambda: b.is_coordinator, 10, message="no new coordinator")
    assert b.term is not None and b.term > first
    # Back on a new session (CI: "a.state == CONNECTED" alone held while a still sat on the
    # expired one, before kazoo told it of the expiry, and its step-down came after).
    wait_until(
        lambda: a.state == State.CONNECTED and a.info.session_id != expired,
        10,
        message="the old coordinator did not register on a new session",
    )
    assert a_events.terms[-1][1] is None and not a.is_coordinator
    # A forced expiry ends the session on the ensemble while ``a`` is still connected: b's
    # election watch and a's "session expired" on reconnect race, so a may learn of its loss
    # a moment after b took over (CI measured 86 ms on 2 loaded cores). The coordinator term
    # in PostgreSQL fences that moment; what the registry owes is a prompt step-down. (The
    # partition test below checks the strict order, where a sees the cut coming.)
    assert a_events.terms[-1][0] <= b_events.terms[-1][0] + 1.0

    b.stop()
    wait_until(lambda: a.is_coordinator, 10, message="a did not take over again")
    assert a.term is not None and a.term > b_events.terms[-2][1]  # terms only grow
    # A worker never stands: no candidate node, never a coordinator.
    assert not w_events.terms
    assert all(not n.startswith("w-") for n in zk.get_children(servers.election_path(zk_root)))


def test_a_partitioned_coordinator_steps_down_before_another_is_elected(
    make: Factory, proxy: Proxy
) -> None:
    a, a_events = make("a", hosts_override=proxy.address, session_timeout=2.0)
    b, b_events = make("b", session_timeout=2.0)
    a.start()
    wait_until(lambda: a.is_coordinator, 5)
    b.start()
    term = a.term
    assert term is not None

    proxy.cut()
    wait_until(lambda: b.is_coordinator, 10, message="no coordinator after the partition")
    stepped_down = a_events.terms[-1]
    assert stepped_down[1] is None and stepped_down[0] < b_events.terms[-1][0]
    assert b.term is not None and b.term > term
    proxy.heal()
    wait_until(lambda: a.state == State.CONNECTED, 15)
    assert not a.is_coordinator and b.is_coordinator


def test_a_short_outage_suspends_steps_down_and_resumes_the_same_term(
    make: Factory, proxy: Proxy, zk: KazooClient, zk_root: str
) -> None:
    a, events = make("a", hosts_override=proxy.address, session_timeout=6.0, step_down_after=0.3)
    a.start()
    wait_until(lambda: a.is_coordinator, 5)
    term, session_id = a.term, a.info.session_id

    proxy.cut()
    wait_until(lambda: a.state == State.SUSPENDED, 5)
    assert a.safe_mode
    wait_until(lambda: events.last_term() is None and not a.is_coordinator, 3)
    # Within the session timeout the node stays: an outage alone removes nobody.
    assert owner(zk, zk_root, "a") == session_id
    proxy.heal()
    wait_until(lambda: a.state == State.CONNECTED and a.is_coordinator, 10)
    assert a.term == term and a.info.session_id == session_id
    assert events.states == [State.CONNECTED, State.SUSPENDED, State.CONNECTED]
    assert [t for _, t in events.terms] == [term, None, term]


# ---------------------------------------------------------------- membership


def test_a_flapping_member_causes_a_bounded_number_of_notifications(
    make: Factory, zk: KazooClient, zk_root: str
) -> None:
    observer, seen = make("o", role="worker", debounce=0.5)
    observer.start()
    wait_until(lambda: set(seen.last_view()) == {"o"}, 5)
    before = len(seen.views)
    path = servers.server_path(zk_root, "flappy")
    record = server_info("flappy").to_bytes()

    began = time.monotonic()
    flaps = 30
    for _ in range(flaps):
        zk.create(path, record, ephemeral=True)
        time.sleep(0.03)  # drive the flapping; not a synchronisation
        zk.delete(path)
        time.sleep(0.03)
    flapping = time.monotonic() - began
    # Once the view is back to {"o"} nothing changes any more: the count is final.
    wait_until(lambda: set(seen.last_view()) == {"o"}, 5)
    notifications = len(seen.views) - before
    bound = int(flapping / 0.5) + 2
    assert notifications <= bound, f"{notifications} notifications for {flaps} flaps"
    assert notifications < flaps


def test_digest_acl_protects_the_registry_and_the_secret_is_never_logged(
    zk_hosts: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = f"/sparkring-test/{services.unique_name('acl')}"
    auth = "sparkring:s3cr3t-pw"
    caplog.set_level(logging.DEBUG)
    factory = registries(zk_hosts, root)
    make_secure = next(factory)
    try:
        a, _ = make_secure("a", auth=auth)
        a.start()
        assert [s.id for s in servers.list_servers(zk_hosts, root, auth=auth)] == ["a"]
        with pytest.raises(errors.RegistryError, match="check SPARKRING_ZK_AUTH"):
            servers.list_servers(zk_hosts, root)
        anonymous = KazooClient(hosts=zk_hosts, timeout=5)
        anonymous.start(timeout=10)
        try:
            with pytest.raises(NoAuthError):
                anonymous.get(servers.server_path(root, "a"))
        finally:
            anonymous.stop()
            anonymous.close()
        a.stop()
        assert "s3cr3t-pw" not in caplog.text
    finally:
        next(factory, None)
        admin = KazooClient(hosts=zk_hosts, timeout=5, auth_data=[("digest", auth)])
        admin.start(timeout=10)
        admin.delete(root, recursive=True)
        admin.stop()
        admin.close()


OLD_AUTH = "sparkring:old-s3cr3t"
NEW_AUTH = "sparkring:new-s3cr3t"


@contextlib.contextmanager
def _client(hosts: str, *auths: str) -> Iterator[KazooClient]:
    """A plain client authenticated as each of ``auths`` (none: anonymous)."""
    client = KazooClient(hosts=hosts, timeout=5, auth_data=[("digest", a) for a in auths])
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@contextlib.contextmanager
def _acl_chroot(hosts: str, *auths: str) -> Iterator[str]:
    """A chroot of this test's own, removed afterwards by a client holding ``auths``."""
    root = f"/sparkring-test/{services.unique_name('acl')}"
    try:
        yield root
    finally:
        with _client(hosts, *auths) as admin:
            admin.delete(root, recursive=True)


def _refused_to(hosts: str, root: str, *auths: str) -> None:
    """A client holding only ``auths`` can neither read nor write the registry."""
    with _client(hosts, *auths) as outsider:
        for path in (root, servers.servers_path(root), servers.election_path(root)):
            with pytest.raises(NoAuthError):
                outsider.get_children(path)
        with pytest.raises(NoAuthError):
            outsider.create(servers.server_path(root, "intruder"), b"{}", ephemeral=True)


def test_an_open_chroot_is_protected_once_a_server_runs_with_auth(zk_hosts: str) -> None:
    """A cluster that ran without SPARKRING_ZK_AUTH has an open chroot: its folders were
    made before any ACL existed. The first server with the setting puts them under its
    digest ACL, so that nobody without it can list or join the servers any more."""
    with _acl_chroot(zk_hosts, OLD_AUTH, NEW_AUTH) as root:
        factory = registries(zk_hosts, root)
        make_one = next(factory)
        try:
            before, _ = make_one("before")
            before.start()
            before.stop()
            secure, _ = make_one("secure", auth=OLD_AUTH)
            secure.start()
            _refused_to(zk_hosts, root)
            assert [s.id for s in servers.list_servers(zk_hosts, root, auth=OLD_AUTH)] == ["secure"]
            stranger, _ = make_one("stranger", auth="sparkring:not-the-password")
            with pytest.raises(errors.RegistryError, match="check SPARKRING_ZK_AUTH") as raised:
                stranger.start()
            assert "not-the-password" not in str(raised.value)
        finally:
            next(factory, None)


def test_the_zookeeper_credential_rotates_while_servers_run(zk_hosts: str) -> None:
    """Rotation without stopping the cluster: servers restarted one at a time with the
    new credential and the old one as SPARKRING_ZK_AUTH_PREVIOUS see, and are seen by,
    those still on the old one; then restarted with the new one alone. At the end the
    old credential opens nothing."""
    with _acl_chroot(zk_hosts, OLD_AUTH, NEW_AUTH) as root:
        factory = registries(zk_hosts, root)
        make_one = next(factory)
        try:
            a, a_seen = make_one("a", auth=OLD_AUTH)
            a.start()
            b, b_seen = make_one("b", auth=NEW_AUTH, previous_auth=OLD_AUTH)
            b.start()
            for seen in (a_seen, b_seen):
                wait_until(lambda seen=seen: set(seen.last_view()) == {"a", "b"}, 10)
            a.stop()
            c, c_seen = make_one("c", auth=NEW_AUTH)
            c.start()
            for seen in (b_seen, c_seen):
                wait_until(lambda seen=seen: set(seen.last_view()) == {"b", "c"}, 10)
            b.stop()
            _refused_to(zk_hosts, root, OLD_AUTH)
            assert [s.id for s in servers.list_servers(zk_hosts, root, auth=NEW_AUTH)] == ["c"]
        finally:
            next(factory, None)


def test_a_previous_credential_needs_a_current_one() -> None:
    with pytest.raises(errors.InvalidServer, match="previous ZooKeeper auth needs a current"):
        connection.make_client("127.0.0.1:1", "", previous_auth=OLD_AUTH)


# ---------------------------------------------------------------- withdrawal (H7)


def test_a_withdrawn_server_leaves_membership_and_the_election_then_comes_back(
    make: Factory, zk: KazooClient, zk_root: str
) -> None:
    """A server that cannot renew its leases (cut off from PostgreSQL only) withdraws:
    its node and its candidacy go, so peers place its jobs elsewhere and a coordinator
    among them takes over; its session stays. It registers again when asked."""
    a, a_events = make("a")
    b, b_events = make("b")
    a.start()
    wait_until(lambda: a.is_coordinator, 5, message="a was not elected")
    b.start()
    wait_until(lambda: set(b_events.last_view()) == {"a", "b"}, 5, message="b never saw a")

    a.withdraw(True)
    a.withdraw(True)  # idempotent
    wait_until(lambda: set(b_events.last_view()) == {"b"}, 5, message="b still lists a")
    wait_until(lambda: b.is_coordinator, 5, message="b did not take over")
    assert not a.is_coordinator and a_events.last_term() is None
    assert a.withdrawn and a.state == State.CONNECTED
    assert zk.exists(servers.server_path(zk_root, "a")) is None
    assert all(not n.startswith("a-") for n in zk.get_children(servers.election_path(zk_root)))

    a.withdraw(False)
    wait_until(lambda: set(b_events.last_view()) == {"a", "b"}, 5, message="a did not return")
    assert not a.withdrawn and owner(zk, zk_root, "a") == a.info.session_id
    wait_until(
        lambda: any(n.startswith("a-") for n in zk.get_children(servers.election_path(zk_root))),
        5,
        message="a did not stand for election again",
    )
    assert b.is_coordinator and not a.is_coordinator  # b's candidacy is older now
