"""Versions in PostgreSQL over objects in S3: upload, resolve, delete, gc (real services)."""

from __future__ import annotations

import concurrent.futures
import io
import threading
import zipfile
from pathlib import Path

import minio
import pytest
import sqlalchemy as sa

from resource_center import catalog, errors, store
from sql import tables

MAX_BYTES = 1024 * 1024


@pytest.fixture
def bucket(stack_env: dict[str, str], s3_endpoint: str, s3_bucket: str) -> store.Store:
    s3 = store.Store(
        endpoint=s3_endpoint,
        access_key=stack_env["SPARKRING_S3_ACCESS_KEY"],
        secret_key=stack_env["SPARKRING_S3_SECRET_KEY"],
        bucket=s3_bucket,
    )
    s3.ensure_bucket()
    return s3


def _file(directory: Path, name: str, content: bytes) -> Path:
    path = directory / name
    path.write_bytes(content)
    return path


def _upload(engine: sa.Engine, bucket: store.Store, name: str, path: Path) -> catalog.Resource:
    return catalog.upload(engine, bucket, name=name, path=path, max_bytes=MAX_BYTES)


def _job(engine: sa.Engine, name: str, resource: catalog.Resource) -> int:
    with engine.begin() as connection:
        return connection.execute(
            sa.insert(tables.jobs)
            .values(name=name, kind="batch", resource_id=resource.id, max_restarts=0)
            .returning(tables.jobs.c.id)
        ).scalar_one()


def _object_keys(bucket: store.Store) -> list[str]:
    return bucket.keys()


def test_round_trip(engine: sa.Engine, bucket: store.Store, tmp_path: Path) -> None:
    content = b"print('hello from etl')\n"
    uploaded = _upload(engine, bucket, "etl", _file(tmp_path, "job.py", content))
    assert (uploaded.name, uploaded.version, uploaded.filename) == ("etl", 1, "job.py")
    assert uploaded.size == len(content)
    assert uploaded.object_key == f"sha256/{uploaded.sha256}"
    assert catalog.resolve(engine, "etl") == uploaded
    assert catalog.get(engine, uploaded.id) == uploaded
    assert catalog.list_resources(engine) == [uploaded]
    assert b"".join(bucket.read(uploaded.object_key)) == content


def test_latest_and_pinned_versions(engine: sa.Engine, bucket: store.Store, tmp_path: Path) -> None:
    first = _upload(engine, bucket, "etl", _file(tmp_path, "job.py", b"print(1)\n"))
    second = _upload(engine, bucket, "etl", _file(tmp_path, "job.py", b"print(2)\n"))
    other = _upload(engine, bucket, "other", _file(tmp_path, "o.py", b"print(3)\n"))
    assert (first.version, second.version, other.version) == (1, 2, 1)
    assert catalog.resolve(engine, "etl") == second
    assert catalog.resolve(engine, "etl:1") == first
    assert catalog.resolve(engine, "etl:2") == second
    with pytest.raises(errors.UnknownResource, match=r"'etl' has no version 3 \(latest is etl:2\)"):
        catalog.resolve(engine, "etl:3")
    with pytest.raises(errors.UnknownResource, match="no resource named 'nope'"):
        catalog.resolve(engine, "nope")
    with pytest.raises(errors.UnknownResource, match="no resource with id 999999"):
        catalog.get(engine, 999999)


def test_identical_content_is_not_a_new_version(
    engine: sa.Engine, bucket: store.Store, tmp_path: Path
) -> None:
    path = _file(tmp_path, "job.py", b"print('same')\n")
    first = _upload(engine, bucket, "etl", path)
    assert _upload(engine, bucket, "etl", path) == first
    # The same bytes under another name are a new row sharing the one object.
    shared = _upload(engine, bucket, "copy", path)
    assert shared.object_key == first.object_key and shared.id != first.id
    assert _object_keys(bucket) == [first.object_key]


def test_concurrent_uploads_of_one_name_get_distinct_versions(
    engine: sa.Engine, bucket: store.Store, tmp_path: Path
) -> None:
    count = 8
    paths = [_file(tmp_path, f"job{i}.py", f"print({i})\n".encode()) for i in range(count)]
    barrier = threading.Barrier(count)

    def upload(path: Path) -> catalog.Resource:
        barrier.wait(timeout=10)
        return _upload(engine, bucket, "etl", path)

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        results = list(pool.map(upload, paths))
    assert sorted(r.version for r in results) == list(range(1, count + 1))
    stored = catalog.list_resources(engine)
    assert {(r.filename, r.sha256) for r in stored} == {(r.filename, r.sha256) for r in results}
    assert len(_object_keys(bucket)) == count


