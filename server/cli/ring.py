"""``sparkring ring``: where the consistent-hash ring puts jobs, and why.

The placement code (and the ring's hash library) is imported by these commands only.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

import typer

from server import clients, defaults
from server.cli import console

if TYPE_CHECKING:
    from scheduler import placement

app = typer.Typer(
    no_args_is_help=True, help="Inspect job placement on the ring; rebalance on request."
)


def _inputs(ctx: typer.Context):
    from scheduler import coordinator

    settings = console.context(ctx).settings()
    live = clients.live_servers(settings)
    engine = clients.engine(settings)
    with engine.connect() as conn:
        rows = coordinator.job_rows(conn)
        placeable = coordinator.placeable(conn, {s.id: s.capacity for s in live})
    return settings, live, rows, placeable, engine


@app.command()
def show(
    ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")
) -> None:
    """Live servers with their capacity and the jobs targeted at and owned by each."""
    _, live, rows, placeable, _ = _inputs(ctx)
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


def _decision(why: placement.Why, row, result: placement.Sticky, ideal: str | None) -> str:
    """One sentence: why the job stays where it is or moves."""
    from scheduler import placement

    target = result.targets.get(row.name)
    where = row.owner or row.target
    if why == placement.Why.KEPT:
        text = (
            f"stays on {target} (sticky): its server is live, placeable and within its "
            "capacity, and a job moves only when its server leaves, drains or loses "
            "capacity, or a joining server takes it (streaming jobs only)"
        )
        if row.kind == "batch":
            text += "; a batch job finishes where it started"
        elif ideal and ideal != target:
            text += (
                f"; a fresh placement would put it on {ideal}: 'sparkring ring rebalance' "
                "moves it there"
            )
        return text
    if why == placement.Why.ORPHANED:
        return (
            f"moves to {target}: {where} left or has capacity 0, so the job is "
            "placed again by bounded loads (the nearest server on the ring with room)"
        )
    if why == placement.Why.DRAINED:
        return (
            f"moves to {target}: {where} is drained by an operator, so the job is placed "
            "again by bounded loads (the nearest server on the ring with room); its owner "
            "hands it off (a planned move: warm for a streaming job)"
        )
    if why == placement.Why.AVOIDED:
        return (
            f"moves to {target}: {where} is avoided for this job (its lease there lapsed "
            "while the server stayed registered, or it deferred the job several times in "
            "a row), so the job is placed on the nearest other server with room"
        )
    if why == placement.Why.SHED:
        return (
            f"moves to {target}: {where} has more jobs than its capacity and sheds "
            "streaming jobs before batch jobs, latest start request first"
        )
    if why == placement.Why.PLACED:
        return (
            f"placed on {target} by bounded loads: the nearest server on the ring "
            "clockwise from the job with room under its bound"
        )
    if why in (placement.Why.JOINED, placement.Why.REBALANCED):
        return f"moves to {target} ({why})"
    return f"waits without a target: {result.pending[row.name]}"


@app.command()
def explain(
    ctx: typer.Context,
    job: str = typer.Argument(..., help="Job name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Why JOB stays where it is or moves (sticky placement), and where a fresh
    bounded-load placement would put it: ring position, candidates walked, overflow."""
    from scheduler import coordinator, placement

    settings, live, rows, placeable, engine = _inputs(ctx)
    by_name = {r.name: r for r in rows}
    if job not in by_name:
        raise console.fail(f"no job named {job!r}")
    active = coordinator.active_jobs(rows)
    if job not in active:
        raise console.fail(f"job {job!r} is not wanted running, so it has no target")
    with engine.connect() as conn:
        planned = coordinator.plan(
            conn,
            {s.id: s.capacity for s in live},
            epsilon=settings.placement_epsilon,
            vnodes=defaults.RING_VNODES,
            lapse=settings.lease_lapse_grace,
            defer_streak=settings.defer_streak,
            defer_window=settings.defer_avoid,
        )
    result = planned.placement
    e = placement.explain(
        job, active, placeable, epsilon=settings.placement_epsilon, vnodes=defaults.RING_VNODES
    )
    row = by_name[job]
    if job in planned.held:
        why = "held"
        decision = (
            f"held for {row.owner}: it left ZooKeeper but its lease is live for another "
            f"{planned.held[job]:.1f} s (a server restarting on its host adopts its drivers); "
            "the job is placed again when the lease expires"
        )
    else:
        why = result.why[job]
        decision = _decision(why, row, result, e.target)
    if as_json:
        console.emit_json(
            {
                "job": e.job,
                "ring_position": e.ring_position,
                "owner": row.owner,
                "target": row.target,
                "decision": str(why),
                "planned_target": result.targets.get(job),
                "reason": decision,
                "ideal_target": e.target,
                "overflowed": e.overflowed,
                "ideal_reason": e.reason,
                "candidates": [
                    {"server": c.server, "load": c.load, "bound": c.bound} for c in e.candidates
                ],
            }
        )
        return
    console.out.print(
        f"job {e.job} ({row.kind}) owner {row.owner or '-'}, target {row.target or '-'}: {why}"
    )
    console.out.print(decision)
    if result.targets.get(job) != row.target:
        console.out.print("(the coordinator has not written this decision yet)")
    console.out.print(
        f"fresh bounded-load placement: ring position {e.ring_position:#x} -> {e.target or '-'}"
    )
    console.table(
        ["candidate", "load", "bound"], [[c.server, c.load, c.bound] for c in e.candidates]
    )
    console.out.print(e.reason)


