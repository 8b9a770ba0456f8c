"""A fresh cluster per test: its own database, ZooKeeper root, bucket and folders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.cluster import Cluster


@pytest.fixture
def cluster(
    stack_env: dict[str, str],
    database_url: str,
    zk_root: str,
    s3_bucket: str,
    zk_hosts: str,
    tmp_path: Path,
) -> Iterator[Cluster]:
    c = Cluster(stack_env, database_url, zk_root, s3_bucket, tmp_path, fork_servers=True)
    yield c
    c.close()
