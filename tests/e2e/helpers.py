"""Shared steps of the end-to-end tests: a cluster of servers, light heartbeat jobs."""

from __future__ import annotations

from typing import Any

from tests.cluster import HEARTBEAT_JOB, Cluster

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
