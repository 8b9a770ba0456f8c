"""Verified local copies of artifacts for drivers, keyed by sha256, bounded in size.

Layout under ``root`` (the server's ``work_dir/cache``)::

    <sha256><suffix>        a verified artifact, read-only; the suffix (.py, .zip, .egg,
                            .jar) is kept because spark-submit decides by it
    .partial/               downloads in progress (never used, removed on failure)
    .locks/<sha256>.lock    one flock per artifact: one download, many waiters

A fetch takes the artifact's lock (threads and processes alike), re-verifies a cached
copy by hashing it (a tampered or rotted file is replaced, never started), or downloads
into ``.partial``, hashing as it writes, fsyncs, compares sha256 and size, and only then
renames into place. A mismatch removes the partial file and raises
:class:`errors.IntegrityError`: nothing is left behind. After a download, least
recently used artifacts (by mtime, refreshed on every hit) are evicted until the cache
fits ``max_bytes``; the artifact just fetched and artifacts locked by another fetch are
never evicted. An artifact larger than the whole bound is still served.

S3 unreachable is retried with exponential backoff for a bounded time (the server path
must ride out a short S3 outage); integrity failures and missing objects are not.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from resource_center import catalog, defaults, errors, store

log = logging.getLogger(__name__)

_ENTRY = re.compile(r"[0-9a-f]{64}\.[a-z0-9]+")


class Cache:
    """A size-bounded directory of verified artifacts shared by every driver of a server."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._partial = self.root / ".partial"
        self._locks = self.root / ".locks"

    def path_for(self, resource: catalog.Resource) -> Path:
        return self.root / f"{resource.sha256}{resource.suffix}"

    def entries(self) -> list[Path]:
        """Cached artifacts, least recently used first."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            if _ENTRY.fullmatch(path.name):
                with contextlib.suppress(FileNotFoundError):
                    found.append((path.stat().st_mtime_ns, path))
        return [path for _, path in sorted(found)]

    def fetch(
        self,
        bucket: store.Store,
        resource: catalog.Resource,
        *,
        retry_for: float = defaults.S3_FETCH_RETRY_S,
        backoff_base: float = defaults.S3_FETCH_BACKOFF_BASE_S,
        backoff_max: float = defaults.S3_FETCH_BACKOFF_MAX_S,
        stop: threading.Event | None = None,
    ) -> Path:
        """A local path holding exactly the resource's bytes (sha256 verified).

        Retries an unreachable S3 for up to ``retry_for`` seconds (``stop`` ends the
        wait early); raises :class:`errors.IntegrityError` on a mismatch and
        :class:`errors.MissingObject` when the object is gone.
        """
        for directory in (self.root, self._partial, self._locks):
            directory.mkdir(parents=True, exist_ok=True)
        final = self.path_for(resource)
        with self._locked(resource.sha256):
            if final.exists():
                if _matches(final, resource):
                    os.utime(final)  # the mtime is the LRU clock
                    log.debug(
                        "cache hit", extra={"action": "fetch", "resource": resource.reference}
                    )
                    return final
                log.warning(
                    "cached artifact does not match its sha256; fetching it again",
                    extra={"action": "fetch", "resource": resource.reference, "path": str(final)},
                )
                final.unlink()
            self._download_retrying(
                bucket, resource, final, retry_for, backoff_base, backoff_max, stop
            )
        self._evict(keep=final)
        return final

    def _download_retrying(
        self,
        bucket: store.Store,
        resource: catalog.Resource,
        final: Path,
        retry_for: float,
        backoff_base: float,
        backoff_max: float,
        stop: threading.Event | None,
    ) -> None:
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                self._download(bucket, resource, final)
                return
            except errors.StoreUnavailable as exc:
                elapsed = time.monotonic() - started
                delay = min(backoff_max, backoff_base * 2 ** (attempt - 1), retry_for - elapsed)
                if delay <= 0 or (stop is not None and stop.is_set()):
                    raise errors.StoreUnavailable(
                        f"{exc} (gave up on {resource.reference} after {attempt} attempts "
                        f"in {elapsed:.1f} s)"
                    ) from None
                log.warning(
                    "S3 unreachable; retrying",
                    extra={
                        "action": "fetch",
                        "resource": resource.reference,
                        "attempt": attempt,
                        "delay_s": round(delay, 3),
                        "error": str(exc),
                    },
                )
                if stop is not None:
                    stop.wait(delay)
                else:
                    time.sleep(delay)

    def _download(self, bucket: store.Store, resource: catalog.Resource, final: Path) -> None:
        partial = self._partial / f"{resource.sha256}.{os.getpid()}.{uuid.uuid4().hex}"
        try:
            digest, size = _hashing_copy(bucket.read(resource.object_key), partial)
            if (digest, size) != (resource.sha256, resource.size):
                raise errors.IntegrityError(
                    f"artifact {resource.reference} from {bucket.describe(resource.object_key)}"
                    f" does not match its sha256 (got {digest[:12]}… and {size} bytes, expected "
                    f"{resource.sha256[:12]}… and {resource.size} bytes): refusing it"
                )
            partial.chmod(0o444)  # cached artifacts are never modified, only replaced
            os.replace(partial, final)
            _fsync_directory(self.root)
        finally:
            partial.unlink(missing_ok=True)
        log.info(
            "fetched",
            extra={"action": "fetch", "resource": resource.reference, "size": resource.size},
        )

    def _evict(self, keep: Path) -> None:
        with self._locked("evict"):
            entries = self.entries()
            total = sum(_size(path) for path in entries)
            for path in entries:
                if total <= self.max_bytes:
                    break
                if path == keep:
                    continue
                # An artifact another fetch holds (verifying, or about to return) stays.
                with self._locked(path.name[:64], blocking=False) as held:
                    if not held:
                        continue
                    size = _size(path)
                    path.unlink(missing_ok=True)
                    total -= size
                    log.info("evicted", extra={"action": "evict", "path": str(path)})

    @contextlib.contextmanager
    def _locked(self, name: str, blocking: bool = True) -> Iterator[bool]:
        """An exclusive flock on ``.locks/<name>.lock``; yields False if not blocking and busy."""
        with (self._locks / f"{name}.lock").open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _hashing_copy(chunks: Iterator[bytes], target: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with target.open("xb") as out:
        for chunk in chunks:
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest(), size


def _matches(path: Path, resource: catalog.Resource) -> bool:
    if _size(path) != resource.size:
        return False
    return catalog.file_sha256(path) == resource.sha256


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
