"""S3 failing under the resource center, on a throwaway S3 server of this test's own.

The stack's shared S3 server is never stopped: each test starts ``moto_server`` on a free
port and kills it at the moment it wants S3 gone.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from resource_center import cache, catalog, errors, store
from testing import services, waiting
from tests import conftest


@pytest.fixture
def throwaway_s3(s3_endpoint: str) -> Iterator[services.ThrowawayS3]:
    if not services.MOTO_SERVER.exists():
        conftest.unavailable(f"{services.MOTO_SERVER} is not installed")
    server = services.ThrowawayS3()
    server.start()
    yield server
    server.kill()


class CountingStore(store.Store):
    """The real store, counting download attempts; attempts past ``hold_after`` wait for
    ``resume``, so a test can restart S3 between two retries without racing them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads = 0
        self.hold_after: int | None = None
        self.resume = threading.Event()

    def read(self, key: str):  # type: ignore[override]
        self.reads += 1
        if self.hold_after is not None and self.reads > self.hold_after:
            self.resume.wait(30)
        return super().read(key)


def _store(stack_env: dict[str, str], endpoint: str, bucket: str) -> CountingStore:
    s3 = CountingStore(
        endpoint=endpoint,
        access_key=stack_env["SPARKRING_S3_ACCESS_KEY"],
        secret_key=stack_env["SPARKRING_S3_SECRET_KEY"],
        bucket=bucket,
    )
    s3.ensure_bucket()
    return s3


def test_s3_killed_during_upload_leaves_no_version(
    engine: sa.Engine,
    throwaway_s3: services.ThrowawayS3,
    stack_env: dict[str, str],
    s3_endpoint: str,
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    doomed = _store(stack_env, throwaway_s3.endpoint, s3_bucket)
    path = tmp_path / "big.py"
    path.write_bytes(os.urandom(40 * 1024 * 1024))
    sent = 0

    def kill_midway(count: int) -> None:
        nonlocal sent
        sent += count
        if sent >= 20 * 1024 * 1024:  # after the first part went out, mid second
            throwaway_s3.kill()

    with pytest.raises(errors.StoreError) as caught:
        catalog.upload(engine, doomed, name="etl", path=path, max_bytes=2**30, progress=kill_midway)
    assert f"S3 at http://{throwaway_s3.endpoint}" in str(caught.value)
    assert stack_env["SPARKRING_S3_SECRET_KEY"] not in str(caught.value)
    assert catalog.list_resources(engine) == []
    # The failed attempt consumed nothing: the next successful upload is version 1.
    healthy = _store(stack_env, s3_endpoint, s3_bucket)
    small = tmp_path / "job.py"
    small.write_bytes(b"print(1)\n")
    assert catalog.upload(engine, healthy, name="etl", path=small, max_bytes=2**30).version == 1


def test_fetch_rides_out_an_s3_outage(
    engine: sa.Engine,
    throwaway_s3: services.ThrowawayS3,
    stack_env: dict[str, str],
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    s3 = _store(stack_env, throwaway_s3.endpoint, s3_bucket)
    path = tmp_path / "job.py"
    path.write_bytes(b"print('survived')\n")
    resource = catalog.upload(engine, s3, name="etl", path=path, max_bytes=2**20)
    throwaway_s3.kill()
    s3.reads, s3.hold_after = 0, 2
    local = cache.Cache(root=tmp_path / "cache", max_bytes=2**20)
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fetching = pool.submit(
            local.fetch, s3, resource, retry_for=60, backoff_base=0.1, backoff_max=0.5, stop=stop
        )
        try:
            # Two attempts failed against the dead server; the third waits for resume.
            waiting.wait_until(lambda: s3.reads >= 3, 10, message="fetch did not retry")
            assert not fetching.done()
            # moto keeps objects in memory: the restarted server needs the object again.
            throwaway_s3.start()
            s3.ensure_bucket()
            s3.put(resource.object_key, path, resource.size)
            s3.resume.set()
            fetched = fetching.result(timeout=30)
        finally:
            s3.resume.set()
            stop.set()
    assert fetched.read_bytes() == b"print('survived')\n"
    assert s3.reads == 3
