"""A session's cells, run one at a time in order on its kernel: timeout → interrupt → retire.

Each cell runs as its own task, so a timeout, an interrupt or a kernel death is handled the
same whether or not a client is still reading. This module decides what happens to a cell;
the kernel's life is `KernelSlot`'s (with the `RestartPolicy`), the files are
`SessionFiles`', and the verdict (`done`) is computed by `Execution` alone.

Every cell ends in `end_cell`, whether it ran here, was refused, or was adopted from a
predecessor gateway (`adoption.py`): one `done`, one metric, the session touched and its
record persisted.

Timeout: interrupt, wait `interrupt_grace`, and if the cell still runs, retire the kernel.
Death: report it at once; the slot revives the kernel for the next cell, which reports
`restarted: true`. A cell nobody follows any more is abandoned: interrupted, and the kernel
retired if it will not stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from kernel_gateway import logs
from kernel_gateway.errors import KernelUnavailable, SessionClosed, SessionFailed
from kernel_gateway.kernels.events import MalformedMessage, error_event, event, parse_reply
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.languages import PYTHON
from kernel_gateway.metrics import Metrics
from kernel_gateway.sessions.execution import Execution, StopReason
from kernel_gateway.sessions.execution_log import ExecutionLog
from kernel_gateway.sessions.files import SessionFiles
from kernel_gateway.sessions.hibernation import Hibernation
from kernel_gateway.sessions.kernel_slot import KernelSlot
from kernel_gateway.sessions.persistence import RunningCell
from kernel_gateway.settings import Settings
from kernel_gateway.tasks import TaskSet
from kernel_gateway.types import DiedReason, Message

logger = logging.getLogger(__name__)

SIGNAL_SPACING = 0.5  # seconds between two SIGINTs to the same cell
REPLY_WAIT = 2.0  # seconds to wait for the shell reply once IOPub said idle
AROUND_SECONDS = 30.0  # seconds the silent code around a cell may take (`submit`)


class CellHost(Protocol):
    """What the runner needs of its session (`Session` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    def touch(self) -> None:
        """The session was used now (its idle clock starts again)."""

    def persist(self) -> None:
        """Write the session's record (it reads `running` and `execution_count`)."""


class CellRunner:
    def __init__(
        self,
        session: CellHost,
        slot: KernelSlot,
        files: SessionFiles,
        log: ExecutionLog,
        settings: Settings,
        metrics: Metrics,
        *,
        ephemeral: bool,
        language: str,
        hibernation: Hibernation | None,
    ) -> None:
        self._session = session
        self._slot = slot
        self._files = files
        self._log = log
        self._settings = settings
        self._metrics = metrics
        self._ephemeral = ephemeral
        self._language = language
        self._hibernation = hibernation
        self._signalling = asyncio.Lock()
        """Held while a signal is on its way, so it cannot land in the next cell."""
        self._tasks = TaskSet()
        self._queue: list[Execution] = []
        self._current: Execution | None = None
        self._running: RunningCell | None = None
        self._execution_count = 0

    # -- what the session reads --------------------------------------------------------------

    @property
    def current(self) -> Execution | None:
        """The cell that holds the kernel, if any."""
        return self._current

    @property
    def running(self) -> RunningCell | None:
        """The running cell as a successor gateway would need it (persisted)."""
        return self._running

    @property
    def execution_count(self) -> int:
        """The kernel's execution count after the last cell that had one."""
        return self._execution_count

    @property
    def queued(self) -> int:
        """Cells waiting for the kernel."""
        return len(self._queue)

    @property
    def busy(self) -> bool:
        """A cell runs or waits."""
        return self._current is not None or bool(self._queue)

    # -- what the session asks ---------------------------------------------------------------

    def enqueue(self, execution: Execution) -> None:
        """Run `execution` after the cells queued before it."""
        self._queue.append(execution)
        execution.task = self._tasks.spawn(self._run(execution))

    async def interrupt(self) -> bool:
        """Interrupt the running cell; False when nothing was running."""
        execution, kernel = self._current, self._slot.kernel
        if execution is None or kernel is None or not execution.running:
            return False
        execution.stop(StopReason.INTERRUPT)
        await self._signal(execution, kernel)
        self._tasks.spawn(self._keep_interrupting(execution, kernel))
        return True

    def abandon(self, execution: Execution) -> None:
        """Nobody follows the cell: stop it rather than run it for nobody.

        Even if a stop was already asked for (a user's interrupt that the cell ignores):
        with nobody left to see the cell, it must not run on until its timeout.
        """
        if execution.finished:
            return
        execution.stop(StopReason.DISCONNECT)
        kernel = self._slot.kernel
        if self._current is execution and kernel is not None:
            self._tasks.spawn(self._stop_abandoned(execution, kernel))

    def stop_all(self, reason: StopReason) -> None:
        """Stop the cells waiting and the one running (a restart, the session closing)."""
        for waiting in self._queue:
            waiting.stop(reason)
        if self._current is not None:
            self._current.stop(reason)

    def take_up(self, execution_count: int) -> None:
        """The kernel's count where a predecessor gateway's record left it."""
        self._execution_count = execution_count

    def follow(self, execution: Execution, running: RunningCell) -> None:
        """An adopted cell holds the kernel (`adoption.py`): it ends in `end_cell`."""
        self._current = execution
        self._running = running

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Work on the session's cells, cancelled at `suspend` and awaited at `close`."""
        self._tasks.spawn(work)

    async def close(self) -> None:
        await self._tasks.join(seconds=10)

    async def suspend(self) -> None:
        self._tasks.cancel()
        await self._tasks.join(seconds=10)

    # -- one cell ----------------------------------------------------------------------------

    async def _run(self, execution: Execution) -> None:
        session_id = self._session.id
        logs.bind(session_id=session_id, execution_id=execution.id)  # this task's log lines
        try:
            async with self._slot.lock:
                self._queue.remove(execution)
                if self._refused(execution):
                    return
                self._current = execution
                try:
                    await self._execute(execution)
                    await self.report_files(execution)
                except Exception as exc:
                    logger.exception("session %s: execution failed", session_id)
                    message = f"the gateway failed to run this cell: {exc}"
                    execution.emit(error_event("GatewayError", message))
                    execution.stop(StopReason.DEATH, "gateway_error")
        except asyncio.CancelledError:
            execution.stop(StopReason.CLOSED)
            execution.restarted = True
            raise
        finally:  # never leave a client without its `done`
            if execution in self._queue:
                self._queue.remove(execution)
            self.end_cell(execution)

    async def report_files(self, execution: Execution) -> None:
        """The cell stopped in the kernel: a `file` event for each file it changed."""
        execution.finishing()
        if not self._session.closed:
            for file_event in await self._files.changed_file_events():
                execution.emit(file_event)

    def end_cell(self, execution: Execution) -> None:
        """End a cell, however it went: the one place a cell ends, its own or adopted.

        If it held the kernel, the session moves on: no current cell, none running in
        the record, the kernel's execution count taken, activity touched and the record
        persisted. Then, for every cell (refused and stopped-while-queued ones too):
        its one `done` (which releases its readers), the metric, and retention.
        Called once per cell (each call counts in the metric).
        """
        if self._current is execution:
            self._current = None
            self._running = None
            if execution.execution_count is not None:
                self._execution_count = execution.execution_count
            self._session.touch()
            self._session.persist()
        execution.finish()
        self._metrics.execution_ended(execution, stateless=self._ephemeral)
        self._log.keep_recent()

    def _refused(self, execution: Execution) -> bool:
        """A cell that must not run (session gone or failed, stopped while queued): its
        reason and error set, for `end_cell`."""
        policy = self._slot.policy
        if self._session.closed:
            execution.stop(StopReason.CLOSED)
            execution.emit(error_event("SessionClosed", f"session {self._session.id} was deleted"))
        elif policy.failed:  # queued before the session failed: never revive for it
            execution.stop(StopReason.DEATH, "session_failed")
            execution.emit(error_event("SessionFailed", policy.failed))
        elif execution.stop_reason is None:
            return False
        return True

    async def _execute(self, execution: Execution) -> None:
        slot = self._slot
        try:
            if self._hibernation is not None:
                await self._hibernation.wake()
            await slot.revive()
        except SessionClosed as exc:  # deleted while it resumed
            execution.stop(StopReason.CLOSED)
            execution.emit(error_event("SessionClosed", exc.message))
            return
        except KernelUnavailable as exc:
            execution.restarted = True
            execution.stop(StopReason.DEATH, "start_failed")
            execution.emit(error_event("KernelUnavailable", exc.message))
            return
        except SessionFailed as exc:
            execution.session_failed = True
            execution.stop(StopReason.DEATH, "session_failed")
            execution.emit(error_event("SessionFailed", exc.message))
            return
        kernel = slot.kernel
        if execution.stop_reason is not None or kernel is None:
            # Stopped (abandoned, restarted, deleted) while its kernel was starting: not sent.
            if self._session.closed:
                message = f"session {self._session.id} was deleted"
                execution.emit(error_event("SessionClosed", message))
            return
        execution.restarted = slot.take_restart_notice()
        notice = self._hibernation.take_notice() if self._hibernation is not None else None
        if notice is not None:
            execution.resumed = notice
            execution.emit(event("resumed", notice))
        if execution.around is not None and not await kernel.run_silent(
            execution.around[0], AROUND_SECONDS
        ):
            execution.stop(StopReason.DEATH, "gateway_error")
            execution.emit(error_event("GatewayError", "the cell's set-up code failed"))
            return
        execution.start()
        async with self._signalling:  # no SIGINT meant for the previous cell is in flight
            msg_id, reply = await kernel.execute(execution.code, execution)
        deadline = time.time() + execution.timeout
        self._running = RunningCell(execution.number, msg_id, execution.timeout, deadline)
        self._session.persist()
        idle = asyncio.ensure_future(execution.idle.wait())
        try:
            await asyncio.wait(
                {idle, kernel.exited},
                timeout=execution.timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if idle.done():
                await self._take_reply(execution, reply)
                self._explain_silent_stop(execution)
                await self._tear_down(execution, kernel)
                if execution.reply is not None and execution.reply.exit_requested:
                    # exit() asks the frontend to end the kernel; the gateway is the frontend.
                    await slot.retire(kernel)
                return
            if kernel.exit_info is None:
                await self._time_out(execution, kernel, reply)
                return
        finally:
            idle.cancel()
            kernel.forget(msg_id)
        self.died(execution, kernel)

    async def _take_reply(self, execution: Execution, reply: asyncio.Future[Message]) -> None:
        try:
            msg = reply.result() if reply.done() else await asyncio.wait_for(reply, REPLY_WAIT)
            execution.on_reply(parse_reply(msg))
        except (TimeoutError, asyncio.CancelledError, MalformedMessage):
            pass  # the verdict falls back to whether an error was seen

    async def _time_out(
        self, execution: Execution, kernel: Kernel, reply: asyncio.Future[Message]
    ) -> None:
        """Interrupt a cell past its time; retire the kernel if it does not stop."""
        execution.stop(StopReason.TIMEOUT)
        if await self._interrupt(execution, kernel, self._settings.interrupt_grace):
            await self._take_reply(execution, reply)
            self._explain_silent_stop(execution)
            await self._tear_down(execution, kernel)
            return
        await self.retire_stuck(execution, kernel)

    async def _tear_down(self, execution: Execution, kernel: Kernel) -> None:
        """The silent code after the cell (`submit`'s `around`), while the cell still
        holds the kernel; a failure is logged (the cell's own outcome stands)."""
        if execution.around is None or kernel.exit_info is not None:
            return
        if not await kernel.run_silent(execution.around[1], AROUND_SECONDS):
            logger.warning(
                "session %s: the code after cell %s failed", self._session.id, execution.id
            )

    def _explain_silent_stop(self, execution: Execution) -> None:
        """A cell stopped by an interrupt that the kernel answered with neither an error nor
        a successful reply: say it was interrupted, so no client sees a bare `done`.

        ipykernel does this when the signal lands outside the cell's code (while its
        request is still being dispatched, seen under gVisor on a loaded host): it logs
        "KeyboardInterrupt caught in kernel" and sends only `idle`. IRkernel and Deno's
        kernel do it every time (an `abort` reply, or an error reply with no error
        message), so for them the gateway's words are the only ones there are.
        """
        reason = execution.stop_reason
        if reason not in (StopReason.INTERRUPT, StopReason.DISCONNECT, StopReason.TIMEOUT):
            return
        if execution.saw_error or (execution.reply is not None and execution.reply.status == "ok"):
            return
        if self._language == PYTHON:
            said = error_event(
                "KeyboardInterrupt",
                "interrupted before the cell's code ran, or between its statements: "
                "the kernel stopped it without a traceback",
            )
        elif reason is StopReason.TIMEOUT:
            said = error_event(
                "Interrupted", f"execution exceeded {execution.timeout:g} s and was interrupted"
            )
        elif reason is StopReason.DISCONNECT:
            said = error_event(
                "Interrupted", "interrupted: its client disconnected and did not come back"
            )
        else:
            said = error_event("Interrupted", "interrupted on request")
        execution.emit(said)
        execution.saw_error = True

    async def retire_stuck(self, execution: Execution | None, kernel: Kernel) -> None:
        """A cell past its time ignored interrupts: restart the kernel, and say so in it."""
        if execution is not None:
            execution.emit(
                error_event(
                    "TimeoutError",
                    f"execution exceeded {execution.timeout:g} s and did not stop when "
                    "interrupted; the kernel was restarted and its state is lost",
                )
            )
            execution.restarted = True
        await self._slot.retire(kernel)
        if execution is not None:
            self._slot.take_restart_notice()  # this cell already says so

    def died(self, execution: Execution, kernel: Kernel) -> None:
        """The kernel ended while the cell ran: say why, and count it if unexpected."""
        slot = self._slot
        if execution.stop_reason is StopReason.CLOSED:
            execution.restarted = True
            execution.emit(error_event("SessionClosed", f"session {self._session.id} was deleted"))
            return
        if slot.was_retired(kernel) or execution.stop_reason is StopReason.RESTART:
            if execution.stop_reason is None:  # else it says why the kernel was retired
                execution.stop(StopReason.RESTART)
            execution.restarted = True
            message = "the kernel was restarted during this cell; its state is lost"
            execution.emit(error_event("KernelRestarted", message))
            return
        exit_info = kernel.exit_info
        reason: DiedReason = exit_info.reason if exit_info else "killed"
        describe = exit_info.describe() if exit_info else "the kernel ended"
        execution.emit(error_event("KernelDied", f"{describe}; its state is lost"))
        execution.stop(StopReason.DEATH, reason)
        if not slot.note_death(kernel):
            execution.session_failed = True
            execution.emit(error_event("SessionFailed", slot.policy.failed or ""))

    # -- interrupts --------------------------------------------------------------------------

    async def _signal(self, execution: Execution, kernel: Kernel) -> None:
        """SIGINT, but only while `execution` still runs (checked under the lock).

        Signals to one cell are spaced out: a second one landing while the kernel
        is still handling the first can cost the cell its reply.
        """
        async with self._signalling:
            now = time.monotonic()
            if (
                self._current is execution
                and execution.running
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
        idle = asyncio.ensure_future(execution.idle.wait())  # one waiter, cancelled below
        try:
            while not idle.done() and kernel.exit_info is None:
                if self._current is not execution:
                    return True
                await self._signal(execution, kernel)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.wait({idle}, timeout=min(SIGNAL_SPACING, remaining))
        finally:
            idle.cancel()
        return execution.idle.is_set()

    async def _keep_interrupting(self, execution: Execution, kernel: Kernel) -> None:
        await self._interrupt(execution, kernel, 4 * self._settings.interrupt_grace)

    async def _stop_abandoned(self, execution: Execution, kernel: Kernel) -> None:
        """Interrupt, and retire the kernel if the cell will not stop."""
        if await self._interrupt(execution, kernel, 2 * self._settings.interrupt_grace):
            return
        if self._current is execution and kernel is self._slot.kernel and execution.running:
            logger.info(
                "session %s: an abandoned cell ignored interrupts; restarting", self._session.id
            )
            await self._slot.retire(kernel)
