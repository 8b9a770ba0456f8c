"""The one way a server asks another HTTP endpoint something: bounded in time and size.

Some of the answers a server reads come from outside the control plane: a webhook
receiver's reply to an alert, a driver's Spark UI (the job's own process, which may
print anything and answer anything). Every such call goes through :func:`request`:

- a **total deadline**, checked between the chunks of the answer (httpx's ``timeout``
  bounds each read, not the request: a receiver that trickles a byte a second never
  trips it); each read is bounded by a fraction of the deadline, so the whole call ends
  within about 1.5 times ``deadline_s``;
- a **byte cap** on the body, counted as it arrives, with ``Accept-Encoding: identity``
  (no compression bomb); what is past the cap is never read;
- redirects are never followed (a 3xx is an answer like any other).

The caller owns the ``httpx.Client`` (its TLS policy: :func:`client`).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

# The share of the deadline one read may take: the deadline is checked between reads.
_READ_SHARE = 0.5


class FetchError(Exception):
    """No usable answer: ``kind`` says why in a few words, never with the URL (it may
    carry a credential)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass(frozen=True)
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes  # at most max_bytes of it
    complete: bool  # False: the body went on past max_bytes, and the rest was not read


def client(
    verify: ssl.SSLContext | bool = True, *, timeout: float = 10.0, trust_env: bool = True
) -> httpx.Client:
    """A client for :func:`request`: no redirects, ``verify`` its TLS policy;
    ``trust_env=False`` ignores the environment's proxies (for a local peer)."""
    return httpx.Client(timeout=timeout, follow_redirects=False, verify=verify, trust_env=trust_env)


def request(
    http: httpx.Client,
    method: str,
    url: str,
    *,
    deadline_s: float,
    max_bytes: int,
    content: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """``method url`` through ``http``, its answer read whole within ``deadline_s`` and
    ``max_bytes``: its first ``max_bytes`` when it is longer (``complete`` False; the
    caller decides whether that is an answer). Raises :class:`FetchError` (``timed
    out``, ``could not connect``, ``bad url``, ``no answer (<kind>)``)."""
    started = time.monotonic()
    per_read = max(0.05, deadline_s * _READ_SHARE)
    timeout = httpx.Timeout(deadline_s, read=per_read)
    sent = {"accept-encoding": "identity", **(headers or {})}
    try:
        with http.stream(method, url, content=content, headers=sent, timeout=timeout) as answer:
            body = bytearray()
            for chunk in answer.iter_raw():
                body += chunk
                if len(body) > max_bytes:
                    del body[max_bytes:]
                    return Answer(answer.status_code, answer.headers, bytes(body), False)
                if time.monotonic() - started > deadline_s:
                    raise FetchError("timed out")
            return Answer(answer.status_code, answer.headers, bytes(body), True)
    except httpx.TimeoutException:
        raise FetchError("timed out") from None
    except httpx.ConnectError:
        raise FetchError("could not connect") from None
    except (httpx.InvalidURL, httpx.UnsupportedProtocol, UnicodeError):
        raise FetchError("bad url") from None
    except httpx.HTTPError as exc:
        raise FetchError(f"no answer ({type(exc).__name__})") from None
