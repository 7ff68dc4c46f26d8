"""Jupyter kernel messages on a WebSocket, as Jupyter Server frames them. Pure functions.

A message travels as `WireMessage`: its channel and its parts, the raw JSON of
header, parent_header, metadata and content followed by any binary buffers, which
is what the kernel's ZMQ frames hold (less the identities, delimiter and
signature). Three framings exist on the WebSocket:

- JSON text: one object with `header`, `parent_header`, `metadata`, `content`,
  `buffers` and `channel` (plus `msg_id` and `msg_type`, which Jupyter Server
  adds and its gateway client reads);
- the legacy binary form, for a JSON message with buffers: a count and offsets
  (32-bit big-endian), the JSON, then the buffers;
- `v1.kernel.websocket.jupyter.org`, negotiated as a subprotocol: a count and
  offsets (64-bit little-endian), the channel name, then the raw parts.

Everything from a client is checked before it reaches a kernel: each part must be
the JSON object the protocol says, and the header must name a msg_id and msg_type.
"""

from __future__ import annotations

import json
import struct
from typing import Any, NamedTuple

V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"
CLIENT_CHANNELS = frozenset({"shell", "control", "stdin"})
KERNEL_CHANNELS = frozenset({"shell", "control", "stdin", "iopub"})
MAX_BUFFERS = 64


class BadFrame(ValueError):
    """A WebSocket frame that is not a Jupyter message."""


class WireMessage(NamedTuple):
    channel: str
    parts: list[bytes]
    """header, parent_header, metadata, content (raw JSON), then buffers."""


def pack(value: Any) -> bytes:
    """JSON as the kernel reads it. ASCII only, so a lone surrogate cannot break encoding."""
    return json.dumps(value, separators=(",", ":"), default=str).encode("ascii")


