"""Placement stability: plain ring, bounded loads (recomputed) and sticky placement.

Pure computation, no services needed::

    .venv/bin/python -m benchmarks.placement_stability [--seeds 3] [--vnodes 640] [--json]

Side by side for the three algorithms:

- churn: 5 servers (capacity 20 each), 50 jobs, then 200 random events (a job starts,
  or a running job stops or finishes), membership fixed. Counts the moves of jobs
  that were not touched by the event, and the max/mean load at the end (the drift
  that sticky placement accepts until the next join, leave or rebalance);
- join and leave at N in {3, 10, 50} servers and K in {100, 1000, 10000} streaming jobs
  (ample capacity): moved / ideal (ideal K/(N+1) for a join, the leaver's K/N share
  for a leave), *needless* moves (a job moved although it was not on the leaver, or
  not to the joiner), and max/mean after the change;
- gentle join (issue 24): the sticky join again, paced as the coordinator paces it
  (``scheduler/residency.py``): a job moves only once it has run for the residency
  (each job starts 0-3 rounds old, the residency is 2 rounds, a moved job starts again
  at 0), at most one move per server per round and none from or to a server whose move
  of the round before is still in flight. Rounds run until no move is made or deferred.
  Reports moved / ideal, needless moves, whether the moved jobs are exactly those of the
  one-shot sticky join, and the rounds it took. Only K <= 1000 (one round per move into
  the joiner: K/(N+1) rounds of a full placement each);
- startup: 3 servers register 1 s apart (t = 0, 1, 2 s), 6 streaming jobs are started
  at t = 0.2 s, the coordinator rebalances every 0.5 s (its membership debounce), a job
  is claimed each time its target changes to a server. Claims per job until t = 20 s.
  Sticky placement runs with the coordinator's rules (``scheduler/coordinator.py``):
  settle window 5 s (``PLACEMENT_SETTLE_S``), new jobs wait while a member settles.

"plain ring" is ``ring.assign`` (no capacity), "bounded loads" is ``placement.place``
recomputed from the job set (the coordinator before issue 12), "sticky" is
``placement.stick`` fed with each job's current server.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path

from scheduler import placement, ring
from server import defaults

REPO = Path(__file__).resolve().parent.parent

ALGORITHMS = ("plain ring", "bounded loads", "sticky")
SIZES = [(n, k) for n in (3, 10, 50) for k in (100, 1000, 10_000)]


def _assign(
    algorithm: str,
    jobs: Mapping[str, str | None],
    servers: Mapping[str, int],
    vnodes: int,
    joined: tuple[str, ...] = (),
    hold: str | None = None,
) -> dict[str, str]:
    """Targets of ``jobs`` (name -> current server or None) under one algorithm."""
    if algorithm == "plain ring":
        return ring.assign(jobs, servers, vnodes)
    if algorithm == "bounded loads":
        return placement.place(jobs, servers, vnodes=vnodes).targets
    described = {name: placement.Job(current=at) for name, at in jobs.items()}
    return placement.stick(described, servers, joined=joined, hold_new=hold, vnodes=vnodes).targets


def _max_mean(targets: Mapping[str, str], servers: Mapping[str, int]) -> float:
    loads = dict.fromkeys(servers, 0)
    for server in targets.values():
        loads[server] += 1
    mean = len(targets) / len(servers) if targets else 1
    return max(loads.values()) / mean


def churn(algorithm: str, seed: int, vnodes: int, events: int = 200) -> dict[str, float]:
    rng = random.Random(seed)
    servers = {f"server-{seed}-{i}": 20 for i in range(5)}
    counter = iter(range(10**9))
    jobs: dict[str, str | None] = {f"job-{seed}-{next(counter)}": None for _ in range(50)}
    targets = _assign(algorithm, jobs, servers, vnodes)
    moves = 0
    for _ in range(events):
        if rng.random() < 0.5 or not jobs:
            touched = f"job-{seed}-{next(counter)}"
            jobs[touched] = None
        else:
            touched = rng.choice(sorted(jobs))
            del jobs[touched]
        jobs = {name: targets.get(name) for name in jobs}
        new = _assign(algorithm, jobs, servers, vnodes)
        moves += sum(
            1 for name in jobs if name != touched and name in targets and new[name] != targets[name]
        )
        targets = new
    return {"moves": moves, "max_mean_end": _max_mean(targets, servers), "jobs_end": len(jobs)}


def join_leave(algorithm: str, servers: int, jobs: int, seed: int, vnodes: int) -> dict[str, float]:
    names = [f"job-{seed}-{i:05d}" for i in range(jobs)]
    ids = [f"server-{seed}-{i:03d}" for i in range(servers + 1)]
    base = dict.fromkeys(ids[:servers], jobs)
    before = _assign(algorithm, dict.fromkeys(names), base, vnodes)
    current = dict(before)
    joiner = ids[servers]
    joined = _assign(algorithm, current, {**base, joiner: jobs}, vnodes, joined=(joiner,))
    moved_join = [n for n in names if joined[n] != before[n]]
    leaver = ids[0]
    rest = {s: c for s, c in base.items() if s != leaver}
    left = _assign(algorithm, current, rest, vnodes)
    moved_leave = [n for n in names if left[n] != before[n]]
    return {
        "balance": _max_mean(before, base),
        "join": len(moved_join) / (jobs / (servers + 1)),
        "join_needless": sum(1 for n in moved_join if joined[n] != joiner),
        "join_balance": _max_mean(joined, {**base, joiner: jobs}),
        "leave": len(moved_leave) / (jobs / servers),
        "leave_needless": sum(1 for n in moved_leave if before[n] != leaver),
        "leave_balance": _max_mean(left, rest),
    }


def join_gentle(servers: int, jobs: int, seed: int, vnodes: int) -> dict[str, float]:
    """The sticky join made by paced rounds; see the module docstring."""
    rng = random.Random(f"gentle-{seed}-{servers}-{jobs}")
    names = [f"job-{seed}-{i:05d}" for i in range(jobs)]
    ids = [f"server-{seed}-{i:03d}" for i in range(servers + 1)]
    base = dict.fromkeys(ids[:servers], jobs)
    joiner = ids[servers]
    grown = {**base, joiner: jobs}
    before = _assign("sticky", dict.fromkeys(names), base, vnodes)
    at_once = _assign("sticky", dict(before), grown, vnodes, joined=(joiner,))
    current = dict(before)
    age = {name: rng.randint(0, 3) for name in names}
    busy: frozenset[str] = frozenset()
    moved: set[str] = set()
    moves = rounds = 0
    while True:
        rounds += 1
        pace = placement.Pace(
            movable=frozenset(n for n in names if age[n] >= GENTLE_RESIDENCY_ROUNDS),
            maturing=frozenset(n for n in names if age[n] < GENTLE_RESIDENCY_ROUNDS),
            busy=busy,
        )
        described = {name: placement.Job(current=at) for name, at in current.items()}
        result = placement.stick(described, grown, joined=(joiner,), pace=pace, vnodes=vnodes)
        made = [n for n in names if result.targets[n] != current[n]]
        busy = frozenset(s for n in made for s in (current[n], result.targets[n]))
        for name in made:
            age[name] = -1  # a move is a new run
        moves += len(made)
        moved.update(made)
        current = dict(result.targets)
        age = {name: a + 1 for name, a in age.items()}
        if not made and not result.deferred:
            break
    return {
        "join": moves / (jobs / (servers + 1)),
        "join_needless": sum(1 for n in moved if current[n] != joiner),
        "same_moves": float(moved == {n for n in names if at_once[n] != before[n]}),
        "rounds": rounds,
    }


# The residency of the gentle join, in rounds of the simulation.
GENTLE_RESIDENCY_ROUNDS = 2
GENTLE_MAX_JOBS = 1000


def startup(algorithm: str, vnodes: int, settle: float = defaults.PLACEMENT_SETTLE_S) -> float:
    """Mean claims per job when 3 servers start 1 s apart and 6 jobs start at once."""
    arrivals = {"s1": 0.0, "s2": 1.0, "s3": 2.0}
    jobs: dict[str, str | None] = {}
    claims = dict.fromkeys((f"job-{i}" for i in range(6)), 0)
    settled: set[str] = set()
    tick = 0.0
    while tick <= 20.0:
        if tick >= 0.2 and not jobs:
            jobs = dict.fromkeys(claims)
        live = {s: 4 for s, at in arrivals.items() if at <= tick}
        joined: tuple[str, ...] = ()
        hold = None
        if algorithm == "sticky":
            ready = {s for s in live if tick - arrivals[s] >= settle} - settled
            settling = set(live) - settled - ready
            joined, hold = tuple(sorted(ready)), ("settling" if settling else None)
            settled |= ready
        if live and jobs:
            targets = _assign(algorithm, jobs, live, vnodes, joined=joined, hold=hold)
            for name, server in targets.items():
                if jobs[name] != server:
                    claims[name] += 1
            jobs = {name: targets.get(name) for name in jobs}
        tick = round(tick + 0.5, 1)
    return statistics.mean(claims.values())


def run(seeds: int, vnodes: int, on_line: Callable[[str], None]) -> dict[str, object]:
    result: dict[str, object] = {"vnodes": vnodes, "seeds": seeds}
    churn_rows = []
    for algorithm in ALGORITHMS:
        samples = [churn(algorithm, seed, vnodes) for seed in range(seeds)]
        row = {
            "algorithm": algorithm,
            "moves_mean": statistics.mean(s["moves"] for s in samples),
            "moves_max": max(s["moves"] for s in samples),
            "max_mean_end_worst": round(max(s["max_mean_end"] for s in samples), 3),
        }
        churn_rows.append(row)
        on_line(
            f"churn  {algorithm:<14} moves of untouched jobs {row['moves_mean']:.1f} "
            f"(worst {row['moves_max']}), max/mean at the end {row['max_mean_end_worst']:.3f}"
        )
    result["churn"] = churn_rows
    rows = []
    for algorithm in ALGORITHMS:
        for servers, jobs in SIZES:
            samples = [join_leave(algorithm, servers, jobs, seed, vnodes) for seed in range(seeds)]
            row: dict[str, object] = {"algorithm": algorithm, "servers": servers, "jobs": jobs}
            for metric in samples[0]:
                values = [s[metric] for s in samples]
                row[metric] = round(max(values), 3)  # the worst over the seeds
            rows.append(row)
            on_line(
                f"N={servers:<3} K={jobs:<6} {algorithm:<14} max/mean {row['balance']:.3f}  "
                f"join {row['join']:.3f} (needless {row['join_needless']}, after "
                f"{row['join_balance']:.3f})  leave {row['leave']:.3f} (needless "
                f"{row['leave_needless']}, after {row['leave_balance']:.3f})"
            )
    result["join_leave"] = rows
    gentle_rows = []
    for servers, jobs in SIZES:
        if jobs > GENTLE_MAX_JOBS:
            continue
        samples = [join_gentle(servers, jobs, seed, vnodes) for seed in range(seeds)]
        row = {"servers": servers, "jobs": jobs}
        row["join"] = round(max(s["join"] for s in samples), 3)
        row["join_needless"] = max(s["join_needless"] for s in samples)
        row["same_moves"] = all(s["same_moves"] for s in samples)
        row["rounds"] = max(s["rounds"] for s in samples)
        gentle_rows.append(row)
        on_line(
            f"N={servers:<3} K={jobs:<6} sticky, gentle  join {row['join']:.3f} (needless "
            f"{row['join_needless']}, same moves as at once: {row['same_moves']}, "
            f"{row['rounds']} rounds)"
        )
    result["join_gentle"] = gentle_rows
    result["startup"] = {}
    for algorithm in ALGORITHMS:
        claims = startup(algorithm, vnodes)
        result["startup"][algorithm] = claims  # type: ignore[index]
        on_line(f"startup {algorithm:<14} claims per job {claims:.2f}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="name sets per cell (default 3)")
    parser.add_argument("--vnodes", type=int, default=defaults.RING_VNODES, help="vnodes/server")
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    args = parser.parse_args()
    if args.seeds < 1 or args.vnodes < 1:
        parser.error("--seeds and --vnodes must be positive")
    if args.json:
        print(json.dumps(run(args.seeds, args.vnodes, lambda line: None), indent=2))
        return
    print(f"vnodes {args.vnodes}; join/leave cells: worst over {args.seeds} name sets")
    run(args.seeds, args.vnodes, lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
