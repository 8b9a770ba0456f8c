"""Alerts: webhooks told when something happens to a job (docs/alerts.md).

An alert is a row of ``alerts``: where to deliver (an ``http(s)`` webhook, an optional
HMAC secret, a JSON or Slack body), what to deliver (``kinds``, ``sql.states.AlertKind``)
and for which jobs (a glob of job names: ``*`` any run of characters, ``?`` one).

Deliveries are rows of ``alert_deliveries`` (the outbox), written by the database's own
triggers in the transaction of the event that raises them (migration 0013): nothing
here writes one, except :func:`test`, which queues a ``test`` delivery for an operator
checking the receiver. Sending them is ``scheduler/alert_delivery.py``'s.

The secret is written once and never read back by this module: the listings say
whether an alert has one, and show a webhook URL's scheme and host only (a Slack
webhook's path is itself a credential).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from scheduler import destinations
from sql import tables
from sql.states import DEFAULT_ALERT_KINDS, AlertFormat, AlertKind, DeliveryStatus

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
GLOB = re.compile(r"^[A-Za-z0-9._\-*?]{1,200}$")
# Kinds an alert may listen to (``test`` is a delivery's, never an alert's).
LISTENABLE = tuple(k for k in AlertKind if k is not AlertKind.TEST)
MAX_URL = 2048
MAX_SECRET = 512
# Shorter secrets are guessed; Standard Webhooks asks for 24 to 64 bytes of key.
MIN_SECRET = 24
# Every committed event is matched against every alert in its own transaction.
MAX_ALERTS = 100
# Names an alert may not take: ``GET /api/v1/alerts/deliveries`` lists the deliveries,
# so an alert of that name could not be read at ``/api/v1/alerts/{name}``.
RESERVED_NAMES = frozenset({"deliveries"})


class AlertError(Exception):
    """An alert command cannot be done; the message says why in one line (and never
    carries a secret)."""


class DestinationRefused(AlertError):
    """The webhook's host is one no server may send to: not a valid host name, or one
    that resolves to an address the destination policy refuses."""


class AlertNotFound(AlertError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no alert named {name!r}")


class AlertNameTaken(AlertError):
    """The name is another alert's, or reserved (:data:`RESERVED_NAMES`)."""


@dataclasses.dataclass(frozen=True)
class Alert:
    """An alert as shown to users: no secret, the webhook's scheme and host only."""

    name: str
    webhook: str
    has_secret: bool
    format: str
    kinds: tuple[str, ...]
    job_glob: str
    created_at: datetime.datetime
    created_by: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "webhook": self.webhook,
            "has_secret": self.has_secret,
            "format": self.format,
            "on": list(self.kinds),
            "job": self.job_glob,
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
        }


