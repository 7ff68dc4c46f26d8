"""Commands beside a kernel container: `docker exec` as the kernel's user.

The process runs in the kernel's container (its files, limits, no network), started
through a small `sh` wrapper that first writes its pid on stderr (`<pid>\\n`), so it can
be killed from inside the container whatever the runtime (a host pid means nothing
under gVisor). Docker multiplexes stdout and stderr on the exec's socket as frames of
an 8-byte header (stream, 0, 0, 0, big-endian length) and the bytes; a thread reads
them and hands them to the event loop. Stdin, when asked for, is written to the same
socket; closing it shuts the socket's write side. On a terminal (`tty`: E2B's PTYs) the
socket carries the terminal's raw bytes both ways instead, the pid's line first (the
wrapper's stderr is the terminal too), and `exec_resize` gives it its size.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import docker
import docker.errors

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.backends.base import STDERR, STDOUT, Command, TerminalSize

WRAPPER = ["/bin/sh", "-c", 'echo "$$" >&2; exec "$@"', "kg-command"]
KILL_GROUP = ["/bin/sh", "-c", 'kill -s "$1" -- "-$2" 2>/dev/null || kill -s "$1" "$2"', "kg-kill"]
FRAME = struct.Struct(">BxxxI")
READ_CHUNK = 64 * 1024
MAX_PID_LINE = 32
REAP_WAIT = 5.0  # seconds SIGKILL waits for the process to be gone


class DockerCommand(Command):
    def __init__(
        self,
        client: docker.DockerClient,
        call: Callable[..., Any],
        container: str,
        user: str,
    ) -> None:
        self._client = client
        self._call = call
        self._container = container
        self._user = user
        self._queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._sock: socket.socket | None = None
        self._raw: Any = None  # the SocketIO around it: closed too, or the fd leaks
        self._exec_id = ""
        self._send_lock = asyncio.Lock()
        self._tty = False
        self.pid = 0

    async def start(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str | None,
        stdin: bool,
        terminal: TerminalSize | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._tty = terminal is not None
        try:
            self._exec_id, self._raw = await self._call(
                self._create, argv, env, cwd, stdin or self._tty
            )
        except (docker.errors.DockerException, OSError) as exc:
            raise KernelUnavailable(f"could not start the command: {exc}") from exc
        self._sock = getattr(self._raw, "_sock", self._raw)  # the SocketIO's own socket
        # docker-py leaves the client's read timeout (30 s) on the exec's socket: a command
        # quiet for longer would look ended. Its end is the socket's end, however late.
        self._sock.settimeout(None)
        threading.Thread(target=self._read, args=(loop,), name="docker-exec", daemon=True).start()
        try:
            self.pid = await asyncio.wait_for(asyncio.shield(self._started), 30)
        except TimeoutError:
            raise KernelUnavailable("the command did not start within 30 s") from None
        if terminal is not None:
            await self.resize(terminal)

    async def resize(self, size: TerminalSize) -> None:
        if not self._tty:
            raise KernelUnavailable("the command has no terminal")
        if self._exit.done():
            return
        try:
            await self._call(
                self._client.api.exec_resize, self._exec_id, height=size.rows, width=size.cols
            )
        except docker.errors.DockerException as exc:
            raise KernelUnavailable(f"could not resize the terminal: {exc}") from exc

    def _create(
        self, argv: list[str], env: dict[str, str], cwd: str | None, stdin: bool
    ) -> tuple[str, Any]:
        created = self._client.api.exec_create(
            self._container,
            [*WRAPPER, *argv],
            stdout=True,
            stderr=True,
            stdin=stdin,
            tty=self._tty,
            user=self._user,
            environment=env,
            workdir=cwd,
        )
        raw: Any = self._client.api.exec_start(created["Id"], socket=True, tty=self._tty)
        return created["Id"], raw

    # -- the reading thread -----------------------------------------------------------------

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._sock is not None
        pid_line = b""
        pid_known = False
        try:
            while self._tty:  # one raw stream: the terminal's, the pid's line first
                chunk = self._sock.recv(READ_CHUNK)
                if not chunk:
                    break
                if not pid_known:
                    pid_line += chunk
                    if b"\n" not in pid_line and len(pid_line) <= MAX_PID_LINE:
                        continue
                    first, _, chunk = pid_line.partition(b"\n")
                    pid_known = True
                    pid = int(first.strip()) if first.strip().isdigit() else 0
                    loop.call_soon_threadsafe(_set, self._started, pid)
                if chunk:
                    loop.call_soon_threadsafe(self._queue.put_nowait, (STDOUT, chunk))
            while not self._tty:
                header = _read_exactly(self._sock, FRAME.size)
                if header is None:
                    break
                stream, length = FRAME.unpack(header)
                data = _read_exactly(self._sock, length) if length else b""
                if data is None:
                    break
                if stream == STDERR and not pid_known:
                    pid_line += data
                    if b"\n" in pid_line or len(pid_line) > MAX_PID_LINE:
                        first, _, data = pid_line.partition(b"\n")
                        pid_known = True
                        pid = int(first) if first.strip().isdigit() else 0
                        loop.call_soon_threadsafe(_set, self._started, pid)
                    if not data:
                        continue
                if stream in (STDOUT, STDERR) and data:
                    loop.call_soon_threadsafe(self._queue.put_nowait, (stream, data))
        except OSError:
            pass
        finally:
            code = self._exit_code()
            loop.call_soon_threadsafe(_set, self._started, 0)
            loop.call_soon_threadsafe(self._queue.put_nowait, None)
            loop.call_soon_threadsafe(_set, self._exit, code)
            with contextlib.suppress(OSError):
                self._sock.close()
            if self._raw is not self._sock:
                with contextlib.suppress(OSError):
                    self._raw.close()

    def _exit_code(self) -> int:
        for _ in range(50):
            try:
                info = self._client.api.exec_inspect(self._exec_id)
            except docker.errors.DockerException:
                return -1
            if not info.get("Running"):
                code = info.get("ExitCode")
                return int(code) if code is not None else -1
            threading.Event().wait(0.05)
        return -1

    # -- the Command interface -----------------------------------------------------------

    async def output(self) -> AsyncIterator[tuple[int, bytes]]:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            yield item

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    async def send_stdin(self, data: bytes) -> None:
        sock = self._sock
        if sock is None or self._exit.done():
            raise KernelUnavailable("the command has ended")
        async with self._send_lock:
            try:
                await asyncio.to_thread(sock.sendall, data)
            except OSError as exc:  # it ended (or closed its stdin) meanwhile
                raise KernelUnavailable(f"the command's input is closed: {exc}") from exc

    async def close_stdin(self) -> None:
        if self._sock is not None and not self._exit.done():
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self._sock.shutdown, socket.SHUT_WR)

    async def kill(self, signum: int = 9) -> None:
        if self.pid <= 0 or self._exit.done():
            return
        self.signalled = int(signum)
        await self._call(self._kill, self.pid, int(signum))

    def _kill(self, pid: int, signum: int) -> None:
        # An exec'd process leads its own session and process group: signal the group, so
        # a shell's children (`bash -c 'sleep 60; ...'`) go too and release the output.
        with contextlib.suppress(docker.errors.DockerException):
            created = self._client.api.exec_create(
                self._container, [*KILL_GROUP, str(signum), str(pid)], user=self._user
            )
            self._client.api.exec_start(created["Id"])
            if signum == signal.SIGKILL:
                self._until_reaped()

    def _until_reaped(self) -> None:
        """Return once the exec no longer runs (or after REAP_WAIT): a process killed is a
        zombie until its parent (the runtime's shim) reaps it, and `kill -0` finds a zombie,
        so a caller that kills and then looks must not find it still there."""
        deadline = time.monotonic() + REAP_WAIT
        while time.monotonic() < deadline:
            if not self._client.api.exec_inspect(self._exec_id).get("Running"):
                return
            time.sleep(0.02)


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    out = bytearray()
    while len(out) < size:
        chunk = sock.recv(min(READ_CHUNK, size - len(out)))
        if not chunk:
            return None
        out += chunk
    return bytes(out)


def _set(future: asyncio.Future[int], value: int) -> None:
    if not future.done():
        future.set_result(value)
