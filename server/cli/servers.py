"""``sparkring server``: run a server, drain one, and list the live ones (from ZooKeeper,
with their drains from PostgreSQL).

The server process and the coordinator are imported by the commands that use them: the
rest of the CLI must not pay for importing the HTTP API, the runner and kazoo.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import sqlalchemy as sa
import typer

from server import clients, defaults, exit_codes
from server import settings as settings_module
from server.cli import console

app = typer.Typer(no_args_is_help=True, help="Inspect and run sparkring servers.")


def _uptime(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s"


def _drivers_as(row: dict[str, Any]) -> str | None:
    """The user a server's drivers run as, marked "(own)" when it is the server's own."""
    if not row["driver_user"]:
        return None  # a server of an older version: not published
    return row["driver_user"] + ("" if row["driver_user_isolated"] else " (own)")


def console_cell(health_url: str) -> str | None:
    """Where a server's web console is: its HTTP endpoint (``health_url``) + /console/."""
    return f"{health_url}/console/" if health_url else None


def spark_masters_cell(report: dict[str, bool]) -> str | None:
    """A server's Spark masters as one cell: how many answer, and which do not."""
    if not report:
        return None  # no spark:// master in use, or a server of an older version
    down = sorted(master for master, up in report.items() if not up)
    shown = f"{len(report) - len(down)}/{len(report)} up"
    return shown + (f", down: {' '.join(down)}" if down else "")


