"""``sparkring server run`` and ``sparkring server drain``: running and emptying servers."""

from __future__ import annotations

import sqlalchemy as sa
import typer

from registry import errors as registry_errors
from scheduler import notify
from server import clients, console, exit_codes, logs, process, signals
from server import settings as settings_module
from sql import database


def run(
    ctx: typer.Context,
    server_id: str | None = typer.Option(
        None, "--id", help="Server id (default: SPARKRING_SERVER_ID, else the host name)."
    ),
    capacity: int | None = typer.Option(
        None, "--capacity", min=0, help="Maximum concurrent drivers (SPARKRING_CAPACITY)."
    ),
    role: settings_module.Role | None = typer.Option(
        None, "--role", help="both: coordinate and run jobs; coordinator; worker."
    ),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING..."),
) -> None:
    """Run a server: register, take part in the election, claim and run its jobs.

    SIGTERM or Ctrl-C hands its jobs off gracefully; a second signal exits at once.
    """
    context = console.context(ctx)
    context.overrides.update(
        {
            k: v
            for k, v in {"server_id": server_id, "capacity": capacity, "role": role}.items()
            if v is not None
        }
    )
    settings = context.settings()
    logs.configure(log_level.upper())
    server = process.Server(settings)
    signals.install(server.request_stop)
    try:
        server.start()
    except (process.StartupError, registry_errors.RegistryError, database.DatabaseError) as exc:
        server.shutdown()
        console.fail(str(exc))
        raise typer.Exit(exit_codes.ExitCode.CONFIG_ERROR) from None
    raise typer.Exit(server.run())


def drain(
    ctx: typer.Context,
    server_id: str = typer.Argument(..., help="Server to empty."),
    undo: bool = typer.Option(False, "--undo", help="Let the server take jobs again."),
) -> None:
    """Move every job off a server without stopping it (it stays drained until --undo)."""
    settings = console.context(ctx).settings()
    engine = clients.engine(settings)
    with engine.begin() as conn:
        if undo:
            conn.execute(sa.text("DELETE FROM drains WHERE server = :s"), {"s": server_id})
        else:
            try:
                conn.execute(
                    sa.text("INSERT INTO drains (server) VALUES (:s) ON CONFLICT DO NOTHING"),
                    {"s": server_id},
                )
            except sa.exc.IntegrityError:
                raise console.fail(f"{server_id!r} is not a server id") from None
        notify.notify(conn, notify.JOBS_CHANNEL, f"drain:{server_id}")
    console.out.print(
        f"server {server_id}: " + ("takes jobs again" if undo else "draining (jobs move off it)")
    )
