"""The pure decisions of alert delivery (scheduler/alert_delivery.py): what an answer
means, when to try again, what is sent and how it is signed."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler import alert_delivery as ad
from sql.states import DeliveryStatus


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_a_2xx_is_delivered(status: int) -> None:
    assert ad.decide(status, None, attempts=1, age_s=0).status == DeliveryStatus.DELIVERED


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 413, 422])
def test_a_4xx_other_than_408_and_429_is_final(status: int) -> None:
    outcome = ad.decide(status, None, attempts=1, age_s=0)
    assert outcome.status == DeliveryStatus.FAILED
    assert outcome.error == f"HTTP {status} (final: not retried)"


@pytest.mark.parametrize("status", [None, 408, 429, 500, 502, 503, 504, 301, 302])
def test_no_answer_408_429_5xx_and_redirects_are_retried(status: int | None) -> None:
    outcome = ad.decide(
        status, "could not connect" if status is None else None, attempts=1, age_s=0
    )
    assert outcome.status == DeliveryStatus.PENDING
    assert outcome.retry_in == ad.RETRY_BASE_S
    assert outcome.error == ("could not connect" if status is None else f"HTTP {status}")


def test_retries_back_off_exponentially_to_a_cap() -> None:
    delays = [ad.retry_delay(n) for n in range(1, 20)]
    assert delays[:4] == [ad.RETRY_BASE_S * f for f in (1, 2, 4, 8)]
    assert max(delays) == ad.RETRY_MAX_S and delays[-1] == ad.RETRY_MAX_S


@given(st.integers(min_value=1, max_value=10_000))
def test_the_delay_never_shrinks_and_stays_in_bounds(attempts: int) -> None:
    assert ad.RETRY_BASE_S <= ad.retry_delay(attempts) <= ad.RETRY_MAX_S
    assert ad.retry_delay(attempts + 1) >= ad.retry_delay(attempts)


def test_retries_stop_after_24_hours() -> None:
    just_in = ad.decide(503, None, attempts=3, age_s=ad.GIVE_UP_AFTER_S - 60)
    assert just_in.status == DeliveryStatus.PENDING
    past = ad.decide(503, None, attempts=30, age_s=ad.GIVE_UP_AFTER_S - 1)
    assert past.status == DeliveryStatus.FAILED
    assert "gave up after 30 attempts in 24 h" in (past.error or "")


@given(st.lists(st.sampled_from([None, 500, 503, 429]), min_size=1, max_size=200))
def test_a_failing_receiver_is_tried_for_24_hours_then_failed(answers: list) -> None:
    """However the answers go, the attempts of one delivery stop within 24 h (plus one
    capped delay), and none is scheduled past the give-up time."""
    age, attempts = 0.0, 0
    for status in answers * 100:
        attempts += 1
        outcome = ad.decide(status, "x" if status is None else None, attempts=attempts, age_s=age)
        if outcome.status == DeliveryStatus.FAILED:
            break
        assert outcome.retry_in is not None
        age += outcome.retry_in
        assert age <= ad.GIVE_UP_AFTER_S
    else:
        pytest.fail("never gave up")


def test_retry_after_is_honoured_within_the_cap() -> None:
    assert ad.decide(429, None, attempts=1, age_s=0, retry_after_s=30).retry_in == 30
    assert ad.decide(429, None, attempts=1, age_s=0, retry_after_s=1e9).retry_in == ad.RETRY_MAX_S
    assert ad.decide(429, None, attempts=5, age_s=0, retry_after_s=1).retry_in == ad.retry_delay(5)


FIELDS = {
    "id": "0b8e6a34-52a4-4d1a-9a4b-2f5d3f1f5a10",
    "alert": "ops",
    "kind": "failed",
    "job": "nightly-etl",
    "at": "2026-11-26T10:00:00Z",
    "server": "s2",
    "epoch": 7,
    "detail": {"error": "exit 1: Traceback ..."},
    "url": "http://console:8080/#/jobs/nightly-etl",
}


def test_the_json_body_holds_every_field_of_the_docs() -> None:
    sent = json.loads(ad.body(FIELDS, "json"))
    assert sent == FIELDS
    assert set(sent) == {"id", "alert", "kind", "job", "at", "server", "epoch", "detail", "url"}


def test_the_slack_body_has_text_saying_what_happened_and_where_to_look() -> None:
    sent = json.loads(ad.body(FIELDS, "slack"))
    assert sent["text"].startswith("sparkring: job nightly-etl: failed (at 2026-11-26T10:00:00Z")
    assert "exit 1: Traceback" in sent["text"]
    assert "<http://console:8080/#/jobs/nightly-etl|open in the console>" in sent["text"]
    assert sent["sparkring"]["id"] == FIELDS["id"]


def test_the_signature_is_the_hmac_sha256_of_the_exact_body() -> None:
    payload = ad.body(FIELDS, "json")
    due = ad.Due("d", 1, 0.0, "http://x/", "k3y", "json", FIELDS)
    headers = ad.headers(due, payload, "sparkring/test")
    expected = hmac.new(b"k3y", payload, hashlib.sha256).hexdigest()
    assert headers["X-Sparkring-Signature"] == f"sha256={expected}"
    assert headers["X-Sparkring-Delivery"] == "d"
    unsigned = ad.Due("d", 1, 0.0, "http://x/", None, "json", FIELDS)
    assert "X-Sparkring-Signature" not in ad.headers(unsigned, payload, "ua")


def test_a_due_delivery_never_shows_its_secret() -> None:
    due = ad.Due("d", 1, 0.0, "http://x/", "very-secret", "json", FIELDS)
    assert "very-secret" not in repr(due)


def test_the_console_link_names_the_job_page() -> None:
    assert ad.console_link("https://c.example/", "a b") == "https://c.example/#/jobs/a%20b"
    assert ad.console_link("https://c.example", None) == "https://c.example/#/jobs"
    assert ad.console_link(None, "j") is None


def test_times_are_iso_8601_utc() -> None:
    t = datetime.datetime(
        2026, 11, 26, 11, 0, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
    )
    assert ad._iso(t) == "2026-11-26T09:00:01Z"
