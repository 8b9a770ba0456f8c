"""``sparkring token``: bearer tokens of the HTTP API and the console."""

from __future__ import annotations

import typer

from scheduler import audit, tokens
from server import settings as settings_module
from server.cli import console

app = typer.Typer(
    no_args_is_help=True,
    help="Create, list and revoke bearer tokens of the HTTP API and the web console. "
    "Each creation and revocation is in the audit trail (GET /api/v1/audit), with the "
    "CLI user as claimed.",
)


def _expiry(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = settings_module.parse_duration(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--expires'") from None
    if seconds <= 0:
        raise typer.BadParameter("must be a positive duration", param_hint="'--expires'")
    return seconds


@app.command()
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Unique token name (named in the audit trail)."),
    role: str = typer.Option(
        ..., "--role", help="viewer (reads everything) or operator (also changes jobs)."
    ),
    expires: str | None = typer.Option(
        None,
        "--expires",
        metavar="DURATION",
        help="Stop working after this long: 30d, 12h, 90m, 3600s or seconds [default: never].",
    ),
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    expires_in = _expiry(expires)
    engine = console.engine(ctx)
    with engine.begin() as conn:
        token = tokens.create(conn, name, role, expires_in)
        audit.record(
            conn,
            audit.cli_actor(),
            audit.Action.TOKEN_CREATED,
            name,
            {"role": role, "expires_in_s": expires_in},
        )
    until = f", expires in {expires}" if expires else ""
    console.err.print(
        f"token {name} ({role}{until}) created; it is shown only now:", highlight=False
    )
    console.out.print(token, highlight=False, markup=False)


@app.command("list")
def list_(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")
) -> None:
    """Every token: name, role, created, expires, last used (to the minute), revoked
    (tokens themselves are never shown)."""
    engine = console.engine(ctx)
    with engine.connect() as conn:
        rows = tokens.list_tokens(conn)
    if as_json:
        console.emit_json(rows)
        return
    console.table(
        ["name", "role", "created", "expires", "last used", "revoked"],
        [
            [
                r["name"],
                r["role"],
                r["created_at"],
                ("expired " if r["expired"] else "") + str(r["expires_at"] or "never"),
                r["last_used_at"] or "never",
                r["revoked_at"],
            ]
            for r in rows
        ],
    )


@app.command()
def revoke(ctx: typer.Context, name: str = typer.Argument(..., help="Token name.")) -> None:
    """Revoke a token: the next request that presents it gets 401."""
    engine = console.engine(ctx)
    with engine.begin() as conn:
        tokens.revoke(conn, name)
        audit.record(conn, audit.cli_actor(), audit.Action.TOKEN_REVOKED, name)
    console.out.print(f"token {name}: revoked")
