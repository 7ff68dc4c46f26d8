"""A fake backend whose kernels speak the real Jupyter wire protocol, scripted by the cell.

Each fake kernel binds ZMQ ipc sockets in the test's own event loop and answers
with signed messages, so `Kernel`, `Session`, `KernelSlot` and the registry run
unchanged above it, in milliseconds. A cell's code is a script, one command
per line:

    print TEXT        stdout
    stderr TEXT       stderr
    sleep SECONDS     interruptible by SIGINT (KeyboardInterrupt)
    outside SECONDS   like sleep, but a SIGINT lands outside the cell's code, as when
                      it hits ipykernel's message handler before the cell runs: the
                      kernel sends no error and no reply, only `idle`
    hang              runs forever and ignores SIGINT
    error             raises (an `error` message, reply status error)
    die [CODE]        the kernel process exits (reason `exited`)
    oom               the kernel is killed for memory (reason `out_of_memory`)
    malformed         publishes a signed `stream` message whose content is a list
    garbage           publishes frames that do not parse
    exit              asks the frontend to end the kernel (exit())

Anything else is accepted silently.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio
from jupyter_client.session import Session as JupyterSession

from kernel_gateway.errors import KernelUnavailable
from kernel_gateway.kernels.backends.base import (
    Backend,
    ExitInfo,
    KernelProcess,
    SessionStorage,
    ipc_connection,
)
from kernel_gateway.kernels.languages import BUILTIN_PYTHON, Language, Languages
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.settings import Settings


class FakeKernelProcess(KernelProcess):
    def __init__(self, kernel_id: str, conn_dir: Path, context: zmq.asyncio.Context) -> None:
        self.id = kernel_id
        self.connection = ipc_connection(str(conn_dir / "k"))
        info = self.connection
        self._jsession = JupyterSession(key=info["key"].encode(), signature_scheme="hmac-sha256")
        self._shell = context.socket(zmq.ROUTER)
        self._control = context.socket(zmq.ROUTER)
        self._iopub = context.socket(zmq.PUB)
        for sock, port in (
            (self._shell, info["shell_port"]),
            (self._control, info["control_port"]),
            (self._iopub, info["iopub_port"]),
        ):
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(f"ipc://{info['ip']}-{port}")
        self._exit: asyncio.Future[ExitInfo] = asyncio.get_running_loop().create_future()
        self._count = 0
        self._cell: asyncio.Task[None] | None = None
        self._uninterruptible = False
        self._outside = False
        self.interrupts = 0
        self.executed: list[str] = []
        self._server = asyncio.create_task(self._serve())

    @property
    def outside(self) -> bool:
        """Whether a cell's `outside` command runs (a SIGINT now lands outside its code)."""
        return self._outside

    # -- KernelProcess -----------------------------------------------------------------------

    def poll(self) -> ExitInfo | None:
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> ExitInfo:
        return await asyncio.shield(self._exit)

    async def send_signal(self, signum: int) -> None:
        if self._exit.done():
            return
        if signum == signal.SIGINT:
            self.interrupts += 1
            if self._cell is not None and not self._uninterruptible:
                self._cell.cancel()
        elif signum == signal.SIGKILL:
            self._end(ExitInfo(-9, "killed"))

    async def kill(self) -> None:
        await self.send_signal(signal.SIGKILL)

    async def cleanup(self) -> None:
        self._end(ExitInfo(-9, "killed"))
        await asyncio.gather(self._server, return_exceptions=True)

    def _end(self, info: ExitInfo) -> None:
        if self._exit.done():
            return
        self._exit.set_result(info)
        if self._cell is not None:
            self._cell.cancel()
        self._server.cancel()
        for sock in (self._shell, self._control, self._iopub):
            sock.close(linger=0)

    # -- the protocol ------------------------------------------------------------------------

    async def _serve(self) -> None:
        poller = zmq.asyncio.Poller()
        poller.register(self._shell, zmq.POLLIN)
        poller.register(self._control, zmq.POLLIN)
        while True:
            for sock, _ in await poller.poll():
                frames = await sock.recv_multipart()
                idents, msg_frames = self._jsession.feed_identities(frames)
                msg = self._jsession.deserialize(msg_frames)
                await self._handle(sock, idents, msg)

    def _publish(self, msg_type: str, content: Any, parent: dict[str, Any]) -> None:
        self._jsession.send(self._iopub, msg_type, content, parent=parent)

    def _reply(
        self,
        sock: zmq.asyncio.Socket,
        idents: list[bytes],
        msg_type: str,
        content: Any,
        parent: Any,
    ) -> None:
        self._jsession.send(sock, msg_type, content, parent=parent, ident=idents)

    async def _handle(self, sock: zmq.asyncio.Socket, idents: list[bytes], msg: Any) -> None:
        msg_type = msg["header"]["msg_type"]
        parent = msg["header"]
        if msg_type == "kernel_info_request":
            self._publish("status", {"execution_state": "busy"}, parent)
            info = {"status": "ok", "language_info": {"name": "python"}}
            self._reply(sock, idents, "kernel_info_reply", info, parent)
            self._publish("status", {"execution_state": "idle"}, parent)
        elif msg_type == "execute_request":
            code = msg["content"]["code"]
            self.executed.append(code)
            silent = msg["content"].get("silent", False)
            # A cell that starts with `hang` ignores SIGINT from its receipt: a signal sent
            # before its task first runs must not stop it (as a busy event loop could).
            self._uninterruptible = code.lstrip().startswith("hang")
            self._cell = asyncio.create_task(self._run(code, silent, parent))
            reply = await self._finish_cell(parent)
            if reply is not None:
                self._reply(sock, idents, "execute_reply", reply, parent)
            self._publish("status", {"execution_state": "idle"}, parent)
            self._cell = None
            self._uninterruptible = False
            self._outside = False

    async def _finish_cell(self, parent: dict[str, Any]) -> dict[str, Any] | None:
        assert self._cell is not None
        try:
            await asyncio.shield(self._cell)
            return self._reply_content("ok")
        except asyncio.CancelledError:
            if self._exit.done():
                raise  # the kernel itself is gone
            if self._outside:
                return None  # "KeyboardInterrupt caught in kernel": logged, nothing sent
            self._publish("error", _error("KeyboardInterrupt", ""), parent)
            return self._reply_content("error")
        except _CellError:
            self._publish("error", _error("ValueError", "scripted error"), parent)
            return self._reply_content("error")
        except _CellExit:
            return {**self._reply_content("ok"), "payload": [{"source": "ask_exit"}]}

    def _reply_content(self, status: str) -> dict[str, Any]:
        return {"status": status, "execution_count": self._count, "payload": []}

    async def _run(self, code: str, silent: bool, parent: dict[str, Any]) -> None:
        self._publish("status", {"execution_state": "busy"}, parent)
        if not silent:
            self._count += 1
            self._publish("execute_input", {"code": code, "execution_count": self._count}, parent)
        for line in code.splitlines():
            command, _, arg = line.strip().partition(" ")
            if command == "print":
                self._publish("stream", {"name": "stdout", "text": arg + "\n"}, parent)
            elif command == "stderr":
                self._publish("stream", {"name": "stderr", "text": arg + "\n"}, parent)
            elif command == "sleep":
                await asyncio.sleep(float(arg))
            elif command == "outside":
                self._outside = True
                await asyncio.sleep(float(arg))
                self._outside = False
            elif command == "hang":
                self._uninterruptible = True
                await asyncio.Event().wait()
            elif command == "error":
                raise _CellError()
            elif command == "die":
                self._end(ExitInfo(int(arg or 1), "exited"))
                await asyncio.Event().wait()
            elif command == "oom":
                self._end(ExitInfo(137, "out_of_memory"))
                await asyncio.Event().wait()
            elif command == "malformed":
                # Signed, so it verifies: only its shape is wrong (content is a list).
                self._publish("stream", b'["not", "an", "object"]', parent)
            elif command == "garbage":
                await self._iopub.send_multipart([b"<IDS|MSG>", b"bad", b"{", b"", b"", b""])
            elif command == "exit":
                raise _CellExit()


