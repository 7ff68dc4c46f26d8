"""Jupyter's ZMQ wire protocol: socket URLs, message signing, framing. Pure functions.

One message on a kernel's ZMQ sockets is a list of frames (Jupyter messaging spec,
"The wire protocol"):

    [identity, ..., b"<IDS|MSG>", signature, header, parent_header, metadata, content,
     buffer, ...]

The identities (routing prefixes of ROUTER sockets) come before the delimiter. The
four *parts* after the signature are raw JSON; any frames after them are binary
buffers.

What is signed, and how it is checked (the invariants every user of this module
relies on):

- The signature is the hex digest, as ASCII bytes, of an HMAC keyed by the
  connection's `key` with the connection's `signature_scheme` (`hmac-sha256` for
  every kernel the gateway starts), over exactly the four parts in order: header,
  parent_header, metadata, content. Identities and buffers are not signed.
- A received message is accepted only if it has a delimiter, a signature and four
  parts, and its signature equals the one computed here, compared in constant time
  (`hmac.compare_digest`), so a kernel's code cannot learn a valid signature by
  timing. Code in a kernel can read its own key, so a verified message is still
  untrusted: `deserialize` also checks the shape the gateway relies on.
- Every kernel the gateway talks to has a key (the gateway makes one per kernel);
  Jupyter's "empty key: no signing" mode is not supported and such messages fail.

Nothing here does I/O or keeps state beyond a `Signer`'s keyed HMAC.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import struct
from collections.abc import Callable, Sequence
from typing import Any, Literal

from kernel_gateway.types import ConnectionInfo, Message

DELIM = b"<IDS|MSG>"
"""The frame between a message's identities and its signature."""

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""The largest message a gateway socket accepts (ZMQ's MAXMSGSIZE): past it, ZMQ drops it."""

SIGNATURE_SCHEME = "hmac-sha256"

Channel = Literal["shell", "iopub", "stdin", "control", "hb"]

IPC_PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
"""The 'port' of each channel's ipc socket: the socket is the file `<ip>-<port>`."""


class BadMessage(ValueError):
    """Frames that are not a correctly signed Jupyter message of the expected shape."""


# -- where the sockets are ----------------------------------------------------------------


def socket_url(info: ConnectionInfo, channel: Channel) -> str:
    """The ZMQ URL of one channel: `ipc://<ip>-<port>` or `tcp://<ip>:<port>`."""
    port = info[f"{channel}_port"]  # type: ignore[literal-required]
    if info["transport"] == "ipc":
        return f"ipc://{info['ip']}-{port}"
    return f"tcp://{info['ip']}:{port}"


def ipc_connection(prefix: str, key: str | None = None) -> ConnectionInfo:
    """Connection info for ZMQ ipc sockets named `<prefix>-<n>`, with `key` or a fresh one
    (256 random bits, hex)."""
    return ConnectionInfo(
        transport="ipc",
        ip=prefix,
        key=secrets.token_hex(32) if key is None else key,
        signature_scheme=SIGNATURE_SCHEME,
        kernel_name="python3",
        shell_port=IPC_PORTS["shell_port"],
        iopub_port=IPC_PORTS["iopub_port"],
        stdin_port=IPC_PORTS["stdin_port"],
        control_port=IPC_PORTS["control_port"],
        hb_port=IPC_PORTS["hb_port"],
    )


# -- signing ------------------------------------------------------------------------------


class Signer:
    """Signs and checks messages with one connection's key.

    The keyed HMAC is built once and copied for each message (cheaper than keying a
    new one each time).
    """

    __slots__ = ("_mac",)

    def __init__(self, key: str | bytes, scheme: str = SIGNATURE_SCHEME) -> None:
        digest = getattr(hashlib, scheme.removeprefix("hmac-"))
        self._mac = hmac.new(key.encode() if isinstance(key, str) else key, digestmod=digest)

    @classmethod
    def of(cls, info: ConnectionInfo) -> Signer:
        """The signer of a kernel's connection."""
        return cls(info["key"], info["signature_scheme"])

    def sign(self, parts: Sequence[bytes]) -> bytes:
        """The signature of a message: over its first four parts, hex, as bytes."""
        mac = self._mac.copy()
        mac.update(parts[0])
        mac.update(parts[1])
        mac.update(parts[2])
        mac.update(parts[3])
        return mac.hexdigest().encode()

    def verify(self, parts: Sequence[bytes], signature: bytes) -> bool:
        """Whether `signature` is this key's signature of `parts` (constant-time compare)."""
        return len(parts) >= 4 and hmac.compare_digest(self.sign(parts), signature)


# -- framing ------------------------------------------------------------------------------


def serialize(parts: Sequence[bytes], signer: Signer) -> list[bytes]:
    """The frames that send `parts` (the four JSON parts, then any buffers), signed."""
    return [DELIM, signer.sign(parts), *parts]


def pack_parts(msg: Message, pack: Callable[[Any], bytes]) -> list[bytes]:
    """A message's four parts, each packed (as JSON bytes) by `pack`."""
    return [
        pack(msg["header"]),
        pack(msg["parent_header"]),
        pack(msg["metadata"]),
        pack(msg["content"]),
    ]


def verified_parts(frames: list[bytes], signer: Signer) -> list[bytes]:
    """The parts of a received message (four JSON parts, then buffers), once its signature
    checks; BadMessage if it has no delimiter, too few frames or a wrong signature."""
    try:
        at = frames.index(DELIM)
    except ValueError:
        raise BadMessage("no <IDS|MSG> delimiter") from None
    parts = frames[at + 2 :]
    if len(parts) < 4:
        raise BadMessage("too few frames")
    if not signer.verify(parts, frames[at + 1]):
        raise BadMessage("bad message signature")
    return parts


def deserialize(frames: list[bytes], signer: Signer) -> Message:
    """Verify and decode one received message (the kernel's hot path: once per message).

    Like jupyter_client's Session.deserialize, minus turning every ISO date in the
    headers into a datetime, which the gateway never reads: that parsing was the
    largest cost per message on the hot path. Each part is parsed once, straight from
    the received frame; buffers stay the frames they came in. BadMessage (a
    ValueError, as is a part that is not JSON) unless the header and parent_header
    are objects and the header names a msg_type.
    """
    parts = verified_parts(frames, signer)
    msg: Message = {
        "header": json.loads(parts[0]),
        "parent_header": json.loads(parts[1]),
        "metadata": json.loads(parts[2]),
        "content": json.loads(parts[3]),
        "buffers": parts[4:],
    }
    if not isinstance(msg["header"], dict) or not isinstance(msg["parent_header"], dict):
        raise BadMessage("header or parent_header is not an object")
    if not isinstance(msg["header"].get("msg_type"), str):
        raise BadMessage("header has no msg_type")
    return msg


# -- one Unix stream instead of ZMQ sockets -----------------------------------------------
#
# A forked stateless kernel (in_kernel/zygote.py) speaks the same signed messages over one
# Unix stream: each message is a record naming its channel, then its frames. zygote.py
# writes records with its own copy of `stream_record` (in-kernel code imports nothing of
# the gateway); tests/unit/test_wire.py checks the two agree.
#
#     record := length:u32 channel:u8 count:u16 (size:u32 frame){count}
#
# All integers big-endian; `length` counts the bytes after the 7-byte head.

RECORD_HEAD = struct.Struct("!IcH")
FRAME_SIZE = struct.Struct("!I")
STREAM_CHANNELS: dict[str, bytes] = {"shell": b"s", "control": b"c", "iopub": b"i"}
"""The channel tag of each record: the channels a stream carries."""
CHANNEL_OF_TAG = {tag: name for name, tag in STREAM_CHANNELS.items()}


def stream_record(channel: str, frames: Sequence[bytes]) -> bytes:
    """One message's frames as a record of the stream, tagged with its channel."""
    body = b"".join(FRAME_SIZE.pack(len(frame)) + frame for frame in frames)
    return RECORD_HEAD.pack(len(body), STREAM_CHANNELS[channel], len(frames)) + body


def record_head(head: bytes) -> tuple[int, str, int]:
    """A record's body length, channel and frame count, from its first 7 bytes; BadMessage
    for an unknown channel (after which nothing on the stream can be trusted). A body past
    `MAX_MESSAGE_BYTES` is the reader's to skip (`oversized`)."""
    length, tag, count = RECORD_HEAD.unpack(head)
    channel = CHANNEL_OF_TAG.get(tag)
    if channel is None:
        raise BadMessage(f"unknown channel tag {tag!r}")
    return length, channel, count


def oversized(length: int) -> bool:
    """Whether a record's body is past `MAX_MESSAGE_BYTES` (skipped unread, as ZMQ's
    MAXMSGSIZE keeps such a message from the gateway)."""
    return length > MAX_MESSAGE_BYTES


def record_frames(body: bytes, count: int) -> list[bytes]:
    """The `count` frames of a record's body; BadMessage if they do not fill it exactly."""
    frames = []
    at = 0
    view = memoryview(body)
    for _ in range(count):
        if at + 4 > len(body):
            raise BadMessage("a record ends inside a frame size")
        (size,) = FRAME_SIZE.unpack_from(body, at)
        at += 4
        if at + size > len(body):
            raise BadMessage("a record ends inside a frame")
        frames.append(bytes(view[at : at + size]))
        at += size
    if at != len(body):
        raise BadMessage("a record has bytes after its frames")
    return frames
