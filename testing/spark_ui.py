"""A stand-in for a Spark driver's monitoring REST API, for the unit tests of the health
monitor's parsing and flags (the real driver's API is used in tests/e2e/test_health.py).

It answers ``/api/v1/applications`` and ``.../executors`` with what the test sets."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class SparkUi:
    def __init__(self) -> None:
        self.apps: object = [{"id": "app-7", "name": "j", "attempts": [{"completed": False}]}]
        self.executors: object = [{"id": "driver", "isActive": True, "totalCores": 0}]
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_cores(self, cores: int) -> None:
        """As a local-mode driver reports its cores (in its own ``driver`` entry)."""
        self.executors = [{"id": "driver", "isActive": True, "totalCores": cores}]


@contextmanager
def serving() -> Iterator[SparkUi]:
    ui = SparkUi()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/api/v1/applications":
                body = ui.apps
            elif self.path.endswith("/executors"):
                body = ui.executors
            else:
                self.send_error(404)
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ui.port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield ui
    finally:
        httpd.shutdown()
        httpd.server_close()
