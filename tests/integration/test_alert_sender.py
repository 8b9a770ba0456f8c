"""Alert deliveries sent to a real webhook receiver (testing/webhook_receiver.py) from a
real PostgreSQL outbox (server/alert_sender.py): retries, a receiver that goes away,
signatures, a sender lost mid-send (sent again, same id), final refusals, two senders
sharing the outbox."""

from __future__ import annotations

import importlib.util
import json
import ssl
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from scheduler import alert_delivery, alerts
from server import alert_sender, bounded_http, metrics, tls
from server.alert_sender import AlertSender
from testing import certificates, factories
from testing.hostile_http import HostileServer
from testing.webhook_receiver import Receiver

_EXAMPLE = Path(__file__).parents[2] / "examples" / "alerts" / "webhook_receiver.py"
_spec = importlib.util.spec_from_file_location("example_receiver", _EXAMPLE)
assert _spec is not None and _spec.loader is not None
example_receiver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example_receiver)

RETRIED_DELIVERED = (
    "sparkring_alert_deliveries_retried_total",
    "sparkring_alert_deliveries_delivered_total",
)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(secret="hook-secret-of-twenty-four-chars").start()
    yield r
    r.stop()


def _sender(engine: sa.Engine, server: str = "s1", interval: float = 0.2) -> AlertSender:
    return AlertSender(
        engine, server, interval=interval, console_url="http://console:8080", user_agent="t",
        allow_networks=factories.LOOPBACK,
    )  # fmt: skip


def _alert(engine: sa.Engine, receiver: Receiver, **kw: object) -> None:
    kw.setdefault("secret", receiver.secret)
    with engine.begin() as conn:
        kw.setdefault("allow_networks", factories.LOOPBACK)
        alerts.create(conn, kw.pop("name", "ops"), receiver.url, kinds="all", **kw)  # type: ignore[arg-type]


def _fail(engine: sa.Engine, job: str = "etl", count: int = 1) -> None:
    with engine.begin() as conn:
        for _ in range(count):
            conn.execute(
                sa.text(
                    "INSERT INTO job_events (job_id, job_name, kind, server, epoch, detail) "
                    "VALUES (1, :job, 'failed', 's2', 3, '{\"error\": \"exit 1\"}')"
                ),
                {"job": job},
            )


def _rows(engine: sa.Engine) -> list[sa.Row]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT * FROM alert_deliveries ORDER BY created_at")))


def _due_now(engine: sa.Engine) -> None:
    """Bring every retry forward (instead of sleeping through the backoff)."""
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alert_deliveries SET next_attempt_at = now()"))


def test_503s_then_success_is_delivered_once_with_the_same_id(
    engine: sa.Engine, receiver: Receiver
) -> None:
    _alert(engine, receiver)
    _fail(engine)
    receiver.script = [503, 503]
    sender = _sender(engine)
    counts = {n: metrics.REGISTRY.counter(n) for n in RETRIED_DELIVERED}
    try:
        for expected in ("pending", "pending", "delivered"):
            assert sender.run_pass() == 1
            (row,) = _rows(engine)
            assert row.status == expected
            _due_now(engine)
        assert sender.run_pass() == 0, "a delivered row was sent again"
    finally:
        sender.stop()
    assert [r.status for r in receiver.received] == [503, 503, 200]
    after = [metrics.REGISTRY.counter(n) - counts[n] for n in RETRIED_DELIVERED]
    assert after == [2, 1], "the metrics did not count the attempts"
    assert len({r.id for r in receiver.received}) == 1
    assert row.attempts == 3 and row.last_status == 200 and row.delivered_at is not None
    body = receiver.received[-1].body
    assert (body["kind"], body["job"], body["server"], body["epoch"]) == ("failed", "etl", "s2", 3)
    assert body["url"] == "http://console:8080/#/jobs/etl"
    assert all(r.signature_ok for r in receiver.received)


