"""envd's `process.Process` service: commands in a sandbox, beside its kernel.

Each command runs in the sandbox's kernel container as the sandbox user
(`KernelProcess.run_command`), in `/home/user` unless told otherwise, with the sandbox's
environment variables and the request's own. Its output is read once and handed to
every stream following it (`Start`'s, and any `Connect` made later); a command outlives
its streams (E2B's background commands) until it ends, is killed, or its
`Connect-Timeout-Ms` passes.

    Start (server stream)   {"event": {"start": {"pid"}}}, then {"data": {"stdout"|"stderr"}}
                            (base64), keepalives, then {"end": {"exitCode", "exited",
                            "status", "error"}}, then the end-of-stream envelope
    Connect (server stream) the same, for a running pid, from now on
    List, SendInput, CloseStdin, SendSignal (SIGKILL, SIGTERM), StreamInput
    Update                  a PTY's size

A command started with `pty` (E2B's `sandbox.pty`) runs on a pseudo-terminal of that size:
its output comes as `{"data": {"pty"}}`, its input is `{"pty"}` (keys, as typed), and
`Update` resizes it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import posixpath
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kernel_gateway.errors import GatewayError
from kernel_gateway.http.responses import ConnectionDropped
from kernel_gateway.kernels.backends.base import STDOUT, Command, TerminalSize
from kernel_gateway.kernels.egress.forwarder import proxy_environment
from kernel_gateway.protocols.e2b.connect import (
    STREAM_TYPE,
    ConnectError,
    EnvelopeReader,
    end_stream,
    envelope,
    parse_message,
    read_message_body,
)
from kernel_gateway.protocols.e2b.connect import (
    field as pick,
)
from kernel_gateway.protocols.e2b.envd_entries import HOME, REVIVAL_WAIT
from kernel_gateway.sessions.network import trust_environment
from kernel_gateway.sessions.session import Session

SIGNALS: dict[object, int] = {"SIGNAL_SIGKILL": 9, 9: 9, "SIGNAL_SIGTERM": 15, 15: 15}
"""process.Signal's values (JSON names or numbers) and the signal each sends."""
DEFAULT_KEEPALIVE = 50.0
MAX_COMMANDS = 64
MAX_ARG_BYTES = 256 * 1024


@dataclass
class Running:
    """A command and everyone following its output."""

    command: Command
    config: dict[str, Any]
    tag: str | None
    followers: list[asyncio.Queue[dict[str, Any] | None]] = field(default_factory=list)
    ended: dict[str, Any] | None = None
    pump: asyncio.Task[None] | None = None
    terminal: bool = False
    """It runs on a PTY."""

    def follow(self) -> asyncio.Queue[dict[str, Any] | None]:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        if self.ended is not None:
            queue.put_nowait({"end": self.ended})
            queue.put_nowait(None)
        else:
            self.followers.append(queue)
        return queue

    def publish(self, event: dict[str, Any] | None) -> None:
        for queue in self.followers:
            queue.put_nowait(event)


