"""Driver logs of current runs: the tail of a local log file, or of a peer's over HTTP.

The server that runs a driver serves its log at ``/logs/<job>?lines=N`` to holders of
a token (``server/api.py``), and with ``follow=true`` keeps the response open, sending
what the driver writes until the run ends. Other servers and the CLI present the cluster credential
(``server/tokens.py``) when they fetch it from there.
"""

from __future__ import annotations

import collections
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

from resource_center import errors, store

# The most lines one request returns.
MAX_LINES = 10_000
# Following a live log: how often an idle file is checked, and the longest one stream
# lasts (a client follows on by asking again), seconds.
FOLLOW_POLL_S = 0.5
FOLLOW_MAX_S = 3600.0
CHUNK_BYTES = 64 * 1024
# S3 keeps an object's LastModified to the second.
LAST_MODIFIED_RESOLUTION = timedelta(seconds=1)


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of ``path`` (read as a stream: logs can be large)."""
    lines = max(1, min(lines, MAX_LINES))
    with path.open("r", errors="replace") as handle:
        last = collections.deque(handle, maxlen=lines)
    return "".join(line if line.endswith("\n") else line + "\n" for line in last)


def fetch(health_url: str, job: str, lines: int, secret: str, timeout: float = 5.0) -> str | None:
    """The tail of ``job``'s live log from the server at ``health_url``; None if that
    server does not answer or runs no driver of the job."""
    url = f"{health_url}/logs/{urllib.parse.quote(job, safe='')}?lines={int(lines)}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {secret}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def shipped(bucket: store.Store, key: str, lines: int) -> str | None:
    """The tail of a finished run's log shipped to S3 under ``key``; None if absent."""
    try:
        if not bucket.exists(key):
            return None
        data = b"".join(bucket.read(key)).decode(errors="replace")
    except errors.ResourceError:
        return None
    lines = max(1, min(lines, MAX_LINES))
    return "\n".join(data.splitlines()[-lines:]) + "\n"


def shipped_run(
    bucket: store.Store, key: str, legacy_key: str, created_at: datetime, lines: int
) -> str | None:
    """The tail of a finished run's shipped log: under ``key`` (``runner.log_key``), else
    under the older code's ``legacy_key`` (``runner.legacy_log_key``, name and epoch
    only) if that object was written after the job was created: an older one is a
    deleted namesake's (hole H6). None if neither is there."""
    text = shipped(bucket, key, lines)
    if text is not None:
        return text
    try:
        modified = dict(bucket.listed(legacy_key)).get(legacy_key)
    except errors.ResourceError:
        return None
    # LastModified is kept to the second: the object may be up to a second younger.
    if modified is None or modified + LAST_MODIFIED_RESOLUTION <= created_at:
        return None
    return shipped(bucket, legacy_key, lines)


def follow(
    path: Path,
    lines: int,
    still_running: Callable[[], bool],
    poll: float = FOLLOW_POLL_S,
    max_seconds: float = FOLLOW_MAX_S,
) -> Iterator[bytes]:
    """The last ``lines`` lines of ``path``, then whatever is appended to it, until the
    run ends (``still_running()`` is false and nothing more was written) or
    ``max_seconds`` pass. Nothing is lost between the tail and the follow: both read
    one open file."""
    lines = max(1, min(lines, MAX_LINES))
    deadline = time.monotonic() + max_seconds
    with path.open("rb") as handle:
        yield b"".join(collections.deque(handle, maxlen=lines))
        while time.monotonic() < deadline:
            chunk = handle.read(CHUNK_BYTES)
            if chunk:
                yield chunk
            elif still_running():
                time.sleep(poll)
            else:
                return


def follow_remote(
    health_url: str, job: str, lines: int, secret: str, max_seconds: float = FOLLOW_MAX_S
) -> Iterator[bytes] | None:
    """``follow`` on the server at ``health_url`` (its ``/logs/<job>?follow=true``),
    relayed; None if that server does not answer or runs no driver of the job."""
    url = f"{health_url}/logs/{urllib.parse.quote(job, safe='')}?lines={int(lines)}&follow=true"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {secret}"})
    try:
        response = urllib.request.urlopen(request, timeout=max_seconds)
    except (urllib.error.URLError, OSError, ValueError):
        return None

    def relay() -> Iterator[bytes]:
        with response:
            try:
                while chunk := response.read1(CHUNK_BYTES):
                    yield chunk
            except OSError:  # the owner went away mid-stream: the stream just ends
                return

    return relay()
