"""Process metrics in Prometheus' text format, without a client library.

Counters, gauges and summaries (count + sum) keyed by name; ``render()`` produces the
``/metrics`` body. Gauges that describe live state are computed on demand through
callbacks registered with :meth:`Registry.gauge_fn`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

HELP = {
    "sparkring_claims_total": "Jobs claimed by this server.",
    "sparkring_driver_starts_total": "Drivers spawned by this server.",
    "sparkring_lease_renew_errors_total": "Lease renewals that failed.",
    "sparkring_lease_renew_seconds": "Latency of the one-statement lease renewal.",
    "sparkring_driver_stop_seconds": "Time to stop a driver (SIGTERM, grace, SIGKILL).",
    "sparkring_jobs_owned": "Jobs this server owns now.",
    "sparkring_coordinator": "1 while this server is the coordinator.",
    "sparkring_zk_connected": "1 while the ZooKeeper session is connected.",
    "sparkring_capacity": "Maximum concurrent drivers on this server.",
}


class Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, float] = {}
        self._summaries: dict[str, tuple[int, float]] = {}
        self._gauges: dict[str, Callable[[], float]] = {}

    def inc(self, name: str, amount: float = 1.0) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0.0) + amount

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            count, total = self._summaries.get(name, (0, 0.0))
            self._summaries[name] = (count + 1, total + value)

    def gauge_fn(self, name: str, fn: Callable[[], float]) -> None:
        with self._lock:
            self._gauges[name] = fn

    def counter(self, name: str) -> float:
        with self._lock:
            return self._counters.get(name, 0.0)

    def render(self) -> str:
        with self._lock:
            counters = dict(self._counters)
            summaries = dict(self._summaries)
            gauges = dict(self._gauges)
        lines: list[str] = []
        for name, value in sorted(counters.items()):
            lines += [f"# HELP {name} {HELP.get(name, name)}", f"# TYPE {name} counter"]
            lines.append(f"{name} {value:g}")
        for name, (count, total) in sorted(summaries.items()):
            lines += [f"# HELP {name} {HELP.get(name, name)}", f"# TYPE {name} summary"]
            lines += [f"{name}_count {count}", f"{name}_sum {total:.6f}"]
        for name, fn in sorted(gauges.items()):
            try:
                value = float(fn())
            except Exception:  # a broken gauge must not break the scrape
                continue
            lines += [f"# HELP {name} {HELP.get(name, name)}", f"# TYPE {name} gauge"]
            lines.append(f"{name} {value:g}")
        return "\n".join(lines) + "\n"


# One registry per process: the server is one process.
REGISTRY = Registry()
