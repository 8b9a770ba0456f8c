"""Following a live driver log cannot starve the server (issue 23, item 3): the API
app behind the server's own listener (``server/web/httpd.py``) on a real database, with a
driver log that stays idle. Follows are asynchronous (they hold no worker thread while
idle) and bounded per token and per server; ``/healthz`` keeps answering."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from scheduler import tokens
from server.web import api, dependencies, httpd, livelog
from testing import waiting

JOB = "quiet"


@pytest.fixture
def server(engine: sa.Engine, tmp_path: Path) -> Iterator[str]:
    log = tmp_path / "driver.log"
    log.write_text("started\n")
    backend = dependencies.Backend(
        server_id="s1",
        engine=engine,
        status=lambda: (True, {"server": "s1", "running": 1}),
        members=dict,
        log_file=lambda job: log if job == JOB else None,
        shipped_log=lambda job, epoch, lines: None,
        placement_epsilon=0.05,
        vnodes=8,
    )
    listener = httpd.HttpServer(api.create_app(backend), 0, host="127.0.0.1")
    listener.start()
    url = f"http://127.0.0.1:{listener.port}"
    waiting.wait_until(lambda: _reachable(url), 10, message="listener up")
    try:
        yield url
    finally:
        listener.stop()


def _reachable(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _viewer(engine: sa.Engine, name: str) -> str:
    with engine.begin() as conn:
        return tokens.create(conn, name, "viewer")


def _open_follow(url: str, token: str) -> socket.socket:
    """A follow request whose answer is left unread (as an idle client leaves it)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(
        f"GET /logs/{JOB}?follow=true HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    return sock


def _status(sock: socket.socket) -> int | None:
    try:
        line = sock.recv(4096).split(b"\r\n", 1)[0]
    except TimeoutError:
        return None
    return int(line.split()[1]) if line else None


def test_idle_follows_from_viewers_leave_healthz_answering(server: str, engine: sa.Engine) -> None:
    """45 idle follows (more than the 40 worker threads) from 12 viewers."""
    viewers = [_viewer(engine, f"v{i}") for i in range(12)]
    follows = [_open_follow(server, viewers[i % 12]) for i in range(45)]
    try:
        statuses = [_status(sock) for sock in follows]
        started = time.monotonic()
        reply = httpx.get(server + "/healthz", timeout=3)
        assert reply.status_code == 200 and time.monotonic() - started < 2
        assert statuses.count(200) == livelog.FOLLOWS_PER_SERVER
        assert statuses.count(429) == 45 - livelog.FOLLOWS_PER_SERVER
    finally:
        for sock in follows:
            sock.close()


def test_follows_are_bounded_per_token_and_a_closed_one_frees_its_place(
    server: str, engine: sa.Engine
) -> None:
    token = _viewer(engine, "watcher")
    follows = [_open_follow(server, token) for _ in range(livelog.FOLLOWS_PER_TOKEN)]
    try:
        assert [_status(sock) for sock in follows] == [200] * livelog.FOLLOWS_PER_TOKEN
        with httpx.Client(base_url=server, timeout=5) as http:
            refused = http.get(
                f"/logs/{JOB}",
                params={"follow": "true"},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"] == (
                f"token 'watcher' has {livelog.FOLLOWS_PER_TOKEN} log follows open, "
                "its limit: close one first"
            )
            follows.pop().close()

            def admitted() -> bool:
                with http.stream(
                    "GET",
                    f"/logs/{JOB}",
                    params={"follow": "true"},
                    headers={"Authorization": f"Bearer {token}"},
                ) as reply:
                    return reply.status_code == 200

            waiting.wait_until(admitted, 10, interval=0.1, message="the closed follow freed")
    finally:
        for sock in follows:
            sock.close()
