"""An HTTP server on loopback that answers as a hostile peer would: a receiver or a
driver's UI that trickles its answer a byte at a time, or sends one far larger than
anybody should read. For the tests of server/bounded_http.py and its callers."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HostileServer:
    """``mode``: ``trickle`` (200, a declared 1 MiB body sent a byte every
    ``interval`` s, for ``seconds`` at most) or ``huge`` (200, ``size`` bytes as fast as
    the reader takes them). ``requests`` counts the requests it saw."""

    def __init__(
        self, mode: str, *, size: int = 64 << 20, interval: float = 0.3, seconds: float = 60.0
    ) -> None:
        self.mode = mode
        self.size = size
        self.interval = interval
        self.seconds = seconds
        self.requests = 0
        self.seen = threading.Event()
        self._stop = threading.Event()
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                hostile.requests += 1
                hostile.seen.set()
                self.send_response(200)
                total = 1 << 20 if hostile.mode == "trickle" else hostile.size
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(total))
                self.end_headers()
                try:
                    if hostile.mode == "trickle":
                        deadline = time.monotonic() + hostile.seconds
                        while time.monotonic() < deadline and not hostile._stop.is_set():
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(hostile.interval)
                    else:
                        chunk = b"[" + b" " * ((1 << 20) - 1)
                        for _ in range(total // len(chunk)):
                            self.wfile.write(chunk)
                except OSError:
                    pass  # the reader hung up: what a bounded reader does

            do_GET = _answer
            do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HostileServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
