"""The local artifact cache against the stack's S3: verified, atomic, shared, bounded."""

from __future__ import annotations

import concurrent.futures
import io
import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import minio
import pytest
import sqlalchemy as sa

from resource_center import cache, catalog, errors, store
from testing import services

MAX_BYTES = 64 * 1024 * 1024


class CountingStore(store.Store):
    """The real store, counting downloads (not a mock: every byte still comes from S3)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.reads = 0
        self._lock = threading.Lock()

    def read(self, key: str):  # type: ignore[override]
        with self._lock:
            self.reads += 1
        return super().read(key)


def _store_args(stack_env: dict[str, str], endpoint: str, bucket: str) -> dict[str, str]:
    return {
        "endpoint": endpoint,
        "access_key": stack_env["SPARKRING_S3_ACCESS_KEY"],
        "secret_key": stack_env["SPARKRING_S3_SECRET_KEY"],
        "bucket": bucket,
    }


@pytest.fixture
def store_args(stack_env: dict[str, str], s3_endpoint: str, s3_bucket: str) -> dict[str, str]:
    return _store_args(stack_env, s3_endpoint, s3_bucket)


@pytest.fixture
def bucket(store_args: dict[str, str]) -> CountingStore:
    s3 = CountingStore(**store_args)
    s3.ensure_bucket()
    return s3


@pytest.fixture
def local(tmp_path: Path) -> cache.Cache:
    return cache.Cache(root=tmp_path / "work" / "cache", max_bytes=MAX_BYTES)


def _upload(
    engine: sa.Engine, bucket: store.Store, directory: Path, name: str, filename: str, data: bytes
) -> catalog.Resource:
    path = directory / filename
    path.write_bytes(data)
    return catalog.upload(engine, bucket, name=name, path=path, max_bytes=MAX_BYTES)


def _leftovers(local: cache.Cache) -> list[Path]:
    partial = local.root / ".partial"
    return sorted(partial.iterdir()) if partial.exists() else []


def test_fetch_verifies_keeps_the_suffix_and_hits_afterwards(
    engine: sa.Engine, bucket: CountingStore, local: cache.Cache, tmp_path: Path
) -> None:
    data = os.urandom(300_000)
    resource = _upload(engine, bucket, tmp_path, "lib", "lib.jar", _zip_bytes(data))
    bucket.reads = 0
    path = local.fetch(bucket, resource)
    assert path == local.root / f"{resource.sha256}.jar"
    assert catalog.file_sha256(path) == resource.sha256
    assert local.fetch(bucket, resource) == path
    assert bucket.reads == 1
    assert local.entries() == [path] and _leftovers(local) == []


def _zip_bytes(payload: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("data.bin", payload)
    return buffer.getvalue()


def test_corrupted_object_is_refused_and_nothing_is_left(
    engine: sa.Engine,
    bucket: CountingStore,
    local: cache.Cache,
    tmp_path: Path,
    store_args: dict[str, str],
) -> None:
    resource = _upload(engine, bucket, tmp_path, "etl", "job.py", b"print('good')\n")
    client = minio.Minio(
        bucket.host,
        access_key=store_args["access_key"],
        secret_key=store_args["secret_key"],
        secure=False,
    )
    evil = b"print('evil')\n"
    client.put_object(bucket.bucket, resource.object_key, io.BytesIO(evil), len(evil))
    bucket.reads = 0
    with pytest.raises(errors.IntegrityError, match=r"etl:1 .* does not match its sha256") as e:
        local.fetch(bucket, resource, retry_for=5)
    assert "\n" not in str(e.value)
    assert bucket.reads == 1  # an integrity failure is not retried
    assert local.entries() == [] and _leftovers(local) == []
    assert not local.path_for(resource).exists()


def test_tampered_cached_file_is_fetched_again(
    engine: sa.Engine, bucket: CountingStore, local: cache.Cache, tmp_path: Path
) -> None:
    resource = _upload(engine, bucket, tmp_path, "etl", "job.py", b"print('good')\n")
    path = local.fetch(bucket, resource)
    path.chmod(0o644)
    path.write_bytes(b"print('tampered')\n")
    bucket.reads = 0
    assert local.fetch(bucket, resource) == path
    assert path.read_bytes() == b"print('good')\n"
    assert bucket.reads == 1


def test_missing_object_is_a_clear_error(
    engine: sa.Engine, bucket: CountingStore, local: cache.Cache, tmp_path: Path
) -> None:
    resource = _upload(engine, bucket, tmp_path, "etl", "job.py", b"print(1)\n")
    bucket.remove(resource.object_key)
    with pytest.raises(errors.MissingObject, match=f"{resource.object_key} is missing"):
        local.fetch(bucket, resource, retry_for=5)
    assert local.entries() == [] and _leftovers(local) == []


def test_concurrent_fetches_in_threads_download_once(
    engine: sa.Engine, bucket: CountingStore, local: cache.Cache, tmp_path: Path
) -> None:
    resource = _upload(engine, bucket, tmp_path, "big", "big.py", os.urandom(4 * 1024 * 1024))
    bucket.reads = 0
    count = 6
    barrier = threading.Barrier(count)

    def fetch() -> Path:
        barrier.wait(timeout=10)
        return local.fetch(bucket, resource)

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        paths = list(pool.map(lambda _: fetch(), range(count)))
    assert set(paths) == {local.path_for(resource)}
    assert bucket.reads == 1
    assert catalog.file_sha256(paths[0]) == resource.sha256
    assert local.entries() == [paths[0]] and _leftovers(local) == []


_FETCH_IN_A_PROCESS = """
import datetime, json, sys
from pathlib import Path
from tests.integration import test_resource_cache as t
from resource_center import cache, catalog
args = json.loads(sys.argv[1])
resource = catalog.Resource(**{**args["resource"],
    "created_at": datetime.datetime.fromisoformat(args["resource"]["created_at"])})
