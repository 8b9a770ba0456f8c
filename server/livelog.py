"""Driver logs of current runs: the tail of a local log file, or of a peer's over HTTP.

The server that runs a driver serves its log at ``/logs/<job>?lines=N`` to holders of
a token (``server/api.py``). Other servers and the CLI present the cluster credential
(``server/tokens.py``) when they fetch it from there.
"""

from __future__ import annotations

import collections
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from resource_center import errors, store

# The most lines one request returns.
MAX_LINES = 10_000


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
