"""Resource center throughput: upload and fetch of a large artifact, and a cache hit.

Runs against the configured PostgreSQL and S3 (``SPARKRING_*`` variables or
``--config``) in a scratch database and a scratch bucket, both removed afterwards::

    eval "$(python3 scripts/stack.py env)"
    .venv/bin/python -m benchmarks.resource_throughput [--size-mb 50] [--repeat 3] [--json]

Each repeat uploads fresh random content (so nothing is deduplicated), fetches it into
an empty cache (cold), then fetches it again (hit: the cached copy is re-hashed).
Figures are medians over the repeats. Upload time is end to end: local sha256, PUT
(multipart), and the read-back that verifies the stored bytes before the row is written.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from resource_center import cache, catalog, store
from server import settings as settings_module
from server.cli import console
from sql import database, migrate

REPO = Path(__file__).resolve().parent.parent

MIB = 1024 * 1024


class TimedStore(store.Store):
    """The real store, timing its PUTs and its verifying read-backs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.put_s = 0.0
        self.verify_s = 0.0

    def put(self, *args: Any, **kwargs: Any) -> str:
        started = time.perf_counter()
        try:
            return super().put(*args, **kwargs)
        finally:
            self.put_s += time.perf_counter() - started

    def sha256(self, key: str) -> tuple[str, int]:
        started = time.perf_counter()
        try:
            return super().sha256(key)
        finally:
            self.verify_s += time.perf_counter() - started


def _scratch_database(url: str) -> str:
    name = f"bench_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(
        database.parse_url(url).set(database="postgres"),
        poolclass=NullPool,
        isolation_level="AUTOCOMMIT",
    )
    with admin.connect() as connection:
        connection.execute(sa.text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return database.parse_url(url).set(database=name).render_as_string(hide_password=False)


def _drop_database(url: str) -> None:
    parsed = database.parse_url(url)
    admin = sa.create_engine(
        parsed.set(database="postgres"), poolclass=NullPool, isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as connection:
        connection.execute(sa.text(f"DROP DATABASE IF EXISTS {parsed.database} WITH (FORCE)"))
    admin.dispose()


def run(settings: settings_module.Settings, size_mb: int, repeat: int) -> dict[str, Any]:
    url = _scratch_database(settings.database_url.get_secret_value())
    engine = database.create_engine(url)
    bucket = TimedStore(
        endpoint=settings.s3_endpoint,
        access_key=settings.s3_access_key.get_secret_value(),
        secret_key=settings.s3_secret_key.get_secret_value(),
        bucket=f"bench-{uuid.uuid4().hex[:12]}",
        secure=settings.s3_secure,
        region=settings.s3_region,
    )
    size = size_mb * MIB
    uploads, puts, verifies, colds, hits = [], [], [], [], []
    try:
        migrate.upgrade(engine)
        bucket.ensure_bucket()
        with tempfile.TemporaryDirectory(prefix="sparkring-bench-") as scratch:
            for attempt in range(repeat):
                path = Path(scratch) / "artifact.py"
                path.write_bytes(os.urandom(size))
                bucket.put_s = bucket.verify_s = 0.0
                started = time.perf_counter()
                resource = catalog.upload(
                    engine, bucket, name="bench", path=path, max_bytes=size + 1
                )
                uploads.append(time.perf_counter() - started)
                puts.append(bucket.put_s)
                verifies.append(bucket.verify_s)

                local = cache.Cache(Path(scratch) / f"cache-{attempt}", max_bytes=4 * size)
                started = time.perf_counter()
                local.fetch(bucket, resource)
                colds.append(time.perf_counter() - started)
                for _ in range(3):
                    started = time.perf_counter()
                    local.fetch(bucket, resource)
                    hits.append(time.perf_counter() - started)
    finally:
        engine.dispose()
        try:
            for key in bucket.keys():
                bucket.remove(key)
            bucket.remove_bucket()
        finally:
            _drop_database(url)

    def rate(seconds: list[float]) -> float:
        return round(size_mb / statistics.median(seconds), 1)

    return {
        "size_mb": size_mb,
        "repeat": repeat,
        "endpoint": bucket.endpoint,
        "upload_mb_s": rate(uploads),
        "upload_s": round(statistics.median(uploads), 3),
        "upload_put_mb_s": rate(puts),
        "upload_verify_mb_s": rate(verifies),
        "fetch_cold_mb_s": rate(colds),
        "fetch_cold_s": round(statistics.median(colds), 3),
        "fetch_hit_ms": round(statistics.median(hits) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=50, help="artifact size, MiB")
    parser.add_argument("--repeat", type=int, default=3, help="repeats; medians are reported")
    parser.add_argument("--config", type=Path, default=None, help="settings TOML file")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    figures = run(settings_module.load(args.config), args.size_mb, args.repeat)
    if args.json:
        console.emit_json(figures)
        return
    print(f"artifact: {args.size_mb} MiB of random bytes, {args.repeat} repeats (medians)")
    print(f"S3: {figures['endpoint']}")
    print(
        f"upload (hash + PUT + verifying read-back): {figures['upload_mb_s']} MiB/s "
        f"({figures['upload_s']} s); PUT alone {figures['upload_put_mb_s']} MiB/s, "
        f"read-back {figures['upload_verify_mb_s']} MiB/s"
    )
    print(
        f"fetch into an empty cache (download + sha256 + fsync + rename): "
        f"{figures['fetch_cold_mb_s']} MiB/s ({figures['fetch_cold_s']} s)"
    )
    print(f"fetch, cache hit (re-hash of the cached copy): {figures['fetch_hit_ms']} ms")


if __name__ == "__main__":
    main()
