"""HTTP requests written on a raw socket, to see whether a server refuses one before
it reads the body.

httpx and curl send a whole body before they read the answer (or stop at an early
close with an error); these helpers send the head, then feed the body from a side
thread while the main thread waits for the status line, and count the body bytes sent
by the time it came. A server that reads the body first cannot answer before all of it
is sent (or, when none is sent, cannot answer at all): the count tells the two apart
without a clock, however loaded the machine.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
import urllib.parse

CHUNK = 256 * 1024


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int | None  # None: no status line before the timeout
    seconds: float  # from the head sent to the status line (or to the timeout)
    body: bytes
    body_sent: int  # body bytes handed to the socket when the status line came

    def error(self) -> str:
        return json.loads(self.body)["error"]


def post(
    url: str,
    path: str,
    *,
    headers: dict[str, str],
    body_bytes: int = 0,
    declared: int | None = None,
    chunked: bool = False,
    prefix: bytes = b"",
    timeout: float = 10.0,
) -> Answer:
    """POST ``path``: ``prefix`` then zero bytes, ``body_bytes`` in all (in chunked
    encoding if ``chunked``), announced as ``Content-Length: declared`` (default:
    ``body_bytes``; none when chunked). The body is sent only until the server closes
    the connection."""
    parts = urllib.parse.urlsplit(url)
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {parts.netloc}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    if chunked:
        head.append("Transfer-Encoding: chunked")
    else:
        head.append(f"Content-Length: {body_bytes if declared is None else declared}")
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        started = time.monotonic()
        sent = [0]
        feeder = threading.Thread(
            target=_feed, args=(sock, prefix, body_bytes, chunked, sent), daemon=True
        )
        feeder.start()
        received = b""
        try:
            while b"\r\n\r\n" not in received:
                data = sock.recv(65536)
                if not data:
                    break
                received += data
        except TimeoutError:
            return Answer(None, time.monotonic() - started, b"", sent[0])
        except ConnectionResetError:
            pass
        seconds = time.monotonic() - started
        body_sent = sent[0]
        status_line, _, rest = received.partition(b"\r\n")
        if not status_line:
            return Answer(None, seconds, b"", body_sent)
        head_block, _, body = rest.partition(b"\r\n\r\n")
        length = _content_length(head_block)
        try:
            while length is not None and len(body) < length:
                data = sock.recv(65536)
                if not data:
                    break
                body += data
        except OSError:
            pass
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    feeder.join(timeout)
    return Answer(int(status_line.split()[1]), seconds, body, body_sent)


def _content_length(head_block: bytes) -> int | None:
    for line in head_block.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return None


def _feed(
    sock: socket.socket, prefix: bytes, body_bytes: int, chunked: bool, sent: list[int]
) -> None:
    """Send the body in pieces; ``sent[0]`` counts the bytes handed to the socket (the
    piece being sent included)."""
    block = bytes(CHUNK)
    try:
        while sent[0] < body_bytes:
            piece = block[: min(CHUNK, body_bytes - sent[0])]
            if sent[0] == 0 and prefix:
                piece = prefix + piece[len(prefix) :]
            # Counted as it is handed to the socket: counted after the send, a piece the
            # server had read could still be uncounted when its answer came (the feeder
            # preempted in between). A refusal may see one piece counted that it never
            # read: fewer than a CHUNK of the count.
            sent[0] += len(piece)
            if chunked:
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            else:
                sock.sendall(piece)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except OSError:  # the server answered and closed: the rest is not wanted
        return
