"""``sparkring alert``: webhook alerts (scheduler/alerts.py; docs/alerts.md) and their
deliveries.

A secret is read from a file or stdin (``--secret-file``) or, less safely, from argv
(``--secret``: other users see it in ``ps``). Nothing here prints it, nor a webhook's
path: listings show a URL's scheme and host only. Creations and deletions are in the
audit trail with the CLI user as claimed; a test delivery names it in its detail.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from scheduler import alerts, audit
from server.cli import console
from sql import states
from sql.states import AlertFormat, DeliveryStatus

if TYPE_CHECKING:
    import sqlalchemy as sa

app = typer.Typer(
    no_args_is_help=True,
    help="Create, list, test and delete webhook alerts, and see their deliveries "
    "(docs/alerts.md). Creations and deletions are in the audit trail.",
)

# Exit codes of `alert test --wait` beside 0, delivered (as `job run --wait`): 124 as
# timeout(1) exits.
NOT_DELIVERED = 1
TIMED_OUT = 124
# How often a waited-for delivery is read again, seconds.
POLL_S = 0.2
DEFAULT_KINDS = ",".join(k.value for k in states.DEFAULT_ALERT_KINDS)


def _secret(secret: str | None, secret_file: str | None) -> str | None:
    """The secret from ``--secret`` or ``--secret-file`` (``-``: stdin), without the
    file's final line break; errors name the option, never the secret."""
    if secret is not None and secret_file is not None:
        raise console.fail("give --secret or --secret-file, not both")
    if secret_file is None:
        return secret
    # Read no more than a secret can be (plus a line break): the store refuses a longer
    # one, and /dev/zero given by mistake must not fill the memory.
    most = alerts.MAX_SECRET + 2
    try:
        if secret_file == "-":
            text = sys.stdin.read(most)
        else:
            with Path(secret_file).open(encoding="utf-8") as source:
                text = source.read(most)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise console.fail(f"cannot read --secret-file {secret_file}: {reason}") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise console.fail(f"--secret-file {secret_file} is empty")
    return text


@app.command()
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Unique alert name (letters, digits, '.', '_', '-')."),
    webhook: str = typer.Option(
        ...,
        "--webhook",
        metavar="URL",
        help="http(s) URL the alert POSTs to. Only its scheme and host are ever shown. Its "
        "host must resolve to public addresses, unless SPARKRING_ALERT_ALLOW_NETWORKS "
        "allows its network.",
    ),
    secret_file: str | None = typer.Option(
        None,
        "--secret-file",
        metavar="PATH",
        help="Sign each delivery with the secret in this file ('-': read stdin; 24-512 "
        "characters, its final line break dropped). Receivers check webhook-signature: "
        "v1,<base64 HMAC-SHA256 of webhook-id.webhook-timestamp.body> (Standard Webhooks; "
        "examples/alerts/webhook_receiver.py) and refuse an old timestamp.",
    ),
    secret: str | None = typer.Option(
        None,
        "--secret",
        metavar="SECRET",
        help="The secret on the command line (other users see it in ps and it stays in "
        "shell history): prefer --secret-file.",
    ),
    format: AlertFormat = typer.Option(
        AlertFormat.JSON.value,
        "--format",
        help="json: the alert's fields; slack: a Slack incoming-webhook message.",
    ),
    on: str = typer.Option(
        DEFAULT_KINDS,
        "--on",
        metavar="KINDS",
        help="Comma-separated kinds to alert on, or 'all': "
        + ", ".join(k.value for k in alerts.LISTENABLE)
        + ".",
    ),
    job: str = typer.Option(
        "*",
        "--job",
        metavar="GLOB",
        help="Only jobs whose name matches: '*' any run of characters, '?' one.",
    ),
) -> None:
    """Create an alert: every event of its kinds, for the jobs its glob matches, is
    POSTed to the webhook (retried for up to 24 h) by one of the live servers."""
    the_secret = _secret(secret, secret_file)
    engine = console.engine(ctx)
    actor = audit.cli_actor()
    with engine.begin() as conn:
        alert = alerts.create(
            conn,
            name,
            webhook,
            secret=the_secret,
            format=format.value,
            kinds=on,
            job_glob=job,
            actor=actor,
            allow_networks=console.context(ctx).settings().alert_networks(),
        )
        audit.record(conn, actor, audit.Action.ALERT_CREATED, name, alert.as_dict())
    signed = ", signed" if alert.has_secret else ""
    console.out.print(
        f"alert {name}: created; {alert.format} to {alert.webhook}{signed}, on "
        f"{', '.join(alert.kinds)}, for jobs {alert.job_glob}",
        highlight=False,
        markup=False,
    )


@app.command("list")
def list_(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")
) -> None:
    """Every alert: webhook (scheme and host), format, kinds, job glob, whether it has a
    secret (never the secret itself)."""
    engine = console.engine(ctx)
    with engine.connect() as conn:
        found = alerts.list_alerts(conn)
    if as_json:
        console.emit_json([a.as_dict() for a in found])
        return
    fields = ("name", "webhook", "format", "kinds", "job_glob", "has_secret")
    rows = [[getattr(a, f) for f in (*fields, "created_at", "created_by")] for a in found]
    console.table(["name", "webhook", "format", "on", "job", "secret", "created", "by"], rows)


