"""The server's small HTTP endpoint: ``/healthz``, ``/metrics`` and ``/logs/<job>``.

``/healthz`` answers 200 with a JSON status while the server is healthy (ZooKeeper
registered, its loops alive, leases renewed recently) and 503 with the same JSON when
not. ``/logs/<job>?lines=N`` serves the tail of a driver log of a job running here, so
``sparkring job logs`` can show a current run wherever it runs.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from server import metrics

log = logging.getLogger(__name__)
MAX_LOG_LINES = 10_000


class HealthServer:
    def __init__(
        self,
        port: int,
        status: Callable[[], tuple[bool, dict[str, Any]]],
        log_file: Callable[[str], Path | None],
        host: str = "0.0.0.0",
    ) -> None:
        self._status = status
        self._log_file = log_file
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer._handle(self)

            def log_message(self, format: str, *args: object) -> None:
                return  # scrapes every few seconds would flood the server log

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="health-http", daemon=True
        )

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        url = urlparse(request.path)
        if url.path == "/healthz":
            healthy, body = self._status()
            code = HTTPStatus.OK if healthy else HTTPStatus.SERVICE_UNAVAILABLE
            self._reply(request, code, json.dumps(body, sort_keys=True), "application/json")
        elif url.path == "/metrics":
            self._reply(
                request, HTTPStatus.OK, metrics.REGISTRY.render(), "text/plain; version=0.0.4"
            )
        elif url.path.startswith("/logs/"):
            job = url.path.removeprefix("/logs/")
            lines = _int(parse_qs(url.query).get("lines", ["200"])[0], 200)
            path = self._log_file(job)
            if path is None or not path.exists():
                self._reply(request, HTTPStatus.NOT_FOUND, f"no run of {job} here\n", "text/plain")
            else:
                text = path.read_text(errors="replace").splitlines()[-min(lines, MAX_LOG_LINES) :]
                self._reply(request, HTTPStatus.OK, "\n".join(text) + "\n", "text/plain")
        else:
            self._reply(request, HTTPStatus.NOT_FOUND, "not found\n", "text/plain")

    @staticmethod
    def _reply(request: BaseHTTPRequestHandler, code: int, body: str, kind: str) -> None:
        data = body.encode()
        request.send_response(code)
        request.send_header("Content-Type", kind)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)


def _int(text: str, default: int) -> int:
    try:
        return max(1, int(text))
    except ValueError:
        return default
