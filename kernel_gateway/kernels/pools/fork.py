"""Stateless kernels forked from preloaded fork servers (the gateway's side of zygote.py).

A stateless request used to cost a whole container, a Python start and the preload.
Here a few fork-server containers wait with everything imported; each request is a
fork of one of them, which drops to a uid of its own and serves the request as a small
Jupyter kernel on ipc sockets. To the session above it, the fork is an ordinary
`KernelProcess` (`ForkedProcess`): it is driven by the same `Kernel`, `Session` and
event code as every other kernel, so events, timeouts, interrupts, output caps and
files behave exactly as before.

One request at a time runs in a fork-server container: between two requests the fork
server kills every process of the old uid and empties every writable place (see
zygote.py). A container is replaced after `--fork-server-requests` requests, and at
once after anything unusual: a request that died, was killed at its timeout, or that
the fork server could not verify clean afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import json
import logging
import shutil
import signal
import socket
import time
from typing import Any

import zmq.asyncio

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.backends.base import Backend, ExitInfo, ForkServerHost, KernelProcess
from kernel_gateway.kernels.channels import Channels, StreamChannels
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.pools.light import is_light, roots
from kernel_gateway.kernels.pools.refill import Refill
from kernel_gateway.kernels.pools.warm import WarmPool, preload_code
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.kernels.storage import SessionStorage
from kernel_gateway.kernels.wire import ipc_connection
from kernel_gateway.metrics import Metrics
from kernel_gateway.settings import Settings
from kernel_gateway.shapes.responses import ForkServerStats
from kernel_gateway.types import JSON, ConnectionInfo

logger = logging.getLogger(__name__)

WRITABLE = ["/home/user", "/tmp", "/home/sandbox", "/dev/shm"]
UID_BASE = 1_000_000
UID_SPAN = 100_000  # uids per container: fork_server_requests is capped below this
CONNECT_WAIT = 0.02
END_TIMEOUT = 10.0


FORK_ATTEMPTS = 3
BURST_AFTER = 0.5
"""A request that has waited this long for a server gets one started for it (a start
costs about a second of CPU; a busy server is usually free again in milliseconds)."""
BURST_KEEP = 30.0
"""Servers started for a burst are let go once they have been idle this long."""


class LostServer(KernelUnavailable):
    """The fork server died before it could fork: try another."""


class State(enum.Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    GONE = "gone"


class ForkServer:
    """One fork-server container and its control connection (JSON lines, one at a time)."""

    def __init__(self, host: ForkServerHost, storage: SessionStorage, limit: int) -> None:
        self.host = host
        self.storage = storage
        self.state = State.STARTING
        self.served = 0
        self.limit = limit
        self.healthy = True
        """False once anything unusual happened: the container is then replaced."""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._replies: asyncio.Queue[JSON] = asyncio.Queue()
        self._listen: asyncio.Task[None] | None = None
        self.current: ForkedProcess | None = None
        self.lost = False
        """Its connection ended while the gateway still used it: the fork server died."""

    @property
    def id(self) -> str:
        return self.host.process.id

    async def connect(self, seconds: float) -> None:
        """Wait until the fork server listens and says it is ready (preload done)."""
        path = self.host.conn_dir / "zygote.sock"
        deadline = time.monotonic() + seconds
        exited = asyncio.ensure_future(self.host.process.wait())
        try:
            while True:
                if exited.done():
                    raise KernelUnavailable(
                        f"the fork server ended while starting: {exited.result().describe()}"
                    )
                if time.monotonic() > deadline:
                    raise KernelUnavailable(f"the fork server was not ready within {seconds:g} s")
                try:
                    self._reader, self._writer = await asyncio.open_unix_connection(
                        str(path), limit=1 << 20
                    )
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    await asyncio.sleep(CONNECT_WAIT)
            self._listen = asyncio.create_task(self._read())
            reply = await self._reply(max(0.1, deadline - time.monotonic()), exited)
            if reply.get("event") != "ready":
                raise KernelUnavailable(f"the fork server said {reply!r} instead of ready")
        finally:
            exited.cancel()
        self.state = State.IDLE

    async def _read(self) -> None:
        assert self._reader is not None
        try:
            while line := await self._reader.readline():
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if message.get("event") == "exited":
                    if self.current is not None:
                        self.current.on_exit(message)
                    continue
                self._replies.put_nowait(message)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:  # the connection is gone: so is the fork server
            if self.state is not State.GONE:
                self.lost = True
            self.healthy = False
            if self.current is not None:
                info = self.host.process.poll() or ExitInfo(None, "killed")
                self.current.on_lost(info)
            self._replies.put_nowait({"event": "lost"})

    async def _send(self, message: JSON) -> None:
        if self._writer is None or self._writer.is_closing():
            error = LostServer if self.lost else KernelUnavailable
            raise error("the fork server's connection is closed")
        self._writer.write(json.dumps(message).encode() + b"\n")
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()

    async def _reply(self, seconds: float, *also: asyncio.Future[Any]) -> JSON:
        getting = asyncio.ensure_future(self._replies.get())
        try:
            done, _ = await asyncio.wait(
                {getting, *also}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not getting.done():
                getting.cancel()
        if getting not in done:
            raise KernelUnavailable(f"the fork server did not answer within {seconds:g} s")
        return getting.result()

    async def fork(self, number: int, light: bool = False) -> ForkedProcess:
        """Fork a child that serves one request on sockets of its own: from the fork
        server's light template if `light` (and it has one), else from the full one."""
        name = f"r{number}"
        inside = f"{self.host.inside}/{name}/k"
        folder = self.host.conn_dir / name
        info = ipc_connection(str(folder / "k"))
        key = info["key"]
        # The child connects to this as its first act (zygote.py chowns it to the child's
        # uid): made before the fork, so nothing waits or retries.
        folder.mkdir(mode=0o700)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(folder / "k.sock"))
            listener.listen(1)
        except OSError:
            listener.close()
            raise
        process = ForkedProcess(self, f"{self.id}-{name}", info, listener)
        self.current = process
        self.state = State.BUSY
        self.served += 1
        try:
            await self._send({"op": "fork", "prefix": inside, "key": key, "light": light})
            reply = await self._reply(END_TIMEOUT)
        except BaseException:
            listener.close()
            raise
        if reply.get("event") != "forked" or not isinstance(reply.get("uid"), int):
            listener.close()
            self.healthy = False
            process.on_lost(ExitInfo(None, "killed"))
            if self.lost:
                raise LostServer(f"fork server {self.id} was lost")
            raise KernelUnavailable(f"the fork server could not fork: {reply.get('error', reply)}")
        process.uid = reply["uid"]
        process.template = str(reply.get("template", "full"))
        return process

    async def end(self) -> None:
        """Kill what the request left and empty its places; the server is then idle again,
        or unhealthy (to be replaced) if it could not say it is clean."""
        try:
            await self._send({"op": "end"})
            reply = await self._reply(END_TIMEOUT)
            if reply.get("event") != "clean":
                logger.warning(
                    "fork server %s: not clean after a request (%s); replacing it",
                    self.id,
                    reply.get("error", reply.get("event")),
                )
                self.healthy = False
        except KernelUnavailable as exc:
            logger.warning("fork server %s: %s; replacing it", self.id, exc.message)
            self.healthy = False
        except BaseException:  # cancelled: its answer would reach the next fork instead
            self.healthy = False
            raise
        finally:
            if self.current is not None:
                self.current.on_lost(ExitInfo(None, "killed"))
            self.current = None
            self.state = State.IDLE

    async def signal(self, signum: int) -> None:
        with contextlib.suppress(KernelUnavailable):
            await self._send({"op": "signal", "signum": signum})

    async def close(self) -> None:
        if self.lost:
            output = (await self.host.process.last_output()).strip()
            logger.warning(
                "fork server %s ended unexpectedly (%s); its last output:\n%s",
                self.id,
                (self.host.process.poll() or ExitInfo(None, "exited")).describe(),
                output[-2000:] or "(none)",
            )
        self.state = State.GONE
        if self._writer is not None:
            self._writer.close()
        if self._listen is not None:
            self._listen.cancel()
            await asyncio.gather(self._listen, return_exceptions=True)
        await self.host.process.cleanup()