@app.command("list")
def list_(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Live servers: role, capacity, coordinator flag, drained flag, uptime, the OS user
    their drivers run as ("(own)": the server's own user, no sandbox), how many of the
    Spark masters each uses answered its last probe ("1/2 up, down: host:port"; "-": no
    spark:// master in use), and the URL of its web console. --json gives each master
    by host:port in spark_masters, and the server's HTTP endpoint in health_url."""
    from registry import election, servers

    settings = console.context(ctx).settings()
    with clients.zookeeper(settings) as (client, root):
        live = servers.read_all(client, root)
        coordinator = election.leader(client, root)
    with clients.engine(settings).connect() as conn:
        drained = set(conn.execute(sa.text("SELECT server FROM drains")).scalars())
    now = time.time()
    rows: list[dict[str, Any]] = []
    for info in sorted(live.values(), key=lambda i: i.id):
        leads = coordinator is not None and coordinator.server_id == info.id
        rows.append(
            {
                **info.to_dict(),
                "coordinator": leads,
                "term": coordinator.term if leads and coordinator else None,
                "drained": info.id in drained,
                "uptime_s": round(max(now - info.started_at, 0.0), 3),
            }
        )
    if as_json:
        console.emit_json(rows)
        return
    console.table(
        [
            "id",
            "role",
            "capacity",
            "coordinator",
            "term",
            "drained",
            "uptime",
            "drivers as",
            "spark masters",
            "host",
            "version",
            "console",
        ],
        [
            [
                r["id"],
                r["role"],
                r["capacity"],
                "yes" if r["coordinator"] else None,
                r["term"],
                "yes" if r["drained"] else None,
                _uptime(r["uptime_s"]),
                _drivers_as(r),
                spark_masters_cell(r["spark_masters"]),
                r["host"],
                r["version"],
                console_cell(r["health_url"]),
            ]
            for r in rows
        ],
    )


# The options of `server run`, shared with `server supervise`, which passes them on.
ServerIdOption = Annotated[
    str | None,
    typer.Option("--id", help="Server id (default: SPARKRING_SERVER_ID, else the host name)."),
]
CapacityOption = Annotated[
    int | None,
    typer.Option(
        "--capacity",
        min=0,
        help=f"Maximum concurrent drivers. [default: SPARKRING_CAPACITY, else {defaults.CAPACITY}]",
    ),
]
RoleOption = Annotated[
    settings_module.Role | None,
    typer.Option(
        "--role",
        help="both: coordinate and run jobs; coordinator; worker. "
        f"[default: SPARKRING_ROLE, else {defaults.ROLE}]",
    ),
]
LogLevelOption = Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING...")]


@app.command()
def run(
    ctx: typer.Context,
    server_id: ServerIdOption = None,
    capacity: CapacityOption = None,
    role: RoleOption = None,
    log_level: LogLevelOption = "INFO",
) -> None:
    """Run a server: register, take part in the election, claim and run its jobs.

    SIGTERM or Ctrl-C hands its jobs off gracefully; a second signal exits at once.
    With SPARKRING_HANDOVER_WINDOW > 0, SIGTERM is a planned restart instead: the drivers
    keep running and the next server started with the same id and work dir adopts them.
    A server restarted after a crash adopts the drivers still running in its work dir.
    With SPARKRING_TLS_CERT and SPARKRING_TLS_KEY it serves the API and console over HTTPS
    only, and verifies its peers against SPARKRING_TLS_CA; SPARKRING_ZK_AUTH puts its
    ZooKeeper nodes under a digest ACL (docs/security.md).
    """
    from registry import errors as registry_errors
    from server import logs, process, signals
    from server.web import endpoint
    from sql import database

    context = console.context(ctx)
    context.overrides.update(
        {
            k: v
            for k, v in {"server_id": server_id, "capacity": capacity, "role": role}.items()
            if v is not None
        }
    )
    # A server uses every service: all their settings are checked before it starts.
    settings = context.settings().require(*settings_module.SERVICE_KEYS)
    logs.configure(log_level.upper())
    server = process.Server(settings, endpoint.open)
    signals.install(
        server.request_stop,
        on_term=server.request_hand_over if settings.handover_window > 0 else None,
    )
    try:
        server.start()
    except (
        process.StartupError,
        registry_errors.RegistryError,
        database.DatabaseError,
    ) as exc:
        # Drivers adopted from the previous incarnation are left to their watchdogs, not
        # stopped: the next start (a supervisor's) adopts them again within their lease.
        server.shutdown(hand_off=False)
        console.fail(str(exc))
        unavailable = isinstance(
            exc, registry_errors.ZooKeeperUnreachable | database.DatabaseUnreachable
        )
        raise typer.Exit(
            exit_codes.ExitCode.UNAVAILABLE if unavailable else exit_codes.ExitCode.CONFIG_ERROR
        ) from None
    raise typer.Exit(server.run())


# Built from the defaults it quotes, so that --help cannot drift from the code. One line
# per paragraph: the help renderer keeps line breaks.
_SUPERVISE_HELP = (
    "Run `server run` as a child; restart it when it crashes (the image's command).\n\n"
    "A crashed server (killed by a signal, or an exit code not named below: 1, 70, 80, "
    "69 when ZooKeeper or PostgreSQL could not be reached at start-up...) "
    "is restarted after "
    f"{defaults.SUPERVISOR_RESTART_DELAY_S:g} s with the same id and work dir, and adopts "
    "the drivers still running: no job restarts. Repeated crashes back off (up to "
    f"{defaults.SUPERVISOR_RESTART_DELAY_MAX_S:g} s); more than "
    f"{defaults.SUPERVISOR_CRASH_LIMIT} within {defaults.SUPERVISOR_CRASH_WINDOW_S:g} s end "
    f"the supervisor with exit code {exit_codes.ExitCode.CRASH_LOOP:d}, for the container "
    "engine's restart policy. Exit 0, 2, 78 (start-up refused) or 79 ends it with the "
    "server's code.\n\n"
    "SIGTERM and SIGINT are passed on to the server (same meaning as for `server run`), "
    "which is then not restarted."
)


@app.command(help=_SUPERVISE_HELP)
def supervise(
    ctx: typer.Context,
    server_id: ServerIdOption = None,
    capacity: CapacityOption = None,
    role: RoleOption = None,
    log_level: LogLevelOption = "INFO",
) -> None:
    from server import logs, supervisor

    logs.configure(log_level.upper())
    argv = supervisor.server_argv(
        console.context(ctx).config,
        {
            "--id": server_id,
            "--capacity": capacity,
            "--role": role.value if role is not None else None,
            "--log-level": log_level,
        },
    )
    raise typer.Exit(supervisor.main(supervisor.Supervisor(argv)))


def _live_ids(settings: settings_module.Settings) -> set[str]:
    return {info.id for info in clients.live_servers(settings)}


@app.command()
def drain(
    ctx: typer.Context,
    server_id: str = typer.Argument(..., help="Server to empty."),
    undo: bool = typer.Option(False, "--undo", help="Let the server take jobs again."),
) -> None:
    """Move every job off a server without stopping it (it stays drained until --undo)."""
    from scheduler import coordinator, notify

    settings = console.context(ctx).settings()
    engine = clients.engine(settings)
    live = set() if undo else _live_ids(settings)
    with engine.begin() as conn:
        if undo:
            undone = conn.execute(
                sa.text("DELETE FROM drains WHERE server = :s"), {"s": server_id}
            ).rowcount
            if not undone:
                raise console.fail(f"server {server_id!r} is not drained")
            coordinator.undrained(conn, server_id)
        else:
            # A typo must not be accepted as a drain of nothing: the server must be live
            # or still hold or be the target of a job (a server that is down may be
            # drained so that it takes nothing when it comes back).
            known = (
                server_id in live
                or conn.execute(
                    sa.text(
                        "SELECT EXISTS (SELECT 1 FROM distribution WHERE owner = :s OR target = :s)"
                    ),
                    {"s": server_id},
                ).scalar_one()
            )
            if not known:
                raise console.fail(
                    f"no server {server_id!r} (live: {', '.join(sorted(live)) or 'none'})"
                )
            conn.execute(
                sa.text("INSERT INTO drains (server) VALUES (:s) ON CONFLICT DO NOTHING"),
                {"s": server_id},
            )
        notify.notify(conn, notify.JOBS_CHANNEL, f"drain:{server_id}")
    console.out.print(
        f"server {server_id}: " + ("takes jobs again" if undo else "draining (jobs move off it)")
    )
