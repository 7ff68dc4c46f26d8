"""JSON responses, and an error as the JSON response its status and type call for."""

from __future__ import annotations

import math
from typing import Any

from starlette.responses import Response

from kernel_gateway.errors import GatewayError
from kernel_gateway.http.sse import dumps

REQUEST_ID_HEADER = "X-Request-Id"
"""Each response's request id (the client's own when it sent a well-formed one)."""


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def error_response(exc: GatewayError) -> JSONResponse:
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    if exc.status_code == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(exc.to_json(), status_code=exc.status_code, headers=headers)
