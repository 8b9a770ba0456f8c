"""The bucket that holds artifact bytes, through the ``minio`` client.

Objects are keyed by the sha256 of their content (``sha256/<hex>``), so an object never
changes once written: the same key always means the same bytes, and a version row can
point at it for ever. This module only moves bytes and translates failures; which
versions exist is the catalog's business, verification the catalog's and the cache's.

Failures become :mod:`resource_center.errors`: S3 unreachable or failing transiently
(connection refused, reset, timeout, HTTP 5xx) is :class:`errors.StoreUnavailable`
naming the endpoint; an S3 error answer is :class:`errors.StoreError` (a missing object
:class:`errors.MissingObject`). Credentials never appear in messages or logs.

The client retries once inside urllib3; longer, bounded retries belong to the caller
(``cache.fetch`` on the server path). The CLI fails fast with one clear line.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import minio
import urllib3
from minio import deleteobjects
from minio import error as minio_error

from resource_center import defaults, errors

OBJECT_PREFIX = "sha256/"
OBJECT_KEY = re.compile(r"sha256/[0-9a-f]{64}")
# Bytes per read while streaming: small enough for a smooth progress bar, large enough
# that Python overhead is negligible.
CHUNK_BYTES = 1024 * 1024
# Multipart part size, bytes: fewer round trips than minio's 5 MiB minimum; minio holds
# up to three parts in memory while uploading them in parallel.
PART_BYTES = 16 * 1024 * 1024

# Called with the number of bytes just sent (rich's ``Progress.advance`` fits).
Progress = Callable[[int], None]

# Keys per DeleteObjects request: the most S3 accepts in one.
DELETE_BATCH = 1000

_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchObject"})
_CREATED_CODES = frozenset({"BucketAlreadyOwnedByYou", "BucketAlreadyExists"})


def object_key(sha256: str) -> str:
    return OBJECT_PREFIX + sha256


def parse_endpoint(endpoint: str, secure: bool) -> tuple[str, bool]:
    """``host:port`` keeps ``secure``; ``http(s)://host:port`` decides it by its scheme."""
    if "://" not in endpoint:
        host, scheme_secure = endpoint, secure
    else:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https"):
            raise errors.StoreError(f"S3 endpoint {endpoint!r} must be http:// or https://")
        if parts.path not in ("", "/") or parts.query or parts.username:
            raise errors.StoreError(
                f"S3 endpoint {parts.scheme}://{parts.hostname}: give only scheme, host "
                "and port (no path, query or credentials)"
            )
        host, scheme_secure = parts.netloc, parts.scheme == "https"
    if not host or "/" in host:
        raise errors.StoreError(f"S3 endpoint {endpoint!r} is not host:port")
    return host, scheme_secure


class _Reader:
    """A file wrapper that reports progress and hashes what minio actually read."""

    def __init__(self, stream: BinaryIO, progress: Progress | None) -> None:
        self._stream = stream
        self._progress = progress
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        if size < 0 or size > CHUNK_BYTES:
            size = CHUNK_BYTES
        data = self._stream.read(size)
        self.digest.update(data)
        if data and self._progress is not None:
            self._progress(len(data))
        return data


