"""Driver logs of current runs: the tail of a local log file, or of a peer's over HTTP.

The server that runs a driver serves its log at ``/logs/<job>?lines=N`` to holders of
a token (``server/web/api.py``), and with ``follow=true`` keeps the response open, sending
what the driver writes until the run ends. Other servers and the CLI present the cluster
credential (``scheduler/tokens.py``) when they fetch it from there.

A follow is an asynchronous stream (it holds no worker thread while the log is idle)
and is bounded: :class:`FollowGate` admits at most ``FOLLOWS_PER_TOKEN`` open follows
per token and ``FOLLOWS_PER_SERVER`` in all (429 beyond). A follow ends when the run
ends, after ``FOLLOW_IDLE_S`` without output, or after ``FOLLOW_MAX_S``; it always ends
with one line saying which, starting with :data:`ENDED` (``job logs -f`` reads it to
follow on, or to say why it stops).
"""

from __future__ import annotations

import asyncio
import collections
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

from resource_center import errors, store
from server import bounded_http

# The most lines one request returns.
MAX_LINES = 10_000
# Following a live log: how often an idle file is checked, how long a follow may see
# no output, and the longest one stream lasts (a client follows on by asking again),
# seconds.
FOLLOW_POLL_S = 0.5
FOLLOW_IDLE_S = 300.0
FOLLOW_MAX_S = 3600.0
# Open follows admitted per token (the cluster credential is not counted: servers
# relaying for their own callers use it) and per server.
FOLLOWS_PER_TOKEN = 4
FOLLOWS_PER_SERVER = 32
CHUNK_BYTES = 64 * 1024
# The most of a log's end read for its last lines (the file's, a shipped copy's, a
# peer's answer): a log is the driver's, and so is the length of its lines.
MAX_TAIL_BYTES = 8 << 20
# The last line of every follow stream starts with this, then says why it ended.
ENDED = b"[sparkring] follow ended: "
RUN_ENDED = "the run ended"
# S3 keeps an object's LastModified to the second.
LAST_MODIFIED_RESOLUTION = timedelta(seconds=1)


def last_lines(data: bytes, lines: int, *, cut: bool) -> str:
    """The last ``lines`` lines of ``data``, each ended; ``cut``: ``data`` is the end
    of something longer, so its first (partial) line is dropped."""
    lines = max(1, min(lines, MAX_LINES))
    if cut:
        data = data.partition(b"\n")[2]
    last = data.decode(errors="replace").splitlines()[-lines:]
    return "".join(line + "\n" for line in last)


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of ``path``, from its last :data:`MAX_TAIL_BYTES` at
    most: the driver writes this file, and one line of it can be gigabytes long."""
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        start = max(0, size - MAX_TAIL_BYTES)
        handle.seek(start)
        data = handle.read(MAX_TAIL_BYTES)
    return last_lines(data, lines, cut=start > 0)


def fetch(
    health_url: str,
    job: str,
    lines: int,
    secret: str,
    timeout: float = 5.0,
    verify: ssl.SSLContext | None = None,
) -> str | None:
    """The tail of ``job``'s live log from the server at ``health_url``; None if that
    server does not answer or runs no driver of the job."""
    url = f"{health_url}/logs/{urllib.parse.quote(job, safe='')}?lines={int(lines)}"
    try:
        with bounded_http.client(verify if verify is not None else True, timeout=timeout) as http:
            answer = bounded_http.request(
                http,
                "GET",
                url,
                deadline_s=timeout,
                max_bytes=MAX_TAIL_BYTES,
                headers={"Authorization": f"Bearer {secret}"},
            )
    except bounded_http.FetchError:
        return None
    if answer.status != 200:
        return None
    return answer.body.decode(errors="replace")


def shipped(bucket: store.Store, key: str, lines: int) -> str | None:
    """The tail of a finished run's log shipped to S3 under ``key``; None if absent."""
    kept: collections.deque[bytes] = collections.deque()
    size, trimmed = 0, False
    try:
        if not bucket.exists(key):
            return None
        for chunk in bucket.read(key):  # streamed; only its last MAX_TAIL_BYTES kept
            kept.append(chunk)
            size += len(chunk)
            while size - len(kept[0]) >= MAX_TAIL_BYTES:
                size -= len(kept.popleft())
                trimmed = True
    except errors.ResourceError:
        return None
    data = b"".join(kept)
    return last_lines(data[-MAX_TAIL_BYTES:], lines, cut=trimmed or len(data) > MAX_TAIL_BYTES)


