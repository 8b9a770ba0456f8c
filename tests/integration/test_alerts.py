"""Alerts and their outbox on a real PostgreSQL (scheduler/alerts.py, migration 0013):
the triggers write a delivery in the transaction of the event that raises it, for the
alerts whose kinds and job glob match; nothing shown reveals a secret."""

from __future__ import annotations

import datetime
import json
import re
import threading

import pytest
import sqlalchemy as sa

from scheduler import alerts, distribution, jobs, runs
from sql.states import EventKind
from testing import factories
from testing.factories import owner


def _deliveries(engine: sa.Engine) -> list[tuple[str, str, str | None]]:
    with engine.connect() as conn:
        return [
            (r.alert_name, r.kind, r.job_name)
            for r in conn.execute(
                sa.text("SELECT * FROM alert_deliveries ORDER BY created_at, alert_name, kind")
            )
        ]


def _alert(engine: sa.Engine, name: str, **kw: object) -> alerts.Alert:
    with engine.begin() as conn:
        kw.setdefault("allow_networks", factories.LOOPBACK)
        return alerts.create(conn, name, kw.pop("webhook", "http://127.0.0.1:9/hook"), **kw)  # type: ignore[arg-type]


def _event(engine: sa.Engine, job: str, kind: str, detail: dict | None = None) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO job_events (job_id, job_name, kind, server, epoch, detail) "
                "VALUES (1, :job, :kind, 's1', 4, CAST(:detail AS jsonb))"
            ),
            {"job": job, "kind": kind, "detail": json.dumps(detail or {})},
        )


def test_each_event_kind_raises_its_alert_kind_for_alerts_listening(engine: sa.Engine) -> None:
    _alert(engine, "everything", kinds="all")
    _alert(engine, "defaults")  # failed, stalled, waiting_for_resources, rolled_back
    cases = [
        (EventKind.FAILED, {}, "failed"),
        (EventKind.CRASHED, {}, "restarted"),
        (EventKind.REAPED, {}, "failed_over"),
        (EventKind.CLAIMED, {"taken_over_from": "s2"}, "failed_over"),
        (EventKind.HEALTH_FLAGGED, {"flag": "stalled"}, "stalled"),
        (EventKind.HEALTH_FLAGGED, {"flag": "waiting_for_resources"}, "waiting_for_resources"),
        (EventKind.HEALTH_CLEARED, {"flag": "stalled"}, "recovered"),
        (EventKind.ROLLED_BACK, {"cause": "crashed"}, "rolled_back"),
    ]
    for i, (kind, detail, _) in enumerate(cases):
        _event(engine, f"j{i}", kind.value, detail)
    got = _deliveries(engine)
    assert sorted(k for a, k, _ in got if a == "everything") == sorted(c[2] for c in cases)
    assert sorted(k for a, k, _ in got if a == "defaults") == sorted(
        ["failed", "stalled", "waiting_for_resources", "rolled_back"]
    )


def test_events_that_tell_nothing_raise_nothing(engine: sa.Engine) -> None:
    _alert(engine, "everything", kinds="all")
    for kind in (
        EventKind.CREATED,
        EventKind.START_REQUESTED,
        EventKind.DRIVER_STARTED,
        EventKind.RELEASED,
        EventKind.FINISHED,
        EventKind.CLAIMED,  # a claim of a released or new run: nobody was lost
        EventKind.ADOPTED,
    ):
        _event(engine, "quiet", kind.value)
    assert _deliveries(engine) == []


def test_the_job_glob_picks_the_jobs(engine: sa.Engine) -> None:
    _alert(engine, "etl", kinds="failed", job_glob="etl-*")
    _alert(engine, "one", kinds="failed", job_glob="etl-?")
    _alert(engine, "literal", kinds="failed", job_glob="a_b")
    for job in ("etl-a", "etl-ab", "other", "a_b", "axb"):
        _event(engine, job, "failed")
    got = sorted((a, j) for a, _, j in _deliveries(engine))
    # '_' in a glob is itself, not LIKE's one-character wildcard.
    assert got == [("etl", "etl-a"), ("etl", "etl-ab"), ("literal", "a_b"), ("one", "etl-a")]


def test_a_crash_written_by_the_owner_raises_restarted_in_its_transaction(
    engine: sa.Engine,
) -> None:
    _alert(engine, "crashes", kinds="restarted,failed")
    job_id = factories.job(engine, "flaky", max_restarts=1)
    factories.target(engine, job_id, "s1")
    factories.crash(engine, job_id)
    factories.crash(engine, job_id)  # past its budget: failed
    assert _deliveries(engine) == [
        ("crashes", "restarted", "flaky"),
        ("crashes", "failed", "flaky"),
    ]


def test_an_event_rolled_back_leaves_no_delivery(engine: sa.Engine) -> None:
    _alert(engine, "all", kinds="all")
    with pytest.raises(RuntimeError), engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO job_events (job_id, job_name, kind) VALUES (1, 'j', 'failed')")
        )
        raise RuntimeError("the writer's transaction fails after its event")
    assert _deliveries(engine) == []