class Store:
    """One bucket on one S3-compatible endpoint (MinIO in production)."""

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str,
        secure: bool = defaults.S3_SECURE,
        region: str = defaults.S3_REGION,
        connect_timeout: float = defaults.S3_CONNECT_TIMEOUT_S,
        read_timeout: float = defaults.S3_READ_TIMEOUT_S,
    ) -> None:
        self.host, self.secure = parse_endpoint(endpoint, secure)
        self.bucket = bucket
        self.region = region
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
            # Room for concurrent fetches plus minio's three parallel part uploads.
            maxsize=16,
            retries=urllib3.Retry(
                total=1, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)
            ),
        )
        # The region is given so minio never asks the server for the bucket's location.
        self._client = minio.Minio(
            self.host,
            access_key=access_key,
            secret_key=secret_key,
            secure=self.secure,
            region=region,
            http_client=http,
        )

    @property
    def endpoint(self) -> str:
        """``scheme://host:port`` for messages; never carries credentials."""
        return f"{'https' if self.secure else 'http'}://{self.host}"

    def describe(self, key: str | None = None) -> str:
        where = f"{self.endpoint}/{self.bucket}"
        return f"{where}/{key}" if key else where

    @contextlib.contextmanager
    def _translated(self, action: str, key: str | None = None) -> Iterator[None]:
        """Turn minio/urllib3 failures into resource center errors naming the endpoint."""
        try:
            yield
        except minio_error.S3Error as exc:
            if exc.code in _MISSING_CODES:
                raise errors.MissingObject(
                    f"object {self.describe(key)} is missing from the bucket"
                ) from None
            raise errors.StoreError(
                f"S3 at {self.endpoint} refused to {action} ({exc.code}: {exc.message})"
            ) from None
        except minio_error.ServerError as exc:
            raise errors.StoreUnavailable(
                f"S3 at {self.endpoint} failed to {action} (HTTP {exc.status_code})"
            ) from None
        except minio_error.InvalidResponseError as exc:
            raise errors.StoreError(
                f"S3 at {self.endpoint} gave an invalid answer to {action}: "
                f"{str(exc).splitlines()[0][:200]}"
            ) from None
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
            raise errors.StoreUnavailable(
                f"cannot reach S3 at {self.endpoint} to {action}: {_reason(exc)}"
            ) from None
        except ValueError as exc:
            # minio validates bucket and object names locally with ValueError.
            raise errors.StoreError(f"S3 at {self.endpoint}: cannot {action}: {exc}") from None

    def ensure_bucket(self) -> None:
        """Create the bucket if absent; several processes may race to do it."""
        with self._translated(f"create bucket {self.bucket}"):
            if self._client.bucket_exists(self.bucket):
                return
            try:
                self._client.make_bucket(self.bucket, location=self.region)
            except minio_error.S3Error as exc:
                if exc.code not in _CREATED_CODES:
                    raise

    def remove_bucket(self) -> None:
        """Remove the bucket, which must be empty (scratch buckets of benchmarks)."""
        with self._translated(f"remove bucket {self.bucket}"):
            self._client.remove_bucket(self.bucket)

    def exists(self, key: str) -> bool:
        with self._translated(f"look up {key}", key):
            try:
                self._client.stat_object(self.bucket, key)
            except minio_error.S3Error as exc:
                if exc.code in _MISSING_CODES or exc.code == "NotFound":
                    return False
                raise
        return True

    def put(self, key: str, path: Path, size: int, progress: Progress | None = None) -> str:
        """Upload a file under ``key``; the sha256 of the bytes that were actually sent.

        S3 makes an object visible only when its upload completes (a multipart upload
        only on completion), so a failure here never leaves a partial object under key.
        """
        with path.open("rb") as stream, self._translated(f"upload {key}", key):
            reader = _Reader(stream, progress)
            self._client.put_object(
                self.bucket,
                key,
                reader,
                size,
                part_size=PART_BYTES,  # type: ignore[arg-type]
            )
        return reader.digest.hexdigest()

    def read(self, key: str) -> Iterator[bytes]:
        """Stream an object's bytes in chunks; failures mid-stream are translated too."""
        with self._translated(f"download {key}", key):
            response = self._client.get_object(self.bucket, key)
            try:
                yield from response.stream(CHUNK_BYTES)
            finally:
                response.close()
                response.release_conn()

    def sha256(self, key: str) -> tuple[str, int]:
        """Hash an object as stored: (hex digest, size). Reads every byte back."""
        digest, size = hashlib.sha256(), 0
        for chunk in self.read(key):
            digest.update(chunk)
            size += len(chunk)
        return digest.hexdigest(), size

    def remove(self, key: str) -> None:
        with self._translated(f"remove {key}", key):
            self._client.remove_object(self.bucket, key)

    def keys(self) -> list[str]:
        """Every artifact object key in the bucket (others are none of our business)."""
        with self._translated(f"list bucket {self.bucket}"):
            names = [
                item.object_name
                for item in self._client.list_objects(
                    self.bucket, prefix=OBJECT_PREFIX, recursive=True
                )
            ]
        return sorted(name for name in names if name and OBJECT_KEY.fullmatch(name))

    def listed(self, prefix: str) -> list[tuple[str, datetime]]:
        """Every object under ``prefix``: (key, LastModified), sorted by key. A bucket
        not created yet (nothing was ever uploaded) holds nothing."""
        with self._translated(f"list {prefix} in bucket {self.bucket}"):
            try:
                found = [
                    (item.object_name, item.last_modified)
                    for item in self._client.list_objects(
                        self.bucket, prefix=prefix, recursive=True
                    )
                    if item.object_name and item.last_modified is not None
                ]
            except minio_error.S3Error as exc:
                if exc.code != "NoSuchBucket":
                    raise
                return []
        return sorted(found)

    def remove_many(self, keys: Sequence[str]) -> None:
        """Remove objects, up to :data:`DELETE_BATCH` per request; a key already gone is
        not an error (S3 reports none), any other refusal is a StoreError."""
        for start in range(0, len(keys), DELETE_BATCH):
            chunk = keys[start : start + DELETE_BATCH]
            with self._translated(f"remove {len(chunk)} objects"):
                failures = list(
                    self._client.remove_objects(
                        self.bucket, [deleteobjects.DeleteObject(key) for key in chunk]
                    )
                )
            if failures:
                first = failures[0]
                raise errors.StoreError(
                    f"S3 at {self.endpoint} refused to remove {len(failures)} objects "
                    f"({first.code}: {first.message}, e.g. {first.name})"
                )


def _reason(exc: BaseException) -> str:
    """The innermost cause of a urllib3 failure, shortened to one line."""
    inner: BaseException = exc
    while isinstance(inner, urllib3.exceptions.MaxRetryError) and inner.reason is not None:
        inner = inner.reason
    text = str(inner).strip().splitlines()[0] if str(inner).strip() else type(inner).__name__
    # urllib3 prefixes messages with the connection object's repr; keep the useful tail.
    text = re.sub(r"^(<urllib3\.[^>]*>|HTTPS?Connection\([^)]*\)):\s*", "", text)
    return text[:200]
