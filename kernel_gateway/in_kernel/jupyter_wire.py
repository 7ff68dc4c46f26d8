"""Jupyter's wire protocol, signing and framing: the one copy, in the gateway and in kernels.

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
  untrusted: the gateway's `kernels/wire.py` also checks the shape it relies on.
- Every kernel the gateway talks to has a key (the gateway makes one per kernel);
  Jupyter's "empty key: no signing" mode is not supported and such messages fail.

Who uses it: the gateway (`kernels/wire.py` adds socket URLs and what it checks of a
message it reads), a forked stateless kernel (`mini_kernel.py`: its messages, on one Unix
stream, below) and the bridge (`bridge.py`: its own interrupts and probes). So it
imports only the standard library: the backends copy it into a container's folder
beside the program that imports it (`in_kernel.PROGRAMS`). Nothing here does I/O or
keeps state beyond a `Signer`'s keyed HMAC.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Mapping, Sequence
from typing import Any

DELIM = b"<IDS|MSG>"
"""The frame between a message's identities and its signature."""

SIGNATURE_SCHEME = "hmac-sha256"


class BadMessage(ValueError):
    """Frames that are not a correctly signed Jupyter message of the expected shape."""


# -- signing ------------------------------------------------------------------------------


class Signer:
    """Signs and checks messages with one connection's key.

    The keyed HMAC is built once and copied for each message (cheaper than keying a
    new one each time).
    """

    __slots__ = ("_mac",)

    def __init__(self, key: str | bytes, scheme: str = SIGNATURE_SCHEME) -> None:
        name = scheme[len("hmac-") :] if scheme.startswith("hmac-") else scheme
        digest = getattr(hashlib, name)
        self._mac = hmac.new(key.encode() if isinstance(key, str) else key, digestmod=digest)

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> Signer:
        """The signer of a kernel's connection (its `key` and `signature_scheme`)."""
        return cls(str(info["key"]), str(info.get("signature_scheme", SIGNATURE_SCHEME)))

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


# -- one Unix stream instead of ZMQ sockets -----------------------------------------------
#
# A forked stateless kernel (mini_kernel.py) and the gateway (kernels/channels.py) speak
# the same signed messages over one Unix stream: each message is a record naming its
# channel, then its frames.
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
    for an unknown channel (after which nothing on the stream can be trusted). How large
    a body may be is the reader's to judge."""
    length, tag, count = RECORD_HEAD.unpack(head)
    channel = CHANNEL_OF_TAG.get(tag)
    if channel is None:
        raise BadMessage(f"unknown channel tag {tag!r}")
    return length, channel, count


def record_frames(body: bytes, count: int) -> list[bytes]:
    """The `count` frames of a record's body; BadMessage if they do not fill it exactly."""
    frames = []
    at = 0
    end = len(body)
    for _ in range(count):
        if at + 4 > end:
            raise BadMessage("a record ends inside a frame size")
        (size,) = FRAME_SIZE.unpack_from(body, at)
        at += 4
        if at + size > end:
            raise BadMessage("a record ends inside a frame")
        frames.append(body[at : at + size])
        at += size
    if at != end:
        raise BadMessage("a record has bytes after its frames")
    return frames
