"""The ``sparkring`` command line: one Typer app with a sub-app per noun.

Errors that users cause or can fix (bad settings, unreachable services, unknown names)
end the command with one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import typer
from sqlalchemy import exc as sa_exc

from registry import errors as registry_errors
from resource_center import errors as resource_errors
from scheduler import jobs as job_errors
from scheduler import ring as ring_errors
from server import (
    cli_db,
    cli_health,
    cli_job,
    cli_resource,
    cli_ring,
    cli_server,
    cli_token,
    console,
    tokens,
)
from server import settings as settings_module
from sql import database

app = typer.Typer(
    name="sparkring",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="HA control plane for PySpark jobs.",
)
app.add_typer(cli_db.app, name="db")
app.add_typer(cli_resource.app, name="resource")
app.add_typer(cli_server.app, name="server")
app.add_typer(cli_job.app, name="job")
app.add_typer(cli_ring.app, name="ring")
app.add_typer(cli_token.app, name="token")
app.command("health")(cli_health.health)

# Exceptions that end a command with their message as one line. Packages add their
# own base error here when they grow a CLI.
USER_ERRORS: tuple[type[Exception], ...] = (
    settings_module.SettingsError,
    database.DatabaseError,
    resource_errors.ResourceError,
    registry_errors.RegistryError,
    job_errors.JobError,
    ring_errors.RingError,
    tokens.TokenError,
)


@app.callback()
def _root(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None,
        "--config",
        envvar="SPARKRING_CONFIG",
        help="TOML file with settings (keys as in SPARKRING_* variables); env vars win.",
        dir_okay=False,
    ),
) -> None:
    console.context(ctx).config = config


def main() -> None:
    try:
        app()
    except USER_ERRORS as exc:
        raise SystemExit(console.fail(str(exc)).exit_code) from None
    except sa_exc.DBAPIError as exc:
        # A statement failed (schema not migrated, a constraint): one line, no traceback.
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        raise SystemExit(console.fail(f"database error: {reason}").exit_code) from None
