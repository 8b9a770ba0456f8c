"""The ``sparkring`` command line: one Typer app with a sub-app per noun.

Errors that users cause or can fix (bad settings, unreachable services, unknown names)
end the command with one line on stderr, never a traceback: exit code 78 (EX_CONFIG)
for settings and a database schema that is not migrated, 1 for the rest.

Each sub-command module imports the heavy libraries (kazoo, minio, alembic, the server
process) inside the commands that use them: every invocation imports this whole tree,
and ``job list`` must not pay for what only ``server run`` needs.
"""

from __future__ import annotations

from pathlib import Path

import typer
from sqlalchemy import exc as sa_exc

from scheduler import tokens
from server import exit_codes, version
from server import settings as settings_module
from server.cli import alert as cli_alert
from server.cli import apply as cli_apply
from server.cli import console
from server.cli import db as cli_db
from server.cli import events as cli_events
from server.cli import health as cli_health
from server.cli import job as cli_job
from server.cli import resource as cli_resource
from server.cli import ring as cli_ring
from server.cli import secret as cli_secret
from server.cli import servers as cli_server
from server.cli import token as cli_token
from sql import database

app = typer.Typer(
    name="sparkring",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain help (click's): Rich's option panels label every flag "<bool>" (typer 0.2x)
    # and wrap at 80 columns when piped.
    rich_markup_mode=None,
    help="HA control plane for PySpark jobs.",
)
app.add_typer(cli_db.app, name="db")
app.add_typer(cli_resource.app, name="resource")
app.add_typer(cli_server.app, name="server")
app.add_typer(cli_job.app, name="job")
app.add_typer(cli_ring.app, name="ring")
app.add_typer(cli_token.app, name="token")
app.add_typer(cli_events.app, name="events")
app.add_typer(cli_alert.app, name="alert")
app.add_typer(cli_secret.app, name="secret")
app.command("apply", short_help="Create, revise, start, stop and prune jobs from a TOML spec.")(
    cli_apply.apply
)
app.command("health", short_help="Probe a health URL: exit 0 on a 2xx answer, else 1.")(
    cli_health.health
)


def user_errors() -> tuple[type[Exception], ...]:
    """Exceptions that end a command with their message as one line. Packages add their
    own base error here when they grow a CLI. Imported when an error is being handled:
    ``scheduler.ring`` brings its hash library, which most commands never need."""
    from registry import errors as registry_errors
    from resource_center import errors as resource_errors
    from scheduler import alerts as alert_errors
    from scheduler import job_spec
    from scheduler import ring as ring_errors
    from scheduler import secrets as secret_errors

    return (
        database.DatabaseError,
        resource_errors.ResourceError,
        registry_errors.RegistryError,
        job_spec.JobError,
        ring_errors.RingError,
        tokens.TokenError,
        alert_errors.AlertError,
        secret_errors.SecretError,
    )


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"sparkring {version.current()}")
        raise typer.Exit()


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
    show_version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the version of sparkring and exit.",
    ),
) -> None:
    console.context(ctx).config = config


# SQLSTATEs of a statement that names a table or column the schema does not have yet.
UNMIGRATED_SQLSTATES = frozenset({"42P01", "42703"})  # undefined_table, undefined_column


def main() -> None:
    config_error = exit_codes.ExitCode.CONFIG_ERROR
    try:
        app()
    except settings_module.SettingsError as exc:
        raise SystemExit(console.fail(str(exc), config_error).exit_code) from None
    except sa_exc.DBAPIError as exc:
        # A statement failed (schema not migrated, a constraint): one line, no traceback.
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        if getattr(exc.orig, "sqlstate", None) in UNMIGRATED_SQLSTATES:
            message = (
                f"the database schema is behind this version of sparkring ({reason}): "
                "run 'sparkring db upgrade'"
            )
            raise SystemExit(console.fail(message, config_error).exit_code) from None
        raise SystemExit(console.fail(f"database error: {reason}").exit_code) from None
    except Exception as exc:
        if isinstance(exc, user_errors()):
            raise SystemExit(console.fail(str(exc)).exit_code) from None
        raise