@app.command()
def show(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Alert name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """One alert (as in 'alert list')."""
    engine = console.engine(ctx)
    with engine.connect() as conn:
        alert = alerts.get(conn, name)
    if as_json:
        console.emit_json(alert.as_dict())
        return
    console.fields(
        [
            ("name", alert.name),
            ("webhook", alert.webhook),
            ("format", alert.format),
            ("on", console.text(list(alert.kinds))),
            ("job", alert.job_glob),
            ("secret", console.text(alert.has_secret)),
            ("created", console.text(alert.created_at)),
            ("by", console.text(alert.created_by)),
        ]
    )


@app.command()
def delete(ctx: typer.Context, name: str = typer.Argument(..., help="Alert name.")) -> None:
    """Delete an alert and its deliveries (those not yet sent are never sent)."""
    engine = console.engine(ctx)
    with engine.begin() as conn:
        gone = alerts.delete(conn, name)
        audit.record(
            conn, audit.cli_actor(), audit.Action.ALERT_DELETED, name, {"deliveries": gone}
        )
    plural = "delivery" if gone == 1 else "deliveries"
    console.out.print(f"alert {name}: deleted (with {gone} {plural})", highlight=False)


@app.command()
def test(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Alert name."),
    wait: bool = typer.Option(
        False,
        "--wait",
        help="Wait until the delivery is delivered (exit 0) or failed (exit 1); "
        "exit 124 if still pending after --timeout.",
    ),
    timeout: float = typer.Option(
        30.0, "--timeout", min=0, metavar="SECONDS", help="With --wait: how long to wait."
    ),
) -> None:
    """Queue a 'test' delivery of the alert and print its id. A live server sends it
    like any other (retried alike): 'alert deliveries --alert NAME' shows how it went."""
    engine = console.engine(ctx)
    with engine.begin() as conn:
        delivery_id = alerts.test(conn, name, actor=audit.cli_actor())
    if not wait:
        console.out.print(f"alert {name}: test delivery {delivery_id} queued", highlight=False)
        return
    _wait(engine, name, delivery_id, timeout)


def _wait(engine: sa.Engine, name: str, delivery_id: str, timeout: float) -> None:
    """Read the delivery until it is delivered or failed, or ``timeout`` passed; print
    how it went and exit 0, 1 or 124."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            found = alerts.delivery(conn, delivery_id)
        if found is None:
            raise console.fail(f"alert {name}: test delivery {delivery_id} is gone (deleted)")
        tried = f"{found.attempts} attempt{'s' if found.attempts != 1 else ''}"
        if found.status == DeliveryStatus.DELIVERED:
            answer = f"HTTP {found.last_status}" if found.last_status else "delivered"
            console.out.print(
                f"alert {name}: test delivery {delivery_id} delivered ({answer}, {tried})",
                highlight=False,
            )
            return
        if found.status == DeliveryStatus.FAILED:
            raise console.fail(
                f"alert {name}: test delivery {delivery_id} failed after {tried}: "
                f"{found.last_error or 'no error recorded'}",
                NOT_DELIVERED,
            )
        if time.monotonic() >= deadline:
            last = f"; last error: {found.last_error}" if found.last_error else ""
            raise console.fail(
                f"alert {name}: test delivery {delivery_id} still pending after "
                f"{timeout:g} s ({tried}{last})",
                TIMED_OUT,
            )
        time.sleep(POLL_S)


@app.command()
def deliveries(
    ctx: typer.Context,
    alert: str | None = typer.Option(None, "--alert", metavar="NAME", help="Only this alert's."),
    status: DeliveryStatus | None = typer.Option(
        None, "--status", help="Only deliveries in this status."
    ),
    limit: int = typer.Option(
        50, "--limit", min=1, max=1000, metavar="N", help="At most this many, newest first."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Deliveries, newest first: what was raised (kind, job), its status (pending,
    delivered, failed), attempts, the receiver's last answer and the next attempt."""
    engine = console.engine(ctx)
    with engine.connect() as conn:
        found = alerts.deliveries(
            conn, alert=alert, status=status.value if status else None, limit=limit
        )
    if as_json:
        console.emit_json([d.as_dict() for d in found])
        return
    console.table(
        [
            "id",
            "alert",
            "kind",
            "job",
            "at",
            "status",
            "attempts",
            "last answer",
            "next attempt / delivered",
        ],
        [
            [
                d.id,
                d.alert,
                d.kind,
                d.job,
                d.at,
                d.status,
                d.attempts,
                _answer(d),
                d.delivered_at if d.status == DeliveryStatus.DELIVERED else d.next_attempt_at,
            ]
            for d in found
        ],
    )


def _answer(d: alerts.Delivery) -> str | None:
    if d.last_error:
        return d.last_error
    return f"HTTP {d.last_status}" if d.last_status is not None else None
