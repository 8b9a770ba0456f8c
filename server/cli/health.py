"""``sparkring health URL``: exit 0 when URL answers 2xx, 1 with one line otherwise.

Container healthchecks run it in exec form, as ``["CMD", "python", "-m",
"server.cli.health", "http://127.0.0.1:8090/healthz"]``: one argument per word, none
needing a shell, so every engine runs it alike (podman 4.3 splits a healthcheck argument
that contains spaces). This module imports the standard library only: a probe every
few seconds per container must cost milliseconds, not the CPU that importing the
whole CLI takes.
"""

from __future__ import annotations

import sys

DEFAULT_TIMEOUT_S = 3.0
USAGE = "usage: python -m server.cli.health URL [TIMEOUT_SECONDS]"


def probe(url: str, timeout: float = DEFAULT_TIMEOUT_S) -> str | None:
    """None when URL answers 2xx, else the reason in a few words."""
    # Imported here: every sparkring command imports this module, few of them probe.
    import http.client
    import urllib.error
    import urllib.parse
    import urllib.request

    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        return "is not an http(s) URL"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        return f"answered HTTP {exc.code}"
    except urllib.error.URLError as exc:
        return f"is unreachable ({exc.reason})"
    except (OSError, http.client.HTTPException) as exc:
        return f"is unreachable ({exc})"
    return None if 200 <= status < 300 else f"answered HTTP {status}"


def check(url: str, timeout: float) -> int:
    reason = probe(url, timeout)
    if reason is not None:
        print(f"error: unhealthy: {url} {reason}", file=sys.stderr)
        return 1
    print(f"healthy: {url}")
    return 0


def health(url: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Probe URL (e.g. http://127.0.0.1:8090/healthz): exit 0 on a 2xx answer, else 1.

    For container healthchecks; images run it as `python -m server.cli.health URL`.
    """
    code = check(url, timeout)
    if code:
        raise SystemExit(code)


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        timeout = float(argv[1]) if len(argv) == 2 else DEFAULT_TIMEOUT_S
    except ValueError:
        print(f"error: TIMEOUT_SECONDS is not a number: {argv[1]}", file=sys.stderr)
        return 2
    return check(argv[0], timeout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
