"""Placement balance and movement: the plain ring against bounded-load placement.

Pure computation, no services needed::

    .venv/bin/python -m benchmarks.placement_balance [--seeds 3] [--vnodes 160 640] [--json]

For each N in {3, 10, 50, 100} servers and K in {1k, 10k, 100k} jobs, and for each
seed (a different set of job and server names), it computes:

- balance: max / mean jobs per server on N servers (mean = K / N);
- join: jobs whose target changed when server N+1 joins, / the ideal K / (N + 1);
- leave: jobs whose target changed when one of the N servers leaves, / the ideal K / N
  (the leaving server's fair share).

Capacities are ample (K per server), so bounded placement's bound is
ceil((1 + epsilon) * K / N). Figures are the mean and the worst over the seeds. It also
times ``placement.place`` and ``ring.assign`` for 100,000 jobs x 100 servers (median of
three runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from scheduler import placement, ring

REPO = Path(__file__).resolve().parent.parent

SERVER_COUNTS = (3, 10, 50, 100)
JOB_COUNTS = (1_000, 10_000, 100_000)

Assign = Callable[[list[str], Mapping[str, int], int], dict[str, str]]


def _plain(jobs: list[str], servers: Mapping[str, int], vnodes: int) -> dict[str, str]:
    return ring.assign(jobs, servers, vnodes)


def _bounded(jobs: list[str], servers: Mapping[str, int], vnodes: int) -> dict[str, str]:
    return placement.place(jobs, servers, placement.DEFAULT_EPSILON, vnodes).targets


ALGORITHMS: dict[str, Assign] = {"plain ring": _plain, "bounded loads": _bounded}


def _moved(before: dict[str, str], after: dict[str, str], jobs: list[str]) -> int:
    return sum(1 for job in jobs if before.get(job) != after.get(job))


def measure(algorithm: Assign, servers: int, jobs: int, seed: int, vnodes: int) -> dict[str, float]:
    """Balance and movement ratios for one name set."""
    job_names = [f"job-{seed}-{i:06d}" for i in range(jobs)]
    names = [f"server-{seed}-{i:03d}" for i in range(servers + 1)]
    base = dict.fromkeys(names[:servers], jobs)
    joined = dict.fromkeys(names, jobs)
    left = dict.fromkeys(names[1:servers], jobs)
    before = algorithm(job_names, base, vnodes)
    loads: dict[str, int] = dict.fromkeys(base, 0)
    for target in before.values():
        loads[target] += 1
    return {
        "balance": max(loads.values()) / (jobs / servers),
        "join": _moved(before, algorithm(job_names, joined, vnodes), job_names)
        / (jobs / (servers + 1)),
        "leave": _moved(before, algorithm(job_names, left, vnodes), job_names) / (jobs / servers),
    }


def run(
    seeds: int, vnodes_list: list[int], on_row: Callable[[dict[str, object]], None]
) -> dict[str, object]:
    """Every cell of the table, and the timings; ``on_row`` sees each row as it is done."""
    rows = []
    for vnodes in vnodes_list:
        for name, algorithm in ALGORITHMS.items():
            for servers in SERVER_COUNTS:
                for jobs in JOB_COUNTS:
                    samples = [
                        measure(algorithm, servers, jobs, seed, vnodes) for seed in range(seeds)
                    ]
                    row: dict[str, object] = {
                        "algorithm": name,
                        "vnodes": vnodes,
                        "servers": servers,
                        "jobs": jobs,
                    }
                    for metric in ("balance", "join", "leave"):
                        values = [sample[metric] for sample in samples]
                        row[f"{metric}_mean"] = round(statistics.mean(values), 3)
                        row[f"{metric}_max"] = round(max(values), 3)
                    rows.append(row)
                    on_row(row)
    return {
        "epsilon": placement.DEFAULT_EPSILON,
        "seeds": seeds,
        "rows": rows,
        "timing": [_timing(vnodes) for vnodes in vnodes_list],
    }


def _timing(vnodes: int) -> dict[str, object]:
    jobs = [f"job-{i:06d}" for i in range(100_000)]
    servers = {f"server-{i:03d}": 100_000 for i in range(100)}
    return {
        "vnodes": vnodes,
        "jobs": len(jobs),
        "servers": len(servers),
        "place_s": round(_median_time(lambda: placement.place(jobs, servers, vnodes=vnodes)), 3),
        "assign_s": round(_median_time(lambda: ring.assign(jobs, servers, vnodes)), 3),
    }


def _median_time(call: Callable[[], object], repeat: int = 3) -> float:
    durations = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        durations.append(time.perf_counter() - started)
    return statistics.median(durations)


HEADER = (
    f"{'algorithm':<14} {'vnodes':>6} {'N':>4} {'K':>7}  "
    f"{'max/mean':>13}  {'join moved/ideal':>16}  {'leave moved/ideal':>17}"
)


def _format_row(row: Mapping[str, object]) -> str:
    def pair(metric: str) -> str:
        return f"{row[f'{metric}_mean']:.3f} / {row[f'{metric}_max']:.3f}"

    return (
        f"{row['algorithm']:<14} {row['vnodes']:>6} {row['servers']:>4} {row['jobs']:>7}  "
        f"{pair('balance'):>13}  {pair('join'):>16}  {pair('leave'):>17}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="name sets per cell (default 3)")
    parser.add_argument(
        "--vnodes", type=int, nargs="+", default=[160, 640], help="vnodes per server to compare"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if args.seeds < 1 or any(v < 1 for v in args.vnodes):
        parser.error("--seeds and --vnodes must be positive")
    if args.json:
        print(json.dumps(run(args.seeds, args.vnodes, lambda row: None), indent=2))
        return
    print(
        f"epsilon {placement.DEFAULT_EPSILON}; each cell: mean / worst over {args.seeds} name sets"
    )
    print(HEADER)
    result = run(args.seeds, args.vnodes, lambda row: print(_format_row(row), flush=True))
    print()
    for timing in result["timing"]:  # type: ignore[attr-defined]
        print(
            f"100,000 jobs x 100 servers, vnodes {timing['vnodes']}: "
            f"place() {timing['place_s']:.3f} s, ring.assign() {timing['assign_s']:.3f} s"
        )


if __name__ == "__main__":
    main()
