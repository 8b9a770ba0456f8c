"""server/metrics.py on prometheus_client: the runner's interface (inc, observe,
gauge_fn, counter) keeps working, latencies are histograms, and a failing gauge or an
unreachable database never breaks a scrape."""

from __future__ import annotations

import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server import metrics


def _families(registry: metrics.Registry) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(registry.render())}


def _value(registry: metrics.Registry, sample: str, **labels: str) -> float | None:
    return registry.collector_registry.get_sample_value(sample, labels)


def test_the_runner_interface_counts_observes_and_reads_back() -> None:
    registry = metrics.Registry()
    registry.inc("sparkring_claims_total")
    registry.inc("sparkring_claims_total", 2)
    registry.observe("sparkring_lease_renew_seconds", 0.003)
    registry.observe("sparkring_lease_renew_seconds", 0.2)
    registry.gauge_fn("sparkring_jobs_owned", lambda: 3)
    assert registry.counter("sparkring_claims_total") == 3
    assert _value(registry, "sparkring_lease_renew_seconds_count") == 2
    assert _value(registry, "sparkring_lease_renew_seconds_bucket", le="0.005") == 1
    assert _value(registry, "sparkring_lease_renew_seconds_bucket", le="0.25") == 2
    assert _value(registry, "sparkring_jobs_owned") == 3
    families = _families(registry)
    for name in metrics.HISTOGRAMS:
        assert families[name].type == "histogram", name
    assert families["sparkring_claims"].type == "counter"
    assert "process_cpu_seconds" in families


def test_jobs_by_state_is_a_labelled_gauge() -> None:
    registry = metrics.Registry()
    registry.jobs_by_state(lambda: {"running": 4, "pending": 1})
    assert _value(registry, "sparkring_jobs", state="running") == 4
    assert _value(registry, "sparkring_jobs", state="pending") == 1


def test_spark_master_up_is_a_gauge_per_master() -> None:
    registry = metrics.Registry()
    registry.spark_masters_up(lambda: {"m1:7077": True, "m2:7077": False})
    assert _value(registry, "sparkring_spark_master_up", master="m1:7077") == 1
    assert _value(registry, "sparkring_spark_master_up", master="m2:7077") == 0
    assert _families(registry)["sparkring_spark_master_up"].type == "gauge"


def test_no_spark_master_means_no_series() -> None:
    registry = metrics.Registry()
    registry.spark_masters_up(dict)
    assert "sparkring_spark_master_up" not in _families(registry)


def test_a_failing_gauge_or_database_is_left_out_of_the_scrape() -> None:
    registry = metrics.Registry()

    def broken() -> float:
        raise RuntimeError("runner gone")

    def no_database() -> dict[str, float]:
        raise ConnectionError("PostgreSQL down")

    registry.gauge_fn("sparkring_coordinator", broken)
    registry.gauge_fn("sparkring_capacity", lambda: 4)
    registry.jobs_by_state(no_database)
    families = _families(registry)
    assert "sparkring_coordinator" not in families and "sparkring_jobs" not in families
    assert _value(registry, "sparkring_capacity") == 4


def test_an_undeclared_name_still_works_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    registry = metrics.Registry()
    with caplog.at_level(logging.WARNING, logger="server.metrics"):
        registry.inc("sparkring_typo_total")
        registry.observe("sparkring_new_seconds", 1.5)
    assert registry.counter("sparkring_typo_total") == 1
    assert _value(registry, "sparkring_new_seconds_count") == 1
    assert [r.metric for r in caplog.records] == ["sparkring_typo_total", "sparkring_new_seconds"]
