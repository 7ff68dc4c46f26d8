"""JSON responses, and an error as the JSON response its status and type call for."""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, Generic, TypeVar

from starlette.responses import Response

from kernel_gateway.errors import GatewayError
from kernel_gateway.http.sse import dumps
from kernel_gateway.types import JSON

T = TypeVar("T")

REQUEST_ID_HEADER = "X-Request-Id"
"""Each response's request id (the client's own when it sent a well-formed one)."""


class ConnectionDropped(Exception):
    """Raised by a streaming body to end its connection unfinished: the client sees the
    connection drop, as it would if what stood behind the stream had died (E2B's SDKs take
    that, and a failed health check after it, as "the sandbox was killed"). Not an error:
    the gateway's middleware and logs pass it over (`quiet`)."""

    quiet = True


class JSONResponse(Response, Generic[T]):
    """A JSON answer whose body is a `T`: a handler annotated `-> JSONResponse[Session]` can
    only answer with what mypy knows to be a `shapes.responses.Session`."""

    media_type = "application/json"

    def __init__(
        self,
        content: T,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(content, status_code, headers)

    def render(self, content: Any) -> bytes:
        return dumps(content)


def error_response(exc: GatewayError) -> JSONResponse[JSON]:
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    if exc.status_code == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(exc.to_json(), status_code=exc.status_code, headers=headers)


CHUNK = 256 * 1024


async def file_chunks(fd: int, size: int) -> AsyncIterator[bytes]:
    """Exactly `size` bytes from an already opened fd (the file may change meanwhile)."""
    remaining = size
    try:
        while remaining > 0:
            chunk = await asyncio.to_thread(os.read, fd, min(CHUNK, remaining))
            if not chunk:
                break
            remaining -= len(chunk)
            yield chunk
        if remaining:  # the file shrank under us: keep Content-Length honest
            yield b"\0" * remaining
    finally:
        os.close(fd)