class ForkedProcess(KernelProcess):
    """One request's child of a fork server, as the Popen-like process a `Kernel` drives."""

    def __init__(
        self, server: ForkServer, kernel_id: str, info: ConnectionInfo, listener: socket.socket
    ) -> None:
        self.id = kernel_id
        self.connection = info
        self._listener = listener
        self.uid = -1
        """The uid the child runs as (from the fork server's answer)."""
        self.template = "full"
        """The template it was forked from: `light` or `full` (zygote.py)."""
        self._server = server
        self._exit: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()
        self._ending = False
        self._cleaned = False

    def channels(self, context: zmq.asyncio.Context) -> Channels:
        return StreamChannels(self._listener)

    def on_exit(self, message: JSON) -> None:
        if self._exit.done():
            return
        sig, code = message.get("signal"), message.get("code")
        if self._ending:
            info = ExitInfo(None, "killed")
        elif message.get("oom"):
            info = ExitInfo(-9, "out_of_memory")
        elif isinstance(sig, int):
            info = ExitInfo(-sig, "killed" if sig == signal.SIGKILL else "signal")
        else:
            info = ExitInfo(code if isinstance(code, int) else None, "exited")
        if not self._ending:
            self._server.healthy = False  # a request that died: replace the container
        self._exit.set_result(info)

    def on_lost(self, info: ExitInfo) -> None:
        if not self._exit.done():
            self._exit.set_result(info)

    def poll(self) -> ExitInfo | None:
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> ExitInfo:
        return await asyncio.shield(self._exit)

    async def send_signal(self, signum: int) -> None:
        if self._exit.done():
            return
        if signum == signal.SIGKILL:
            self._server.healthy = False  # killed mid-cell: replace the container anyway
        await self._server.signal(signum)

    async def kill(self) -> None:
        await self.send_signal(signal.SIGKILL)

    async def cleanup(self) -> None:
        if self._cleaned:
            return
        self._cleaned = True
        self._listener.close()  # if no Kernel took it
        self._ending = True
        await self._server.end()


