"""Request parsing and JSON responses shared by the routes.

Bodies are read in chunks and refused with 413 as soon as they pass the cap,
so an oversized upload is never held in memory whole.
"""

from __future__ import annotations

import base64
import binascii
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
from kernel_gateway.kernels.workspace import split_path
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


def reject_unknown(body: JSON, allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidRequest(
            f"unknown field(s): {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def number_field(body: JSON, name: str, *, minimum: float, maximum: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"'{name}' must be a number")
    try:
        finite = math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite:
        raise InvalidRequest(f"'{name}' must be a finite number")
    if not minimum < value <= maximum:
        raise InvalidRequest(f"'{name}' must be greater than {minimum:g} and at most {maximum:g}")
    return float(value)


def string_field(body: JSON, name: str) -> str:
    value = body.get(name)
    if value is None:
        raise InvalidRequest(f"'{name}' is required")
    if not isinstance(value, str):
        raise InvalidRequest(f"'{name}' must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"'{name}' is not valid Unicode (lone surrogate)") from None
    return value


def wants_json(request: Request) -> bool:
    """JSON instead of SSE when the client asks for it and not for event-stream."""
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "text/event-stream" not in accept


def files_field(body: JSON, name: str, limit: int) -> list[tuple[str, bytes]]:
    """`[{"path": str, "data": base64}]` -> decoded (path, bytes) pairs, each validated."""
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"'{name}' must be a list of {{path, data}} objects")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != {"path", "data"}:
            raise InvalidRequest(f"'{name}[{i}]' must be an object with 'path' and 'data'")
        path, data = item["path"], item["data"]
        if not isinstance(path, str) or not isinstance(data, str):
            raise InvalidRequest(f"'{name}[{i}]': 'path' and 'data' must be strings")
        try:
            split_path(path)
        except GatewayError as exc:
            raise InvalidRequest(f"'{name}[{i}].path': {exc.message}") from None
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"'{name}[{i}].data' is not valid base64") from None
        if len(raw) > limit:
            raise PayloadTooLarge(f"'{name}[{i}]' exceeds the {limit}-byte upload limit")
        out.append((path, raw))
    return out
