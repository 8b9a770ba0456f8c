"""Sending the alert outbox: which delivery is due, what its body is, what an answer
means (docs/alerts.md).

Any live server delivers (``server/alert_sender.py`` holds the thread and the HTTP
client). A delivery is *leased* (``lease_owner``, ``lease_until``, ``attempts + 1``) in
one short transaction, sent outside any transaction, and its outcome written back
*fenced* on that lease: an outcome of a server whose lease lapsed (it was paused, or
the answer came late) is dropped, and the delivery is sent again by whoever leased it
next. So a delivery is sent at least once, and more than once only when a server dies
or stalls mid-send: the body's ``id`` is the same every time, for the receiver to drop
the repeats.

The decisions are pure functions: :func:`decide` (what an answer means, and when to try
again) and :func:`body` (what is sent); the signature is :func:`signature`.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import hmac
import json
import time
from typing import Any

import sqlalchemy as sa

from sql.states import AlertFormat, DeliveryStatus

# Retries back off from RETRY_BASE_S, doubling, to at most RETRY_MAX_S apart, for
# GIVE_UP_AFTER_S after the delivery was written; then it is failed for good.
RETRY_BASE_S = 2.0
RETRY_MAX_S = 3600.0
GIVE_UP_AFTER_S = 24 * 3600.0
# Answers that say "later", not "never", among the 4xx.
RETRYABLE_4XX = frozenset({408, 429})
SIGNATURE_HEADER = "X-Sparkring-Signature"
ID_HEADER = "X-Sparkring-Delivery"
MAX_ERROR = 300


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: DeliveryStatus
    retry_in: float | None  # seconds until the next attempt (pending only)
    error: str | None  # why it did not go through (None when delivered)


def retry_delay(attempts: int) -> float:
    """Seconds before attempt ``attempts + 1``, after ``attempts`` (>= 1) failed."""
    return min(RETRY_MAX_S, RETRY_BASE_S * 2.0 ** min(max(attempts - 1, 0), 30))


def decide(
    http_status: int | None,
    error: str | None,
    *,
    attempts: int,
    age_s: float,
    retry_after_s: float | None = None,
) -> Outcome:
    """What an attempt's answer means: ``http_status`` (None: no answer, ``error`` says
    why) after ``attempts`` attempts, the delivery ``age_s`` seconds old.

    2xx: delivered. 4xx other than 408 and 429: failed, final (the receiver refuses it:
    a wrong URL or a rejected signature does not mend itself). Anything else (no
    answer, 408, 429, 5xx, a 1xx or 3xx: redirects are not followed): pending, again
    after :func:`retry_delay` (or the receiver's Retry-After, within the same bounds),
    unless that lands past :data:`GIVE_UP_AFTER_S`: failed."""
    if http_status is not None and 200 <= http_status < 300:
        return Outcome(DeliveryStatus.DELIVERED, None, None)
    why = error if http_status is None else f"HTTP {http_status}"
    if http_status is not None and 400 <= http_status < 500 and http_status not in RETRYABLE_4XX:
        return Outcome(DeliveryStatus.FAILED, None, f"{why} (final: not retried)")
    delay = retry_delay(attempts)
    if retry_after_s is not None and retry_after_s > 0:
        delay = min(RETRY_MAX_S, max(delay, retry_after_s))
    if age_s + delay > GIVE_UP_AFTER_S:
        return Outcome(
            DeliveryStatus.FAILED, None, f"{why} (gave up after {attempts} attempts in 24 h)"
        )
    return Outcome(DeliveryStatus.PENDING, delay, why)


@dataclasses.dataclass(frozen=True)
class Due:
    """A leased delivery, with what sending it needs (the secret stays in memory)."""

    id: str
    attempts: int  # this attempt's number (the fence of its outcome)
    age_s: float
    url: str
    secret: str | None = dataclasses.field(repr=False)
    format: str
    fields: dict[str, Any]


def _iso(t: datetime.datetime | None) -> str | None:
    if t is None:
        return None
    return t.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")


def console_link(console_url: str | None, job: str | None) -> str | None:
    if not console_url:
        return None
    base = console_url.rstrip("/")
    if not job:
        return f"{base}/#/jobs"
    from urllib.parse import quote

    return f"{base}/#/jobs/{quote(job, safe='')}"


def fields_of(row: sa.Row, console_url: str | None) -> dict[str, Any]:
    """The JSON body's fields (docs/alerts.md)."""
    return {
        "id": str(row.id),
        "alert": row.alert_name,
        "kind": row.kind,
        "job": row.job_name,
        "at": _iso(row.at),
        "server": row.server,
        "epoch": row.epoch,
        "detail": row.detail or {},
        "url": console_link(console_url, row.job_name),
    }


def body(fields: dict[str, Any], format: str) -> bytes:
    """The bytes sent: the fields as JSON, or a Slack message that says the same."""
    if format == AlertFormat.SLACK:
        subject = f"job {fields['job']}" if fields["job"] else f"alert {fields['alert']}"
        text = f"sparkring: {subject}: {fields['kind'].replace('_', ' ')}"
        facts = [f"at {fields['at']}"]
        if fields["server"]:
            facts.append(f"on {fields['server']}")
        if fields["epoch"] is not None:
            facts.append(f"epoch {fields['epoch']}")
        text = slack_escape(text + " (" + ", ".join(facts) + ")")
        why = fields["detail"].get("error") or fields["detail"].get("cause")
        if why:
            text += f"\n> {slack_escape(str(why)[:500])}"
        if fields["url"]:
            text += f"\n<{slack_escape(fields['url'])}|open in the console>"
        return json.dumps({"text": text, "sparkring": fields}, sort_keys=True).encode()
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def signature(secret: str, payload: bytes) -> str:
    """``sha256=`` and the hex HMAC-SHA256 of the body under the alert's secret (the
    older header, :data:`SIGNATURE_HEADER`: it signs the body only, so a captured
    delivery can be replayed; receivers should check :func:`standard_signature`)."""
    return "sha256=" + hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()


def standard_signature(secret: str, delivery_id: str, timestamp: int, payload: bytes) -> str:
    """The Standard Webhooks signature (``webhook-signature``): ``v1,`` and the base64
    HMAC-SHA256 of ``<id>.<timestamp>.<body>`` under the alert's secret (its UTF-8
    bytes, as they are: no ``whsec_`` prefix is stripped)."""
    signed = f"{delivery_id}.{timestamp}.".encode() + payload
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(
    due: Due, payload: bytes, user_agent: str, timestamp: int | None = None
) -> dict[str, str]:
    """The request's headers: the delivery's id, and with a secret both signatures;
    ``timestamp`` (Unix seconds, default now) is the attempt's, signed with the body."""
    at = int(time.time()) if timestamp is None else timestamp
    out = {
        "Content-Type": "application/json",
        "User-Agent": user_agent,
        ID_HEADER: due.id,
        "webhook-id": due.id,
        "webhook-timestamp": str(at),
    }
    if due.secret:
        out[SIGNATURE_HEADER] = signature(due.secret, payload)
        out["webhook-signature"] = standard_signature(due.secret, due.id, at, payload)
    return out


def slack_escape(text: str) -> str:
    """``text`` as Slack shows it literally: ``&``, ``<`` and ``>`` escaped, so that a
    job's error message saying ``<!channel>`` pings nobody and links nowhere."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_LEASE = sa.text(
    """
    WITH due AS (
        SELECT id FROM alert_deliveries
         WHERE status = 'pending' AND next_attempt_at <= now()
           AND (lease_until IS NULL OR lease_until < now())
         ORDER BY next_attempt_at
         LIMIT :limit
           FOR UPDATE SKIP LOCKED
    )
    UPDATE alert_deliveries d
       SET lease_owner = :server,
           lease_until = now() + make_interval(secs => :lease_s),
           attempts = d.attempts + 1
      FROM due, alerts a
     WHERE d.id = due.id AND a.id = d.alert_id
    RETURNING d.id, d.attempts, d.alert_name, d.kind, d.job_name, d.at, d.server, d.epoch,
              d.detail, extract(epoch FROM now() - d.created_at) AS age_s,
              a.webhook_url, a.secret, a.format
    """
)


def lease_due(
    conn: sa.Connection, server: str, *, limit: int, lease_s: float, console_url: str | None
) -> list[Due]:
    """Lease up to ``limit`` due deliveries for ``lease_s`` seconds (one attempt each)."""
    rows = conn.execute(_LEASE, {"server": server, "limit": limit, "lease_s": lease_s})
    return [
        Due(
            id=str(row.id),
            attempts=row.attempts,
            age_s=float(row.age_s),
            url=row.webhook_url,
            secret=row.secret,
            format=row.format,
            fields=fields_of(row, console_url),
        )
        for row in rows
    ]


_RECORD = sa.text(
    """
    UPDATE alert_deliveries
       SET status = :status,
           lease_owner = NULL,
           lease_until = NULL,
           last_status = :http_status,
           last_error = :error,
           delivered_at = CASE WHEN :status = 'delivered' THEN now() END,
           next_attempt_at = CASE WHEN :status = 'pending'
                                  THEN now() + make_interval(secs => :retry_in)
                                  ELSE next_attempt_at END
     WHERE id = CAST(:id AS uuid) AND lease_owner = :server AND attempts = :attempts
       AND status = 'pending'
    """
)


def record(
    conn: sa.Connection,
    due: Due,
    server: str,
    outcome: Outcome,
    http_status: int | None,
) -> bool:
    """Write an attempt's outcome, fenced on its lease; False if the lease was lost
    (the outcome is dropped: the delivery is sent again)."""
    result = conn.execute(
        _RECORD,
        {
            "id": due.id,
            "server": server,
            "attempts": due.attempts,
            "status": outcome.status.value,
            "http_status": http_status,
            "error": outcome.error[:MAX_ERROR] if outcome.error else None,
            "retry_in": outcome.retry_in or 0.0,
        },
    )
    return result.rowcount == 1