def shipped_run(
    bucket: store.Store, key: str, legacy_key: str, created_at: datetime, lines: int
) -> str | None:
    """The tail of a finished run's shipped log: under ``key`` (``log_shipping.log_key``), else
    under the older code's ``legacy_key`` (``log_shipping.legacy_log_key``, name and epoch
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


def ending(reason: str, after: bytes = b"\n") -> bytes:
    """The last line of a follow stream; ``after`` is what the stream sent last (a line
    it left open is ended first)."""
    return (b"" if after.endswith(b"\n") else b"\n") + ENDED + reason.encode() + b"\n"


async def follow(
    path: Path,
    lines: int,
    still_running: Callable[[], bool],
    poll: float = FOLLOW_POLL_S,
    max_seconds: float = FOLLOW_MAX_S,
    idle_seconds: float = FOLLOW_IDLE_S,
) -> AsyncIterator[bytes]:
    """The last ``lines`` lines of ``path`` (none for 0), then whatever is appended to
    it, until the run ends (``still_running()`` is false and nothing more was written),
    nothing was written for ``idle_seconds`` or ``max_seconds`` pass; then the
    :func:`ending` line. Nothing is lost between the tail and the follow: both read one
    open file. Waits are ``asyncio.sleep``: an idle follow holds no thread."""
    lines = max(0, min(lines, MAX_LINES))
    started = time.monotonic()
    last = b"\n"
    with path.open("rb") as handle:
        if lines:
            last = b"".join(collections.deque(handle, maxlen=lines)) or last
            yield last
        else:
            handle.seek(0, 2)
        quiet_since = time.monotonic()
        while True:
            now = time.monotonic()
            chunk = handle.read(CHUNK_BYTES)
            if chunk:
                last, quiet_since = chunk, now
                yield chunk
            elif not still_running():
                yield ending(RUN_ENDED, last)
                return
            elif now - quiet_since >= idle_seconds:
                yield ending(f"no output for {idle_seconds:g} s; follow again to go on", last)
                return
            elif now - started >= max_seconds:
                yield ending(f"the limit of {max_seconds:g} s; follow again to go on", last)
                return
            else:
                await asyncio.sleep(poll)


async def follow_remote_async(
    health_url: str, job: str, lines: int, secret: str, verify: ssl.SSLContext | None = None
) -> AsyncIterator[bytes] | None:
    """``follow`` on the server at ``health_url`` (its ``/logs/<job>?follow=true``),
    relayed without a thread; None if that server does not answer or runs no driver of
    the job. A stream cut mid-way ends with an :func:`ending` line saying so."""
    import httpx

    url = f"{health_url}/logs/{urllib.parse.quote(job, safe='')}"
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(10.0, read=FOLLOW_IDLE_S + 30),
        verify=verify if verify is not None else True,
    )
    try:
        request = client.build_request(
            "GET",
            url,
            params={"lines": int(lines), "follow": "true"},
            headers={"Authorization": f"Bearer {secret}"},
        )
        response = await client.send(request, stream=True)
    except (httpx.HTTPError, OSError, ValueError):
        await client.aclose()
        return None
    if response.status_code != 200:
        await response.aclose()
        await client.aclose()
        return None

    async def relay() -> AsyncIterator[bytes]:
        last = b"\n"
        try:
            async for chunk in response.aiter_raw():  # as it comes (a size would buffer)
                last = chunk
                yield chunk
        except (httpx.HTTPError, OSError):
            yield ending("the connection to the server running the job was lost", last)
        finally:
            await response.aclose()
            await client.aclose()

    return relay()


def follow_remote(
    health_url: str,
    job: str,
    lines: int,
    secret: str,
    timeout: float = FOLLOW_IDLE_S + 30,
    verify: ssl.SSLContext | None = None,
) -> Iterator[bytes] | None:
    """``follow`` on the server at ``health_url`` for the CLI (blocking reads, at most
    ``timeout`` each); None if that server does not answer or runs no driver of the
    job. A stream cut mid-way ends with an :func:`ending` line saying so."""
    url = f"{health_url}/logs/{urllib.parse.quote(job, safe='')}?lines={int(lines)}&follow=true"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {secret}"})
    try:
        response = urllib.request.urlopen(request, timeout=timeout, context=verify)
    except (urllib.error.URLError, OSError, ValueError):
        return None

    def relay() -> Iterator[bytes]:
        last = b"\n"
        with response:
            try:
                while chunk := response.read1(CHUNK_BYTES):
                    last = chunk
                    yield chunk
            except OSError:  # the owner went away mid-stream
                yield ending("the connection to the server running the job was lost", last)

    return relay()


class FollowRefused(Exception):
    """Too many follows open; the message names the limit."""


class FollowGate:
    """Counts open follows per token and in all; :meth:`admit` refuses past a bound."""

    def __init__(
        self, per_token: int = FOLLOWS_PER_TOKEN, per_server: int = FOLLOWS_PER_SERVER
    ) -> None:
        self._per_token = per_token
        self._per_server = per_server
        self._open: collections.Counter[str] = collections.Counter()
        self._total = 0
        self._lock = threading.Lock()

    def admit(self, token: str, counted: bool = True) -> Callable[[], None]:
        """A place for one follow by ``token`` (not counted per token if not
        ``counted``); returns its release, which may be called more than once."""
        with self._lock:
            if self._total >= self._per_server:
                raise FollowRefused(
                    f"this server has {self._total} log follows open, its limit: try again later"
                )
            if counted and self._open[token] >= self._per_token:
                raise FollowRefused(
                    f"token {token!r} has {self._open[token]} log follows open, "
                    "its limit: close one first"
                )
            self._total += 1
            if counted:
                self._open[token] += 1
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if released.is_set():
                    return
                released.set()
                self._total -= 1
                if counted:
                    self._open[token] -= 1
                    if not self._open[token]:
                        del self._open[token]

        return release


async def gated(stream: AsyncIterator[bytes], release: Callable[[], None]) -> AsyncIterator[bytes]:
    """``stream``, releasing its place in the gate when it ends or is abandoned."""
    try:
        async for chunk in stream:
            yield chunk
    finally:
        release()
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
