"""The side thread of a server that sends the alert outbox (scheduler/alert_delivery.py).

Every live server runs one. Each pass leases as many due deliveries as it has free
senders (:data:`BATCH` in flight at most; a lease each, so two servers never send the
same one at once) and starts them on a small pool of threads, one POST each, with a
deadline well inside the lease; each attempt writes its outcome back, fenced on its
lease. A pass does not wait for its attempts: a receiver slow to answer holds its own
delivery and one sender, never the others. Passes run every ``interval`` seconds, at
once after a pass that found work, and when a sender frees up. A failure (PostgreSQL
away) is logged and retried; the thread never ends before :meth:`stop`.

What is logged of a delivery: its id, alert, kind, job, attempt and outcome; never the
webhook URL (it can hold a credential) or the secret.
"""

from __future__ import annotations

import email.utils
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

import httpx
import sqlalchemy as sa

from scheduler import alert_delivery, destinations, loop
from server import bounded_http, metrics
from sql.states import DeliveryStatus

log = logging.getLogger(__name__)

BATCH = 16  # deliveries leased (and sent at once) per pass
SEND_TIMEOUT_S = 10.0  # one POST, connect to last byte read (within 1.5 x: bounded_http)
MAX_ANSWER_BYTES = 64 * 1024  # of a receiver's answer: only its status and headers matter
# The errors of a delivery that can never go through: failed at once, not retried.
REFUSED = "destination refused (SPARKRING_ALERT_ALLOW_NETWORKS)"
FINAL_ERRORS = frozenset({REFUSED, "bad url"})
LEASE_S = 3 * SEND_TIMEOUT_S  # a server paused mid-send loses it after this
STOP_GRACE_S = 2.0  # what a stop gives the sends in flight before it cuts them
_COUNTER = {
    DeliveryStatus.DELIVERED: "sparkring_alert_deliveries_delivered_total",
    DeliveryStatus.PENDING: "sparkring_alert_deliveries_retried_total",
    DeliveryStatus.FAILED: "sparkring_alert_deliveries_failed_total",
}


