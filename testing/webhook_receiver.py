"""A real HTTP webhook receiver for alert tests, the demo and the chaos campaign.

It listens on 127.0.0.1 or the address given (on a port of its own, or the one given,
so it can go away and come back at the same address), records every request (the
delivery id, the body and whether its signature verified), answers from a script of
statuses (then 200), and can hold requests until released (a delivery in flight, for a
kill mid-send). It de-duplicates by the body's ``id``, as the docs tell receivers to.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import http.server
import json
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Received:
    id: str | None
    body: dict[str, Any]
    signature: str | None
    signature_ok: bool | None  # None: no secret to check against
    status: int  # what was answered
    at: float  # time.monotonic() of its arrival
    wall: float  # time.time() of its arrival


class Receiver:
    def __init__(
        self,
        *,
        secret: str | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        path: str = "/hook",
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """``tls``: (certificate, key) PEM files: an HTTPS receiver."""
        self.secret = secret
        self.tls = tls
        self.host = host
        self.path = path  # of :attr:`url` (any path is answered)
        self.received: list[Received] = []
        self.script: list[int] = []  # statuses to answer, in order; then 200
        self.hold = threading.Event()  # cleared: requests wait until set (or 60 s)
        self.hold.set()
        self.holding = threading.Event()  # set while a request is being held
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._port = port
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> Receiver:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if not receiver.hold.is_set():
                    receiver.holding.set()
                    receiver.hold.wait(60)
                    receiver.holding.clear()
                status = receiver._answer(raw, self.headers.get("X-Sparkring-Signature"))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            # socketserver's default backlog (5) drops concurrent connects: the senders'
            # SYNs would be retried a second later, and timed as the product's latency.
            request_queue_size = 256

        self._httpd = Server((self.host, self._port), Handler)
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(self.tls[0]), str(self.tls[1]))
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._httpd.daemon_threads = True
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Go away (connections are refused) until :meth:`start` again, same port."""
        self.hold.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}:{self._port}{self.path}"

    # ---------------------------------------------------------------- answers

    def _answer(self, raw: bytes, signature: str | None) -> int:
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        ok = None
        if self.secret is not None:
            expected = "sha256=" + hmac.new(self.secret.encode(), raw, hashlib.sha256).hexdigest()
            ok = signature is not None and hmac.compare_digest(signature, expected)
        with self._changed:
            status = self.script.pop(0) if self.script else 200
            if ok is False:
                status = 401
            self.received.append(
                Received(body.get("id"), body, signature, ok, status, time.monotonic(), time.time())
            )
            self._changed.notify_all()
        return status

    # ---------------------------------------------------------------- reading

    def bodies(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.body for r in self.received]

    def accepted_ids(self) -> list[str]:
        """Ids answered 2xx, each once (the receiver's de-duplication)."""
        with self._lock:
            seen: dict[str, None] = {}
            for r in self.received:
                if 200 <= r.status < 300 and r.id is not None:
                    seen.setdefault(r.id, None)
            return list(seen)

    def wait_for(self, check: Callable[[list[Received]], bool], timeout: float) -> bool:
        """Wait until ``check(received)`` holds (True) or the deadline passes (False)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not check(list(self.received)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.5))
            return True
