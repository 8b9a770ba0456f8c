"""The ring (``/api/v1/ring``) and why a job is placed where it is."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter, Depends

from scheduler import coordinator, placement, ring
from server.web import auth, contract, dependencies

# Jobs drawn on the ring picture at most (the picture is for eyes, not for audits).
RING_JOBS_DRAWN = 2000


router = APIRouter(tags=["ring"], responses=contract.errors(*contract.READ))
viewer = Depends(auth.reader)


@router.get(f"{contract.API}/ring")
def show_ring(backend: dependencies.AppBackend, principal: auth.Caller = viewer) -> dict[str, Any]:
    """The ring: each live server's arcs (fractions of the circle), capacity, load and
    bound, and where wanted-running jobs sit on it."""
    members = backend.members()
    with backend.engine.connect() as conn:
        rows = coordinator.job_rows(conn)
        placeable = coordinator.placeable(conn, {s.id: s.capacity for s in members.values()})
    active = coordinator.active_jobs(rows)
    built = ring.build(sorted(placeable) or sorted(members), backend.vnodes)
    bounds = _bounds(active, placeable, backend)
    targeted = Counter(r.target for r in rows if r.target)
    owned = Counter(r.owner for r in rows if r.owner)
    ids = sorted(set(members) | set(targeted) | set(owned))
    return {
        "vnodes": backend.vnodes,
        "servers": [
            {
                "server": sid,
                "live": sid in members,
                "capacity": members[sid].capacity if sid in members else None,
                "placeable": sid in placeable,
                "targeted": targeted.get(sid, 0),
                "owned": owned.get(sid, 0),
                "bound": bounds.get(sid),
            }
            for sid in ids
        ],
        "arcs": _arcs(built),
        "jobs": [
            {
                "name": r.name,
                "position": ring.position(r.name) / ring.HASH_SPACE,
                "target": r.target,
                "owner": r.owner,
            }
            for r in rows
            if r.name in active
        ][:RING_JOBS_DRAWN],
        "pending": sorted(r.name for r in rows if r.pending_reason),
    }


@router.get(f"{contract.API}/ring/explain/{{job}}", responses=contract.errors(404, 409, 422))
def explain(
    job: contract.JobName, backend: dependencies.AppBackend, principal: auth.Caller = viewer
) -> dict[str, Any]:
    """Why JOB is placed where it is: ring position, candidates walked, overflow."""
    members = backend.members()
    with backend.engine.connect() as conn:
        rows = coordinator.job_rows(conn)
        placeable = coordinator.placeable(conn, {s.id: s.capacity for s in members.values()})
    if job not in {r.name for r in rows}:
        raise contract.ApiError(404, f"no job named {job!r}")
    active = coordinator.active_jobs(rows)
    if job not in active:
        raise contract.ApiError(409, f"job {job!r} is not wanted running, so it has no target")
    e = placement.explain(
        job, active, placeable, epsilon=backend.placement_epsilon, vnodes=backend.vnodes
    )
    return {
        "job": e.job,
        "ring_position": str(e.ring_position),
        "target": e.target,
        "overflowed": e.overflowed,
        "reason": e.reason,
        "candidates": [
            {"server": c.server, "load": c.load, "bound": c.bound} for c in e.candidates
        ],
    }


def _arcs(built: ring.Ring) -> list[dict[str, Any]]:
    """The circle as arcs [start, end) in fractions of a turn, each owned by the server
    whose vnode ends it (a key maps to the next vnode clockwise); adjacent arcs of one
    server merged."""
    points, owners = built.points, built.owners
    if not points:
        return []
    arcs: list[dict[str, Any]] = []
    # The arc ending at points[0] starts at the last point (wrapping past the top).
    previous = points[-1] - ring.HASH_SPACE
    for point, owner in zip(points, owners, strict=True):
        start, end = previous / ring.HASH_SPACE, point / ring.HASH_SPACE
        if arcs and arcs[-1]["server"] == owner:
            arcs[-1]["end"] = end
        else:
            arcs.append({"server": owner, "start": start, "end": end})
        previous = point
    return arcs


def _bounds(
    active: list[str], placeable: dict[str, int], backend: dependencies.Backend
) -> dict[str, int]:
    """Each placeable server's bounded-load cap for the current number of active jobs."""
    if not placeable:
        return {}
    result = placement.place(
        active, placeable, epsilon=backend.placement_epsilon, vnodes=backend.vnodes
    )
    return dict(result.bounds)