def test_referenced_delete_is_refused_naming_the_jobs(
    engine: sa.Engine, bucket: store.Store, tmp_path: Path
) -> None:
    used = _upload(engine, bucket, "etl", _file(tmp_path, "job.py", b"print(1)\n"))
    helper = _upload(engine, bucket, "lib", _file(tmp_path, "lib.py", b"X = 1\n"))
    _job(engine, "nightly", used)
    job_id = _job(engine, "hourly", used)
    with engine.begin() as connection:
        connection.execute(
            sa.insert(tables.job_py_files).values(job_id=job_id, position=0, resource_id=helper.id)
        )
    with pytest.raises(errors.ResourceInUse, match="etl:1 is used by jobs hourly, nightly"):
        catalog.delete(engine, bucket, "etl:1")
    with pytest.raises(errors.ResourceInUse, match="lib is used by job hourly"):
        catalog.delete(engine, bucket, "lib")
    assert catalog.resolve(engine, "etl:1") == used
    assert catalog.referencing_jobs(engine, used) == ["hourly", "nightly"]
    assert bucket.exists(used.object_key) and bucket.exists(helper.object_key)


def test_delete_removes_versions_and_orphaned_objects(
    engine: sa.Engine, bucket: store.Store, tmp_path: Path
) -> None:
    one = _upload(engine, bucket, "etl", _file(tmp_path, "job.py", b"print(1)\n"))
    two = _upload(engine, bucket, "etl", _file(tmp_path, "job.py", b"print(2)\n"))
    twin = _upload(engine, bucket, "twin", _file(tmp_path, "job.py", b"print(2)\n"))
    assert catalog.delete(engine, bucket, "etl:1") == [one]
    assert not bucket.exists(one.object_key)
    with pytest.raises(errors.UnknownResource, match="'etl' has no version 1"):
        catalog.delete(engine, bucket, "etl:1")
    # Deleting NAME deletes every version; an object another name shares stays.
    assert catalog.delete(engine, bucket, "etl") == [two]
    assert bucket.exists(twin.object_key)
    assert catalog.list_resources(engine) == [twin]


def test_gc_removes_only_unreferenced_objects(
    engine: sa.Engine, bucket: store.Store, tmp_path: Path, stack_env: dict[str, str]
) -> None:
    kept = _upload(engine, bucket, "etl", _file(tmp_path, "job.py", b"print(1)\n"))
    orphan = "sha256/" + "0" * 64
    unrelated = "checkpoints/etl/offsets"
    client = minio.Minio(
        bucket.host,
        access_key=stack_env["SPARKRING_S3_ACCESS_KEY"],
        secret_key=stack_env["SPARKRING_S3_SECRET_KEY"],
        secure=False,
    )
    for key in (orphan, unrelated):
        client.put_object(bucket.bucket, key, io.BytesIO(b"x"), 1)
    assert catalog.gc(engine, bucket) == [orphan]
    assert bucket.keys() == [kept.object_key]
    assert client.stat_object(bucket.bucket, unrelated).size == 1
    assert catalog.gc(engine, bucket) == []


@pytest.mark.parametrize(
    ("name", "filename", "content", "message"),
    [
        ("../etc", "job.py", b"x", "resource name '../etc' is invalid"),
        ("a/b", "job.py", b"x", "resource name 'a/b' is invalid"),
        ("etl:2", "job.py", b"x", "resource name 'etl:2' is invalid"),
        ("x" * 129, "job.py", b"x", "is invalid: use 1-128 letters"),
        ("etl", "job.sh", b"x", "unsupported file kind '.sh'"),
        ("etl", "job.zip", b"not a zip", "job.zip is not a valid zip archive"),
        ("etl", "job.py", b"", "the file is empty"),
        ("etl", "job.py", b"x" * (MAX_BYTES + 1), "over the limit of 1048576 bytes"),
    ],
)
def test_bad_input_is_refused_before_anything_is_stored(
    engine: sa.Engine,
    bucket: store.Store,
    tmp_path: Path,
    name: str,
    filename: str,
    content: bytes,
    message: str,
) -> None:
    path = _file(tmp_path, filename, content)
    with pytest.raises(errors.InvalidResource, match=message.replace("(", r"\(")) as caught:
        _upload(engine, bucket, name, path)
    assert "\n" not in str(caught.value)
    assert catalog.list_resources(engine) == []
    assert bucket.keys() == []


def test_valid_zip_is_accepted(engine: sa.Engine, bucket: store.Store, tmp_path: Path) -> None:
    path = tmp_path / "deps.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pkg/__init__.py", "VALUE = 1\n")
    assert _upload(engine, bucket, "deps", path).filename == "deps.zip"