class Processes:
    """One sandbox's commands, by pid."""

    def __init__(self, env: dict[str, str]) -> None:
        self._env = env
        self._by_pid: dict[int, Running] = {}

    async def close(self) -> None:
        for running in list(self._by_pid.values()):
            with contextlib.suppress(Exception):
                await running.command.kill()

    async def handle(self, method: str, request: Request, session: Session) -> Response:
        if method in ("Start", "Connect"):
            return await self._stream(method, request, session)
        try:
            if method == "StreamInput":
                return await self._stream_input(request)
            message = parse_message(await read_message_body(request))
            if method == "List":
                answer = self._list()
            elif method == "SendInput":
                running = self._selected(message)
                await running.command.send_stdin(_input_bytes(pick(message, "input"), running))
                answer = {}
            elif method == "CloseStdin":
                await self._selected(message).command.close_stdin()
                answer = {}
            elif method == "SendSignal":
                running = self._selected(message)
                signal = pick(message, "signal")
                if not isinstance(signal, str | int) or signal not in SIGNALS:
                    raise ConnectError("invalid_argument", f"unsupported signal {signal!r}")
                await running.command.kill(SIGNALS[signal])
                answer = {}
            elif method == "Update":
                running = self._selected(message)
                if not running.terminal:
                    raise ConnectError("failed_precondition", "the process has no PTY")
                size = _terminal_size(pick(message, "pty"))
                if size is not None:
                    await running.command.resize(size)
                answer = {}
            else:
                raise ConnectError("unimplemented", f"process.Process/{method} is not served")
        except ConnectError as exc:
            return JSONResponse(exc.to_json(), status_code=exc.status)
        except GatewayError as exc:
            error = ConnectError("failed_precondition", exc.message)
            return JSONResponse(error.to_json(), status_code=error.status)
        return JSONResponse(answer)

    # -- streams ----------------------------------------------------------------------------

    async def _stream(self, method: str, request: Request, session: Session) -> Response:
        keepalive = _seconds(request.headers.get("keepalive-ping-interval"), DEFAULT_KEEPALIVE)
        deadline = _seconds(request.headers.get("connect-timeout-ms"), 0.0, 0.001)
        queue: asyncio.Queue[dict[str, Any] | None] | None = None
        running: Running | None = None
        error: ConnectError | None = None
        try:
            reader = EnvelopeReader()
            messages = list(reader.feed(await read_message_body(request)))
            reader.finish()
            message = messages[0] if messages else {}
            if method == "Start":
                running = await self._start(message, session)
            else:
                running = self._selected(message)
            queue = running.follow()
        except ConnectError as exc:
            error = exc
        except GatewayError as exc:
            error = ConnectError("failed_precondition", exc.message)

        async def stream() -> AsyncIterator[bytes]:
            if error is not None or queue is None or running is None:
                yield end_stream(error)
                return
            yield envelope({"event": {"start": {"pid": running.command.pid}}})
            started = time.monotonic()
            try:
                while True:
                    wait = keepalive
                    if deadline:
                        wait = min(wait, max(0.0, started + deadline - time.monotonic()))
                    try:
                        event = await asyncio.wait_for(queue.get(), wait)
                    except TimeoutError:
                        if deadline and time.monotonic() >= started + deadline:
                            await running.command.kill()  # as envd does at the deadline
                            yield end_stream(ConnectError("deadline_exceeded", "timed out"))
                            return
                        yield envelope({"event": {"keepalive": {}}})
                        continue
                    if event is None:
                        yield end_stream()
                        return
                    if "end" in event and session.closed:
                        # The sandbox was killed under it: as envd's connection would, this one
                        # drops, and the SDK's health check then finds the sandbox gone.
                        raise ConnectionDropped()
                    yield envelope({"event": event})
            finally:
                with contextlib.suppress(ValueError):
                    running.followers.remove(queue)

        return StreamingResponse(stream(), media_type=STREAM_TYPE)

    async def _start(self, message: dict[str, Any], session: Session) -> Running:
        config = pick(message, "process") or {}
        if not isinstance(config, dict) or not isinstance(config.get("cmd"), str):
            raise ConnectError("invalid_argument", "'process.cmd' is required")
        terminal = _terminal_size(pick(message, "pty"))
        args = config.get("args") or []
        envs = config.get("envs") or {}
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConnectError("invalid_argument", "'process.args' must be strings")
        if not isinstance(envs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in envs.items()
        ):
            raise ConnectError("invalid_argument", "'process.envs' must map strings to strings")
        for name, value in envs.items():
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise ConnectError(
                    "invalid_argument", f"{name!r} cannot be an environment variable"
                )
        if sum(len(a) for a in args) > MAX_ARG_BYTES:
            raise ConnectError("resource_exhausted", "the command line is too long")
        self._forget_ended()
        if len(self._by_pid) >= MAX_COMMANDS:
            raise ConnectError("resource_exhausted", f"at most {MAX_COMMANDS} commands at once")
        asked = config.get("cwd") or HOME
        if not isinstance(asked, str) or "\0" in asked:
            raise ConnectError("invalid_argument", "'process.cwd' must be a path")
        cwd = posixpath.join(HOME, asked)  # a relative one is taken from /home/user
        if session.hibernated:  # its commands run beside its kernel: bring it back
            try:
                await session.resume()
            except GatewayError as exc:
                raise ConnectError(
                    "unavailable", f"the sandbox could not resume: {exc.message}"
                ) from None
        # A kernel killed from inside (a command's `pkill`) is being replaced: wait for it.
        kernel = await session.slot.live_kernel(REVIVAL_WAIT)
        if kernel is None:
            raise ConnectError("unavailable", "the sandbox's kernel is starting; retry")
        # A sandbox allowed some domains: its commands use the proxy as its kernels do.
        proxy = proxy_environment() if session.network is not None else {}
        if session.network is not None and session.network.secret_names:
            proxy.update(trust_environment())  # its HTTPS is opened by the relay
        env = {"HOME": HOME, **proxy, **self._env, **envs, "PWD": cwd}  # `pwd` says /home/user
        if terminal is not None:
            env.setdefault("TERM", "xterm-256color")
        command = await kernel.process.run_command(
            [config["cmd"], *args], env, cwd, bool(pick(message, "stdin")), terminal
        )
        tag = pick(message, "tag")
        running = Running(
            command,
            {"cmd": config["cmd"], "args": args, "envs": envs, "cwd": cwd},
            tag if isinstance(tag, str) else None,
            terminal=terminal is not None,
        )
        self._by_pid[command.pid] = running
        running.pump = asyncio.ensure_future(self._pump(running))
        return running

    async def _pump(self, running: Running) -> None:
        async for stream, data in running.command.output():
            name = "pty" if running.terminal else "stdout" if stream == STDOUT else "stderr"
            running.publish({"data": {name: base64.b64encode(data).decode()}})
        code = await running.command.wait()
        signum = running.command.signalled
        if signum is not None and code == 128 + signum:  # as envd (Go) tells a signal's end
            status = f"signal: {_signal_name(signum)}"
            end: dict[str, Any] = {"exitCode": -1, "exited": False, "status": status}
        else:
            status = f"exit status {code}"
            end = {"exitCode": code, "exited": True, "status": status}
        if code != 0:
            end["error"] = status
        running.ended = end
        running.publish({"end": end})
        running.publish(None)
        running.followers.clear()

    async def _stream_input(self, request: Request) -> Response:
        reader = EnvelopeReader()
        running: Running | None = None
        error: ConnectError | None = None
        try:
            async for chunk in request.stream():
                for message in reader.feed(chunk):
                    if "start" in message:
                        if not isinstance(message["start"], dict):
                            raise ConnectError("invalid_argument", "'start' must be an object")
                        running = self._selected(message["start"])
                    elif "data" in message:
                        if running is None:
                            raise ConnectError("failed_precondition", "no start message first")
                        data = _input_bytes(pick(message["data"], "input"), running)
                        await running.command.send_stdin(data)
            reader.finish()
        except ConnectError as exc:
            error = exc
        except GatewayError as exc:
            error = ConnectError("failed_precondition", exc.message)
        body = end_stream(error) if error else envelope({}) + end_stream()
        return Response(body, media_type=STREAM_TYPE)

    # -- helpers ------------------------------------------------------------------------------

    def _list(self) -> dict[str, Any]:
        self._forget_ended()
        processes = []
        for pid, running in self._by_pid.items():
            info: dict[str, Any] = {"config": running.config, "pid": pid}
            if running.tag is not None:
                info["tag"] = running.tag
            processes.append(info)
        return {"processes": processes}

    def _selected(self, message: dict[str, Any]) -> Running:
        selector = pick(message, "process") or {}
        pid = selector.get("pid") if isinstance(selector, dict) else None
        tag = selector.get("tag") if isinstance(selector, dict) else None
        if pid is not None:
            try:
                pid = int(pid)  # a number, or (proto3 JSON) a string of one
            except (TypeError, ValueError):
                raise ConnectError("invalid_argument", f"'pid' {pid!r} is not a number") from None
        if tag is not None and not isinstance(tag, str):
            raise ConnectError("invalid_argument", "'tag' must be a string")
        self._forget_ended()
        for found_pid, running in self._by_pid.items():
            if (pid is not None and pid == found_pid) or (tag and tag == running.tag):
                return running
        raise ConnectError("not_found", f"no running process {pid or tag!r}")

    @property
    def running(self) -> bool:
        """Whether a command of the sandbox is still running (its sandbox is in use)."""
        return any(r.ended is None for r in self._by_pid.values())

    def _forget_ended(self) -> None:
        for pid in [p for p, r in self._by_pid.items() if r.ended is not None]:
            del self._by_pid[pid]