bucket = t.CountingStore(**args["store"])
print("ready", flush=True)
sys.stdin.readline()
path = cache.Cache(Path(args["root"]), args["max_bytes"]).fetch(bucket, resource)
print(json.dumps({"path": str(path), "reads": bucket.reads}), flush=True)
"""


def test_concurrent_fetches_in_processes_download_once(
    engine: sa.Engine,
    bucket: CountingStore,
    local: cache.Cache,
    tmp_path: Path,
    store_args: dict[str, str],
) -> None:
    resource = _upload(engine, bucket, tmp_path, "big", "big.py", os.urandom(4 * 1024 * 1024))
    argument = json.dumps(
        {
            "resource": resource.to_json(),
            "store": store_args,
            "root": str(local.root),
            "max_bytes": MAX_BYTES,
        }
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _FETCH_IN_A_PROCESS, argument],
            cwd=services.REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        # Release all of them at once, after their (slow) imports.
        for process in processes:
            assert process.stdout is not None and process.stdout.readline() == "ready\n"
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        results = [json.loads(process.communicate(timeout=60)[0]) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert all(process.returncode == 0 for process in processes)
    assert {result["path"] for result in results} == {str(local.path_for(resource))}
    assert sum(result["reads"] for result in results) == 1
    assert catalog.file_sha256(local.path_for(resource)) == resource.sha256
    assert local.entries() == [local.path_for(resource)] and _leftovers(local) == []


def test_least_recently_used_artifacts_are_evicted(
    engine: sa.Engine, bucket: CountingStore, tmp_path: Path
) -> None:
    size = 100_000
    small = cache.Cache(root=tmp_path / "cache", max_bytes=int(2.5 * size))
    first, second, third = (
        _upload(engine, bucket, tmp_path, f"r{i}", "job.py", os.urandom(size)) for i in range(3)
    )
    first_path = small.fetch(bucket, first)
    second_path = small.fetch(bucket, second)
    # Make the order of use unambiguous whatever the file system's timestamp resolution.
    os.utime(first_path, (time.time() - 10, time.time() - 10))
    small.fetch(bucket, first)  # a hit refreshes first: second is now the least recent
    third_path = small.fetch(bucket, third)
    assert set(small.entries()) == {first_path, third_path}
    assert not second_path.exists()
    # An artifact larger than the whole bound is still served, alone.
    tiny = cache.Cache(root=tmp_path / "cache", max_bytes=size // 2)
    assert tiny.fetch(bucket, second) == second_path
    assert tiny.entries() == [second_path]


def test_unreachable_store_is_retried_for_a_bounded_time(
    engine: sa.Engine, bucket: CountingStore, local: cache.Cache, tmp_path: Path
) -> None:
    resource = _upload(engine, bucket, tmp_path, "etl", "job.py", b"print(1)\n")
    dead = CountingStore(
        endpoint="http://127.0.0.1:1",
        access_key="sparkring",
        secret_key="secret-never-shown",
        bucket="sparkring",
    )
    started = time.monotonic()
    with pytest.raises(errors.StoreUnavailable) as caught:
        local.fetch(dead, resource, retry_for=1.0, backoff_base=0.1, backoff_max=0.4)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert message.startswith("cannot reach S3 at http://127.0.0.1:1 to download")
    assert "gave up on etl:1 after" in message and "secret-never-shown" not in message
    assert dead.reads >= 3
    assert 0.9 <= elapsed < 5
    assert local.entries() == [] and _leftovers(local) == []
