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
import base64
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .backends.base import ExitInfo, SessionStorage
from .errors import GatewayError, KernelUnavailable, SessionBusy, SessionClosed, SessionFailed
from .events import OutputLimiter, error_event
from .execution import Execution
from .kernel import Kernel
from .settings import Settings
from .types import JSON, DoneStatus, Event
from .workspace import (
    INLINE_IMAGE_TYPES,
    Snapshot,
    Workspace,
    changed_files,
    file_url,
    guess_mime,
    split_path,
)

logger = logging.getLogger(__name__)

Launcher = Callable[[SessionStorage], Awaitable[Kernel]]
SIGNAL_SPACING = 0.5  # seconds between two SIGINTs to the same cell
INLINE_SCAN_FILES = 64  # workspaces this small are scanned on the event loop


def _exit_of(kernel: Kernel) -> ExitInfo:
    task = kernel.exited
    if task.done() and not task.cancelled() and task.exception() is None:
        return task.result()
    return ExitInfo(None, "killed")


class Session:
    def __init__(
        self,
        session_id: str,
        kernel: Kernel,
        storage: SessionStorage,
        workspace: Workspace,
        launch: Launcher,
        settings: Settings,
        *,
        ephemeral: bool = False,
    ) -> None:
        self.id = session_id
        self.ephemeral = ephemeral
        """One execution, then gone: never restarted, files sent whole in events."""
        self.kernel: Kernel | None = kernel
        self.storage = storage
        self.files = workspace
        self._baseline: Snapshot = {}
        self._launch = launch
        self._settings = settings
        self._lock = asyncio.Lock()
        self._signalling = asyncio.Lock()
        """Held while a signal is on its way, so it cannot land in the next cell."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: set[Execution] = set()
        self.current: Execution | None = None
        self.queued = 0
        self.execution_count = 0
        self.restarts = 0
        self.created_at = datetime.now(UTC)
        self.last_activity = time.monotonic()
        self._restart_notice = False
        self.closed = False
        self.failed: str | None = None
        """Why the session gave up on its kernel (too many deaths), or None."""
        self._deaths: deque[float] = deque()
        self._watch(kernel)

    # -- public ------------------------------------------------------------------------------

    def submit(self, code: str, timeout: float | None) -> Execution:
        """Queue a cell; its events can be read from the returned Execution at once."""
        if self.closed:
            raise SessionClosed(f"session {self.id} was deleted")
        if self.failed:
            raise SessionFailed(self.failed)
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
        self._pending.add(execution)
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
        await self._signal(execution, kernel)
        self._spawn(self._keep_interrupting(execution, kernel))
        return True

    async def _keep_interrupting(self, execution: Execution, kernel: Kernel) -> None:
        await self._interrupt(execution, kernel, 4 * self._settings.interrupt_grace)

    async def _signal(self, execution: Execution, kernel: Kernel) -> None:
        """SIGINT, but only while `execution` still runs (checked under the lock).

        Signals to one cell are spaced out: a second one landing while the kernel
        is still handling the first can cost the cell its reply.
        """
        async with self._signalling:
            now = time.monotonic()
            if (
                self.current is execution
                and not execution.idle.is_set()
                and now - execution.signalled_at >= SIGNAL_SPACING
            ):
                execution.signalled_at = now
                await kernel.interrupt()

    async def _interrupt(self, execution: Execution, kernel: Kernel, within: float) -> bool:
        """SIGINT until the cell is idle; True if it stopped within `within` seconds.

        A signal can be lost (seen when it lands just as the cell prints), so it
        is sent again every 0.5 s. That is harmless: between cells the kernel
        ignores SIGINT, and the next cell is only sent once this one is idle.
        """
        deadline = time.monotonic() + within
        while not execution.idle.is_set() and not kernel.exited.done():
            if self.current is not execution:
                return True
            await self._signal(execution, kernel)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            pause = min(SIGNAL_SPACING, remaining)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(execution.idle.wait()), pause)
        return execution.idle.is_set()

    def abandon(self, execution: Execution) -> None:
        """The client stopped listening: stop the cell rather than run it for nobody."""
        execution.abandoned = True
        if execution.finished:
            return
        execution.interrupted = True
        if self.current is execution and self.kernel is not None:
            self._spawn(self._stop_abandoned(execution, self.kernel))

    async def _stop_abandoned(self, execution: Execution, kernel: Kernel) -> None:
        """Interrupt, and replace the kernel if the cell will not stop."""
        if await self._interrupt(execution, kernel, 2 * self._settings.interrupt_grace):
            return
        if not execution.finished and self.current is execution and kernel is self.kernel:
            logger.info("session %s: an abandoned cell ignored interrupts; restarting", self.id)
            execution.restarting = True
            await kernel.process.kill()

    async def restart(self) -> None:
        """Replace the kernel now, even if a cell is stuck in it; state is lost."""
        self.touch()
        old = self.kernel
        for waiting in self._pending:  # cells queued behind a stuck one are dropped
            waiting.interrupted = True
        if self.current is not None:
            self.current.restarting = True
        if old is not None:
            await old.process.kill()
        async with self._lock:
            # An explicit restart is a fresh start: it also resets the restart budget.
            self.failed = None
            self._deaths.clear()
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
        for waiting in self._pending:
            waiting.interrupted = True
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)

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
        if self.failed:
            return "failed"
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
            "failed": self.failed,
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
            if (
                not self.closed
                and not self.ephemeral
                and self.kernel is kernel
                and self.current is None
            ):
                self._spawn(self._recover(kernel))

        kernel.exited.add_done_callback(on_exit)

    async def _recover(self, kernel: Kernel) -> None:
        async with self._lock:
            if self.closed or self.kernel is not kernel:
                return
            logger.info("session %s: %s; restarting", self.id, _exit_of(kernel).describe())
            self._restart_notice = True
            if self._record_death():
                await asyncio.sleep(self._backoff())
                with contextlib.suppress(KernelUnavailable):
                    await self._replace_kernel()

    async def _replace_kernel(self) -> None:
        old, self.kernel = self.kernel, None
        if old is not None:
            await old.close()
        if self.closed:
            return
        kernel = await self._launch(self.storage)
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
                    return
                if self.failed:  # queued before the session failed: never restart for it
                    execution.emit(error_event("SessionFailed", self.failed))
                    execution.finish("died", 0.0, False, reason="session_failed")
                    return
                if execution.interrupted:
                    execution.finish("interrupted", 0.0, False)
                    return
                self.current = execution
                try:
                    outcome = await self._execute(execution)
                    await self._report_files(execution)
                    execution.finish(
                        outcome.status, outcome.duration_ms, outcome.restarted, **outcome.extra
                    )
                finally:
                    self.current = None
                    self.touch()
                if outcome.replace_kernel and not self.ephemeral and not self.failed:
                    await asyncio.sleep(outcome.backoff)
                    with contextlib.suppress(KernelUnavailable):
                        await self._replace_kernel()
        except Exception as exc:
            logger.exception("session %s: execution failed", self.id)
            message = f"the gateway failed to run this cell: {exc}"
            execution.emit(error_event("GatewayError", message))
            execution.finish("died", (time.monotonic() - started) * 1000, False)
        finally:  # never leave a client without its `done`, even when cancelled
            if not execution.finished:
                execution.finish("interrupted", (time.monotonic() - started) * 1000, True)
            self._pending.discard(execution)

    async def _execute(self, execution: Execution) -> Outcome:
        restarted, self._restart_notice = self._restart_notice, False
        started = time.monotonic()

        def outcome(status: DoneStatus, restarted: bool, **extra: Any) -> Outcome:
            replace = bool(extra.pop("replace_kernel", False))
            backoff = float(extra.pop("backoff", 0.0))
            elapsed = (time.monotonic() - started) * 1000
            return Outcome(status, elapsed, restarted, extra, replace, backoff)

        kernel = self.kernel
        if kernel is None or kernel.exited.done():
            try:
                await self._replace_kernel()
            except KernelUnavailable as exc:
                execution.emit(error_event("KernelUnavailable", exc.message))
                return outcome("died", True, reason="start_failed")
            restarted = True
            kernel = self.kernel
            assert kernel is not None
            started = time.monotonic()

        async with self._signalling:  # no SIGINT meant for the previous cell is in flight
            msg_id, reply = await kernel.execute(execution.code, execution.on_message)
        idle: asyncio.Future[Any] = asyncio.ensure_future(execution.idle.wait())
        try:
            waiting: set[asyncio.Future[Any]] = {idle, kernel.exited}
            await asyncio.wait(
                waiting, timeout=execution.timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if idle.done():
                status = await self._finished_status(execution, reply)
                self._count(execution)
                if execution.exit_requested:
                    self._restart_notice = True
                    return outcome(status, restarted, replace_kernel=True)
                return outcome(status, restarted)
            if not kernel.exited.done():
                # Timed out: interrupt, and restart if the kernel does not stop in time.
                await self._interrupt(execution, kernel, self._settings.interrupt_grace)
                self._count(execution)
                if idle.done():
                    return outcome("timeout", restarted)
                execution.emit(
                    error_event(
                        "TimeoutError",
                        f"execution exceeded {execution.timeout:g} s and did not stop when "
                        "interrupted; the kernel was restarted and its state is lost",
                    )
                )
                await kernel.process.kill()
                return outcome("timeout", True, replace_kernel=True)
        finally:
            idle.cancel()
            kernel.forget(msg_id)
        return self._on_death(execution, kernel, outcome)

    def _on_death(
        self, execution: Execution, kernel: Kernel, outcome: Callable[..., Outcome]
    ) -> Outcome:
        exit_info = _exit_of(kernel)
        self._count(execution)
        if self.closed:
            execution.emit(error_event("SessionClosed", f"session {self.id} was deleted"))
            return outcome("interrupted", True)
        if execution.restarting:
            message = "the session was restarted during this cell"
            execution.emit(error_event("KernelRestarted", message))
            return outcome("interrupted", True)
        execution.emit(error_event("KernelDied", f"{exit_info.describe()}; its state is lost"))
        self._restart_notice = True
        if not self._record_death():
            execution.emit(error_event("SessionFailed", self.failed or ""))
            return outcome("died", False, reason=exit_info.reason, session_failed=True)
        return outcome(
            "died", False, reason=exit_info.reason, replace_kernel=True, backoff=self._backoff()
        )

    def _record_death(self) -> bool:
        """Count an unexpected death; False once the budget is spent (the session fails)."""
        now = time.monotonic()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > self._settings.restart_window:
            self._deaths.popleft()
        if len(self._deaths) > self._settings.restart_budget:
            self.failed = (
                f"the kernel of session {self.id} died {len(self._deaths)} times within "
                f"{self._settings.restart_window:g} s, so it is not restarted again; "
                "delete this session and start a new one"
            )
            logger.warning("session %s failed: %s", self.id, self.failed)
            return False
        return True

    def _backoff(self) -> float:
        """Seconds to wait before the next restart: 0, 0.5, 1, 2, 4, 8 for repeated deaths."""
        recent = len(self._deaths)
        return 0.0 if recent <= 1 else min(8.0, 0.5 * 2 ** (recent - 2))

    async def _finished_status(
        self, execution: Execution, reply: asyncio.Future[JSON]
    ) -> DoneStatus:
        try:
            msg = (
                reply.result()
                if reply.done()
                else await asyncio.wait_for(asyncio.shield(reply), 2.0)
            )
            content = msg["content"]
            ok = content.get("status") == "ok"
            # exit() asks the frontend to end the kernel; the gateway is the frontend.
            payloads = content.get("payload") or []
            execution.exit_requested = any(p.get("source") == "ask_exit" for p in payloads)
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

    async def _report_files(self, execution: Execution) -> None:
        """Emit a `file` event for each file the cell created or changed."""
        if self.closed:
            return
        s = self._settings
        if len(self._baseline) < INLINE_SCAN_FILES:
            after, _ = self.files.scan()  # a few entries: cheaper than a thread hop
        else:
            after, _ = await asyncio.to_thread(self.files.scan)
        changed = changed_files(self._baseline, after)
        self._baseline = after
        for path in changed[: s.max_file_events]:
            size = after[path][0]
            data: JSON = {
                "path": path,
                "size": size,
                "mime": guess_mime(path),
                # A stateless kernel is gone after the response: no URL, the bytes instead.
                "url": None if self.ephemeral else file_url(self.id, path),
            }
            inline = self.ephemeral or data["mime"] in INLINE_IMAGE_TYPES
            if inline and size <= s.max_inline_file_bytes:
                content = await asyncio.to_thread(self._read_quietly, path)
                if content is not None:
                    data["data"] = base64.b64encode(content).decode()
            execution.emit(Event("file", data))
        if len(changed) > s.max_file_events:
            execution.emit(
                Event(
                    "stderr",
                    {
                        "text": f"[{len(changed) - s.max_file_events} more changed "
                        "files not reported; see GET /files]\n"
                    },
                )
            )

    def _read_quietly(self, path: str) -> bytes | None:
        try:
            return self.files.read_bytes(path, self._settings.max_inline_file_bytes)
        except GatewayError:
            return None  # replaced by a symlink or removed since the scan

    def note_upload(self, path: str) -> None:
        """An upload is not something the code produced: keep it out of `file` events."""
        state = self.files.state_of(path)
        if state is not None:
            self._baseline["/".join(split_path(path))] = state


@dataclass
class Outcome:
    status: DoneStatus
    duration_ms: float
    restarted: bool
    extra: dict[str, Any]
    replace_kernel: bool = False
    backoff: float = 0.0