def shown_url(url: str) -> str:
    """What a listing shows of a webhook URL: its scheme and host (and port), the rest
    elided. A path or query may hold a credential (Slack's do), user info too."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    rest = "/…" if (parts.path not in ("", "/") or parts.query) else "/"
    return f"{parts.scheme}://{host}{port}{rest}"


def check_url(url: str) -> str:
    """The webhook URL, or :class:`AlertError` saying what is wrong with it (the message
    shows the scheme and host at most)."""
    if len(url) > MAX_URL:
        raise AlertError(f"the webhook URL is longer than {MAX_URL} characters")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise AlertError("the webhook URL is not a valid URL") from None
    # The raw prefix, not parts.scheme (lowercased): the table's CHECK is case-sensitive.
    if not url.startswith(("http://", "https://")):
        raise AlertError("the webhook URL must start with http:// or https://")
    if not parts.hostname:
        raise AlertError("the webhook URL has no host")
    try:
        parts.hostname.encode("idna")  # what an HTTP client does with it: "a..b" cannot
    except UnicodeError:
        raise DestinationRefused("the webhook URL's host is not a valid host name") from None
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise AlertError("the webhook URL holds whitespace or control characters")
    return url


def parse_kinds(kinds: Iterable[str] | str | None) -> tuple[str, ...]:
    """Alert kinds from a list or a comma-separated string (None: the defaults), each
    checked; in the order of :class:`AlertKind`, each once."""
    if kinds is None:
        return tuple(k.value for k in DEFAULT_ALERT_KINDS)
    if isinstance(kinds, str):
        kinds = kinds.split(",")
    wanted = {k.strip() for k in kinds if k.strip()}
    if "all" in wanted:
        wanted = (wanted - {"all"}) | {k.value for k in LISTENABLE}
    known = {k.value for k in LISTENABLE}
    unknown = sorted(wanted - known)
    if unknown:
        raise AlertError(
            f"unknown alert kind {', '.join(map(repr, unknown))}: "
            f"choose from {', '.join(sorted(known))} (or all)"
        )
    if not wanted:
        raise AlertError("an alert must listen to at least one kind")
    return tuple(k.value for k in LISTENABLE if k.value in wanted)


def check_glob(glob: str) -> str:
    if not GLOB.fullmatch(glob):
        raise AlertError(
            f"job glob {glob!r} may hold letters, digits, '.', '_', '-' and the "
            "wildcards '*' (any run of characters) and '?' (one character)"
        )
    return glob


def create(
    conn: sa.Connection,
    name: str,
    webhook: str,
    *,
    secret: str | None = None,
    format: str = AlertFormat.JSON.value,
    kinds: Iterable[str] | str | None = None,
    job_glob: str = "*",
    actor: str | None = None,
    allow_networks: Sequence[destinations.Network] = (),
) -> Alert:
    """A new alert; :class:`AlertError` if the name is taken or an input is bad,
    including a webhook whose host resolves to an address the destination policy
    refuses (``allow_networks``: SPARKRING_ALERT_ALLOW_NETWORKS; scheduler/destinations.py).
    A host that does not resolve here is judged at each send instead (the CLI may run
    where the servers' names do not resolve)."""
    if not NAME.fullmatch(name):
        raise AlertError(
            f"alert name {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if name in RESERVED_NAMES:
        raise AlertNameTaken(f"the alert name {name!r} is reserved: choose another")
    check_url(webhook)
    try:
        destinations.check(webhook, allow_networks)
    except destinations.Unresolved:
        pass
    except destinations.DestinationError as exc:
        raise DestinationRefused(str(exc)) from None
    if secret is not None and not (MIN_SECRET <= len(secret) <= MAX_SECRET):
        raise AlertError(
            f"an alert's secret must be {MIN_SECRET}-{MAX_SECRET} characters (a short one "
            "is guessed: e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if conn.execute(sa.text("SELECT count(*) FROM alerts")).scalar_one() >= MAX_ALERTS:
        raise AlertError(
            f"there are {MAX_ALERTS} alerts already, the most a cluster keeps: every event "
            "is matched against each of them in its own transaction; delete one first"
        )
    if format not in [f.value for f in AlertFormat]:
        raise AlertError(f"alert format {format!r} must be one of: json, slack")
    on = parse_kinds(kinds)
    check_glob(job_glob)
    row = conn.execute(
        sa.text(
            """
            INSERT INTO alerts (name, webhook_url, secret, format, kinds, job_glob, created_by)
            VALUES (:name, :url, :secret, :format, :kinds, :glob, :actor)
            ON CONFLICT (name) DO NOTHING
            RETURNING name, webhook_url, secret IS NOT NULL AS has_secret, format, kinds,
                      job_glob, created_at, created_by
            """
        ),
        {
            "name": name,
            "url": webhook,
            "secret": secret,
            "format": format,
            "kinds": list(on),
            "glob": job_glob,
            "actor": actor,
        },
    ).one_or_none()
    if row is None:
        raise AlertNameTaken(f"an alert named {name!r} already exists")
    return _alert(row)


_SHOWN = (
    "name, webhook_url, secret IS NOT NULL AS has_secret, format, kinds, job_glob, "
    "created_at, created_by"
)


def _alert(row: sa.Row) -> Alert:
    return Alert(
        name=row.name,
        webhook=shown_url(row.webhook_url),
        has_secret=row.has_secret,
        format=row.format,
        kinds=tuple(row.kinds),
        job_glob=row.job_glob,
        created_at=row.created_at,
        created_by=row.created_by,
    )


def list_alerts(conn: sa.Connection) -> list[Alert]:
    rows = conn.execute(sa.text(f"SELECT {_SHOWN} FROM alerts ORDER BY name"))
    return [_alert(row) for row in rows]


def get(conn: sa.Connection, name: str) -> Alert:
    row = conn.execute(
        sa.text(f"SELECT {_SHOWN} FROM alerts WHERE name = :name"), {"name": name}
    ).one_or_none()
    if row is None:
        raise AlertNotFound(name)
    return _alert(row)


def delete(conn: sa.Connection, name: str) -> int:
    """Delete the alert and its deliveries (those not yet sent are never sent); how many
    deliveries went with it."""
    row = conn.execute(
        sa.text(
            """
            WITH gone AS (DELETE FROM alerts WHERE name = :name RETURNING id)
            SELECT (SELECT count(*) FROM alert_deliveries d JOIN gone ON d.alert_id = gone.id)
              FROM gone
            """
        ),
        {"name": name},
    ).one_or_none()
    if row is None:
        raise AlertNotFound(name)
    return int(row[0])


def test(conn: sa.Connection, name: str, actor: str | None = None) -> str:
    """Queue a ``test`` delivery of the alert (sent like any other, retried alike);
    returns its id. The alert's row is locked as it is read (``FOR KEY SHARE``): a
    delete in flight is waited for and then found, so the test answers as if it came
    after it (AlertNotFound), never with the foreign key's violation."""
    row = conn.execute(
        sa.text(
            """
            WITH alert AS (SELECT id, name FROM alerts WHERE name = :name FOR KEY SHARE)
            INSERT INTO alert_deliveries (alert_id, alert_name, kind, detail)
            SELECT id, name, 'test', jsonb_build_object('by', CAST(:actor AS text))
              FROM alert
            RETURNING id
            """
        ),
        {"name": name, "actor": actor},
    ).one_or_none()
    if row is None:
        raise AlertNotFound(name)
    return str(row.id)


@dataclasses.dataclass(frozen=True)
class Delivery:
    id: str
    alert: str
    kind: str
    job: str | None
    at: datetime.datetime
    status: str
    attempts: int
    next_attempt_at: datetime.datetime | None
    last_status: int | None
    last_error: str | None
    delivered_at: datetime.datetime | None

    def as_dict(self) -> dict[str, Any]:
        def iso(t: datetime.datetime | None) -> str | None:
            return t.isoformat() if t else None

        return {
            "id": self.id,
            "alert": self.alert,
            "kind": self.kind,
            "job": self.job,
            "at": iso(self.at),
            "status": self.status,
            "attempts": self.attempts,
            "next_attempt_at": iso(self.next_attempt_at),
            "last_status": self.last_status,
            "last_error": self.last_error,
            "delivered_at": iso(self.delivered_at),
        }


def deliveries(
    conn: sa.Connection,
    *,
    alert: str | None = None,
    status: str | None = None,
    limit: int = 100,
) -> list[Delivery]:
    """The newest deliveries first, of one alert or all; ``next_attempt_at`` only while
    one is pending. :class:`AlertNotFound` for an alert that does not exist."""
    if alert is not None:
        get(conn, alert)
    if status is not None and status not in [s.value for s in DeliveryStatus]:
        raise AlertError(f"delivery status {status!r} must be one of: pending, delivered, failed")
    d = tables.alert_deliveries
    query = sa.select(d).order_by(d.c.created_at.desc(), d.c.id).limit(limit)
    if alert is not None:
        query = query.where(d.c.alert_name == alert)
    if status is not None:
        query = query.where(d.c.status == status)
    return [_delivery(row) for row in conn.execute(query)]


def delivery(conn: sa.Connection, delivery_id: str) -> Delivery | None:
    """One delivery by its id (what :func:`test` returned); None once it is gone (its
    alert was deleted)."""
    d = tables.alert_deliveries
    row = conn.execute(sa.select(d).where(d.c.id == delivery_id)).one_or_none()
    return None if row is None else _delivery(row)


def _delivery(row: sa.Row) -> Delivery:
    return Delivery(
        id=str(row.id),
        alert=row.alert_name,
        kind=row.kind,
        job=row.job_name,
        at=row.at,
        status=row.status,
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at if row.status == "pending" else None,
        last_status=row.last_status,
        last_error=row.last_error,
        delivered_at=row.delivered_at,
    )
