"""Refusing a request before its body is read: a pure ASGI middleware.

FastAPI reads (and parses, or spools to disk) a request's body before it resolves the
route's dependencies, the token check among them. So this middleware, in front of the
app, takes every request for one of the API's writes (a POST or DELETE the API declares
on that path: all of them an operator's) and, before one byte of the body is read:

1. authenticates the ``Authorization`` header and requires an operator (401 / 403);
2. refuses a declared ``Content-Length`` above the route's cap (413): artifact uploads
   (``POST /api/v1/resources/<name>``) get ``SPARKRING_MAX_ARTIFACT_BYTES`` plus the
   multipart framing, every other body ``defaults.MAX_JSON_BODY_BYTES``;
3. counts a body sent without a length (chunked) while the app reads it, and cuts it
   at the same cap with a 413.

A refusal is the API's one-line JSON error and closes the connection (the unread body
is not wanted; a small one the client already sent is read and dropped first, so that
the close does not reset the connection under the answer). The principal found is left
in the scope (``auth.SCOPE_KEY``), so the route does not look the token up again.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import anyio
import anyio.to_thread
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.web import auth

# Reads check their token in their route. A method the API does not declare on a path
# (PUT, PATCH, TRACE, a POST to /healthz, ...) is answered 405 (or 404) by the router,
# which reads no body either, whoever asks.
READ_METHODS = frozenset({"GET", "HEAD"})
UPLOAD = re.compile(r"^/api/v1/resources/[^/]+$")
# Room for the multipart boundaries and part headers around an uploaded file.
MULTIPART_FRAMING_BYTES = 64 * 1024
# A refused request's body read and dropped before the connection closes, when it is
# this small, within this long (_drain_small_body).
DRAIN_BYTES = 64 * 1024
DRAIN_S = 0.5


class BodyTooLarge(HTTPException):
    """A body without a declared length grew past its cap while it was read."""

    def __init__(self, message: str) -> None:
        super().__init__(status_code=413, detail=message)


class Admission:
    def __init__(
        self,
        app: ASGIApp,
        authenticator: auth.Authenticator,
        *,
        max_json_bytes: int,
        max_artifact_bytes: int,
        declared: Callable[[str], frozenset[str]],
    ) -> None:
        """``declared``: the methods the API declares on a path."""
        self.app = app
        self._declared = declared
        self._authenticator = authenticator
        self._max_json_bytes = max_json_bytes
        self._max_artifact_bytes = max_artifact_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] in READ_METHODS
            or scope["method"] not in self._declared(scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            scope[auth.SCOPE_KEY] = await anyio.to_thread.run_sync(
                self._authenticator.writer_of, headers.get("authorization")
            )
        except auth.AuthError as exc:
            extra = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
            await _refuse(scope, receive, send, exc.status, str(exc), extra)
            return
        limit, named = self._limit(scope["method"], scope["path"])
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                await _refuse(scope, receive, send, 400, "Content-Length is not a number")
                return
            if int(declared) > limit:
                await _refuse(
                    scope,
                    receive,
                    send,
                    413,
                    f"the request body of {int(declared)} bytes is above the limit of "
                    f"{limit} bytes{named}",
                )
                return
        await self.app(scope, _capped(receive, limit, named), send)

    def _limit(self, method: str, path: str) -> tuple[int, str]:
        """The body cap of a request, and how the refusal names where it comes from."""
        if method == "POST" and UPLOAD.match(path):
            return (
                self._max_artifact_bytes + MULTIPART_FRAMING_BYTES,
                " (SPARKRING_MAX_ARTIFACT_BYTES and the multipart framing)",
            )
        return self._max_json_bytes, ""


def _capped(receive: Receive, limit: int, named: str) -> Receive:
    received = 0

    async def capped_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise BodyTooLarge(f"the request body is above the limit of {limit} bytes{named}")
        return message

    return capped_receive


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    message: str,
    headers: dict[str, str] | None = None,
) -> None:
    await _drain_small_body(scope, receive)
    response = JSONResponse(
        {"error": message}, status_code=status, headers={**(headers or {}), "Connection": "close"}
    )
    await response(scope, receive, send)


async def _drain_small_body(scope: Scope, receive: Receive) -> None:
    """Take a small body the client has sent already (a declared length up to
    DRAIN_BYTES, for at most DRAIN_S) before the refusal closes the connection: closed
    with unread bytes in its buffer, a connection is reset, and the client may lose the
    answer it has not read yet. A large or chunked body is never read."""
    declared = Headers(scope=scope).get("content-length", "")
    if not declared.isdigit() or int(declared) > DRAIN_BYTES:
        return
    taken = 0
    with anyio.move_on_after(DRAIN_S):
        while taken <= DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                return
            taken += len(message.get("body", b""))
            if not message.get("more_body", False):
                return
