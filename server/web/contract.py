"""What every route of the API shares in its answers: the error (:class:`ApiError`,
answered as ``{"error": "<one line>"}``) and the JSON form of the values it returns."""

from __future__ import annotations

import datetime
import json
from typing import Any

from fastapi.responses import JSONResponse

API = "/api/v1"


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def default(value: Any) -> str:
    """Datetimes in ISO 8601, as ``--json`` prints them; anything else as text."""
    return value.isoformat() if isinstance(value, datetime.datetime) else str(value)


def plain(data: Any) -> Any:
    """Plain JSON values (datetimes as ISO 8601 strings)."""
    return json.loads(json.dumps(data, default=default))
