"""Request bodies read with a cap: a body past it is refused as soon as it passes it, never
read into memory or spooled to disk whole first (a declared Content-Length past the cap is
refused before anything is read)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import Message


class TooLarge(Exception):
    """The body is larger than the cap (answered 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than {limit} bytes")


def capped(request: Request, limit: int) -> Request:
    """`request`, whose body raises TooLarge once more than `limit` bytes have come."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(limit)
    received = 0
    receive = request.receive

    async def counting() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise TooLarge(limit)
        return message

    return Request(request.scope, counting)


async def read_capped(request: Request, limit: int) -> bytes:
    """The whole body, at most `limit` bytes (TooLarge past it)."""
    body = bytearray()
    async for chunk in capped(request, limit).stream():
        body += chunk
    return bytes(body)
