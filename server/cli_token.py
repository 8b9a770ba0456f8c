"""``sparkring token``: bearer tokens of the HTTP API and the console."""

from __future__ import annotations

import typer

from server import console, tokens

app = typer.Typer(
    no_args_is_help=True,
    help="Create, list and revoke bearer tokens of the HTTP API and the web console.",
)


@app.command()
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Unique token name (named in the audit trail)."),
    role: str = typer.Option(
        ..., "--role", help="viewer (reads everything) or operator (also changes jobs)."
    ),
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    engine = console.engine(ctx)
    with engine.begin() as conn:
        token = tokens.create(conn, name, role)
    console.err.print(f"token {name} ({role}) created; it is shown only now:", highlight=False)
    console.out.print(token, highlight=False, markup=False)


@app.command("list")
def list_(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")
) -> None:
    """Every token: name, role, created, revoked (tokens themselves are never shown)."""
    engine = console.engine(ctx)
    with engine.connect() as conn:
        rows = tokens.list_tokens(conn)
    if as_json:
        console.emit_json(rows)
        return
    console.table(
        ["name", "role", "created", "revoked"],
        [[r["name"], r["role"], r["created_at"], r["revoked_at"]] for r in rows],
    )


@app.command()
def revoke(ctx: typer.Context, name: str = typer.Argument(..., help="Token name.")) -> None:
    """Revoke a token: the next request that presents it gets 401."""
    engine = console.engine(ctx)
    with engine.begin() as conn:
        tokens.revoke(conn, name)
    console.out.print(f"token {name}: revoked")