def _input_bytes(value: Any, running: Running) -> bytes:
    """`input.stdin`, or for a command on a PTY `input.pty` (base64 either way)."""
    name = "pty" if running.terminal else "stdin"
    if not isinstance(value, dict) or not isinstance(value.get(name), str):
        other = "stdin" if running.terminal else "pty"
        if isinstance(value, dict) and other in value:
            raise ConnectError(
                "invalid_argument",
                f"'input.{other}' was sent, but the process "
                + ("runs on a PTY: send 'input.pty'" if running.terminal else "has no PTY"),
            )
        raise ConnectError("invalid_argument", f"'input.{name}' (base64) is required")
    try:
        return base64.b64decode(value[name], validate=True)
    except ValueError:
        raise ConnectError("invalid_argument", f"'input.{name}' is not base64") from None


MAX_TERMINAL = 1000


def _terminal_size(value: Any) -> TerminalSize | None:
    """A PTY's `{"size": {"rows", "cols"}}`, checked; None when there is none."""
    if value is None:
        return None
    size = value.get("size") if isinstance(value, dict) else None
    rows = size.get("rows") if isinstance(size, dict) else None
    cols = size.get("cols") if isinstance(size, dict) else None
    if not all(isinstance(n, int) and 1 <= n <= MAX_TERMINAL for n in (rows, cols)):
        raise ConnectError(
            "invalid_argument", f"'pty.size' needs rows and cols from 1 to {MAX_TERMINAL}"
        )
    assert isinstance(rows, int) and isinstance(cols, int)
    return TerminalSize(rows, cols)


def _seconds(raw: str | None, default: float, scale: float = 1.0) -> float:
    try:
        value = float(raw) * scale if raw else default
    except ValueError:
        return default
    return value if value > 0 else default


def _signal_name(number: int) -> str:
    """Go's name of a signal, as envd reports it: "killed", "terminated"."""
    import signal

    try:
        return (signal.strsignal(number) or str(number)).lower()
    except ValueError:
        return str(number)
