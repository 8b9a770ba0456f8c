"""``sparkring ring``: where the consistent-hash ring puts jobs, and why."""

from __future__ import annotations

import logging
from collections import Counter

import typer

from registry import servers
from scheduler import coordinator, placement
from server import clients, console, defaults

app = typer.Typer(no_args_is_help=True, help="Inspect job placement on the ring.")


def _inputs(ctx: typer.Context):
    settings = console.context(ctx).settings()
    logging.getLogger("kazoo").setLevel(logging.CRITICAL + 1)
    live = servers.list_servers(
        settings.zk_hosts, settings.zk_root, settings.zk_auth.get_secret_value()
    )
    engine = clients.engine(settings)
    with engine.connect() as conn:
        rows = coordinator.job_rows(conn)
        placeable = coordinator.placeable(conn, {s.id: s.capacity for s in live})
    return settings, live, rows, placeable


@app.command()
def show(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")
) -> None:
    """Live servers with their capacity and the jobs targeted at and owned by each."""
    _, live, rows, placeable = _inputs(ctx)
    targeted = Counter(r.target for r in rows if r.target)
    owned = Counter(r.owner for r in rows if r.owner)
    ids = sorted({s.id for s in live} | set(targeted) | set(owned))
    by_id = {s.id: s for s in live}
    report = [
        {
            "server": sid,
            "live": sid in by_id,
            "role": by_id[sid].role if sid in by_id else None,
            "capacity": by_id[sid].capacity if sid in by_id else None,
            "placeable": sid in placeable,
            "targeted": targeted.get(sid, 0),
            "owned": owned.get(sid, 0),
        }
        for sid in ids
    ]
    pending = [r.name for r in rows if r.pending_reason]
    if as_json:
        console.emit_json({"servers": report, "pending": pending})
        return
    console.table(
        ["server", "live", "role", "capacity", "placeable", "targeted", "owned"],
        [
            [r[k] for k in ("server", "live", "role", "capacity", "placeable", "targeted", "owned")]
            for r in report
        ],
    )
    if pending:
        console.out.print(f"pending (no target): {', '.join(sorted(pending))}")


@app.command()
def explain(
    ctx: typer.Context,
    job: str = typer.Argument(..., help="Job name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Why JOB is placed where it is: ring position, candidates walked, overflow."""
    settings, _, rows, placeable = _inputs(ctx)
    names = {r.name for r in rows}
    if job not in names:
        raise console.fail(f"no job named {job!r}")
    active = coordinator.active_jobs(rows)
    if job not in active:
        raise console.fail(f"job {job!r} is not wanted running, so it has no target")
    e = placement.explain(
        job, active, placeable, epsilon=settings.placement_epsilon, vnodes=defaults.RING_VNODES
    )
    if as_json:
        console.emit_json(
            {
                "job": e.job,
                "ring_position": e.ring_position,
                "target": e.target,
                "overflowed": e.overflowed,
                "reason": e.reason,
                "candidates": [
                    {"server": c.server, "load": c.load, "bound": c.bound} for c in e.candidates
                ],
            }
        )
        return
    console.out.print(f"job {e.job} at ring position {e.ring_position:#x} -> {e.target or '-'}")
    console.table(
        ["candidate", "load", "bound"], [[c.server, c.load, c.bound] for c in e.candidates]
    )
    console.out.print(e.reason)