def test_the_retry_waits_its_backoff(engine: sa.Engine, receiver: Receiver) -> None:
    _alert(engine, receiver)
    _fail(engine)
    receiver.script = [503]
    sender = _sender(engine)
    try:
        sender.run_pass()
        assert sender.run_pass() == 0, "retried before its backoff"
    finally:
        sender.stop()
    (row,) = _rows(engine)
    with engine.connect() as conn:
        wait = conn.execute(
            sa.text("SELECT extract(epoch FROM next_attempt_at - now()) FROM alert_deliveries")
        ).scalar_one()
    assert 0 < wait <= alert_delivery.RETRY_BASE_S
    assert row.last_error == "HTTP 503"


def test_a_receiver_down_for_a_while_gets_it_when_back(engine: sa.Engine) -> None:
    receiver = Receiver().start()
    url = receiver.url
    receiver.stop()  # gone: connections refused at its address
    with engine.begin() as conn:
        alerts.create(conn, "ops", url, kinds="failed", allow_networks=factories.LOOPBACK)
    _fail(engine)
    sender = _sender(engine)
    try:
        for _ in range(3):
            sender.run_pass()
            _due_now(engine)
        (row,) = _rows(engine)
        assert (row.status, row.attempts, row.last_error) == ("pending", 3, "could not connect")
        receiver.start()  # back, same port
        sender.run_pass()
    finally:
        sender.stop()
        receiver.stop()
    (row,) = _rows(engine)
    assert (row.status, row.attempts) == ("delivered", 4)
    assert receiver.accepted_ids() == [str(row.id)]


def test_a_wrong_secret_is_refused_by_the_receiver_and_not_retried(
    engine: sa.Engine, receiver: Receiver
) -> None:
    _alert(engine, receiver, secret="not-the-receivers-secret-at-all")
    _fail(engine)
    sender = _sender(engine)
    try:
        sender.run_pass()
        _due_now(engine)
        assert sender.run_pass() == 0
    finally:
        sender.stop()
    (row,) = _rows(engine)
    assert (row.status, row.attempts, row.last_status) == ("failed", 1, 401)
    assert row.last_error == "HTTP 401 (final: not retried)"
    assert [r.signature_ok for r in receiver.received] == [False]


def test_a_sender_lost_mid_send_is_replaced_and_the_receiver_deduplicates(
    engine: sa.Engine, receiver: Receiver
) -> None:
    """s1 leases the delivery and sends it, and is lost before it writes the outcome
    (its lease lapses); s2 sends it again with the same id; s1's late outcome is
    dropped by the fence."""
    _alert(engine, receiver)
    _fail(engine)
    with engine.begin() as conn:
        (due,) = alert_delivery.lease_due(conn, "s1", limit=5, lease_s=30, console_url=None)
    s1 = _sender(engine, "s1")
    try:
        from server.alert_sender import send

        status, _, _ = send(s1._client, due, "t", factories.LOOPBACK)  # s1's POST arrives...
        assert status == 200
    finally:
        s1.stop()
    with engine.begin() as conn:  # ... and s1 is gone: its lease lapses
        conn.execute(sa.text("UPDATE alert_deliveries SET lease_until = now() - interval '1s'"))
    s2 = _sender(engine, "s2")
    try:
        assert s2.run_pass() == 1
    finally:
        s2.stop()
    late = alert_delivery.decide(200, None, attempts=due.attempts, age_s=0)
    with engine.begin() as conn:
        assert not alert_delivery.record(conn, due, "s1", late, 200), "the fence let s1 in"
    (row,) = _rows(engine)
    assert (row.status, row.attempts) == ("delivered", 2)
    assert [r.id for r in receiver.received] == [str(row.id)] * 2
    assert receiver.accepted_ids() == [str(row.id)]


