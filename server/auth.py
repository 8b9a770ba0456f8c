"""Bearer-token authentication of the HTTP API (FastAPI dependencies).

``Authorization: Bearer <token>`` is looked up on every request (a revoked token stops
working at once). No header or an unknown token: 401. A viewer asking to write: 403.
Tokens are never logged; a refusal names the problem, not the token.
"""

from __future__ import annotations

from typing import Annotated

import sqlalchemy as sa
from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from server import tokens

_bearer = HTTPBearer(auto_error=False, description="A token from 'sparkring token create'.")


class AuthError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Authenticator:
    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def reader(
        self, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> tokens.Principal:
        """Any valid token (viewer, operator or the cluster credential)."""
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise AuthError(401, "a bearer token is required (Authorization: Bearer <token>)")
        with self._engine.begin() as conn:
            principal = tokens.authenticate(conn, credentials.credentials)
        if principal is None:
            raise AuthError(401, "the bearer token is unknown or revoked")
        return principal

    def writer(
        self, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> tokens.Principal:
        """An operator token."""
        principal = self.reader(credentials)
        if not principal.may_write:
            raise AuthError(
                403, f"token {principal.name!r} is a {principal.role} token; this needs an operator"
            )
        return principal


# The principal a route receives (the dependency itself is chosen per route).
Caller = tokens.Principal
