"""Request reading and JSON responses shared by the routes (the gateway's and the router's).

Bodies are read in chunks and refused with 413 as soon as they pass the cap,
so an oversized upload is never held in memory whole. Reading a body as a typed
model is in `validation.py`, which loads pydantic; the router imports this module
and has no use for it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kernel_gateway.errors import (
    BadRequest,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from kernel_gateway.server.sse import dumps
from kernel_gateway.types import JSON

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


def check_declared_length(request: Request, limit: int) -> None:
    """413 at once when the client announces more than `limit`, before reading a byte."""
    declared = request.headers.get("content-length")
    if declared is None:
        return
    try:
        size = int(declared)
    except ValueError:
        raise BadRequest("Content-Length is not a number") from None
    if size > limit:
        raise PayloadTooLarge(f"request body of {size} bytes exceeds the {limit}-byte limit")


async def read_body(request: Request, limit: int) -> bytes:
    check_declared_length(request, limit)
    chunks = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, limit: int, *, optional: bool = False) -> JSON:
    """The body as a JSON object: 400 if it is not JSON, 422 if it is not an object."""
    body = await read_body(request, limit)
    if not body.strip():
        if optional:
            return {}
        raise BadRequest("request body is empty; expected a JSON object")
    # Browsers can send text/plain or form bodies cross-site without asking; a JSON
    # content type needs a CORS preflight, which this server never grants.
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise UnsupportedMediaType("send the body as JSON with 'Content-Type: application/json'")
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"request body must be a JSON object, not {type(value).__name__}")
    return value


def wants_json(request: Request) -> bool:
    """JSON instead of SSE when the client asks for it and not for event-stream."""
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "text/event-stream" not in accept