class ForkedKernel:
    """One request's forked kernel, on its fork server's storage; as a `Lease`: never
    relaunched, its files owned by the request's uid, and released by closing the kernel
    (which ends the request in its server) and giving the server back to the pool."""

    def __init__(self, kernel: Kernel, server: ForkServer, uid: int, pool: ForkPool) -> None:
        self.kernel = kernel
        self._server = server
        self._uid = uid
        self._pool = pool

    @property
    def storage(self) -> SessionStorage:
        return self._server.storage

    @property
    def relaunchable(self) -> bool:
        return False

    @property
    def files_owner(self) -> tuple[int, int] | None:
        return (self._uid, self._uid)

    async def release(self) -> None:
        try:
            await self.kernel.close()
        finally:
            self._pool._give_back(self._server)


class ForkPool:
    """Fork-server containers kept for stateless requests, one request each at a time."""

    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        runtime: RuntimeDir,
        warm: WarmPool,
        context: zmq.asyncio.Context,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self._runtime = runtime
        self._warm = warm
        self._context = context
        self.metrics = metrics or Metrics()
        self._busy: set[ForkServer] = set()
        self._long_waits = 0
        """Requests that have waited `BURST_AFTER` for a server."""
        self._idle_since: dict[ForkServer, float] = {}
        self._trimming = False
        self._refill: Refill[ForkServer] = Refill(
            "fork server",
            self._start_one,
            self._wanted,
            settings.max_concurrent_starts,
            on_ready=self._kept_ready,
            on_handed=self._busy.add,
        )
        self._numbers = itertools.count(1)
        light = settings.fork_light_preload_list
        self.light_modules = roots(light) if light else None
        """Top-level packages of the light template, or None if there is only one."""
        self._config: JSON = {
            "conn_dir": "/conn",
            "writable": WRITABLE,
            "preload_code": preload_code(light or settings.preload_list),
            "full_preload_code": preload_code(
                [m for m in settings.preload_list if m not in light] if light else []
            ),
            "full_start_seconds": settings.kernel_start_timeout / 2,
            "offline": settings.network == "none",
            "figure_formats": settings.figure_format_list,
            "figure_dpi": settings.figure_dpi,
        }
        self._seq = itertools.count()
        self.requests_served = 0
        self.light_requests = 0
        self.servers_started = 0

    def _wanted(self) -> int:
        """Servers to keep idle or starting: `--fork-servers` in all, and one more for each
        request that has waited `BURST_AFTER` beyond them, up to twice `--fork-servers`."""
        busy = len(self._busy)
        waiting = min(self._long_waits, self.settings.fork_servers)
        total = min(
            max(self.settings.fork_servers, busy + waiting), self.settings.fork_servers + waiting
        )
        return total - busy

    def start(self) -> None:
        self._refill.fill()

    def stats(self) -> ForkServerStats:
        return {
            "idle": len(self._refill.ready),
            "busy": len(self._busy),
            "starting": self._refill.starting,
            "target": self.settings.fork_servers,
            "servers_started": self.servers_started,
            "requests_served": self.requests_served,
            "light_requests": self.light_requests,
        }

    async def close(self) -> None:
        servers = [*await self._refill.close(), *self._busy]
        self._busy.clear()
        await asyncio.gather(*(self._discard(s) for s in servers), return_exceptions=True)

    # -- one request -------------------------------------------------------------------------

    def is_light(self, code: str) -> bool:
        """Whether a request for `code` may be forked from the light template (light.py)."""
        return self.light_modules is not None and is_light(code, self.light_modules)

    async def acquire(self, light: bool = False) -> ForkedKernel:
        """A ready kernel forked for one request; releasing it gives its server back.
        `light`: from the light template (`is_light`), else from the full one.

        A fork server found dead at the fork is replaced and the fork tried on another:
        that is not the request's doing.
        """
        for _ in range(FORK_ATTEMPTS - 1):
            try:
                return await self._acquire_once(light)
            except LostServer:
                continue
        return await self._acquire_once(light)

    async def _acquire_once(self, light: bool) -> ForkedKernel:
        server = await self._server()
        try:
            process = await server.fork(next(self._numbers), light)
            # No kernel_info handshake: the child answers nothing before the gateway's
            # IOPub subscription has reached it (zygote.py), so the cell can go at once.
            kernel = Kernel(process, self._context)
        except BaseException:
            server.healthy = False
            self._give_back(server)
            raise
        self.requests_served += 1
        self.light_requests += process.template == "light"
        return ForkedKernel(kernel, server, process.uid, self)

    async def _server(self) -> ForkServer:
        ready = self._refill.ready
        while ready:
            server = ready.popleft()
            self._idle_since.pop(server, None)
            if server.healthy and server.host.process.poll() is None:
                self._busy.add(server)
                return server
            self._refill.tasks.spawn(self._discard(server))
            self._refill.fill()
        long_wait = False

        def waited_long() -> None:
            nonlocal long_wait
            long_wait = True
            self._long_waits += 1
            self._refill.fill()

        timer = asyncio.get_running_loop().call_later(BURST_AFTER, waited_long)
        try:
            server = await self._refill.wait(self.settings.kernel_start_timeout)
        finally:
            timer.cancel()
            if long_wait:
                self._long_waits -= 1
        self._busy.add(server)
        return server

    def _give_back(self, server: ForkServer) -> None:
        self._busy.discard(server)
        worn = server.served >= min(self.settings.fork_server_requests, UID_SPAN - 1)
        dead = server.host.process.poll() is not None
        if self._refill.closed or not server.healthy or worn or dead:
            self._refill.tasks.spawn(self._discard(server))
            self._refill.fill()
            return
        # Last in, first out: the busiest server stays warm in the caches, and the ones
        # at the other end are those a burst no longer needs.
        self._refill.hand_out(server, newest_first=True)

    def _kept_ready(self, server: ForkServer) -> None:
        """A server went into the ready queue (given back, or just started)."""
        self._busy.discard(server)  # handed to a waiter that left before taking it
        self._idle_since[server] = time.monotonic()
        if len(self._refill.ready) + len(self._busy) > self.settings.fork_servers:
            self._trim_later()

    def _trim_later(self) -> None:
        if not self._trimming:
            self._trimming = True
            self._refill.tasks.spawn(self._trim())

    async def _trim(self) -> None:
        """Let go of ready servers beyond `--fork-servers` once idle for `BURST_KEEP`,
        the longest idle first; done when none is beyond."""
        try:
            while len(self._refill.ready) + len(self._busy) > self.settings.fork_servers:
                await asyncio.sleep(BURST_KEEP / 4)
                ready = self._refill.ready
                now = time.monotonic()
                for server in sorted(ready, key=lambda s: self._idle_since.get(s, now)):
                    surplus = len(ready) + len(self._busy) - self.settings.fork_servers
                    if surplus <= 0 or now - self._idle_since.get(server, now) < BURST_KEEP:
                        break
                    ready.remove(server)
                    self._refill.tasks.spawn(self._discard(server))
        finally:
            self._trimming = False

    # -- fork servers ------------------------------------------------------------------------

    async def _start_one(self) -> ForkServer | None:
        storage: SessionStorage | None = None
        server: ForkServer | None = None
        began = time.monotonic()
        try:
            root = self._runtime.new_workspace()
            storage = SessionStorage(root)
            storage = await self.backend.prepare_storage(root)
            config = {**self._config, "uid_base": UID_BASE + (next(self._seq) % 20_000) * UID_SPAN}
            host = await self.backend.launch_fork_server(storage, config)
            server = ForkServer(host, storage, self.settings.fork_server_requests)
            await server.connect(self.settings.kernel_start_timeout)
        except BaseException as exc:
            if server is not None:
                await asyncio.shield(self._discard(server))
            elif storage is not None:
                await asyncio.shield(self._warm.remove_storage(storage))
            if isinstance(exc, Exception):
                self.metrics.kernel_start_failed()
            raise
        self.servers_started += 1
        self.metrics.kernel_started(time.monotonic() - began)
        if self._refill.closed:
            await self._discard(server)
            return None
        return server

    async def _discard(self, server: ForkServer) -> None:
        self._idle_since.pop(server, None)
        try:
            await server.close()
        finally:
            await self._warm.remove_storage(server.storage)
            await asyncio.to_thread(shutil.rmtree, server.host.conn_dir, True)


def fork_pool(
    settings: Settings,
    backend: Backend,
    runtime: RuntimeDir,
    warm: WarmPool,
    context: zmq.asyncio.Context,
    metrics: Metrics,
) -> ForkPool | None:
    """The fork pool `--stateless-mode` asks for, or None for a container per request."""
    if settings.stateless_mode == "container":
        return None
    if settings.stateless_mode == "fork" and backend.fork_servers is not None:
        raise KernelUnavailable(f"--stateless-mode fork: {backend.fork_servers}")
    why_not = backend.fork_servers_by_default
    if settings.stateless_mode == "auto" and why_not is not None:
        logger.info("stateless requests get a container each: %s", why_not)
        return None
    return ForkPool(settings, backend, runtime, warm, context, metrics)
