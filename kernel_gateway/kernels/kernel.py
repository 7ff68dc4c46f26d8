"""One connected kernel: Jupyter messages in and out (over ZMQ, or one Unix stream for a
forked stateless kernel: channels.py).

A reader task per channel routes every incoming message by its parent's
msg_id to whoever sent the request, so each execution sees only its own
output, and output that arrives late (a background thread printing after the
cell ended) is dropped rather than leaking into the next execution. Routing is
one dict lookup per message, whatever the number of kernels.

Code in a kernel can read its own connection key and publish signed messages
of any shape, so a message that does not parse or has the wrong shape is
dropped and counted (`dropped_messages`); it never stops a reader.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import Callable
from typing import Any, Protocol

import zmq
import zmq.asyncio
from jupyter_client.session import Session as JupyterSession

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.backends.base import ExitInfo, KernelProcess
from kernel_gateway.kernels.channels import Requests
from kernel_gateway.kernels.events import ExecuteReply, input_count, is_idle, translate
from kernel_gateway.kernels.languages import PYTHON
from kernel_gateway.kernels.wire import Signer, deserialize, pack_parts, serialize
from kernel_gateway.types import Event, Message

logger = logging.getLogger(__name__)

Listener = Callable[[Message], None]


class KernelCallFailed(Exception):
    """Silent code the gateway ran in a kernel failed (`Kernel.evaluate`): the words say why."""


class KernelCallTimedOut(KernelCallFailed):
    """No answer within the time given: the code may still be running in the kernel."""


class OutputSink(Protocol):
    """Receives what one execute_request caused on IOPub, already parsed."""

    def on_input(self, execution_count: int) -> None: ...
    def on_event(self, event: Event) -> None: ...
    def on_idle(self) -> None: ...


class Kernel:
    def __init__(self, process: KernelProcess, context: zmq.asyncio.Context) -> None:
        info = process.connection
        self.process = process
        self.id = process.id
        self.language = process.language
        # jupyter_client builds the headers and packs the JSON; wire.py signs and checks.
        # (Keyed all the same: an unkeyed Session warns that signing is disabled.)
        self._session = JupyterSession(
            key=info["key"].encode(),
            signature_scheme=info["signature_scheme"],
            username="kernel-gateway",
        )
        self._signer = Signer.of(info)
        self._channels = process.channels(context)
        self._listeners: dict[str, Listener] = {}
        self._replies: dict[str, asyncio.Future[Message]] = {}
        self.exited: asyncio.Task[ExitInfo] = asyncio.ensure_future(process.wait())
        self._killing: asyncio.Future[None] | None = None
        self._channels.start(self._receive, self._broken)
        self.language_info: dict[str, Any] = {}
        self.closed = False
        self.dropped_messages = 0
        """Messages dropped because they did not verify, parse or have the right shape."""

    # -- receiving ---------------------------------------------------------------------------

    def _receive(self, channel: str, frames: list[bytes]) -> None:
        """Each message verified and parsed once (`wire.deserialize`, which skips what
        jupyter_client adds and the gateway never reads), then routed."""
        try:
            msg = deserialize(frames, self._signer)
            if channel == "iopub":
                self._on_iopub(msg)
            else:
                self._on_reply(msg)
        except Exception as exc:
            self._drop(exc)

    def _broken(self, exc: Exception) -> None:
        """The kernel's stream stopped being framed right: nothing more from it can be
        read, so the kernel is ended (its execution fails saying it died)."""
        logger.warning("kernel %s broke its message stream (%s); ending it", self.id, exc)
        if not isinstance(exc, EOFError):  # a stream closed early lost no message
            self.dropped_messages += 1
        if not self.closed:
            self._killing = asyncio.ensure_future(self.process.kill())

    def _drop(self, exc: Exception) -> None:
        self.dropped_messages += 1
        if self.dropped_messages == 1 or self.dropped_messages % 1000 == 0:
            logger.warning(
                "kernel %s sent a malformed message (%s); dropped (%d so far)",
                self.id,
                exc,
                self.dropped_messages,
            )

    def _on_iopub(self, msg: Message) -> None:
        listener = self._listeners.get(msg["parent_header"].get("msg_id", ""))
        if listener is not None:
            listener(msg)

    def _on_reply(self, msg: Message) -> None:
        future = self._replies.pop(msg["parent_header"].get("msg_id", ""), None)
        if future is not None and not future.done():
            future.set_result(msg)

    # -- sending -----------------------------------------------------------------------------

    async def _send(
        self,
        channel: Requests,
        msg_type: str,
        content: dict[str, Any],
        listener: Listener | None = None,
    ) -> tuple[str, asyncio.Future[Message]]:
        msg = self._session.msg(msg_type, content)
        frames = serialize(pack_parts(msg, self._session.pack), self._signer)
        msg_id: str = msg["header"]["msg_id"]
        reply: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._replies[msg_id] = reply
        if listener is not None:
            self._listeners[msg_id] = listener
        await self._channels.send(channel, frames)
        return msg_id, reply

    async def execute(self, code: str, sink: OutputSink) -> tuple[str, asyncio.Future[Message]]:
        """Send an execute_request; what it causes on IOPub goes to `sink`, parsed.

        Returns the request's msg_id and a future for its shell reply.
        """
        return await self._send(
            "shell",
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
            _router(sink),
        )

    def follow(self, msg_id: str, sink: OutputSink) -> None:
        """Route what an execute_request sent by an earlier gateway still causes to `sink`.

        Its shell reply went to that gateway's socket and is lost; its IOPub output is not.
        """
        self._listeners[msg_id] = _router(sink)

    async def outcome(self, msg_id: str, seconds: float) -> ExecuteReply | None:
        """How the cell sent as `msg_id` ended, from the kernel's own log (see
        kernel_startup's `_install_outcome_log`); None if the kernel does not know.

        Only Python's kernel keeps that log: other languages' kernels do not know."""
        if self.language != PYTHON or not all(c.isalnum() or c in "-_" for c in msg_id):
            return None
        content = {
            "code": "",
            "silent": True,
            "store_history": False,
            "user_expressions": {"o": f"get_ipython().kernel._kg_outcomes.get({msg_id!r})"},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        sent, reply = await self._send("shell", "execute_request", content)
        try:
            waiting: set[asyncio.Future[Any]] = {reply, self.exited}
            await asyncio.wait(waiting, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            if not reply.done() or reply.cancelled():
                return None
            found = reply.result()["content"]["user_expressions"]["o"]
            text = ast.literal_eval(found["data"]["text/plain"])
            if not isinstance(text, str):
                return None
            data = json.loads(text)
            count = data.get("execution_count")
            return ExecuteReply(
                status=str(data["status"]),
                execution_count=count if isinstance(count, int) else None,
                exit_requested=False,
            )
        except (KeyError, TypeError, ValueError, SyntaxError):
            return None
        finally:
            self.forget(sent)

    async def probe(self, seconds: float) -> bool:
        """Whether the kernel answers a kernel_info_request in time.

        Asked on the control channel, which ipykernel and Deno serve even while a cell
        runs, and on shell too: IRkernel answers kernel_info on shell only.
        """
        control_id, control = await self._send("control", "kernel_info_request", {})
        shell_id, shell = await self._send("shell", "kernel_info_request", {})
        try:
            waiting: set[asyncio.Future[Any]] = {control, shell, self.exited}
            await asyncio.wait(waiting, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            return any(r.done() and not r.cancelled() for r in (control, shell))
        finally:
            self.forget(control_id)
            self.forget(shell_id)

    def forget(self, msg_id: str) -> None:
        """Stop routing messages for a finished request (late output is dropped)."""
        self._listeners.pop(msg_id, None)
        future = self._replies.pop(msg_id, None)
        if future is not None and not future.done():
            future.cancel()

    async def run_silent(self, code: str, seconds: float) -> bool:
        """Run code the user never sees: no output, no history, no execution count."""
        content = {
            "code": code,
            "silent": True,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        msg_id, reply = await self._send("shell", "execute_request", content)
        try:
            waiting: set[asyncio.Future[Any]] = {reply, self.exited}
            await asyncio.wait(waiting, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            return reply.done() and reply.result()["content"].get("status") == "ok"
        finally:
            self.forget(msg_id)

    async def evaluate(self, code: str, expression: str, seconds: float) -> str:
        """Run `code` silently, then return `expression`'s value as text (`text/plain`).

        Raises `KernelCallFailed` saying why when the code fails, the kernel ends, or no
        answer comes within `seconds`."""
        content = {
            "code": code,
            "silent": True,
            "store_history": False,
            "user_expressions": {"value": expression},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        if self.closed:
            raise KernelCallFailed("the kernel was closed")
        try:
            msg_id, reply = await self._send("shell", "execute_request", content)
        except zmq.ZMQError as exc:
            raise KernelCallFailed(f"the kernel cannot be reached: {exc}") from None
        try:
            waiting: set[asyncio.Future[Any]] = {reply, self.exited}
            await asyncio.wait(waiting, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.forget(msg_id)
        if not reply.done() or reply.cancelled():
            if self.exit_info is not None:
                raise KernelCallFailed(self.exit_info.describe())
            raise KernelCallTimedOut(f"no answer within {seconds:g} s")
        answer = reply.result()["content"]
        if answer.get("status") != "ok":
            raise KernelCallFailed(f"{answer.get('ename', 'Error')}: {answer.get('evalue', '')}")
        value = answer.get("user_expressions", {}).get("value", {})
        if not isinstance(value, dict) or value.get("status") != "ok":
            name = value.get("ename", "Error") if isinstance(value, dict) else "Error"
            evalue = value.get("evalue", "") if isinstance(value, dict) else ""
            raise KernelCallFailed(f"{name}: {evalue}")
        text = value.get("data", {}).get("text/plain")
        if not isinstance(text, str):
            raise KernelCallFailed("the kernel answered without a value")
        return text

    async def wait_ready(self, seconds: float) -> None:
        """Wait until the kernel answers on shell and its IOPub output reaches us.

        A SUB socket misses what is published before its subscription lands, so
        readiness needs an IOPub message for our own kernel_info_request too: its
        `idle` status, the kernel's word that it is done with the request. (Deno's
        kernel, sent a cell while it still handled kernel_info, ran the next cell
        without publishing its result.)
        """
        deadline = time.monotonic() + seconds
        while True:
            if self.exited.done():
                exit_info = self.exited.result().describe()
                raise KernelUnavailable(f"kernel died while starting: {exit_info}")
            seen = asyncio.Event()
            msg_id, reply = await self._send("shell", "kernel_info_request", {}, _idle_setter(seen))
            try:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise KernelUnavailable(f"kernel did not become ready within {seconds:g} s")
                waiting: set[asyncio.Future[Any]] = {reply, self.exited}
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=min(remaining, 1.0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if reply in done:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(seen.wait(), 0.25)
                    if seen.is_set():
                        self.language_info = reply.result()["content"].get("language_info", {})
                        return
            finally:
                self.forget(msg_id)

    @property
    def exit_info(self) -> ExitInfo | None:
        """How the kernel ended, or None while it runs."""
        task = self.exited
        if not task.done():
            return None
        if task.cancelled() or task.exception() is not None:
            return ExitInfo(None, "killed")
        return task.result()

    async def interrupt(self) -> None:
        await self.process.send_signal(signal.SIGINT)

    async def kill(self) -> None:
        """End the kernel at once (its state is lost); `exited` resolves soon after."""
        await self.process.kill()

    async def close(self) -> None:
        """Stop reading, close sockets, and kill and remove the kernel (idempotent)."""
        self.disconnect()
        # cleanup() guarantees the process has ended, so `exited` resolves on its own.
        await self.process.cleanup()

    def disconnect(self) -> None:
        """Stop reading and close sockets, leaving the kernel running (for a successor)."""
        if self.closed:
            return
        self.closed = True
        self._channels.close()
        for future in self._replies.values():
            future.cancel()
        self._replies.clear()
        self._listeners.clear()


def _router(sink: OutputSink) -> Listener:
    def route(msg: Message) -> None:
        if is_idle(msg):
            sink.on_idle()
            return
        count = input_count(msg)
        if count is not None:
            sink.on_input(count)
            return
        event = translate(msg)
        if event is not None:
            sink.on_event(event)

    return route


def _idle_setter(event: asyncio.Event) -> Listener:
    def on_message(msg: Message) -> None:
        if is_idle(msg):
            event.set()

    return on_message
