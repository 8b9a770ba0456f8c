"""The safety invariants S1-S5 (DESIGN.md), checked from the evidence a cluster leaves.

Pure functions over three kinds of records, so that each check is unit-tested
(``tests/chaos/test_invariants.py``) before the campaign trusts it:

- heartbeats the light driver appends every 0.2 s: ``{"job","epoch","server","pid","t"}``;
- watchdog lifetime records: one ``started`` and one ``ended`` per driver, whose
  interval contains the driver's whole life (``docs/drivers.md``);
- ``job_events`` rows (oldest first), every fenced write of a server included.

Each check returns a list of human-readable problems; an empty list means it holds.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Events only the owner of an epoch may write (each one a statement fenced by
# owner and epoch in scheduler/distribution.py).
OWNER_WRITES = frozenset(
    {"driver_started", "stopping", "released", "finished", "crashed", "failed", "deferred"}
)
# Events that mean a driver was (about to be) started for a job.
START_EVENTS = frozenset({"claimed", "driver_started"})


def _overlapping(spans: Mapping[str, list[tuple[str, float, float]]], margin: float) -> list[str]:
    problems = []
    for job, items in sorted(spans.items()):
        items = sorted(items, key=lambda item: item[1])
        for a, b in itertools.combinations(items, 2):
            overlap = min(a[2], b[2]) - max(a[1], b[1])
            if overlap > margin:
                problems.append(f"{job}: {a[0]} and {b[0]} overlap by {overlap:.3f} s")
    return problems


def heartbeat_overlaps(records: Iterable[Mapping[str, Any]], margin: float = 0.0) -> list[str]:
    """S1 from heartbeats: two driver processes of one job beating in the same instant.

    A driver's span runs from its first to its last heartbeat; two spans of one job
    that overlap by more than ``margin`` seconds are a double run.
    """
    first_last: dict[tuple[str, int], list[float]] = {}
    for r in records:
        span = first_last.setdefault((r["job"], r["pid"]), [r["t"], r["t"]])
        span[0], span[1] = min(span[0], r["t"]), max(span[1], r["t"])
    spans: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    for (job, pid), (start, end) in first_last.items():
        spans[job].append((f"pid {pid}", start, end))
    return _overlapping(spans, margin)


def lifetime_overlaps(
    records: Iterable[Mapping[str, Any]], margin: float = 0.0, now: float | None = None
) -> list[str]:
    """S1 from the watchdogs' lifetime records; a driver with no ``ended`` record is
    alive until ``now``."""
    now = time.time() if now is None else now
    lives: dict[tuple[str, int, str], list[float]] = {}
    for r in records:
        life = lives.setdefault((r["job"], int(r["epoch"]), r["server"]), [float("inf"), now])
        if r["event"] == "started":
            life[0] = r["t"]
        elif r["event"] == "ended":
            life[1] = r["t"]
    spans: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    for (job, epoch, server), (start, end) in lives.items():
        if start != float("inf"):
            spans[job].append((f"epoch {epoch} on {server}", start, end))
    return _overlapping(spans, margin)


def double_runs(
    heartbeats: Sequence[Mapping[str, Any]],
    lifetimes: Sequence[Mapping[str, Any]],
    margin: float = 0.0,
) -> list[str]:
    """Every S1 violation either kind of evidence shows."""
    return heartbeat_overlaps(heartbeats, margin) + lifetime_overlaps(lifetimes, margin)


def stale_writes(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """S2 from ``job_events`` (each job's events oldest first): an owner write by an
    epoch older than the newest claim, or by a server that did not claim that epoch."""
    by_job: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for e in events:
        by_job[e["job_name"]].append(e)
    problems = []
    for job, items in sorted(by_job.items()):
        newest = 0
        claimer: dict[int, str] = {}
        for e in sorted(items, key=lambda e: e["id"]):
            if e["kind"] == "claimed":
                claimer[e["epoch"]] = e["server"]
                newest = max(newest, e["epoch"])
            elif e["kind"] in OWNER_WRITES:
                if e["epoch"] < newest:
                    problems.append(
                        f"{job}: {e['kind']} by {e['server']} at epoch {e['epoch']} "
                        f"after epoch {newest} was claimed"
                    )
                elif claimer.get(e["epoch"]) != e["server"]:
                    problems.append(
                        f"{job}: {e['kind']} by {e['server']} at epoch {e['epoch']}, "
                        f"claimed by {claimer.get(e['epoch'])}"
                    )
    return problems


def lost_jobs(jobs: Iterable[Mapping[str, Any]], live: Iterable[str]) -> list[str]:
    """S3: a job wanted running that is neither running on a live server nor visibly
    FAILED with a reason."""
    live = set(live)
    problems = []
    for j in jobs:
        if j["desired"] != "running" or j["state"] == "finished":
            continue
        if j["state"] == "failed" and j.get("last_error"):
            continue
        if j["state"] == "running" and j["owner"] in live:
            continue
        problems.append(f"{j['name']}: {j['state']} (owner {j['owner']}, target {j['target']})")
    return problems


def resurrections(
    before: Mapping[str, Mapping[str, Any]],
    after: Mapping[str, Mapping[str, Any]],
    events_since: Iterable[Mapping[str, Any]],
) -> list[str]:
    """S4: a job that was finished, stopped or failed before the fault changed state,
    epoch or attempt, or was claimed or started again, without an operator command."""
    problems = []
    started_again = {e["job_name"] for e in events_since if e["kind"] in START_EVENTS}
    for name, was in sorted(before.items()):
        now = after[name]
        keys = ("state", "epoch", "attempt")
        if any(was[k] != now[k] for k in keys):
            changed = ", ".join(f"{k} {was[k]} -> {now[k]}" for k in keys if was[k] != now[k])
            problems.append(f"{name}: {changed}")
        elif name in started_again:
            problems.append(f"{name}: claimed or started again")
    return problems


def corrupt_starts(
    names: Iterable[str],
    lifetimes: Iterable[Mapping[str, Any]],
    events: Iterable[Mapping[str, Any]],
) -> list[str]:
    """S5: a driver of a job whose artifact is corrupt or missing was started."""
    names = set(names)
    problems = [
        f"{r['job']}: driver started at epoch {r['epoch']} on {r['server']}"
        for r in lifetimes
        if r["job"] in names and r["event"] == "started"
    ]
    problems += [
        f"{e['job_name']}: driver_started event at epoch {e['epoch']}"
        for e in events
        if e["job_name"] in names and e["kind"] == "driver_started"
    ]
    return problems
