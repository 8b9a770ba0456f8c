"""``sparkring server``: the servers of the cluster as the registry (ZooKeeper) sees them."""

from __future__ import annotations

import logging
import time
from typing import Any

import typer

from registry import connection, election, servers
from server import console

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


@app.command("list")
def list_(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Live servers: role, capacity, coordinator flag and uptime."""
    settings = console.context(ctx).settings()
    # kazoo logs every failed connection attempt to stderr; a one-shot command reports
    # one line of its own instead.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL + 1)
    auth = settings.zk_auth.get_secret_value()
    root = servers.validate_root(settings.zk_root)
    with connection.opened(settings.zk_hosts, auth, timeout=5.0) as client:
        live = servers.read_all(client, root)
        coordinator = election.leader(client, root)
    now = time.time()
    rows: list[dict[str, Any]] = []
    for info in sorted(live.values(), key=lambda i: i.id):
        leads = coordinator is not None and coordinator.server_id == info.id
        rows.append(
            {
                **info.to_dict(),
                "coordinator": leads,
                "term": coordinator.term if leads and coordinator else None,
                "uptime_s": round(max(now - info.started_at, 0.0), 3),
            }
        )
    if as_json:
        console.emit_json(rows)
        return
    console.table(
        ["id", "role", "capacity", "coordinator", "term", "uptime", "host", "version"],
        [
            [
                r["id"],
                r["role"],
                r["capacity"],
                "yes" if r["coordinator"] else None,
                r["term"],
                _uptime(r["uptime_s"]),
                r["host"],
                r["version"],
            ]
            for r in rows
        ],
    )
