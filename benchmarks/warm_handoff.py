"""The output gap of planned moves of a real Structured Streaming job: warm against cold.

Runs two ``sparkring server run`` processes on the local stack (the chaos harness's
cluster, fast timeouts) and examples/jobs/streaming_counter.py (a ``rate`` source to a
file sink, local[1], every row tagged with its driver's epoch). For each mode, one job
at a time:

- ``warm``: the default, the warm hand-off (docs/drivers.md, "Warm hand-off");
- ``cold``: the same job with ``--conf sparkring.handoff.warm=false`` (stop, then start);

and per trial two planned moves:

- ``roll``: ``job update`` to a new artifact version (the same server rolls it);
- ``drain``: ``server drain`` of its owner (the job moves to the other server), then
  ``server drain --undo`` (with a residency past the run: the job does not move back).

The output gap of a move is the time between the last committed file written by the
old driver and the first written by the new one (``testing/sink.output_gap``). Each move
is also checked exactly-once at the end (every value once, none lost).

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.warm_handoff [--trials 3] [--modes warm,cold] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import failover
from testing import sink
from testing.cluster import EXAMPLES, Cluster

SERVERS = ("s1", "s2")
COUNTER = EXAMPLES / "streaming_counter.py"
MOVE_TIMEOUT_S = 300.0
# A drained server that is undone is a joiner for the job it lost: a residency far
# past the run keeps the job where the drain put it (one move per measurement).
# The product's default ready wait (90 s), not the harness's shorter one.
SERVER_ENV = {"SPARKRING_MIN_RESIDENCY": "36000", "SPARKRING_WARM_READY_WAIT": "90"}


def _running_after(cluster: Cluster, name: str, epoch: int) -> dict[str, Any]:
    return failover.wait_for(
        lambda: (
            (j := cluster.job(name))["state"] == "running"
            and j["owner"] is not None
            and j["epoch"] > epoch
            and j
        ),
        MOVE_TIMEOUT_S,
        f"{name} running after epoch {epoch}",
    )


def _gap(cluster: Cluster, name: str, output: Path, before: dict[str, Any]) -> float:
    after = _running_after(cluster, name, before["epoch"])
    failover.wait_for(
        lambda: after["epoch"] in sink.written_by_epoch(output),
        MOVE_TIMEOUT_S,
        f"{name}: output of epoch {after['epoch']}",
    )
    return sink.output_gap(output, before["epoch"], after["epoch"])


def _warm_claims(cluster: Cluster, name: str) -> int:
    return sum(
        1 for e in cluster.events(name) if e["kind"] == "claimed" and e["detail"].get("warm")
    )


def measure(cluster: Cluster, mode: str, trials: int, scratch: Path) -> dict[str, list[float]]:
    name = f"stream-{mode}"
    output = cluster.root / f"out-{mode}"
    conf = ["--conf", "sparkring.handoff.warm=false"] if mode == "cold" else []
    cluster.cli("job", "create", name, "--resource", "counter", "--master", "local[1]",
                "--conf", "spark.sql.shuffle.partitions=1", *conf, f"--arg={output}")  # fmt: skip
    cluster.cli("job", "start", name)
    job = _running_after(cluster, name, 0)
    failover.wait_for(lambda: sink.committed_batches(output) >= 3, MOVE_TIMEOUT_S, "3 batches")
    gaps: dict[str, list[float]] = {"roll": [], "drain": []}
    for trial in range(trials):
        version = scratch / f"{mode}-{trial}" / "streaming_counter.py"
        version.parent.mkdir(parents=True)
        version.write_text(COUNTER.read_text() + f"\n# {mode} {trial}\n")
        cluster.cli("resource", "upload", "counter", str(version))
        cluster.cli("job", "update", name, "--resource", "counter")
        gaps["roll"].append(_gap(cluster, name, output, job))
        job = cluster.job(name)
        owner = job["owner"]
        cluster.cli("server", "drain", owner)
        gaps["drain"].append(_gap(cluster, name, output, job))
        cluster.cli("server", "drain", owner, "--undo")
        job = cluster.job(name)
        failover.log(
            f"{mode} {trial + 1}/{trials}: roll {gaps['roll'][-1]:.1f} s, "
            f"drain {gaps['drain'][-1]:.1f} s"
        )
    cluster.cli("job", "stop", name)
    failover.wait_for(lambda: cluster.job(name)["state"] == "stopped", 120, f"{name} stopped")
    values = sink.committed_values(output)
    exactly_once = len(values) == len(set(values)) and sorted(values) == list(
        range(min(values), max(values) + 1)
    )
    if not exactly_once:
        raise RuntimeError(f"{name}: a value was lost or written twice")
    warm_claims = _warm_claims(cluster, name)
    expected = 2 * trials if mode == "warm" else 0
    if warm_claims != expected:
        failover.log(f"{name}: {warm_claims} warm claims of {2 * trials} moves")
    return {**gaps, "warm_claims": [float(warm_claims)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--modes", default="warm,cold")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if unknown := set(modes) - {"warm", "cold"}:
        parser.error(f"--modes: unknown mode(s) {', '.join(sorted(unknown))}")
    started = time.monotonic()
    raw: dict[str, list[float]] = {}
    with failover.environment() as t, tempfile.TemporaryDirectory() as scratch:
        failover.start_servers(t, SERVERS, SERVER_ENV)
        t.cluster.cli("resource", "upload", "counter", str(COUNTER))
        for mode in modes:
            for key, values in measure(t.cluster, mode, args.trials, Path(scratch)).items():
                raw[f"{mode}_{key}"] = values
    result = {
        "trials": args.trials,
        "raw": raw,
        "summary": {k: failover.summary(v) for k, v in raw.items() if "claims" not in k},
        "seconds": round(time.monotonic() - started, 1),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'output gap (s)':<16} {'n':>3} {'p50':>8} {'p90':>8} {'min':>8} {'max':>8}")
    for key, s in result["summary"].items():
        figures = " ".join(f"{s[p]:>8.1f}" for p in ("p50", "p90", "min", "max"))
        print(f"{key:<16} {s['n']:>3} {figures}")
    for mode in modes:
        print(
            f"{mode}: warm claims {int(raw[f'{mode}_warm_claims'][0])} of {2 * args.trials} moves"
        )
    print(f"total {result['seconds']} s")


if __name__ == "__main__":
    main()
