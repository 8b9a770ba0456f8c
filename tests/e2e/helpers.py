"""Shared steps of the end-to-end tests: a cluster of servers, light heartbeat jobs, and
a real Structured Streaming job (examples/jobs/streaming_counter.py)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

from testing import sink, waiting
from testing.cluster import EXAMPLES, HEARTBEAT_JOB, Cluster, overlaps

STREAMING_COUNTER = EXAMPLES / "streaming_counter.py"

SERVERS = ("s1", "s2", "s3")


def start_cluster(
    c: Cluster, servers: tuple[str, ...] = SERVERS, capacity: int = 4, command: str = "run"
) -> None:
    for sid in servers:
        c.start_server(sid, capacity=capacity, command=command)
    c.wait_members(len(servers))


def heartbeat_job(
    c: Cluster, name: str, *, kind: str = "streaming", extra: list[str] = (), max_restarts: int = 3
) -> None:
    if c.cli("resource", "show", "heartbeat", check=False).returncode != 0:
        c.cli("resource", "upload", "heartbeat", str(HEARTBEAT_JOB))
    c.cli(
        "job",
        "create",
        name,
        "--resource",
        "heartbeat",
        "--kind",
        kind,
        "--max-restarts",
        str(max_restarts),
        f"--arg={c.heartbeats}",
        *(f"--arg={a}" for a in extra),
    )


def running(job: dict[str, Any]) -> bool:
    return job["state"] == "running" and job["owner"] is not None


def start_running(c: Cluster, names: list[str], timeout: float = 120) -> dict[str, dict[str, Any]]:
    """Create and start a heartbeat job per name; wait until each runs. Their rows."""
    for name in names:
        heartbeat_job(c, name)
        c.cli("job", "start", name)
    return {name: c.wait_job(name, running, timeout, f"{name} running") for name in names}


def start_streaming_counter(c: Cluster, *create: str) -> tuple[Path, dict[str, Any]]:
    """Upload examples/jobs/streaming_counter.py as resource ``counter``, create the
    streaming job ``stream`` from it (local[1], one shuffle partition, ``create``'s extra
    ``job create`` arguments), start it and wait for three committed micro-batches.
    Returns its output folder and its row once running."""
    output = c.root / "stream-out"
    c.cli("resource", "upload", "counter", str(STREAMING_COUNTER))
    c.cli(
        "job", "create", "stream", "--resource", "counter", "--master", "local[1]",
        "--conf", "spark.sql.shuffle.partitions=1", f"--arg={output}", *create,
    )  # fmt: skip
    c.cli("job", "start", "stream")
    first = c.wait_job("stream", running, 120, "streaming job running")
    waiting.wait_until(
        lambda: sink.committed_batches(output) >= 3, 180, interval=0.5,
        message="three micro-batches committed",
    )  # fmt: skip
    return output, first


def upload_counter_version(c: Cluster, folder: Path, edit: Any = lambda text: text) -> None:
    """Upload a new version of resource ``counter``: streaming_counter.py through
    ``edit`` (text -> text), written under ``folder``."""
    folder.mkdir()
    version = folder / STREAMING_COUNTER.name
    version.write_text(edit(STREAMING_COUNTER.read_text()))
    c.cli("resource", "upload", "counter", str(version))


def stop_after_more_batches_exactly_once(
    c: Cluster, job: str, output: Path, timeout: float, what: str
) -> None:
    """Wait until the streaming ``job`` committed three more micro-batches to ``output``
    (``what`` names whose), stop it, and check that its output holds every value from 0
    once: none written twice, none lost."""
    before = sink.committed_batches(output)
    waiting.wait_until(
        lambda: sink.committed_batches(output) >= before + 3, timeout, interval=0.5,
        message=f"{what} committed three more micro-batches",
    )  # fmt: skip
    c.cli("job", "stop", job)
    c.wait_job(job, lambda j: j["state"] == "stopped", 60, "job stopped")
    values = sink.committed_values(output)
    assert len(values) == len(set(values)), "a value was written twice"
    assert sorted(values) == list(range(min(values), max(values) + 1)), "a value was lost"
    assert min(values) == 0


def overlapping_heartbeats(records: list[dict[str, Any]]) -> list[str]:
    """Two driver processes of one job alive in the same instant (heartbeat spans)."""
    spans: dict[tuple[str, int], list[float]] = {}
    for r in records:
        span = spans.setdefault((r["job"], r["pid"]), [r["t"], r["t"]])
        span[0], span[1] = min(span[0], r["t"]), max(span[1], r["t"])
    by_job: dict[str, list[list[float]]] = defaultdict(list)
    for (job, _), span in spans.items():
        by_job[job].append(span)
    problems = []
    for job, items in by_job.items():
        items.sort()
        for before, after in itertools.pairwise(items):
            if after[0] < before[1]:
                problems.append(f"{job}: {before} overlaps {after}")
    return problems


def assert_single_drivers(c: Cluster) -> None:
    """S1 from both sides: no two drivers of one job alive at once, by their heartbeats
    and by their watchdogs' lifetime records."""
    assert overlapping_heartbeats(c.heartbeat_records()) == []
    assert overlaps(c.driver_records()) == []
