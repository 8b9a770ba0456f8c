"""Whether the Spark masters a server uses answer, seen from that server: its own
``SPARKRING_SPARK_MASTER`` when that is a ``spark://`` URL, and the masters of the runs
it holds (each ``host:port`` once).

A side thread (``sparkring-master-watch``) probes them every
``SPARK_MASTER_PROBE_INTERVAL_S`` with a short TCP connect (:func:`probe`), off every hot
path, and hands a changed report (``{"host:port": answers}``) to ``on_change``: the
server publishes it in its ZooKeeper node (``ServerInfo.spark_masters``, read by
``sparkring server list`` and ``/api/v1/servers``), and the gauge
``sparkring_spark_master_up{master=...}`` reads :meth:`MasterWatch.current`. Informational
only: ``/healthz`` stays about the server itself, and launching a driver checks its
job's master on its own (``server/spark_master.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from scheduler import loop
from server import defaults, spark_master

log = logging.getLogger(__name__)

Report = dict[str, bool]


def probe(endpoint: spark_master.Endpoint) -> bool:
    """True when ``endpoint`` accepts a TCP connection within the probe timeout."""
    return spark_master.answers(endpoint, defaults.SPARK_MASTER_PROBE_TIMEOUT_S)


def endpoints_of(masters: Iterable[str]) -> list[str]:
    """Each ``host:port`` of the ``spark://`` URLs among ``masters``, once, sorted."""
    return sorted(_endpoints(masters))


def _endpoints(masters: Iterable[str]) -> dict[str, spark_master.Endpoint]:
    """The endpoints of ``masters`` by ``host:port``. Other masters than ``spark://``
    have nothing to probe; a malformed URL is its job's own error, not reported here."""
    found: dict[str, spark_master.Endpoint] = {}
    for master in masters:
        try:
            found.update((str(e), e) for e in spark_master.endpoints(master))
        except spark_master.MasterURLError:
            continue
    return found


class MasterWatch(loop.Loop):
    """Probes ``masters()``'s endpoints every ``interval`` seconds. ``start()`` once,
    ``stop()`` any number of times; :meth:`check` is one pass (the thread's, or a
    test's)."""

    def __init__(
        self,
        masters: Callable[[], Iterable[str]],
        on_change: Callable[[Report], None],
        interval: float = defaults.SPARK_MASTER_PROBE_INTERVAL_S,
        probe: Callable[[spark_master.Endpoint], bool] = probe,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"master watch interval {interval!r} must be positive")
        self._masters = masters
        self._on_change = on_change
        self._probe = probe
        self._lock = threading.Lock()
        self._current: Report = {}
        super().__init__(
            "sparkring-master-watch",
            join_timeout=defaults.SPARK_MASTER_PROBE_TIMEOUT_S * 8 + 5,
            interval=interval,
        )

    def current(self) -> Report:
        """The last report: each master's ``host:port`` and whether it answered."""
        with self._lock:
            return dict(self._current)

    def check(self) -> Report:
        """Probe every master now; call ``on_change`` if the report changed."""
        try:
            masters = list(self._masters())
        except Exception:  # the runner going away must not end the watch
            log.debug("master list failed", exc_info=True, extra={"action": "master_watch"})
            return self.current()
        found = _endpoints(masters)
        report = {name: self._probe(found[name]) for name in sorted(found)}
        with self._lock:
            changed, self._current = report != self._current, report
        if changed:
            log.info(
                "Spark master reachability changed",
                extra={
                    "action": "master_watch",
                    "up": sorted(n for n, up in report.items() if up),
                    "down": sorted(n for n, up in report.items() if not up),
                },
            )
            try:
                self._on_change(dict(report))
            except Exception:  # a publishing bug must not end the watch
                log.exception("master report callback failed", extra={"action": "master_watch"})
        return report

    def step(self) -> None:
        self.check()