def test_a_claim_over_another_servers_expired_lease_is_a_failover(engine: sa.Engine) -> None:
    _alert(engine, "moves", kinds="failed_over")
    job_id = factories.job(engine, "moved")
    factories.target(engine, job_id, "s1")
    with engine.begin() as conn:
        distribution.claim(conn, job_id, owner("s1"), ttl=30.0)
    assert _deliveries(engine) == []  # a first claim moves nothing
    factories.expire_lease(engine, job_id)
    with engine.begin() as conn:  # s1 re-claims its own lapsed lease: not a failover
        distribution.claim(conn, job_id, owner("s1", "b"), ttl=30.0)
    assert _deliveries(engine) == []
    factories.expire_lease(engine, job_id)
    factories.target(engine, job_id, "s2")
    with engine.begin() as conn:
        distribution.claim(conn, job_id, owner("s2"), ttl=30.0)
    assert _deliveries(engine) == [("moves", "failed_over", "moved")]


def test_a_skipped_fire_time_raises_schedule_skipped(engine: sa.Engine) -> None:
    _alert(engine, "sched", kinds="schedule_skipped")
    job_id = factories.job(engine, "nightly", kind="batch")
    at = datetime.datetime(2026, 11, 26, 2, 0, tzinfo=datetime.UTC)
    with engine.begin() as conn:
        runs.record_skipped(conn, job_id, at, "misfire")
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM alert_deliveries")).one()
    assert (row.kind, row.job_name) == ("schedule_skipped", "nightly")
    assert row.detail["scheduled_time"] == "2026-11-26T02:00:00Z"
    assert row.detail["reason"] == "misfire"


def test_listings_show_no_secret_and_only_the_webhooks_host(engine: sa.Engine) -> None:
    url = "https://hooks.slack.com/services/T000/B000/XXXXSECRETPATH"
    made = _alert(
        engine, "slack", webhook=url, secret="s3cr3t-value-long-enough-for-it", format="slack"
    )
    with engine.connect() as conn:
        shown = [made, *alerts.list_alerts(conn), alerts.get(conn, "slack")]
    for alert in shown:
        text = repr(alert) + repr(alert.as_dict())
        assert "s3cr3t-value" not in text and "SECRETPATH" not in text
        assert alert.webhook == "https://hooks.slack.com/…"
        assert alert.has_secret


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"webhook": "ftp://x/y"}, "must start with http:// or https://"),
        ({"webhook": "HTTPS://x/y"}, "must start with http:// or https://"),
        ({"webhook": "http:///nohost"}, "has no host"),
        ({"webhook": "http://x:99999/"}, "not a valid URL"),
        ({"kinds": "failed,explode"}, "unknown alert kind 'explode'"),
        ({"kinds": "test"}, "unknown alert kind 'test'"),
        ({"kinds": ","}, "at least one kind"),
        ({"format": "xml"}, "must be one of: json, slack"),
        ({"job_glob": "etl-[ab]"}, "job glob"),
        ({"secret": ""}, "secret must be"),
        ({"name": "deliveries"}, "'deliveries' is reserved"),
    ],
)
def test_bad_input_is_refused_naming_the_problem_and_writes_nothing(
    engine: sa.Engine, kw: dict, message: str
) -> None:
    with pytest.raises(alerts.AlertError, match=re.escape(message)):
        _alert(engine, **{"name": "bad", **kw})
    with engine.connect() as conn:
        assert alerts.list_alerts(conn) == []


def test_a_name_is_taken_once_and_delete_takes_the_deliveries(engine: sa.Engine) -> None:
    _alert(engine, "a", kinds="failed")
    with pytest.raises(alerts.AlertError, match="already exists"):
        _alert(engine, "a")
    _event(engine, "j", "failed")
    with engine.begin() as conn:
        test_id = alerts.test(conn, "a", actor="cli:me")
        assert {d.kind for d in alerts.deliveries(conn, alert="a")} == {"failed", "test"}
        assert test_id in {d.id for d in alerts.deliveries(conn)}
        assert alerts.delete(conn, "a") == 2
        with pytest.raises(alerts.AlertNotFound):
            alerts.delete(conn, "a")
        with pytest.raises(alerts.AlertNotFound):
            alerts.test(conn, "a")
        with pytest.raises(alerts.AlertNotFound):
            alerts.deliveries(conn, alert="a")
    assert _deliveries(engine) == []


def test_a_deleted_job_name_reused_is_matched_by_name(engine: sa.Engine) -> None:
    """Alerts match job names, so a job deleted and made again keeps its alerts."""
    _alert(engine, "n", kinds="failed", job_glob="reborn")
    factories.job(engine, "reborn", start=False)
    with engine.begin() as conn:
        jobs.delete(conn, "reborn")
    factories.job(engine, "reborn", start=False)
    _event(engine, "reborn", "failed")
    assert _deliveries(engine) == [("n", "failed", "reborn")]


def test_a_test_delivery_racing_the_alerts_delete_finds_it_gone(engine: sa.Engine) -> None:
    """A test delivery asked while a delete of the alert is in flight (its transaction
    open) waits for it and answers as if it came after it: AlertNotFound (404), never
    the foreign key's violation (a 503 'database error' found by schemathesis)."""
    _alert(engine, "racing")
    outcome: list[BaseException | str] = []
    with engine.connect() as deleting:
        deleting.begin()
        assert alerts.delete(deleting, "racing") == 0

        def ask() -> None:
            try:
                with engine.begin() as conn:
                    outcome.append(alerts.test(conn, "racing"))
            except BaseException as exc:
                outcome.append(exc)

        asking = threading.Thread(target=ask)
        asking.start()
        # The test's statement waits on the delete's row lock: it has not answered yet.
        asking.join(timeout=1.0)
        assert asking.is_alive() and outcome == []
        deleting.commit()
    asking.join(timeout=10)
    assert len(outcome) == 1 and isinstance(outcome[0], alerts.AlertNotFound), outcome