def test_a_lease_in_flight_is_not_sent_by_another_server(
    engine: sa.Engine, receiver: Receiver
) -> None:
    _alert(engine, receiver)
    _fail(engine)
    with engine.begin() as conn:
        assert len(alert_delivery.lease_due(conn, "s1", limit=5, lease_s=30, console_url=None)) == 1
    s2 = _sender(engine, "s2")
    try:
        assert s2.run_pass() == 0
    finally:
        s2.stop()
    assert receiver.received == []


def test_two_senders_share_the_outbox_and_send_each_once(
    engine: sa.Engine, receiver: Receiver
) -> None:
    _alert(engine, receiver)
    _fail(engine, count=60)
    senders = [_sender(engine, f"s{i}", interval=0.05) for i in (1, 2)]
    for s in senders:
        s.start()
    try:
        assert receiver.wait_for(lambda got: len(got) >= 60, timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if all(r.status == "delivered" for r in _rows(engine)):
                break
            time.sleep(0.1)
    finally:
        for s in senders:
            s.stop()
    rows = _rows(engine)
    assert {r.status for r in rows} == {"delivered"}
    assert len(receiver.received) == 60, "a delivery was sent twice with no fault"
    assert sorted(receiver.accepted_ids()) == sorted(str(r.id) for r in rows)
    assert all(s.sent > 0 for s in senders), "one sender did all the work"


def test_the_loop_sends_a_new_event_within_seconds(engine: sa.Engine, receiver: Receiver) -> None:
    _alert(engine, receiver)
    sender = _sender(engine, interval=1.0)
    sender.start()
    try:
        started = time.monotonic()
        _fail(engine)
        assert receiver.wait_for(lambda got: len(got) == 1, timeout=10)
        assert time.monotonic() - started < 10
    finally:
        sender.stop()


def test_a_test_delivery_reaches_the_receiver(engine: sa.Engine, receiver: Receiver) -> None:
    _alert(engine, receiver)
    with engine.begin() as conn:
        delivery_id = alerts.test(conn, "ops", actor="cli:me")
    sender = _sender(engine)
    try:
        sender.run_pass()
    finally:
        sender.stop()
    (got,) = receiver.received
    assert (got.id, got.body["kind"], got.body["job"]) == (delivery_id, "test", None)
    assert got.body["url"] == "http://console:8080/#/jobs"


def test_no_secret_or_webhook_path_reaches_a_log_or_a_recorded_error(
    engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with engine.begin() as conn:
        alerts.create(
            conn,
            "ops",
            "http://127.0.0.1:9/PATH-TOKEN",
            secret="SECRET-VALUE-LONG-ENOUGH-TO-BE-ONE",
            allow_networks=factories.LOOPBACK,
            kinds="failed",
        )
    _fail(engine)
    sender = _sender(engine)
    caplog.set_level("DEBUG")
    try:
        sender.run_pass()
    finally:
        sender.stop()
    (row,) = _rows(engine)
    assert row.last_error == "could not connect"
    logged = caplog.text + " ".join(str(r.__dict__) for r in caplog.records)
    assert "SECRET-VALUE" not in logged and "PATH-TOKEN" not in logged


# --- a hostile receiver ----------------------------------------------------------------


def _due(url: str) -> alert_delivery.Due:
    return alert_delivery.Due(
        id="d1", attempts=1, age_s=0.0, url=url, secret=None, format="json",
        fields={"alert": "ops", "kind": "failed", "job": "etl"},
    )  # fmt: skip


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[HostileServer]:
    server = HostileServer(request.param).start()
    yield server
    server.stop()


@pytest.mark.parametrize("hostile", ["trickle"], indirect=True)
def test_a_receiver_that_trickles_its_answer_is_cut_at_the_send_deadline(
    hostile: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: httpx's timeout bounds each read, not the request; a byte every 0.3 s
    held the sender for as long as the receiver liked."""
    monkeypatch.setattr(alert_sender, "SEND_TIMEOUT_S", 2.0)
    with bounded_http.client(timeout=2.0) as client:
        started = time.monotonic()
        status, error, _ = alert_sender.send(client, _due(hostile.url), "t", factories.LOOPBACK)
        took = time.monotonic() - started
    assert (status, error) == (None, "timed out")
    assert took < 2.0 * 1.5 + 1.0, took


@pytest.mark.parametrize("hostile", ["huge"], indirect=True)
def test_a_huge_answer_is_not_read_past_its_cap(hostile: HostileServer) -> None:
    """Issue 45: the whole answer was read into memory (a 200 MiB answer cost 400 MiB).
    Only its status and headers matter; at most MAX_ANSWER_BYTES of the body is read."""
    with bounded_http.client(timeout=10.0) as client:
        tracemalloc.start()
        try:
            status, error, _ = alert_sender.send(client, _due(hostile.url), "t", factories.LOOPBACK)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert (status, error) == (200, None)
    assert peak < 8 << 20, f"peak {peak / 2**20:.0f} MiB for a {hostile.size >> 20} MiB answer"


@pytest.mark.parametrize("hostile", ["trickle"], indirect=True)
def test_stop_cuts_a_send_in_flight_instead_of_waiting_for_the_receiver(
    engine: sa.Engine, hostile: HostileServer
) -> None:
    """Issue 45: stop() waited for the pool without bound, before the hand-over, so a
    trickling receiver held SIGTERM until the container's SIGKILL killed the drivers."""
    with engine.begin() as conn:
        alerts.create(conn, "slow", hostile.url, kinds="all", allow_networks=factories.LOOPBACK)
    _fail(engine)
    sender = _sender(engine)
    sender.start()
    try:
        assert hostile.seen.wait(20), "the sender never posted"
    finally:
        started = time.monotonic()
        sender.stop()
        took = time.monotonic() - started
    assert took < 3.0, took
    assert not sender.is_alive()
    (row,) = _rows(engine)
    assert row.status != "delivered"  # cut, to be sent again (same id)


def test_a_destination_the_policy_refuses_at_send_time_fails_at_once_without_traffic(
    engine: sa.Engine, receiver: Receiver
) -> None:
    """Issue 45: an alert created where loopback was allowed (or whose name resolves
    elsewhere now) is refused by a sender without that allowance: failed, final, and
    nothing reaches the receiver."""
    _alert(engine, receiver)
    _fail(engine)
    sender = AlertSender(
        engine, "s1", interval=0.2, console_url=None, user_agent="t", allow_networks=()
    )
    assert sender.run_pass() == 1
    (row,) = _rows(engine)
    assert row.status == "failed" and row.attempts == 1
    assert "destination refused" in row.last_error and "(final)" in row.last_error
    assert receiver.received == []


def test_a_signed_delivery_carries_a_standard_webhooks_signature_the_example_verifies(
    engine: sa.Engine, receiver: Receiver
) -> None:
    """Issue 45: the old signature covered the body only, so a captured delivery could
    be replayed for ever. The Standard Webhooks one signs id, timestamp and body; the
    example receiver (examples/alerts/webhook_receiver.py) refuses it five minutes on,
    and refuses a changed body."""
    due = alert_delivery.Due(
        id="d-42", attempts=1, age_s=0.0, url="http://x", secret=receiver.secret,
        format="json", fields={"alert": "ops", "kind": "failed", "job": "etl"},
    )  # fmt: skip
    payload = alert_delivery.body(due.fields, due.format)
    now = 1_800_000_000
    sent = {k.lower(): v for k, v in alert_delivery.headers(due, payload, "t", now).items()}
    assert (sent["webhook-id"], sent["webhook-timestamp"]) == ("d-42", str(now))
    assert sent["webhook-signature"].startswith("v1,")
    secret = receiver.secret.encode()
    assert example_receiver.verified(secret, sent, payload, now + 10)
    assert not example_receiver.verified(secret, sent, payload, now + 6 * 60)  # a replay
    assert not example_receiver.verified(secret, sent, payload + b" ", now + 10)
    assert not example_receiver.verified(b"another-secret-of-24-chars", sent, payload, now)


def test_slack_text_is_escaped_so_a_jobs_error_pings_nobody() -> None:
    fields = {
        "alert": "ops", "kind": "failed", "job": "etl<&>", "at": "2026-11-28T00:00:00Z",
        "server": "s1", "epoch": 3, "detail": {"error": "boom <!channel> & <http://x|y>"},
        "url": None,
    }  # fmt: skip
    text = json.loads(alert_delivery.body(fields, "slack"))["text"]
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text
    assert "job etl&lt;&amp;&gt;" in text and "&lt;http://x|y&gt;" in text


def test_with_a_cluster_ca_set_a_receiver_with_a_public_certificate_is_still_delivered_to(
    engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: with SPARKRING_TLS_CA set, every HTTPS receiver was verified against the
    private CA alone, and Slack or PagerDuty failed as "could not connect" for 24 h.
    Here the system's trust store (SSL_CERT_FILE) holds a "public" CA, the receiver's
    certificate is that CA's, and the cluster has a CA of its own."""
    public_cert, public_key = certificates.self_signed(tmp_path, "public-ca")
    cluster_ca, _ = certificates.self_signed(tmp_path, "cluster-ca")
    monkeypatch.setenv("SSL_CERT_FILE", str(public_cert))
    receiver = Receiver(secret="hook-secret-of-twenty-four-chars", tls=(public_cert, public_key))
    receiver.start()
    try:
        _alert(engine, receiver)
        _fail(engine)
        # The control: what the sender verified with before (the cluster CA alone).
        # Then the system's store, and the store with the cluster CA (what
        # SPARKRING_ALERT_TRUST_CLUSTER_CA=true gives).
        for verify, expected in (
            (ssl.create_default_context(cafile=str(cluster_ca)), "pending"),
            (tls.webhook_context(None), "delivered"),
            (tls.webhook_context(cluster_ca), "delivered"),
        ):
            sender = AlertSender(
                engine, "s1", interval=0.2, console_url=None, user_agent="t",
                verify=verify, allow_networks=factories.LOOPBACK,
            )  # fmt: skip
            _due_now(engine)
            with engine.begin() as conn:
                conn.execute(sa.text("UPDATE alert_deliveries SET status = 'pending'"))
            assert sender.run_pass() == 1
            sender.stop()
            (row,) = _rows(engine)
            assert row.status == expected, (verify, row.last_error)
    finally:
        receiver.stop()


@pytest.mark.parametrize("hostile", ["trickle"], indirect=True)
def test_a_receiver_that_holds_its_answer_delays_no_other_delivery(
    engine: sa.Engine, receiver: Receiver, hostile: HostileServer
) -> None:
    """Issue 45: each pass waited for all of its sends, so one receiver that trickled
    its answer held every alert of the cluster's server behind it (the old code for as
    long as the receiver liked; bounded, up to the send's deadline). An event raised
    while that send is in flight reaches another receiver within a pass or two."""
    with engine.begin() as conn:
        alerts.create(conn, "slow", hostile.url, kinds="all", allow_networks=factories.LOOPBACK)
    _alert(engine, receiver)
    sender = _sender(engine, interval=0.2)
    sender.start()
    try:
        _fail(engine, job="first")
        assert hostile.seen.wait(20), "the slow receiver never got its delivery"
        assert receiver.wait_for(lambda got: len(got) >= 1, 10)
        raised = time.monotonic()
        _fail(engine, job="second")
        assert receiver.wait_for(lambda got: len(got) >= 2, alert_sender.SEND_TIMEOUT_S / 2), (
            "the second event waited for the slow receiver"
        )
        assert time.monotonic() - raised < alert_sender.SEND_TIMEOUT_S / 2
    finally:
        sender.stop()
