"""Jupyter's view of the gateway's sessions: kernel models, and WebSocket channels.

A Jupyter kernel here *is* a gateway session (same limits, idle reaping and
restart policy, same files at `/sessions/{id}/files`). Its kernel id is the
session id's UUID in Jupyter's canonical spelling (`6f1c0e2a-…`, which Jupyter
Server's routes require; the session id is the same UUID without dashes). Its
`/api/kernels/{id}/channels` WebSocket is a proxy onto the kernel's own ZMQ
channels, as Jupyter Server's is: each connection opens its own shell, control
and stdin sockets (one identity, so `input()` works) and an IOPub subscriber,
beside the gateway's, so every message type reaches the kernel (completion,
inspection, comms and widgets included) and the gateway's own cells are not
disturbed.

What the proxy adds, so that a notebook never hangs on a kernel the gateway
replaced: when the kernel ends, each client is sent an IOPub `status` of
`restarting` (a new kernel is coming; `dead` once the restart budget is spent),
and every execute_request still unanswered gets an `error` output, an `idle`
status and an error `execute_reply`, as if the kernel had raised. Once the new
kernel answers, the proxy reconnects and says `idle`. A `shutdown_request` is
carried out by the gateway (a restart replaces the kernel; otherwise the session
is deleted) instead of letting the kernel exit as if it died. A cell running
over a connection keeps its session from being reaped as idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import zmq
import zmq.asyncio
from starlette.websockets import WebSocket, WebSocketDisconnect

from kernel_gateway.errors import GatewayError, SessionNotFound
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.languages import PYTHON
from kernel_gateway.kernels.wire import (
    MAX_MESSAGE_BYTES,
    BadMessage,
    Channel,
    Signer,
    serialize,
    socket_url,
    verified_parts,
)
from kernel_gateway.protocols.jupyter.wire import (
    CLIENT_CHANNELS,
    BadFrame,
    WireMessage,
    from_client,
    header_of,
    make,
    to_client,
)
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.session import Session
from kernel_gateway.tasks import TaskSet
from kernel_gateway.tenants.principal import ADMIN, Principal
from kernel_gateway.types import JSON

logger = logging.getLogger(__name__)

KERNEL_NAME = "python3"
"""Python's kernelspec name (Jupyter's usual one); every other language's is its own name."""


def kernel_name(language: str) -> str:
    """The kernelspec name of a language: `python3` for Python, else the language's name."""
    return KERNEL_NAME if language == PYTHON else language


ALIASES = {KERNEL_NAME: PYTHON, "ir": "r", "deno": "typescript", "jjava": "java"}
"""Kernelspec names notebooks made elsewhere carry (IRkernel's `ir`, Deno's `deno`, JJava's
`jjava`), and the gateway's language each starts."""


def language_of(name: str) -> str:
    """The language a kernelspec name starts: its own name, or an alias's (`python3`)."""
    return ALIASES.get(name, name)


PROTOCOL_VERSION = "5.3"
MAX_CONNECTIONS = 16
"""WebSockets one kernel may have open at once."""
SEND_TIMEOUT = 60.0
"""Seconds a client may take to accept one message before it is disconnected."""
NUDGE_SECONDS = 30.0
KEEPALIVE_SECONDS = 10.0
"""Most seconds between two touches of a session while a cell runs over a connection."""
POLL_SECONDS = 0.1
QUEUE_SIZE = 256


@dataclass
class KernelState:
    """What Jupyter reports about a kernel beyond what the session knows."""

    connections: int = 0
    execution_state: str | None = None
    """The last IOPub status seen over a connection (None: none seen)."""
    proxies: set[ChannelProxy] = field(default_factory=set)