@app.command()
def rebalance(
    ctx: typer.Context,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the moves a full rebalance would make; change nothing."
    ),
    timeout: float = typer.Option(
        30.0, "--timeout", min=0, help="Seconds to wait for the coordinator to apply it."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Rebalance fully: every streaming job goes to a freshly balanced target.

    Running batch jobs never move (they finish where they started). Each move is a
    stop on the old server, then a start from the job's checkpoint on the new one.
    Without --dry-run the request is recorded in PostgreSQL and carried out by the
    coordinator; the moves it makes can differ from those printed if jobs or servers
    change meanwhile.
    """
    from scheduler import coordinator, placement

    settings, live, _, _, engine = _inputs(ctx)
    with engine.connect() as conn:
        planned = coordinator.plan(
            conn,
            {s.id: s.capacity for s in live},
            epsilon=settings.placement_epsilon,
            vnodes=defaults.RING_VNODES,
            full=True,
            lapse=settings.lease_lapse_grace,
            defer_streak=settings.defer_streak,
            defer_window=settings.defer_avoid,
        )
    rows, result = planned.rows, planned.placement
    moves = [
        {"job": r.name, "kind": r.kind, "from": r.target, "to": result.targets[r.name]}
        for r in sorted(rows, key=lambda r: r.name)
        if r.target is not None
        and result.targets.get(r.name) not in (None, r.target)
        and result.why.get(r.name) == placement.Why.REBALANCED
    ]
    loads = {server: load for server, load in result.loads.items() if server in result.bounds}
    applied = None
    if not dry_run:
        with engine.begin() as conn:
            coordinator.request_rebalance(conn)

        def done() -> bool:
            with engine.connect() as conn:
                return not coordinator.rebalance_pending(conn)

        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() >= deadline:
                raise console.fail(
                    f"no coordinator carried out the rebalance within {timeout:g} s; it "
                    "stays requested and runs when a coordinator is elected"
                )
            time.sleep(0.2)
        applied = True
    if as_json:
        console.emit_json({"dry_run": dry_run, "moves": moves, "loads": loads, "applied": applied})
        return
    if moves:
        console.table(["job", "kind", "from", "to"], [list(m.values()) for m in moves])
    verb = "would move" if dry_run else "moved"
    console.out.print(
        f"{verb} {len(moves)} streaming job{'s' if len(moves) != 1 else ''}; jobs per server "
        "after: " + ", ".join(f"{server} {load}" for server, load in sorted(loads.items()))
    )
