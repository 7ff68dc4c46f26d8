"""Request bodies read with a cap, for every app of ours (the gateway, its protocols, the router),
and the one query value both APIs read the same way (`query_seconds`).

Bodies are read in chunks and refused with 413 (`PayloadTooLarge`) as soon as they pass the
cap, so an oversized upload is never held in memory whole; a declared Content-Length past
the cap is refused before a byte is read. `read_model` reads a body as a request model
(`kernel_gateway.shapes.requests`) without importing it: a router that never calls it never
loads pydantic.
"""

from __future__ import annotations

import json
import math
from typing import Any, Protocol, Self, TypeVar

from starlette.requests import Request
from starlette.types import Message

from kernel_gateway.errors import (
    BadRequest,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from kernel_gateway.types import JSON


class FromJSON(Protocol):
    """A request body's model: built from a JSON object and checked against the gateway's
    limits (`kernel_gateway.shapes.requests.RequestModel` and its subclasses)."""

    @classmethod
    def from_json(cls, body: JSON, limits: Any) -> Self: ...


M = TypeVar("M", bound=FromJSON)


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


def capped(request: Request, limit: int) -> Request:
    """`request`, whose body raises `PayloadTooLarge` once more than `limit` bytes have come
    (for handlers that stream a body on instead of reading it whole)."""
    check_declared_length(request, limit)
    received = 0
    receive = request.receive

    async def counting() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
        return message

    return Request(request.scope, counting)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, at most `limit` bytes."""
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


async def read_model(
    request: Request, model: type[M], limit: int, limits: Any, *, optional: bool = False
) -> M:
    """The JSON body (at most `limit` bytes; `optional`: may be empty) as a `model`.

    400 when it is not JSON, 413 when it is too large, 415 without a JSON content type,
    422 when it is not an object or `model` refuses it (413 for a file over the upload
    limit), with a message naming the field.
    """
    body = await read_json(request, limit, optional=optional)
    return model.from_json(body, limits)


def query_seconds(request: Request, name: str) -> float | None:
    """A query parameter in Unix seconds (`?start=1732870000`), or None when absent;
    `InvalidRequest` (422) for one that is not a time."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= 0 or not math.isfinite(value):
        raise InvalidRequest(f"'{name}' must be a Unix time in seconds, got {raw[:40]!r}")
    return value