class JupyterKernels:
    """Kernel models and open channel proxies, per session."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.context = zmq.asyncio.Context()
        self._states: dict[str, KernelState] = {}
        self.tasks = TaskSet()
        """What shutdown_requests set going (a restart, a deletion), awaited at `close`."""

    def state(self, session_id: str) -> KernelState:
        return self._states.setdefault(session_id, KernelState())

    def session(self, kernel_id: str, viewer: Principal) -> Session:
        """The session behind a kernel id (either spelling), if `viewer` may see it;
        SessionNotFound if none."""
        return self.registry.get(session_id(kernel_id), viewer)

    def model(self, session: Session) -> JSON:
        """The kernel model Jupyter Server and its gateway client read; a kernel on a
        template also has `template` (id, name, build_id), which Jupyter's clients pass
        along untouched (its `name` stays the kernelspec's, which clients look up)."""
        state = self._states.get(session.id) or KernelState()
        idle = session.idle_seconds()
        last = datetime.now(UTC) - timedelta(seconds=max(0.0, idle))
        model: JSON = {
            "id": kernel_id(session.id),
            "name": kernel_name(session.language),
            "last_activity": last.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "execution_state": self.execution_state(session, state),
            "connections": state.connections,
        }
        if session.template is not None:
            model["template"] = session.template.to_json()
        return model

    def execution_state(self, session: Session, state: KernelState) -> str:
        status = session.status
        if status in ("failed", "closed"):
            return "dead"
        if status == "restarting":
            return "restarting"
        if status in ("busy", "hibernating") or state.execution_state == "busy":
            return "busy"
        return "idle"

    def forget(self, session_id: str) -> None:
        """Drop what is known of a kernel beyond its session, unless a client is connected."""
        state = self._states.get(session_id)
        if state is not None and not state.proxies:
            del self._states[session_id]

    async def close(self) -> None:
        proxies = [p for state in self._states.values() for p in state.proxies]
        for proxy in proxies:
            proxy.stop()
        await asyncio.gather(*(p.finished.wait() for p in proxies), return_exceptions=True)
        await self.tasks.join()
        self.context.destroy(linger=0)

    async def interrupt(self, session: Session) -> None:
        """Interrupt whatever the kernel runs: a gateway cell, or a notebook's."""
        if await session.interrupt():
            return
        kernel = session.slot.kernel
        if kernel is not None and session.slot.alive:
            session.touch()
            await kernel.interrupt()

    async def serve(self, websocket: WebSocket, session: Session, protocol: str | None) -> None:
        state = self.state(session.id)
        proxy = ChannelProxy(self, session, websocket, protocol)
        state.proxies.add(proxy)
        state.connections += 1
        session.hold()
        try:
            await proxy.run()
        finally:
            state.connections -= 1
            session.let_go()
            state.proxies.discard(proxy)
            self.forget(session.id)  # what IOPub said is stale once nobody listens


def kernel_id(session_id: str) -> str:
    """A session id as a Jupyter kernel id: the same UUID, with dashes."""
    try:
        return str(uuid.UUID(hex=session_id))
    except ValueError:
        return session_id


def session_id(kernel_id: str) -> str:
    """A Jupyter kernel id (or a session id) as the session id."""
    try:
        return uuid.UUID(kernel_id).hex
    except ValueError:
        return kernel_id


class KernelLink:
    """One connection's sockets to one kernel: shell, control, stdin (one identity), IOPub."""

    def __init__(self, kernel: Kernel, context: zmq.asyncio.Context) -> None:
        info = kernel.process.connection
        self.kernel = kernel
        self._signer = Signer.of(info)
        identity = uuid.uuid4().hex.encode()
        self.sockets: dict[str, zmq.asyncio.Socket] = {}
        channels: tuple[tuple[Channel, int], ...] = (
            ("shell", zmq.DEALER),
            ("control", zmq.DEALER),
            ("stdin", zmq.DEALER),
            ("iopub", zmq.SUB),
        )
        for channel, kind in channels:
            sock = context.socket(kind)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            sock.setsockopt(zmq.RECONNECT_IVL, 10)
            if kind == zmq.DEALER:
                sock.setsockopt(zmq.IDENTITY, identity)
            else:
                sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(socket_url(info, channel))
            self.sockets[channel] = sock

    async def send(self, message: WireMessage) -> None:
        frames = serialize(message.parts, self._signer)
        await self.sockets[message.channel].send_multipart(frames)

    async def receive(self, channel: str) -> WireMessage | None:
        """The next message on a channel; None for one that fails its signature."""
        frames = await self.sockets[channel].recv_multipart()
        try:
            return WireMessage(channel, verified_parts(frames, self._signer))
        except BadMessage:
            return None

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close(linger=0)


class ChannelProxy:
    """One client WebSocket onto a session's kernel, across the kernel's replacements."""

    def __init__(
        self,
        hub: JupyterKernels,
        session: Session,
        websocket: WebSocket,
        protocol: str | None,
    ) -> None:
        self.hub = hub
        self.session = session
        self.websocket = websocket
        self.protocol = protocol
        self.finished = asyncio.Event()
        self._inbox: asyncio.Queue[WireMessage] = asyncio.Queue(QUEUE_SIZE)
        self._pending: dict[str, dict[str, Any]] = {}
        """Unanswered execute_requests: msg_id -> header."""
        self._internal: set[str] = set()
        """msg_ids of the proxy's own requests (nudges), whose answers clients never see."""
        self._send_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._status_session = uuid.uuid4().hex

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def run(self) -> None:
        self._task = asyncio.current_task()
        await self.websocket.accept(subprotocol=self.protocol)
        reader = asyncio.ensure_future(self._read_client())
        try:
            await self._serve(reader)
        except (WebSocketDisconnect, asyncio.CancelledError):
            pass
        except _Closed:
            pass
        except Exception:
            logger.exception("session %s: the kernel WebSocket failed", self.session.id)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self.websocket.close()
            self.finished.set()

    async def _serve(self, reader: asyncio.Task[None]) -> None:
        """Connect to the session's kernel, and again to each kernel that replaces it."""
        first = True
        while not reader.done():
            kernel = await self._live_kernel(reader)
            if kernel is None:
                return
            link = KernelLink(kernel, self.hub.context)
            try:
                await self._nudge(link, reader)
                if not first:
                    await self._status("idle")
                first = False
                ended = await self._pump(link, reader)
            finally:
                link.close()
            if not ended:
                return
            await self._kernel_ended(kernel)

    async def _live_kernel(self, reader: asyncio.Task[None]) -> Kernel | None:
        """The session's kernel once it runs; None when the session is gone or the client left."""
        said_dead = False
        while not reader.done():
            if self.session.closed:
                await self._status("dead")
                return None
            slot = self.session.slot
            if slot.hibernated:  # a notebook connects: bring its kernel back
                with contextlib.suppress(GatewayError):
                    await self.session.resume()
            if slot.alive and slot.kernel is not None:
                return slot.kernel
            if slot.policy.failed and not said_dead:
                await self._status("dead")
                said_dead = True
            await asyncio.wait({reader}, timeout=POLL_SECONDS)
        return None

    async def _nudge(self, link: KernelLink, reader: asyncio.Task[None]) -> None:
        """Wait until IOPub is subscribed (a SUB socket misses what comes before).

        As Jupyter Server does: kernel_info_requests on shell and control (control
        answers even while a cell runs) until some IOPub message arrives. IOPub output
        of a running cell that arrives meanwhile goes to the client; the answers to the
        nudges never do.
        """
        seen = asyncio.Event()
        deadline = time.monotonic() + NUDGE_SECONDS

        async def watch() -> None:
            while True:
                message = await link.receive("iopub")
                if message is None:
                    continue
                seen.set()
                if _parent_id(message) not in self._internal:
                    await self._send(message)

        async def drain(channel: str) -> None:
            while True:
                await link.receive(channel)

        tasks = [asyncio.ensure_future(watch())]
        tasks += [asyncio.ensure_future(drain(c)) for c in ("shell", "control")]
        seen_wait = asyncio.ensure_future(seen.wait())
        # Stop nudging as soon as the client leaves or the kernel ends: nobody would get
        # an answer (and a proxy left nudging for its whole deadline holds up shutdown).
        stop = {seen_wait, reader, link.kernel.exited}
        try:
            while time.monotonic() < deadline:
                for channel in ("shell", "control"):
                    header = _header("kernel_info_request", self._status_session)
                    self._internal.add(header["msg_id"])
                    await link.send(make(channel, header, {}, {}))
                done, _ = await asyncio.wait(stop, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                if done:
                    break
        finally:
            seen_wait.cancel()
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, _Closed):
                    raise result

    async def _pump(self, link: KernelLink, reader: asyncio.Task[None]) -> bool:
        """Carry messages both ways until the kernel ends (True) or the client leaves (False)."""
        tasks = [asyncio.ensure_future(self._to_kernel(link))]
        tasks += [asyncio.ensure_future(self._to_client(link, c)) for c in ("iopub", "shell")]
        tasks += [asyncio.ensure_future(self._to_client(link, c)) for c in ("control", "stdin")]
        tasks.append(asyncio.ensure_future(self._keep_alive()))
        exited = link.kernel.exited
        try:
            done, _ = await asyncio.wait(
                {exited, reader, *tasks}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if task is exited or task is reader:
                    continue
                error = task.exception()
                if error is not None:
                    raise error
            return exited in done and reader not in done
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _read_client(self) -> None:
        """Client frames -> the inbox; ends when the client leaves or sends garbage."""
        while True:
            event = await self.websocket.receive()
            if event["type"] == "websocket.disconnect":
                return
            frame = event.get("bytes")
            if frame is None:
                frame = event.get("text")
            if frame is None:
                continue
            try:
                message = from_client(frame, self.protocol)
            except BadFrame as exc:
                logger.info("session %s: closing a WebSocket: %s", self.session.id, exc)
                await self.websocket.close(code=1007, reason=f"not a Jupyter message: {exc}"[:120])
                return
            if message.channel not in CLIENT_CHANNELS:
                logger.info(
                    "session %s: message on channel %r dropped", self.session.id, message.channel
                )
                continue
            await self._inbox.put(message)

    async def _to_kernel(self, link: KernelLink) -> None:
        while True:
            message = await self._inbox.get()
            self.session.touch()
            header = header_of(message)
            msg_type = header["msg_type"]
            if msg_type == "shutdown_request" and message.channel in ("shell", "control"):
                await self._shutdown(message, header)
                continue
            if msg_type == "execute_request" and message.channel == "shell":
                self._pending[header["msg_id"]] = header
            await link.send(message)

    async def _to_client(self, link: KernelLink, channel: str) -> None:
        state = self.hub.state(self.session.id)
        while True:
            message = await link.receive(channel)
            if message is None:
                continue
            try:
                header = header_of(message)
                parent = _parent_id(message)
            except BadFrame:
                continue
            if parent in self._internal:
                continue
            msg_type = header["msg_type"]
            if channel == "iopub" and msg_type == "status":
                state.execution_state = _execution_state(message) or state.execution_state
            if channel == "shell" and msg_type == "execute_reply":
                self._pending.pop(parent, None)
            self.session.touch()
            await self._send(message)

    async def _keep_alive(self) -> None:
        """A cell running over this connection keeps the session from being reaped as idle."""
        period = min(KEEPALIVE_SECONDS, self.hub.registry.settings.idle_timeout / 4)
        while True:
            await asyncio.sleep(period)
            if self._pending:
                self.session.touch()

    async def _send(self, message: WireMessage) -> None:
        frame = to_client(message, self.protocol)
        async with self._send_lock:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
                # cancellation that arrives as the send completes, leaving the task that
                # sent (a proxy being stopped) running on for good.
                async with asyncio.timeout(SEND_TIMEOUT):
                    if isinstance(frame, bytes):
                        await self.websocket.send_bytes(frame)
                    else:
                        await self.websocket.send_text(frame)
            except (TimeoutError, RuntimeError, OSError, WebSocketDisconnect) as exc:
                raise _Closed() from exc

    async def _status(self, state: str, parent: dict[str, Any] | None = None) -> None:
        header = _header("status", self._status_session)
        await self._send(make("iopub", header, parent or {}, {"execution_state": state}))

    async def _kernel_ended(self, kernel: Kernel) -> None:
        """Tell the client the kernel is gone, and answer every cell that was running in it."""
        self.hub.state(self.session.id).execution_state = None
        info = kernel.exit_info
        if self.session.closed:
            why = "the session was deleted"
        elif self.session.slot.was_retired(kernel):
            why = "the kernel was restarted"
        else:
            why = info.describe() if info is not None else "the kernel ended"
        await self._status("restarting")
        pending, self._pending = self._pending, {}
        for parent in pending.values():
            error = {"ename": "DeadKernelError", "evalue": why, "traceback": [f"{why}"]}
            await self._send(make("iopub", _header("error", self._status_session), parent, error))
            await self._status("idle", parent)
            reply = {"status": "error", "execution_count": None, **error}
            await self._send(
                make("shell", _header("execute_reply", self._status_session), parent, reply)
            )

    async def _shutdown(self, message: WireMessage, header: dict[str, Any]) -> None:
        """Carry out a shutdown_request: a restart replaces the kernel, else the session goes."""
        content = _json_part(message, 3)
        restart = bool(content.get("restart", False))
        reply = make(
            message.channel,
            _header("shutdown_reply", self._status_session),
            header,
            {"status": "ok", "restart": restart},
        )
        await self._send(reply)
        if restart:
            self.hub.tasks.spawn(_quietly(self.session.restart))
        else:
            registry, session_id = self.hub.registry, self.session.id
            # Its owner's (or the admin's) client, checked when the WebSocket opened.
            self.hub.tasks.spawn(_quietly(lambda: registry.delete_session(session_id, ADMIN)))


class _Closed(Exception):
    """The client's WebSocket is gone or stalled."""


async def _quietly(action: Callable[[], Any]) -> None:
    try:
        await action()
    except (GatewayError, SessionNotFound) as exc:
        logger.info("shutdown_request: %s", exc)


def _header(msg_type: str, session: str) -> dict[str, Any]:
    return {
        "msg_id": uuid.uuid4().hex,
        "msg_type": msg_type,
        "session": session,
        "username": "kernel-gateway",
        "date": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "version": PROTOCOL_VERSION,
    }


def _json_part(message: WireMessage, index: int) -> dict[str, Any]:
    try:
        value = json.loads(message.parts[index])
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _parent_id(message: WireMessage) -> str:
    parent = _json_part(message, 1)
    value = parent.get("msg_id", "")
    return value if isinstance(value, str) else ""


def _execution_state(message: WireMessage) -> str | None:
    value = _json_part(message, 3).get("execution_state")
    return value if isinstance(value, str) else None
