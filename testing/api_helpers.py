"""A real server for the HTTP API and console tests, shared by a test module.

One ``sparkring server run`` subprocess (role coordinator: it runs no drivers, so
started jobs stay pending and no Spark JVM is spent) on its own database, ZooKeeper root
and bucket; a viewer and an operator token made with the CLI; an ``httpx`` client.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from registry import servers
from scheduler import tokens
from testing import services, waiting
from testing.cluster import HEARTBEAT_JOB, Cluster

API = "/api/v1"


@dataclass
class ApiStack:
    cluster: Cluster
    url: str  # base URL of server s1
    viewer: str  # tokens
    operator: str

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)

    def members(self) -> dict[str, servers.ServerInfo]:
        env = self.cluster.env
        live = servers.list_servers(env["SPARKRING_ZK_HOSTS"], env["SPARKRING_ZK_ROOT"])
        return {info.id: info for info in live}

    def wait_members(self, ids: set[str], timeout: float = 30) -> None:
        waiting.wait_until(
            lambda: set(self.members()) == ids, timeout, interval=0.2, message=f"members {ids}"
        )

    def token(self, name: str, role: str) -> str:
        """A new token, made in-process (the CLI path has tests of its own)."""
        with self.cluster.engine.begin() as conn:
            return tokens.create(conn, name, role)

    def create_job(self, name: str, **extra: Any) -> dict[str, Any]:
        with self.client(self.operator) as http:
            reply = http.post(f"{API}/jobs", json={"name": name, "resource": "heartbeat", **extra})
        assert reply.status_code == 201, reply.text
        return reply.json()


def api_stack(
    postgres_url: str,
    stack_env: dict[str, str],
    root: Path,
    extra_env: dict[str, str] | None = None,
) -> Iterator[ApiStack]:
    """Start the server (``extra_env`` added to its environment), wait until it is
    registered and healthy, yield, clean up."""
    database_url = services.create_test_database(postgres_url)
    zk_root = f"/sparkring-test/{services.unique_name('api')}"
    cluster = Cluster(
        stack_env,
        database_url,
        zk_root,
        services.unique_name("api"),
        root,
        extra_env,
        fork_servers=True,
    )
    try:
        cluster.start_server("s1", capacity=0, role="coordinator")
        cluster.cli("resource", "upload", "heartbeat", str(HEARTBEAT_JOB))
        stack = ApiStack(cluster=cluster, url="", viewer="", operator="")
        stack.viewer = stack.token("watcher", "viewer")
        stack.operator = stack.token("ops", "operator")
        stack.wait_members({"s1"})
        stack.url = stack.members()["s1"].health_url

        def healthy() -> bool:
            try:
                return httpx.get(stack.url + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        waiting.wait_until(healthy, 30, interval=0.2, message="s1 healthy")
        yield stack
    finally:
        cluster.close()
        services.drop_database(database_url)