def _object(raw: bytes, name: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadFrame(f"{name} is not JSON") from None
    if not isinstance(value, dict):
        raise BadFrame(f"{name} is not a JSON object")
    return value


def check_header(header: Any) -> dict[str, Any]:
    if not isinstance(header, dict):
        raise BadFrame("header is not a JSON object")
    if not isinstance(header.get("msg_id"), str) or not header["msg_id"]:
        raise BadFrame("header has no msg_id")
    if not isinstance(header.get("msg_type"), str) or not header["msg_type"]:
        raise BadFrame("header has no msg_type")
    return header


def header_of(message: WireMessage) -> dict[str, Any]:
    return check_header(_object(message.parts[0], "header"))


# -- from a client -----------------------------------------------------------------------------


def from_client(frame: str | bytes, protocol: str | None) -> WireMessage:
    """Decode one client frame; raises BadFrame if it is not a well-formed message."""
    if protocol == V1_PROTOCOL:
        if not isinstance(frame, bytes):
            raise BadFrame(f"{V1_PROTOCOL} sends binary frames only")
        message = _from_v1(frame)
        header_of(message)
        names = ("parent_header", "metadata", "content")
        for raw, name in zip(message.parts[1:4], names, strict=True):
            _object(raw, name)
        return message
    if isinstance(frame, bytes):
        document, buffers = _from_legacy_binary(frame)
    else:
        try:
            document = json.loads(frame)
        except ValueError:
            raise BadFrame("the frame is not JSON") from None
        buffers = []
    if not isinstance(document, dict):
        raise BadFrame("the message is not a JSON object")
    channel = document.get("channel") or "shell"
    if not isinstance(channel, str):
        raise BadFrame("channel is not a string")
    header = check_header(document.get("header"))
    parts = [pack(header)]
    for name in ("parent_header", "metadata", "content"):
        value = document.get(name)
        value = {} if value is None else value
        if not isinstance(value, dict):
            raise BadFrame(f"{name} is not a JSON object")
        parts.append(pack(value))
    return WireMessage(channel, parts + buffers)


def _from_v1(frame: bytes) -> WireMessage:
    if len(frame) < 8:
        raise BadFrame("the frame is too short")
    count = int.from_bytes(frame[:8], "little")
    if not 6 <= count <= 6 + MAX_BUFFERS or len(frame) < 8 * (count + 1):
        raise BadFrame("bad offset table")
    offsets = [int.from_bytes(frame[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(count)]
    if offsets[0] != 8 * (count + 1) or offsets != sorted(offsets) or offsets[-1] > len(frame):
        raise BadFrame("bad offset table")
    bounds = [*offsets, len(frame)]
    chunks = [frame[bounds[i] : bounds[i + 1]] for i in range(count)]
    try:
        channel = chunks[0].decode("utf-8")
    except UnicodeDecodeError:
        raise BadFrame("bad channel name") from None
    # The last offset marks the end of the last part (Jupyter Server writes it so).
    parts = chunks[1:-1] if offsets[-1] == len(frame) else chunks[1:]
    if len(parts) < 4:
        raise BadFrame("a message needs header, parent_header, metadata and content")
    return WireMessage(channel, parts)


def _from_legacy_binary(frame: bytes) -> tuple[Any, list[bytes]]:
    if len(frame) < 4:
        raise BadFrame("the frame is too short")
    count = struct.unpack("!I", frame[:4])[0]
    if not 1 <= count <= 1 + MAX_BUFFERS or len(frame) < 4 * (count + 1):
        raise BadFrame("bad offset table")
    offsets = list(struct.unpack(f"!{count}I", frame[4 : 4 * (count + 1)]))
    if offsets != sorted(offsets) or offsets[0] < 4 * (count + 1) or offsets[-1] > len(frame):
        raise BadFrame("bad offset table")
    bounds = [*offsets, len(frame)]
    chunks = [frame[bounds[i] : bounds[i + 1]] for i in range(count)]
    try:
        document = json.loads(chunks[0])
    except (ValueError, UnicodeDecodeError):
        raise BadFrame("the frame's message is not JSON") from None
    return document, chunks[1:]


# -- to a client -------------------------------------------------------------------------------


def to_client(message: WireMessage, protocol: str | None) -> str | bytes:
    """Encode a kernel message for a client speaking `protocol` (None: the JSON framing)."""
    if protocol == V1_PROTOCOL:
        return _to_v1(message)
    header = _object(message.parts[0], "header")
    document: dict[str, Any] = {
        "header": header,
        "parent_header": _object(message.parts[1], "parent_header"),
        "metadata": _object(message.parts[2], "metadata"),
        "content": _object(message.parts[3], "content"),
        "buffers": [],
        "channel": message.channel,
        "msg_id": header.get("msg_id"),
        "msg_type": header.get("msg_type"),
    }
    buffers = message.parts[4:]
    if not buffers:
        return json.dumps(document, default=str)
    del document["buffers"]
    chunks = [json.dumps(document, default=str).encode("utf-8"), *buffers]
    offsets = [4 * (len(chunks) + 1)]
    for chunk in chunks[:-1]:
        offsets.append(offsets[-1] + len(chunk))
    return struct.pack(f"!{len(chunks) + 1}I", len(chunks), *offsets) + b"".join(chunks)


def _to_v1(message: WireMessage) -> bytes:
    channel = message.channel.encode("utf-8")
    offsets = [8 * (1 + 1 + len(message.parts) + 1)]
    offsets.append(offsets[-1] + len(channel))
    for part in message.parts:
        offsets.append(offsets[-1] + len(part))
    table = b"".join(n.to_bytes(8, "little") for n in [len(offsets), *offsets])
    return table + channel + b"".join(message.parts)


def make(
    channel: str,
    header: dict[str, Any],
    parent: dict[str, Any],
    content: dict[str, Any],
) -> WireMessage:
    """A message the gateway itself sends a client (a status, or a reply for a dead kernel)."""
    return WireMessage(channel, [pack(header), pack(parent), pack({}), pack(content)])
