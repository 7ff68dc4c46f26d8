"""kernels/channels.py's Unix stream, driven by a `Kernel` as the gateway drives a forked
stateless kernel; the kernel's side is mini_kernel.py's own session and wire."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq.asyncio

from kernel_gateway.in_kernel import mini_kernel
from kernel_gateway.kernels.backends.base import ExitInfo, KernelProcess
from kernel_gateway.kernels.channels import Channels, StreamChannels
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.wire import ipc_connection
from kernel_gateway.types import Event


class StreamProcess(KernelProcess):
    def __init__(self, folder: Path) -> None:
        self.id = "stream-kernel"
        self.connection = ipc_connection(str(folder / "k"))
        self.path = folder / "k.sock"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(1)
        self.signals: list[int] = []
        self._exit: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()

    def channels(self, context: zmq.asyncio.Context) -> Channels:
        return StreamChannels(self.listener)

    def poll(self) -> ExitInfo | None:
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> ExitInfo:
        return await asyncio.shield(self._exit)

    async def send_signal(self, signum: int) -> None:
        self.signals.append(signum)
        if signum == signal.SIGKILL and not self._exit.done():
            self._exit.set_result(ExitInfo(-9, "killed"))

    async def kill(self) -> None:
        await self.send_signal(signal.SIGKILL)

    async def cleanup(self) -> None:
        self.listener.close()


class Sink:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.idle = asyncio.Event()
        self.count: int | None = None

    def on_input(self, execution_count: int) -> None:
        self.count = execution_count

    def on_event(self, event: Event) -> None:
        self.events.append(event)

    def on_idle(self) -> None:
        self.idle.set()


def _serve_one(
    path: Path, key: str, garbage: bytes | None = None, signing_key: str | None = None
) -> threading.Thread:
    """The kernel's side: connect, answer one execute_request as the child does."""

    def run() -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        wire = mini_kernel.Wire(sock)
        session = mini_kernel.stream_session()
        session.start(key.encode(), wire)
        channel, frames = wire.receive()
        request = session.read_request(frames)
        parent = request["header"]
        if signing_key is not None:  # what it sends is signed with another key
            session.start(signing_key.encode(), wire)
        session.send("iopub", "status", {"execution_state": "busy"}, parent)
        session.send("iopub", "execute_input", {"code": "x", "execution_count": 1}, parent)
        session.send("iopub", "stream", {"name": "stdout", "text": "hello\n"}, parent)
        if garbage is not None:
            wire.drain()
            sock.sendall(garbage)
            sock.close()
            return
        reply = {"status": "ok", "execution_count": 1, "payload": [], "user_expressions": {}}
        session.send(channel, "execute_reply", reply, parent)
        session.send("iopub", "status", {"execution_state": "idle"}, parent)
        wire.drain()
        sock.recv(1)  # as a forked kernel does: its stream stays open until the gateway's end
        sock.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
async def stream_kernel(tmp_path: Path) -> AsyncIterator[tuple[StreamProcess, Kernel]]:
    context = zmq.asyncio.Context()
    process = StreamProcess(tmp_path)
    kernel = Kernel(process, context)
    try:
        yield process, kernel
    finally:
        await kernel.close()
        context.destroy(linger=0)


@pytest.mark.asyncio
async def test_a_cell_runs_over_the_stream(stream_kernel: tuple[StreamProcess, Kernel]) -> None:
    process, kernel = stream_kernel
    sink = Sink()
    # The request is sent before the kernel connects: it waits on the stream.
    _, reply = await kernel.execute("print('hello')", sink)
    thread = _serve_one(process.path, process.connection["key"])
    answer = await asyncio.wait_for(reply, 10)
    await asyncio.wait_for(sink.idle.wait(), 10)
    assert answer["content"]["status"] == "ok"
    assert sink.count == 1
    assert [(e.name, e.data) for e in sink.events] == [("stdout", {"text": "hello\n"})]
    assert kernel.dropped_messages == 0
    assert thread.is_alive() and kernel.exit_info is None  # served, and still running


@pytest.mark.asyncio
async def test_a_stream_that_stops_being_framed_right_ends_the_kernel(
    stream_kernel: tuple[StreamProcess, Kernel],
) -> None:
    process, kernel = stream_kernel
    sink = Sink()
    await kernel.execute("x", sink)
    # A record naming no channel: after it nothing on the stream can be trusted.
    _serve_one(process.path, process.connection["key"], garbage=b"\x00\x00\x00\x01?\x00\x01")
    info = await asyncio.wait_for(kernel.exited, 10)
    assert info.reason == "killed" and process.signals == [signal.SIGKILL]
    assert [e.name for e in sink.events] == ["stdout"]  # what came before still counts


@pytest.mark.asyncio
async def test_messages_signed_with_another_key_are_dropped(
    stream_kernel: tuple[StreamProcess, Kernel],
) -> None:
    process, kernel = stream_kernel
    sink = Sink()
    _, reply = await kernel.execute("x", sink)
    thread = _serve_one(process.path, process.connection["key"], signing_key="another")
    await asyncio.sleep(0.5)
    assert not reply.done() and not sink.events
    assert kernel.dropped_messages >= 1
    assert thread.is_alive()  # it waits for the gateway to close the stream
