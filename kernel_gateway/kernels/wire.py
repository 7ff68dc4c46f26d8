"""Jupyter's ZMQ wire protocol as the gateway speaks it: socket URLs, signing, framing,
and the checks of what it reads. Pure functions.

One message on a kernel's ZMQ sockets is a list of frames: identities, the `<IDS|MSG>`
delimiter, a signature, then four JSON *parts* (header, parent_header, metadata,
content) and any binary buffers. Signing and framing, with the records of a forked
kernel's Unix stream, are `in_kernel/jupyter_wire.py`: one standard-library copy that
the gateway imports and the backends copy into containers, where a forked stateless
kernel and the bridge sign and frame with it. Its invariants (what is signed, how it is
checked) are written there; its names are re-exported here, so the gateway imports the
wire from one place. What is the gateway's alone is here: where the sockets are, how
large a message may be, and the shape a received message must have.

Nothing here does I/O or keeps state beyond a `Signer`'s keyed HMAC.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any, Literal

from kernel_gateway.in_kernel.jupyter_wire import (
    CHANNEL_OF_TAG,
    DELIM,
    FRAME_SIZE,
    RECORD_HEAD,
    SIGNATURE_SCHEME,
    STREAM_CHANNELS,
    BadMessage,
    Signer,
    record_frames,
    record_head,
    serialize,
    stream_record,
    verified_parts,
)
from kernel_gateway.types import ConnectionInfo, Message

__all__ = [
    "CHANNEL_OF_TAG",
    "DELIM",
    "FRAME_SIZE",
    "IPC_PORTS",
    "MAX_MESSAGE_BYTES",
    "RECORD_HEAD",
    "SIGNATURE_SCHEME",
    "STREAM_CHANNELS",
    "BadMessage",
    "Channel",
    "Signer",
    "deserialize",
    "ipc_connection",
    "oversized",
    "pack_parts",
    "record_frames",
    "record_head",
    "serialize",
    "socket_url",
    "stream_record",
    "verified_parts",
]

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""The largest message a gateway socket accepts (ZMQ's MAXMSGSIZE): past it, ZMQ drops it."""

Channel = Literal["shell", "iopub", "stdin", "control", "hb"]

IPC_PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
"""The 'port' of each channel's ipc socket: the socket is the file `<ip>-<port>`."""


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


# -- the gateway's messages ---------------------------------------------------------------


def pack_parts(msg: Message, pack: Callable[[Any], bytes]) -> list[bytes]:
    """A message's four parts, each packed (as JSON bytes) by `pack`."""
    return [
        pack(msg["header"]),
        pack(msg["parent_header"]),
        pack(msg["metadata"]),
        pack(msg["content"]),
    ]


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


def oversized(length: int) -> bool:
    """Whether a stream record's body (`record_head`) is past `MAX_MESSAGE_BYTES` (skipped
    unread, as ZMQ's MAXMSGSIZE keeps such a message from the gateway)."""
    return length > MAX_MESSAGE_BYTES
