"""How fast the registry notices a lost server and elects a new coordinator.

Each trial starts a coordinator (first to join) and a survivor (second candidate) under a
fresh ZooKeeper path, takes the coordinator away and times, on the survivor:

- membership: from the loss until ``on_members`` delivers a view without the lost
  incarnation (its id gone, or back with a new session);
- election: from the loss until ``on_coordinator(term)`` makes the survivor coordinator.

Two ways to lose the coordinator:

- ``kill9``: the coordinator is a separate process, killed with SIGKILL. ZooKeeper only
  learns of it when the session times out, so this includes the session timeout: it is
  what an operator sees when a machine dies.
- ``expiry``: the coordinator's session is expired at ZooKeeper (a fault injection, as a
  partition past the timeout ends); this is the registry's own reaction time (watch
  delivery + debounce for membership, candidate watch + election for the coordinator).

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.registry_failover [--trials 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from kazoo.client import KazooClient

from registry import servers, session
from server import defaults

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import os, sys, time
from registry import servers, session
hosts, root, timeout = sys.argv[1:4]
info = servers.ServerInfo(id="lost", host="127.0.0.1", pid=os.getpid(), capacity=1,
                          role="both", version="bench", started_at=time.time())
reg = session.Registry(hosts, root, info, session_timeout=float(timeout))
reg.start()
while not reg.is_coordinator:
    time.sleep(0.01)
print(reg.info.session_id, flush=True)
time.sleep(3600)
"""


def _info(server_id: str) -> servers.ServerInfo:
    return servers.ServerInfo(
        id=server_id,
        host="127.0.0.1",
        pid=os.getpid(),
        capacity=1,
        role="both",
        version="bench",
        started_at=time.time(),
    )


class Survivor:
    """The second candidate: records when it saw the loss and when it took over."""

    def __init__(self, hosts: str, root: str, timeout: float, debounce: float) -> None:
        self.lost_session = ""
        self.members_at: float | None = None
        self.elected_at: float | None = None
        self.done = threading.Event()
        self.registry = session.Registry(
            hosts,
            root,
            _info("survivor"),
            session_timeout=timeout,
            on_members=self._on_members,
            on_coordinator=self._on_coordinator,
            debounce=debounce,
        )

    def _on_members(self, view: dict[str, servers.ServerInfo]) -> None:
        lost = view.get("lost")
        if self.lost_session and self.members_at is None:
            if lost is None or lost.session_id != self.lost_session:
                self.members_at = time.monotonic()
        self._check()

    def _on_coordinator(self, term: int | None) -> None:
        if term is not None and self.lost_session and self.elected_at is None:
            self.elected_at = time.monotonic()
        self._check()

    def _check(self) -> None:
        if self.members_at is not None and self.elected_at is not None:
            self.done.set()


def _trial(
    hosts: str, root: str, mode: str, timeout: float, debounce: float
) -> tuple[float, float]:
    child: subprocess.Popen[str] | None = None
    lost: session.Registry | None = None
    if mode == "kill9":
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, hosts, root, str(timeout)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert child.stdout is not None
        lost_session = child.stdout.readline().strip()
    else:
        lost = session.Registry(hosts, root, _info("lost"), session_timeout=timeout)
        lost.start()
        while not lost.is_coordinator:
            time.sleep(0.01)
        lost_session = lost.info.session_id
    survivor = Survivor(hosts, root, timeout, debounce)
    survivor.registry.start()
    try:
        deadline = time.monotonic() + 10
        while "lost" not in survivor.registry.members() and time.monotonic() < deadline:
            time.sleep(0.05)
        survivor.lost_session = lost_session
        began = time.monotonic()
        if child is not None:
            os.kill(child.pid, signal.SIGKILL)
        else:
            assert lost is not None
            lost.expire_session()
        if not survivor.done.wait(timeout * 3 + 10):
            raise SystemExit(f"{mode}: the survivor did not react within {timeout * 3 + 10} s")
        assert survivor.members_at is not None and survivor.elected_at is not None
        return survivor.members_at - began, survivor.elected_at - began
    finally:
        survivor.registry.stop()
        if lost is not None:
            lost.stop()
        if child is not None:
            child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()


def _summary(samples: list[float]) -> dict[str, object]:
    return {
        "median_s": round(statistics.median(samples), 3),
        "max_s": round(max(samples), 3),
        "samples_s": [round(s, 3) for s in samples],
    }


def _hosts() -> str:
    hosts = os.environ.get("SPARKRING_ZK_HOSTS", "")
    env_file = REPO / ".stack" / "env.json"
    if not hosts and env_file.exists():
        hosts = json.loads(env_file.read_text()).get("SPARKRING_ZK_HOSTS", "")
    if not hosts:
        raise SystemExit('SPARKRING_ZK_HOSTS is not set: eval "$(python3 scripts/stack.py env)"')
    return hosts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--session-timeout", type=float, default=defaults.ZK_SESSION_TIMEOUT_S)
    parser.add_argument("--debounce", type=float, default=defaults.MEMBERSHIP_DEBOUNCE_S)
    parser.add_argument("--modes", default="expiry,kill9", help="comma-separated: expiry,kill9")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    # The survivor logs the lost coordinator's step-downs; only the figures matter here.
    logging.basicConfig(level=logging.ERROR)
    hosts = _hosts()
    base = f"/sparkring-bench/{uuid.uuid4().hex[:12]}"
    results: dict[str, object] = {}
    try:
        for mode in args.modes.split(","):
            members, elections = [], []
            for i in range(args.trials):
                m, e = _trial(
                    hosts, f"{base}/{mode}-{i}", mode, args.session_timeout, args.debounce
                )
                members.append(m)
                elections.append(e)
                if not args.json:
                    print(f"{mode} trial {i + 1}: membership {m:.3f} s, election {e:.3f} s")
            results[f"{mode}_to_membership_change"] = _summary(members)
            results[f"{mode}_to_new_coordinator"] = _summary(elections)
    finally:
        cleanup = KazooClient(hosts=hosts, timeout=5)
        cleanup.start(timeout=10)
        cleanup.delete(base, recursive=True)
        cleanup.stop()
        cleanup.close()
    report = {
        "session_timeout_s": args.session_timeout,
        "debounce_s": args.debounce,
        "trials": args.trials,
        "results": results,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"session timeout {args.session_timeout:g} s, debounce {args.debounce:g} s")
    for name, figures in results.items():
        assert isinstance(figures, dict)
        print(f"{name:<36} median {figures['median_s']:.3f} s   max {figures['max_s']:.3f} s")


if __name__ == "__main__":
    main()
