"""``sparkring secret``: secrets a job's driver gets as environment variables.

``create`` and ``rotate`` need ``SPARKRING_SECRET_KEYS`` (they encrypt); ``list`` and
``delete`` do not. No command prints a value (scheduler/secrets.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from scheduler import audit, secrets
from server import exit_codes
from server.cli import console

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

app = typer.Typer(
    no_args_is_help=True,
    help="Create, list, delete and re-encrypt secrets that jobs get as environment "
    "variables (job create --secret-env KEY=NAME). Values are stored encrypted with "
    "SPARKRING_SECRET_KEYS and never printed (docs/secrets.md).",
)


def _read_value(from_file: Path | None, from_stdin: bool) -> bytes:
    if (from_file is None) == (not from_stdin):
        raise console.fail("give the value with --from-file FILE or --from-stdin (one of them)")
    if from_stdin:
        value = sys.stdin.buffer.read(secrets.MAX_VALUE_BYTES + 1)
    else:
        assert from_file is not None
        try:
            with from_file.open("rb") as handle:
                value = handle.read(secrets.MAX_VALUE_BYTES + 1)
        except OSError as exc:
            raise console.fail(f"cannot read {from_file}: {exc.strerror}") from None
    # A file or a heredoc ends with a newline that is not part of the value.
    return value.removesuffix(b"\n").removesuffix(b"\r")


def _box(ctx: typer.Context) -> MultiFernet:
    box = console.context(ctx).settings().secret_box()
    if box is None:
        raise console.fail(
            f"{secrets.KEYS_SETTING} is not set: it holds the key that encrypts secrets "
            "(make one with 'sparkring secret keygen' and give it to every server)",
            exit_codes.ExitCode.CONFIG_ERROR,
        )
    return box


@app.command()
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The secret's name (letters, digits, '.', '_', '-')."),
    from_file: Path | None = typer.Option(
        None, "--from-file", help="Read the value from this file (one final newline dropped)."
    ),
    from_stdin: bool = typer.Option(
        False, "--from-stdin", help="Read the value from standard input."
    ),
) -> None:
    """Create a secret, or give an existing one a new value (drivers started from then
    on get it; running drivers keep theirs until they restart). The value is never
    shown again."""
    value = _read_value(from_file, from_stdin)
    box = _box(ctx)
    engine = console.engine(ctx)
    with engine.begin() as conn:
        version = secrets.put(conn, name, value, box, audit.cli_actor())
        audit.record(conn, audit.cli_actor(), audit.Action.SECRET_PUT, name, {"version": version})
    made = "created" if version == 1 else f"updated (version {version})"
    console.out.print(f"secret {name} {made}", highlight=False)


@app.command("list")
def list_(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")
) -> None:
    """Every secret: name, version, when it was set and by whom, the jobs given it
    (never a value)."""
    engine = console.engine(ctx)
    with engine.connect() as conn:
        rows = secrets.listing(conn)
    if as_json:
        console.emit_json([row.as_dict() for row in rows])
        return
    console.table(
        ["name", "version", "updated", "by", "jobs"],
        [[r.name, r.version, r.updated_at, r.updated_by, list(r.jobs)] for r in rows],
    )


@app.command()
def delete(ctx: typer.Context, name: str = typer.Argument(...)) -> None:
    """Delete a secret; refused while a job's definition gives it to its driver."""
    engine = console.engine(ctx)
    with engine.begin() as conn:
        secrets.delete(conn, name)
        audit.record(conn, audit.cli_actor(), audit.Action.SECRET_DELETED, name)
    console.out.print(f"secret {name} deleted", highlight=False)


@app.command()
def rotate(ctx: typer.Context) -> None:
    """Encrypt every secret anew under the first key of SPARKRING_SECRET_KEYS (after
    a new key was put first on every server; then the old key can be dropped)."""
    box = _box(ctx)
    engine = console.engine(ctx)
    with engine.begin() as conn:
        count = secrets.rotate(conn, box)
        audit.record(conn, audit.cli_actor(), audit.Action.SECRETS_ROTATED, "*", {"secrets": count})
    console.out.print(f"{count} secret(s) encrypted under the first key", highlight=False)


@app.command()
def keygen() -> None:
    """Print a new Fernet key for SPARKRING_SECRET_KEYS (nothing is stored)."""
    console.out.print(secrets.new_key(), highlight=False, markup=False)
