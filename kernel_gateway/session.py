"""A session: one kernel whose state persists from cell to cell.

Executions run one at a time in arrival order (an asyncio.Lock is FIFO). Each
runs as its own task, so a timeout, an interrupt or a kernel death is handled
the same whether or not a client is still reading.

Timeout: interrupt, wait `interrupt_grace`, and if the kernel is still busy,
replace it. Death: report it at once, replace the kernel in the background
(still holding the lock, so the next cell waits for the new kernel), and tell
the next execution its state was lost (`restarted: true`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .backends.base import ExitInfo
from .errors import KernelUnavailable, SessionBusy, SessionClosed
from .events import OutputLimiter, error_event
from .execution import Execution
from .kernel import Kernel
from .settings import Settings
from .types import JSON, DoneStatus

logger = logging.getLogger(__name__)

Launcher = Callable[[Path], Awaitable[Kernel]]


def _exit_of(kernel: Kernel) -> ExitInfo:
    task = kernel.exited
    if task.done() and not task.cancelled() and task.exception() is None:
        return task.result()
    return ExitInfo(None, "killed")


class Session:
    def __init__(
        self, session_id: str, kernel: Kernel, workspace: Path, launch: Launcher, settings: Settings
    ) -> None:
        self.id = session_id
        self.kernel: Kernel | None = kernel
        self.workspace = workspace
        self._launch = launch
        self._settings = settings
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.current: Execution | None = None
        self.queued = 0
        self.execution_count = 0
        self.restarts = 0
        self.created_at = datetime.now(UTC)
        self.last_activity = time.monotonic()
        self._restart_notice = False
        self.closed = False
        self._watch(kernel)

    # -- public ------------------------------------------------------------------------------

    def submit(self, code: str, timeout: float | None) -> Execution:
        """Queue a cell; its events can be read from the returned Execution at once."""
        if self.closed:
            raise SessionClosed(f"session {self.id} was deleted")
        if self.queued >= self._settings.max_queued_executions:
            raise SessionBusy(
                f"session {self.id} already has {self.queued} executions waiting; "
                "wait for them or interrupt"
            )
        s = self._settings
        execution = Execution(
            code,
            timeout if timeout is not None else s.exec_timeout,
            OutputLimiter(s.max_output_bytes, s.max_display_bytes),
        )
        self.queued += 1
        self.touch()
        execution.task = self._spawn(self._run(execution))
        return execution

    async def interrupt(self) -> bool:
        """Interrupt the running cell; False when nothing was running."""
        self.touch()
        execution, kernel = self.current, self.kernel
        if execution is None or kernel is None:
            return False
        execution.interrupted = True
        await kernel.interrupt()
        return True

    def abandon(self, execution: Execution) -> None:
        """The client stopped listening: stop the cell rather than run it for nobody."""
        execution.abandoned = True
        if execution.finished:
            return
        execution.interrupted = True
        if self.current is execution and self.kernel is not None:
            self._spawn(self.kernel.interrupt())

    async def restart(self) -> None:
        """Replace the kernel now, even if a cell is stuck in it; state is lost."""
        self.touch()
        old = self.kernel
        if self.current is not None:
            self.current.restarting = True
        if old is not None:
            await old.process.kill()
        async with self._lock:
            if self.kernel is None or self.kernel is old or self.kernel.exited.done():
                await self._replace_kernel()
            self._restart_notice = False

    async def close(self) -> None:
        self.closed = True
        kernel, self.kernel = self.kernel, None
        if self.current is not None:
            self.current.restarting = True
        if kernel is not None:
            await kernel.close()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 5)

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def idle_seconds(self) -> float:
        if self.current is not None or self.queued:
            return 0.0
        return time.monotonic() - self.last_activity

    @property
    def status(self) -> str:
        if self.closed:
            return "closed"
        if self.current is not None:
            return "busy"
        if self.kernel is None or self.kernel.exited.done():
            return "restarting"
        return "idle"

    def to_json(self) -> JSON:
        return {
            "id": self.id,
            "status": self.status,
            "created_at": self.created_at.isoformat().replace("+00:00", "Z"),
            "idle_seconds": round(self.idle_seconds(), 3),
            "execution_count": self.execution_count,
            "queued": self.queued,
            "restarts": self.restarts,
        }

    # -- internals ---------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _watch(self, kernel: Kernel) -> None:
        """Notice a kernel that dies while no cell runs, and replace it right away."""

        def on_exit(_: object) -> None:
            if not self.closed and self.kernel is kernel and self.current is None:
                self._spawn(self._recover(kernel))

        kernel.exited.add_done_callback(on_exit)

    async def _recover(self, kernel: Kernel) -> None:
        async with self._lock:
            if self.closed or self.kernel is not kernel:
                return
            logger.info("session %s: %s; restarting", self.id, _exit_of(kernel).describe())
            self._restart_notice = True
            with contextlib.suppress(KernelUnavailable):
                await self._replace_kernel()

    async def _replace_kernel(self) -> None:
        old, self.kernel = self.kernel, None
        if old is not None:
            await old.close()
        if self.closed:
            return
        kernel = await self._launch(self.workspace)
        if self.closed:
            await kernel.close()
            return
        self.kernel = kernel
        self.restarts += 1
        self._watch(kernel)

    async def _run(self, execution: Execution) -> None:
        started = time.monotonic()
        try:
            async with self._lock:
                self.queued -= 1
                started = time.monotonic()
                if self.closed:
                    execution.emit(error_event("SessionClosed", f"session {self.id} was deleted"))
                    execution.finish("interrupted", 0.0, False)
                elif execution.interrupted:
                    execution.finish("interrupted", 0.0, False)
                else:
                    self.current = execution
                    try:
                        await self._execute(execution)
                    finally:
                        self.current = None
                        self.touch()
        except Exception as exc:  # never leave a client without its `done`
            logger.exception("session %s: execution failed", self.id)
            message = f"the gateway failed to run this cell: {exc}"
            execution.emit(error_event("GatewayError", message))
            execution.finish("died", (time.monotonic() - started) * 1000, False)

    async def _execute(self, execution: Execution) -> None:
        restarted, self._restart_notice = self._restart_notice, False
        started = time.monotonic()

        def elapsed_ms() -> float:
            return (time.monotonic() - started) * 1000

        kernel = self.kernel
        if kernel is None or kernel.exited.done():
            try:
                await self._replace_kernel()
            except KernelUnavailable as exc:
                execution.emit(error_event("KernelUnavailable", exc.message))
                execution.finish("died", elapsed_ms(), True, reason="start_failed")
                return
            restarted = True
            kernel = self.kernel
            assert kernel is not None
            started = time.monotonic()

        msg_id, reply = await kernel.execute(execution.code, execution.on_message)
        idle: asyncio.Future[Any] = asyncio.ensure_future(execution.idle.wait())
        try:
            waiting: set[asyncio.Future[Any]] = {idle, kernel.exited}
            done, _ = await asyncio.wait(
                waiting, timeout=execution.timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if idle in done:
                status = await self._finished_status(execution, reply)
                self._count(execution)
                execution.finish(status, elapsed_ms(), restarted)
                return
            if not kernel.exited.done():
                await self._on_timeout(execution, kernel, idle, elapsed_ms, restarted)
                return
        finally:
            idle.cancel()
            kernel.forget(msg_id)
        await self._on_death(execution, kernel, elapsed_ms)

    async def _finished_status(
        self, execution: Execution, reply: asyncio.Future[JSON]
    ) -> DoneStatus:
        try:
            msg = await asyncio.wait_for(asyncio.shield(reply), 2.0)
            content = msg["content"]
            ok = content.get("status") == "ok"
            if content.get("execution_count") is not None:
                execution.execution_count = content["execution_count"]
        except (TimeoutError, asyncio.CancelledError):
            ok = not execution.saw_error
        if ok:
            return "ok"
        return "interrupted" if execution.interrupted else "error"

    def _count(self, execution: Execution) -> None:
        if execution.execution_count is not None:
            self.execution_count = execution.execution_count

    async def _on_timeout(
        self,
        execution: Execution,
        kernel: Kernel,
        idle: asyncio.Future[Any],
        elapsed_ms: Callable[[], float],
        restarted: bool,
    ) -> None:
        await kernel.interrupt()
        waiting: set[asyncio.Future[Any]] = {idle, kernel.exited}
        done, _ = await asyncio.wait(
            waiting,
            timeout=self._settings.interrupt_grace,
            return_when=asyncio.FIRST_COMPLETED,
        )
        self._count(execution)
        if idle in done:
            execution.finish("timeout", elapsed_ms(), restarted)
            return
        execution.emit(
            error_event(
                "TimeoutError",
                f"execution exceeded {execution.timeout:g} s and did not stop when interrupted; "
                "the kernel was restarted and its state is lost",
            )
        )
        await kernel.process.kill()
        execution.finish("timeout", elapsed_ms(), True)
        with contextlib.suppress(KernelUnavailable):
            await self._replace_kernel()

    async def _on_death(
        self, execution: Execution, kernel: Kernel, elapsed_ms: Callable[[], float]
    ) -> None:
        exit_info = _exit_of(kernel)
        self._count(execution)
        if self.closed:
            execution.emit(error_event("SessionClosed", f"session {self.id} was deleted"))
            execution.finish("interrupted", elapsed_ms(), True)
            return
        if execution.restarting:
            message = "the session was restarted during this cell"
            execution.emit(error_event("KernelRestarted", message))
            execution.finish("interrupted", elapsed_ms(), True)
            return
        execution.emit(error_event("KernelDied", f"{exit_info.describe()}; its state is lost"))
        execution.finish("died", elapsed_ms(), False, reason=exit_info.reason)
        self._restart_notice = True
        with contextlib.suppress(KernelUnavailable):
            await self._replace_kernel()