def retry_after(value: str | None) -> float | None:
    """Seconds of a Retry-After header (seconds, or an HTTP date); None if absent/bad."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def send(
    client: httpx.Client,
    due: alert_delivery.Due,
    user_agent: str,
    allow_networks: Sequence[destinations.Network] = (),
) -> tuple[int | None, str | None, float | None]:
    """POST one delivery: (HTTP status or None, why there was no answer, Retry-After).
    Within SEND_TIMEOUT_S all told and MAX_ANSWER_BYTES of the answer's body, the rest
    of which is never read (server/bounded_http.py: a receiver can neither hold the
    sender nor fill the server's memory). The error names the failure's kind only: an
    exception's text can carry the URL. The destination is checked first, as it
    resolves now (scheduler/destinations.py): a refused one is :data:`REFUSED`."""
    payload = alert_delivery.body(due.fields, due.format)
    try:
        destinations.check(due.url, allow_networks)
    except destinations.Unresolved:
        return None, "could not resolve its host", None
    except destinations.DestinationError:
        return None, REFUSED, None
    try:
        answer = bounded_http.request(
            client,
            "POST",
            due.url,
            deadline_s=SEND_TIMEOUT_S,
            max_bytes=MAX_ANSWER_BYTES,
            content=payload,
            headers=alert_delivery.headers(due, payload, user_agent),
        )
    except bounded_http.FetchError as exc:
        return None, exc.kind, None
    return answer.status, None, retry_after(answer.headers.get("retry-after"))


class AlertSender(loop.Loop):
    """The side thread of a server that sends the alert outbox; :meth:`begin_stop`
    leases no more deliveries (the sends in flight go on), :meth:`stop` ends them."""

    def __init__(
        self,
        engine: sa.Engine,
        server: str,
        *,
        interval: float,
        console_url: str | None,
        user_agent: str,
        verify: object = True,
        allow_networks: Sequence[destinations.Network] = (),
    ) -> None:
        self._engine = engine
        self._server = server
        self._console_url = console_url
        self._user_agent = user_agent
        self._allow_networks = tuple(allow_networks)
        self._client = bounded_http.client(verify, timeout=SEND_TIMEOUT_S)  # type: ignore[arg-type]
        self._pool = ThreadPoolExecutor(max_workers=BATCH, thread_name_prefix="alert-send")
        self._in_flight: set[Future[None]] = set()  # attempts started, not yet ended
        self._in_flight_lock = threading.Lock()
        self.sent = 0  # attempts made by this server (for tests and the benchmark)
        super().__init__("alert-sender", join_timeout=5.0, interval=interval)

    def stop(self, timeout: float | None = None) -> None:
        """Idempotent: lease no more, give the sends in flight STOP_GRACE_S to end (a
        receiver that answers is recorded as delivered), then cut the rest (their client
        is closed: a receiver that holds its answer cannot hold the server's shutdown)
        and wait at most ``timeout`` s for the loop. A cut send is recorded to be retried,
        or, if that cannot be written any more, sent again once its lease lapses (same
        id)."""
        self.begin_stop()
        with self._in_flight_lock:
            in_flight = list(self._in_flight)
        if in_flight:
            wait_futures(in_flight, timeout=STOP_GRACE_S)
        self._client.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        super().stop(timeout)

    def run_pass(self) -> int:
        """Lease, send and record one batch, and wait for its attempts; how many."""
        attempts = self._submit_pass()
        for attempt in attempts:
            attempt.result()  # an attempt's exception is the pass's, as in the loop
        return len(attempts)

    def _submit_pass(self) -> list[Future[None]]:
        """Lease as many due deliveries as there are free senders (BATCH in flight at
        most) and start their attempts, without waiting for them: a receiver that is
        slow to answer holds its own delivery, never the next ones."""
        with self._in_flight_lock:
            room = BATCH - len(self._in_flight)
        if room <= 0:
            return []
        with self._engine.begin() as conn:
            leased = alert_delivery.lease_due(
                conn,
                self._server,
                limit=room,
                lease_s=LEASE_S,
                console_url=self._console_url,
            )
        attempts = []
        for due in leased:
            attempt = self._pool.submit(self._attempt, due)
            with self._in_flight_lock:
                self._in_flight.add(attempt)
            attempt.add_done_callback(self._done)
            attempts.append(attempt)
        return attempts

    def _done(self, attempt: Future[None]) -> None:
        with self._in_flight_lock:
            self._in_flight.discard(attempt)
        if not attempt.cancelled() and attempt.exception() is not None:
            log.warning(
                "alert delivery attempt failed",
                extra={"action": "alert_attempt_failed", "error": str(attempt.exception())},
            )
        self.wake()  # a sender is free: due deliveries may wait for one

    def _attempt(self, due: alert_delivery.Due) -> None:
        status, error, later = send(self._client, due, self._user_agent, self._allow_networks)
        self.sent += 1
        if error in FINAL_ERRORS:
            outcome = alert_delivery.Outcome(DeliveryStatus.FAILED, None, f"{error} (final)")
        else:
            outcome = alert_delivery.decide(
                status, error, attempts=due.attempts, age_s=due.age_s, retry_after_s=later
            )
        metrics.REGISTRY.inc(_COUNTER[outcome.status])
        try:
            with self._engine.begin() as conn:
                kept = alert_delivery.record(conn, due, self._server, outcome, status)
        except sa.exc.SQLAlchemyError as exc:
            kept = False
            log.warning(
                "could not record an alert delivery's outcome: it will be sent again",
                extra={"action": "alert_record_failed", "delivery": due.id, "error": str(exc)},
            )
        log.info(
            "alert delivery attempted",
            extra={
                "action": "alert_delivery",
                "delivery": due.id,
                "alert": due.fields["alert"],
                "kind": due.fields["kind"],
                "job": due.fields["job"],
                "attempt": due.attempts,
                "outcome": outcome.status.value,
                "http_status": status,
                "error": outcome.error,
                "recorded": kept,
            },
        )

    def step(self) -> float | None:
        """One pass; no wait before the next while deliveries were leased."""
        try:
            busy = len(self._submit_pass()) > 0
        except Exception as exc:  # logged; the next pass retries
            busy = False
            log.warning(
                "alert delivery pass failed",
                extra={"action": "alert_pass_failed", "error": str(exc)},
            )
        return 0.0 if busy else None
