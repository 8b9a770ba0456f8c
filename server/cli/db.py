"""``sparkring db``: schema migrations (Alembic, imported by these commands only)."""

from __future__ import annotations

import typer

from server.cli import console

app = typer.Typer(no_args_is_help=True, help="Migrate the PostgreSQL schema (Alembic).")


@app.command()
def upgrade(
    ctx: typer.Context,
    revision: str = typer.Argument("head", help="Target revision."),
) -> None:
    """Upgrade the schema to REVISION (default: head). Safe to run from several servers."""
    from sql import migrate

    engine = console.engine(ctx)
    migrate.upgrade(engine, revision)
    console.out.print(f"database at revision {migrate.current(engine)}")


@app.command()
def downgrade(
    ctx: typer.Context,
    revision: str = typer.Argument(..., help="Target revision, or 'base' to drop everything."),
) -> None:
    """Downgrade the schema to REVISION ('base' removes every sparkring table)."""
    from sql import migrate

    engine = console.engine(ctx)
    migrate.downgrade(engine, revision)
    console.out.print(f"database at revision {migrate.current(engine) or 'base'}")


@app.command()
def current(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show the database's revision and the code's head."""
    from sql import migrate

    engine = console.engine(ctx)
    revision, heads = migrate.current(engine), migrate.heads()
    if as_json:
        console.emit_json({"current": revision, "heads": heads, "up_to_date": revision in heads})
    else:
        state = "up to date" if revision in heads else f"behind head {', '.join(heads)}"
        console.out.print(f"{revision or 'base'} ({state})")
