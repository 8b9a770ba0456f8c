"""Process metrics, exposed by ``prometheus_client`` in Prometheus' text format.

One :class:`Registry` per process (:data:`REGISTRY`) keeps the small interface the
runner uses: ``inc(name)`` for counters, ``observe(name, seconds)`` for latency
histograms, ``gauge_fn(name, fn)`` for gauges computed at scrape time, and
``render()`` for the ``/metrics`` body. The known metrics are declared in
:data:`COUNTERS`, :data:`HISTOGRAMS` and :data:`GAUGES` with their help text. A name
not declared there still works (the runner must never fail over a metric) but is
created on first use with a warning in the log, so a typo shows.

Besides these, every scrape carries the process collector (CPU, memory, open files),
and ``jobs_by_state(fn)`` adds ``sparkring_jobs{state=...}``: the cluster's jobs per
run state, read from PostgreSQL at scrape time; ``spark_masters_up(fn)`` adds
``sparkring_spark_master_up{master=...}``: whether each Spark master this server uses
answered its last probe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping

import prometheus_client
from prometheus_client import core, exposition

log = logging.getLogger(__name__)

CONTENT_TYPE = exposition.CONTENT_TYPE_LATEST

COUNTERS = {
    "sparkring_claims_total": "Jobs claimed by this server.",
    "sparkring_driver_starts_total": "Drivers spawned by this server.",
    "sparkring_lease_renew_errors_total": "Lease renewals that failed.",
    "sparkring_http_requests_total": "HTTP API requests answered, by method and status.",
    "sparkring_health_stalled_total": "Runs of this server flagged stalled (server/health.py).",
    "sparkring_health_waiting_for_resources_total": (
        "Runs of this server flagged waiting for resources (no executor cores)."
    ),
    "sparkring_health_restarts_total": "Jobs restarted because they stalled (opt-in).",
    "sparkring_health_restarts_refused_total": (
        "Stalled jobs (opted in) not restarted: their restart budget was spent."
    ),
    "sparkring_alert_deliveries_delivered_total": "Alert deliveries this server sent (2xx).",
    "sparkring_alert_deliveries_retried_total": (
        "Alert delivery attempts of this server that will be tried again (no answer, 5xx)."
    ),
    "sparkring_alert_deliveries_failed_total": (
        "Alert deliveries this server failed for good (a final 4xx, or 24 h of retries)."
    ),
    "sparkring_health_failed_on_stall_total": (
        "Stalled jobs (opted in) ended FAILED: a stall past their restart budget."
    ),
}
HISTOGRAMS = {
    "sparkring_claim_seconds": "Latency of one claim statement, seconds.",
    "sparkring_lease_renew_seconds": "Latency of the one-statement lease renewal, seconds.",
    "sparkring_driver_start_seconds": "Claim to spawned driver process, seconds.",
    "sparkring_driver_stop_seconds": "Time to stop a driver (SIGTERM, grace, SIGKILL), seconds.",
    "sparkring_failover_seconds": (
        "Claim of a job whose previous owner was lost: seconds since the lost lease expired."
    ),
    "sparkring_http_request_seconds": "HTTP API request latency, seconds.",
}
GAUGES = {
    "sparkring_jobs_owned": "Jobs this server owns now.",
    "sparkring_coordinator": "1 while this server is the coordinator.",
    "sparkring_zk_connected": "1 while the ZooKeeper session is connected.",
    "sparkring_capacity": "Maximum concurrent drivers on this server.",
    "sparkring_jobs_stalled": "Runs of this server flagged stalled now.",
    "sparkring_jobs_waiting_for_resources": (
        "Runs of this server flagged waiting for resources now."
    ),
}
JOBS_BY_STATE_HELP = "Jobs of the cluster per run state (read from PostgreSQL at scrape time)."
SPARK_MASTER_UP_HELP = (
    "1 while this Spark master (host:port) answered this server's last TCP probe, else 0."
)
# Seconds: claims and renewals take milliseconds, driver starts and failovers seconds.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)

# Series ``<name>_created`` double every counter and histogram for no use here.
prometheus_client.disable_created_metrics()


class _Callbacks:
    """A collector of gauges whose values are computed at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gauges: dict[str, Callable[[], float]] = {}
        self._by_state: Callable[[], Mapping[str, float]] | None = None
        self._masters_up: Callable[[], Mapping[str, bool]] | None = None

    def set(self, name: str, fn: Callable[[], float]) -> None:
        with self._lock:
            self._gauges[name] = fn

    def set_by_state(self, fn: Callable[[], Mapping[str, float]]) -> None:
        with self._lock:
            self._by_state = fn

    def set_masters_up(self, fn: Callable[[], Mapping[str, bool]]) -> None:
        with self._lock:
            self._masters_up = fn

    def collect(self) -> Iterable[core.Metric]:
        with self._lock:
            gauges = dict(self._gauges)
            by_state = self._by_state
            masters_up = self._masters_up
        if masters_up is not None:
            yield from _masters_up_family(masters_up)
        for name, fn in sorted(gauges.items()):
            try:
                value = float(fn())
            except Exception:  # a broken gauge must not break the scrape
                log.debug("gauge failed", exc_info=True, extra={"gauge": name})
                continue
            yield core.GaugeMetricFamily(name, GAUGES[name], value=value)
        if by_state is not None:
            try:
                counts = dict(by_state())
            except Exception:  # PostgreSQL away: the scrape still answers
                log.debug("jobs-by-state gauge failed", exc_info=True)
                return
            family = core.GaugeMetricFamily("sparkring_jobs", JOBS_BY_STATE_HELP, labels=["state"])
            for state, count in sorted(counts.items()):
                family.add_metric([state], float(count))
            yield family


