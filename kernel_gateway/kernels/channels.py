"""How one kernel's messages travel: Jupyter's ZMQ sockets, or one Unix stream.

Every kernel the gateway starts binds the ZMQ sockets of Jupyter's wire protocol
(shell, control, IOPub), and `ZmqChannels` connects to them. A forked stateless
kernel (in_kernel/zygote.py) serves one request and ends: there, ZMQ's context, I/O
thread, three sockets and the subscription handshake were most of the request's cost,
so it speaks the same signed messages over one Unix stream instead (`StreamChannels`,
records framed by `wire.stream_record`), which the gateway listens on before the
kernel exists.

Either way a `Kernel` sends a message's frames on a channel and is handed each
received message's frames with the channel they came on; nothing here parses or signs.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Literal

import zmq
import zmq.asyncio

from kernel_gateway.kernels.wire import (
    MAX_MESSAGE_BYTES,
    RECORD_HEAD,
    oversized,
    record_frames,
    record_head,
    socket_url,
    stream_record,
)
from kernel_gateway.types import ConnectionInfo

logger = logging.getLogger(__name__)

IOPUB_QUEUE = 100
"""IOPub messages the gateway holds unread per kernel (ZMQ's receive high-water mark)."""

Receiver = Callable[[str, list[bytes]], None]
"""Called with the channel ("shell", "control" or "iopub") and the frames of a message."""
Broken = Callable[[Exception], None]
"""Called once if the kernel's side stopped speaking the protocol (the stream is closed)."""
Requests = Literal["shell", "control"]


class Channels(abc.ABC):
    @abc.abstractmethod
    def start(self, receive: Receiver, broken: Broken) -> None:
        """Begin handing every received message to `receive`."""

    @abc.abstractmethod
    async def send(self, channel: Requests, frames: list[bytes]) -> None:
        """Send one message; it is queued, never waited for (as ZMQ does)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop receiving and close everything (idempotent)."""


class ZmqChannels(Channels):
    """Connects to a kernel's shell, control and IOPub ZMQ sockets."""

    def __init__(self, info: ConnectionInfo, context: zmq.asyncio.Context) -> None:
        self._sockets: dict[str, zmq.asyncio.Socket] = {
            "shell": _socket(context, zmq.DEALER, socket_url(info, "shell")),
            "control": _socket(context, zmq.DEALER, socket_url(info, "control")),
            "iopub": _socket(context, zmq.SUB, socket_url(info, "iopub")),
        }
        self._sockets["iopub"].setsockopt(zmq.SUBSCRIBE, b"")
        # A message may be up to 64 KiB of printed text (in_kernel/kernel_startup.py): at
        # ZMQ's default 1,000 a session printing faster than the gateway reads would hold
        # 64 MiB here. The kernel's side queues the rest in the sandbox, without loss.
        self._sockets["iopub"].setsockopt(zmq.RCVHWM, IOPUB_QUEUE)
        self._readers: list[asyncio.Task[None]] = []

    def start(self, receive: Receiver, broken: Broken) -> None:
        self._readers = [
            asyncio.create_task(_read(sock, channel, receive))
            for channel, sock in self._sockets.items()
        ]

    async def send(self, channel: Requests, frames: list[bytes]) -> None:
        await self._sockets[channel].send_multipart(frames)

    def close(self) -> None:
        for task in self._readers:
            task.cancel()
        for sock in self._sockets.values():
            sock.close(linger=0)


def _socket(context: zmq.asyncio.Context, kind: int, url: str) -> zmq.asyncio.Socket:
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    # The kernel binds its sockets a few hundred ms after start: retry quickly.
    sock.setsockopt(zmq.RECONNECT_IVL, 10)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 100)
    # A kernel cannot make the gateway buffer an absurd message: past this ZMQ drops it.
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    sock.connect(url)
    return sock


async def _read(sock: zmq.asyncio.Socket, channel: str, receive: Receiver) -> None:
    while True:
        try:
            frames = await sock.recv_multipart(copy=True)
        except (zmq.ZMQError, asyncio.CancelledError):
            return
        receive(channel, frames)


class StreamChannels(Channels):
    """One Unix stream the kernel connects to once; records carry every channel.

    `listener` is bound and listening before the kernel starts (the kernel connects as
    its first act), so there is no reconnect loop and nothing to miss: unlike a SUB
    socket, the stream holds what the kernel wrote before the gateway read it. A record
    that does not parse ends the stream (`broken`): after it nothing on the stream can
    be trusted to be framed right; so does the kernel closing its end while it runs. A
    record past `MAX_MESSAGE_BYTES` is skipped unread and counted as dropped.
    """

    def __init__(self, listener: socket.socket) -> None:
        listener.setblocking(False)
        self._listener: socket.socket | None = listener
        self._writer: asyncio.StreamWriter | None = None
        self._queued: list[bytes] = []
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self, receive: Receiver, broken: Broken) -> None:
        self._task = asyncio.create_task(self._run(receive, broken))

    async def _run(self, receive: Receiver, broken: Broken) -> None:
        listener = self._listener
        assert listener is not None
        try:
            conn, _ = await asyncio.get_running_loop().sock_accept(listener)
        except (OSError, asyncio.CancelledError):
            return
        finally:
            self._listener = None
            listener.close()
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn, limit=1 << 20)
        except BaseException:
            conn.close()
            raise
        self._writer = writer
        for record in self._queued:
            writer.write(record)
        self._queued.clear()
        try:
            while True:
                head = await reader.readexactly(RECORD_HEAD.size)
                length, channel, count = record_head(head)
                if oversized(length):
                    await _skip(reader, length)
                    receive(channel, [])  # counted as dropped: it has no parts
                    continue
                receive(channel, record_frames(await reader.readexactly(length), count))
        except asyncio.IncompleteReadError:
            if not self._closed:  # the kernel closed its stream: it can answer no more
                broken(EOFError("the kernel closed its stream"))
        except (ConnectionError, asyncio.CancelledError):
            return
        except Exception as exc:  # BadMessage, or anything else: the stream is unusable
            broken(exc)
        finally:
            writer.close()

    async def send(self, channel: Requests, frames: list[bytes]) -> None:
        if self._closed:
            return
        record = stream_record(channel, frames)
        if self._writer is None:
            self._queued.append(record)
        elif not self._writer.is_closing():
            self._writer.write(record)

    def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._writer is not None:
            with contextlib.suppress(RuntimeError):
                self._writer.close()


async def _skip(reader: asyncio.StreamReader, length: int) -> None:
    while length:
        length -= len(await reader.readexactly(min(length, 1 << 20)))
