"""The HTTP listener (server/web/httpd.py) on a real socket: a trivial app behind it."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from server.web import httpd

HOST = "127.0.0.1"
# Longer than uvicorn's own default keep-alive (5 s), far shorter than the listener's.
IDLE_S = 7.0


@pytest.fixture
def listener() -> Iterator[httpd.HttpServer]:
    app = FastAPI()

    @app.post("/echo")
    def echo() -> dict[str, str]:
        return {"ok": "yes"}

    server = httpd.HttpServer(app, 0, host=HOST)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _exchange(sock: socket.socket, port: int) -> bytes:
    """One POST on ``sock`` (keep-alive); the answer's head and body, or b"" if the
    server had closed the connection."""
    sock.sendall(
        f"POST /echo HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Length: 2\r\n"
        "Content-Type: application/json\r\n\r\n{}".encode()
    )
    received = b""
    try:
        while b'"ok"' not in received:
            data = sock.recv(65536)
            if not data:
                break
            received += data
    except ConnectionResetError:
        return b""
    return received


def test_an_idle_keep_alive_connection_outlives_a_load_balancers_idle_timeout(
    listener: httpd.HttpServer,
) -> None:
    """A keep-alive connection idle for seconds still carries the next request. With
    uvicorn's default (5 s) the listener closed it, and a client that sent a POST just
    as it closed got "Connection reset by peer" (Schemathesis' stateful phase on a
    loaded machine; behind a load balancer that keeps idle connections for 60 s, the
    same race is a sporadic 502). The listener keeps them for KEEP_ALIVE_S (75 s, as
    nginx does), longer than the balancers' usual idle timeouts."""
    assert httpd.KEEP_ALIVE_S > 60
    with socket.create_connection((HOST, listener.port), timeout=10) as sock:
        assert b" 200 " in _exchange(sock, listener.port)
        time.sleep(IDLE_S)  # the idle time is what is tested
        assert b" 200 " in _exchange(sock, listener.port)
