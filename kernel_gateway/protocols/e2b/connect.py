"""The Connect protocol, as E2B's envd speaks it: JSON codec only, framed by hand. Pure.

E2B's SDKs call envd's `filesystem.Filesystem` and `process.Process` services with
Connect (connectrpc in Python, connect-web in JS), always with the JSON codec, so the
gateway needs no protobuf library (see design/e2b-wire.md, section 7):

- **unary**: `POST /<package.Service>/<Method>`, `Content-Type: application/json`, the
  message as proto3 JSON; the answer is 200 with the response message, or an error
  status with `{"code": "<snake_case code>", "message": ...}`.
- **streaming**: `Content-Type: application/connect+json` (exactly: Python's client
  refuses any parameter after it). Each message is an *envelope*: one flag byte, a
  4-byte big-endian length, the JSON. A server stream ends with an envelope whose flag
  is `END_STREAM` and whose JSON is `{}` or `{"error": {"code", "message"}}`; errors
  inside a stream travel there, with HTTP 200 (JS reads a non-200 stream answer as a
  different code).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from kernel_gateway.errors import PayloadTooLarge
from kernel_gateway.http.bodies import read_body

UNARY_TYPE = "application/json"
STREAM_TYPE = "application/connect+json"
END_STREAM = 0x02
COMPRESSED = 0x01
HEADER = struct.Struct(">BI")
MAX_MESSAGE_BYTES = 16 * 2**20
"""The largest request message accepted (a `SendInput` chunk; uploads go through /files)."""

STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}
"""Each Connect code's HTTP status, for unary answers."""


@dataclass
class ConnectError(Exception):
    """An RPC's failure, as the SDK maps it (`not_found` -> NotFoundException, ...)."""

    code: str
    message: str

    def __post_init__(self) -> None:
        if self.code not in STATUS:
            raise ValueError(f"not a Connect code: {self.code!r}")
        super().__init__(self.message)

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def connect_header(flags: int, length: int) -> bytes:
    return HEADER.pack(flags, length)


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    """One streamed message: flag byte, big-endian length, compact JSON."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return connect_header(flags, len(body)) + body


def end_stream(error: ConnectError | None = None) -> bytes:
    """The envelope that ends a server stream, carrying its error if it failed."""
    return envelope({} if error is None else {"error": error.to_json()}, END_STREAM)


class EnvelopeReader:
    """Splits a request body, fed in chunks as they arrive, into its JSON messages."""

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self._buffer = bytearray()
        self._limit = limit

    def feed(self, chunk: bytes) -> Iterator[dict[str, Any]]:
        self._buffer += chunk
        while len(self._buffer) >= HEADER.size:
            flags, length = HEADER.unpack_from(self._buffer)
            if length > self._limit:
                raise ConnectError("resource_exhausted", f"a message of {length} bytes")
            if flags & COMPRESSED:
                raise ConnectError("unimplemented", "compressed messages are not supported")
            if len(self._buffer) < HEADER.size + length:
                return
            body = bytes(self._buffer[HEADER.size : HEADER.size + length])
            del self._buffer[: HEADER.size + length]
            if flags & END_STREAM:
                continue  # a client's end of stream (not sent by E2B's SDKs): nothing to do
            yield parse_message(body)

    def finish(self) -> None:
        """The body ended: anything left over is a truncated envelope."""
        if self._buffer:
            raise ConnectError("invalid_argument", "the request body ends inside a message")


async def read_message_body(request: Request) -> bytes:
    """A Connect request's body, at most MAX_MESSAGE_BYTES (`resource_exhausted` past it)."""
    try:
        return await read_body(request, MAX_MESSAGE_BYTES)
    except PayloadTooLarge as exc:
        raise ConnectError("resource_exhausted", exc.message) from None


def parse_message(body: bytes) -> dict[str, Any]:
    """A request message (proto3 JSON): an object, or `invalid_argument`."""
    try:
        message = json.loads(body) if body.strip() else {}
    except ValueError as exc:
        raise ConnectError("invalid_argument", f"the message is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", "the message is not a JSON object")
    return message


def field(message: dict[str, Any], name: str, camel: str | None = None) -> Any:
    """A field by its JSON name or its proto name (proto3 JSON accepts both)."""
    if camel is not None and camel in message:
        return message[camel]
    return message.get(name)