class _CellError(Exception):
    pass


class _CellExit(Exception):
    pass


def _error(ename: str, evalue: str) -> dict[str, Any]:
    return {"ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}


class FakeBackend(Backend):
    """Launches `FakeKernelProcess`es; `fail_launches` makes the next N launches fail,
    `launch_delay` makes each launch take that long."""

    # Not one of the API's backends (`Health.backend`): a test double, never behind /health.
    name = "fake"  # type: ignore[assignment]

    def __init__(self) -> None:
        # ipc socket paths must stay under ~100 characters: a short folder of our own.
        self._root = Path(tempfile.mkdtemp(prefix="kgfake-"))
        self._context = zmq.asyncio.Context()
        self.kernels: list[FakeKernelProcess] = []
        self.fail_launches = 0
        self.launch_delay = 0.0
        self._n = 0

    @property
    def isolation(self) -> str:
        return "none: an in-process fake for tests"

    async def start(self) -> None:
        return None

    async def launch(
        self, storage: SessionStorage, language: Language = BUILTIN_PYTHON
    ) -> KernelProcess:
        await asyncio.sleep(self.launch_delay)
        if self.fail_launches:
            self.fail_launches -= 1
            raise KernelUnavailable("scripted launch failure", retry_after=1)
        self._n += 1
        conn_dir = self._root / f"fake-{self._n}"
        conn_dir.mkdir(parents=True)
        kernel = FakeKernelProcess(f"fake{self._n}", conn_dir, self._context)
        self.kernels.append(kernel)
        return kernel

    async def close(self) -> None:
        await asyncio.gather(*(k.cleanup() for k in self.kernels))
        self._context.destroy(linger=0)
        shutil.rmtree(self._root, ignore_errors=True)


if TYPE_CHECKING:
    from kernel_gateway.metrics import Metrics
    from kernel_gateway.sessions.session import Session


async def run(session: Session, code: str, limit: float | None = None) -> list[Any]:
    """Submit a cell (with a time `limit`) and collect its events as (name, data) pairs."""
    execution = session.submit(code, limit)
    return [(e.name, e.data) for e in [e async for e in execution.stream()]]


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not met in time")


@asynccontextmanager
async def fake_registry(
    tmp_path: Path,
    metrics: Metrics | None = None,
    *,
    languages: Sequence[Language] = (),
    **overrides: Any,
) -> AsyncIterator[tuple[Registry, FakeBackend]]:
    """A started `Registry` on a warm pool of fake kernels, closed (with all it made) after.

    Settings: the local backend's, one warm kernel, no preload, runtime dir `tmp_path`, a
    5 s kernel start limit; `overrides` change any of them. `languages`: others than
    Python, a pool of fake kernels each.
    """
    values: dict[str, Any] = {
        "backend": "local",
        "pool_size": 1,
        "preload": "",
        "runtime_dir": tmp_path,
        "kernel_start_timeout": 5,
        **overrides,
    }
    settings = Settings(**values)
    runtime = RuntimeDir(tmp_path)
    runtime.open()
    backend = FakeBackend()
    if languages:
        backend.languages = Languages([BUILTIN_PYTHON, *languages])
    context = zmq.asyncio.Context()
    warm = WarmPool(settings, backend, runtime, context, metrics)
    others = [WarmPool(settings, backend, runtime, context, metrics, lang) for lang in languages]
    registry = Registry(settings, warm, runtime.instance, others=others)
    registry.start()
    try:
        yield registry, backend
    finally:
        await registry.close()
        await backend.close()
        context.destroy(linger=0)
        runtime.close()