class Registry:
    def __init__(self) -> None:
        self.collector_registry = prometheus_client.CollectorRegistry()
        prometheus_client.ProcessCollector(registry=self.collector_registry)
        self._counters = {
            name: prometheus_client.Counter(
                name.removesuffix("_total"), text, registry=self.collector_registry
            )
            for name, text in COUNTERS.items()
            if name != "sparkring_http_requests_total"
        }
        self._histograms = {
            name: prometheus_client.Histogram(
                name, text, buckets=BUCKETS, registry=self.collector_registry
            )
            for name, text in HISTOGRAMS.items()
            if name != "sparkring_http_request_seconds"
        }
        self.http_requests = prometheus_client.Counter(
            "sparkring_http_requests",
            COUNTERS["sparkring_http_requests_total"],
            ["method", "status"],
            registry=self.collector_registry,
        )
        self.http_latency = prometheus_client.Histogram(
            "sparkring_http_request_seconds",
            HISTOGRAMS["sparkring_http_request_seconds"],
            buckets=BUCKETS,
            registry=self.collector_registry,
        )
        self._callbacks = _Callbacks()
        self.collector_registry.register(self._callbacks)
        self._lock = threading.Lock()

    def inc(self, name: str, amount: float = 1.0) -> None:
        self._counter(name).inc(amount)

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            histogram = self._histograms.get(name)
            if histogram is None:
                _undeclared(name)
                histogram = self._histograms[name] = prometheus_client.Histogram(
                    name, name, buckets=BUCKETS, registry=self.collector_registry
                )
        histogram.observe(value)

    def gauge_fn(self, name: str, fn: Callable[[], float]) -> None:
        if name not in GAUGES:
            _undeclared(name)
            GAUGES[name] = name
        self._callbacks.set(name, fn)

    def jobs_by_state(self, fn: Callable[[], Mapping[str, float]]) -> None:
        """``fn`` returns {run state: number of jobs}; called at each scrape."""
        self._callbacks.set_by_state(fn)

    def spark_masters_up(self, fn: Callable[[], Mapping[str, bool]]) -> None:
        """``fn`` returns {"host:port": answers} (server/master_watch.py); exported as
        ``sparkring_spark_master_up{master=...}`` at each scrape, no series when empty."""
        self._callbacks.set_masters_up(fn)

    def counter(self, name: str) -> float:
        value = self.collector_registry.get_sample_value(name)
        return 0.0 if value is None else value

    def render(self) -> str:
        return exposition.generate_latest(self.collector_registry).decode()

    def _counter(self, name: str) -> prometheus_client.Counter:
        with self._lock:
            counter = self._counters.get(name)
            if counter is None:
                _undeclared(name)
                counter = self._counters[name] = prometheus_client.Counter(
                    name.removesuffix("_total"), name, registry=self.collector_registry
                )
        return counter


def _masters_up_family(fn: Callable[[], Mapping[str, bool]]) -> Iterable[core.Metric]:
    try:
        report = dict(fn())
    except Exception:  # a broken gauge must not break the scrape
        log.debug("spark master gauge failed", exc_info=True)
        return
    if not report:
        return
    family = core.GaugeMetricFamily(
        "sparkring_spark_master_up", SPARK_MASTER_UP_HELP, labels=["master"]
    )
    for master, up in sorted(report.items()):
        family.add_metric([master], float(up))
    yield family


def _undeclared(name: str) -> None:
    log.warning("metric not declared in server/metrics.py", extra={"metric": name})


# One registry per process: the server is one process.
REGISTRY = Registry()
