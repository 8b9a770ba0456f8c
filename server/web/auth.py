"""Bearer-token authentication of the HTTP API (FastAPI dependencies).

``Authorization: Bearer <token>`` is looked up on every request (a revoked or expired
token stops working at once). No header, an unknown or an expired token: 401. A viewer asking to
write: 403. Tokens are never logged; a refusal names the problem, not the token.

Requests that carry a body are checked before it is read (``server/web/admission.py``),
with :meth:`Authenticator.writer_of`; the principal found there is kept in the request's
scope, so the route's dependency (:func:`reader` or :func:`writer`, which find the app's
``Authenticator`` in its state) does not look the token up a second time.
"""

from __future__ import annotations

from typing import Annotated

import sqlalchemy as sa
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from scheduler import tokens

_bearer = HTTPBearer(auto_error=False, description="A token from 'sparkring token create'.")
# Where server/web/admission.py leaves the principal it checked (the ASGI scope's state).
SCOPE_KEY = "sparkring.principal"


class AuthError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Authenticator:
    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def reader_of(self, authorization: str | None) -> tokens.Principal:
        """The principal of an ``Authorization`` header value: any valid token (viewer,
        operator or the cluster credential)."""
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            raise AuthError(401, "a bearer token is required (Authorization: Bearer <token>)")
        try:
            with self._engine.begin() as conn:
                principal = tokens.authenticate(conn, credentials.strip())
        except tokens.TokenExpired as exc:
            raise AuthError(401, str(exc)) from None
        if principal is None:
            raise AuthError(401, "the bearer token is unknown or revoked")
        return principal

    def writer_of(self, authorization: str | None) -> tokens.Principal:
        """The principal of an ``Authorization`` header value, if it is an operator."""
        principal = self.reader_of(authorization)
        if not principal.may_write:
            raise AuthError(
                403, f"token {principal.name!r} is a {principal.role} token; this needs an operator"
            )
        return principal


def _authenticator(request: Request) -> Authenticator:
    return request.app.state.authenticator


def reader(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> tokens.Principal:
    """Any valid token (viewer, operator or the cluster credential)."""
    checked = request.scope.get(SCOPE_KEY)
    if checked is not None:
        return checked
    return _authenticator(request).reader_of(request.headers.get("authorization"))


def writer(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> tokens.Principal:
    """An operator token."""
    checked = request.scope.get(SCOPE_KEY)
    if checked is not None and checked.may_write:
        return checked
    return _authenticator(request).writer_of(request.headers.get("authorization"))


# The principal a route receives (the dependency itself is chosen per route).
Caller = tokens.Principal
