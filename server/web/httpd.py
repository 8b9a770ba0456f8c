"""The server's HTTP listener: uvicorn serving ``server/web/api.py`` on a side thread.

The socket is bound before the thread starts, so the port (0 picks a free one) is known
at once and a taken port fails start-up with a clear error. uvicorn installs no signal
handlers off the main thread: the server process keeps its own (``server/signals.py``).
With a :class:`~server.tls.ServerTls` the listener speaks HTTPS only.
"""

from __future__ import annotations

import logging
import socket
import threading

import uvicorn
from fastapi import FastAPI

from server import tls

log = logging.getLogger(__name__)
# How long stop() waits for open requests to finish, seconds.
STOP_TIMEOUT_S = 5.0
# How long an idle keep-alive connection is kept, seconds. uvicorn's default, 5 s, is
# shorter than the idle timeout of the load balancers in front of an API (60 s on AWS'
# ALB): a request sent on a connection as the listener closes it is reset (a 502 behind
# the balancer). A listener must keep idle connections longer than its clients; nginx
# keeps them 75 s.
KEEP_ALIVE_S = 75


class HttpServer:
    def __init__(
        self,
        app: FastAPI,
        port: int,
        host: str = "0.0.0.0",
        listener_tls: tls.ServerTls | None = None,
    ) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError as exc:
            self._socket.close()
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        self._socket.listen(128)
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=STOP_TIMEOUT_S,
            timeout_keep_alive=KEEP_ALIVE_S,
            ssl_certfile=str(listener_tls.cert) if listener_tls else None,
            ssl_keyfile=str(listener_tls.key) if listener_tls else None,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="http", daemon=True
        )

    @property
    def port(self) -> int:
        return self._socket.getsockname()[1]

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Idempotent: finish open requests (bounded), then close the socket."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(STOP_TIMEOUT_S + 2)
        self._socket.close()
