"""A session: cells run one at a time, in order, on one kernel whose state persists.

Each cell runs as its own task, so a timeout, an interrupt or a kernel death is
handled the same whether or not a client is still reading. This module decides
what happens to a cell; the kernel's life is `KernelSlot`'s (with the
`RestartPolicy`), the files are `SessionFiles`', and the verdict (`done`) is
computed by `Execution` alone.

Every cell ends in `_end_cell`, whether it ran here, was refused, or was adopted
from a predecessor gateway: one `done`, one metric, the session touched and its
record persisted.

Timeout: interrupt, wait `interrupt_grace`, and if the cell still runs, retire
the kernel. Death: report it at once; the slot revives the kernel for the next
cell, which reports `restarted: true`.

Clients come and go: a cell whose last reader disconnects keeps running for
`reconnect_grace` seconds, so a client can resume its stream, and is only then
abandoned (interrupted). The session keeps its recent executions' events for
that, within `replay_executions` and `replay_bytes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from kernel_gateway import logs
from kernel_gateway.errors import (
    Conflict,
    ExecutionExpired,
    ExecutionNotFound,
    KernelUnavailable,
    SessionBusy,
    SessionClosed,
    SessionFailed,
    ShuttingDown,
)
from kernel_gateway.kernels.events import (
    MAX_EVENTS,
    MalformedMessage,
    OutputLimiter,
    error_event,
    parse_reply,
)
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.languages import PYTHON
from kernel_gateway.metrics import Metrics
from kernel_gateway.sessions.execution import Execution, StopReason
from kernel_gateway.sessions.files import SessionFiles
from kernel_gateway.sessions.kernel_slot import KernelSlot
from kernel_gateway.sessions.network import SessionNetwork
from kernel_gateway.sessions.persistence import HibernatedState, RunningCell, SessionRecord
from kernel_gateway.settings import Settings
from kernel_gateway.tasks import TaskSet
from kernel_gateway.types import JSON, Event, Message, SessionStatus

if TYPE_CHECKING:
    from kernel_gateway.kernels.backends.base import SessionStorage
    from kernel_gateway.sessions.hibernation import Hibernator

logger = logging.getLogger(__name__)

SIGNAL_SPACING = 0.5  # seconds between two SIGINTs to the same cell
REPLY_WAIT = 2.0  # seconds to wait for the shell reply once IOPub said idle
PERSIST_ACTIVITY_EVERY = 5.0  # seconds: how stale a persisted idle clock may get
AROUND_SECONDS = 30.0  # seconds the silent code around a cell may take (`submit`)
ADOPTED_READY_WAIT = 5.0  # seconds an adopted, idle kernel has to answer on shell
SUSPEND_WAIT = 60.0  # seconds a stopping gateway waits for a hibernation under way


class Session:
    def __init__(
        self,
        session_id: str,
        slot: KernelSlot,
        files: SessionFiles,
        settings: Settings,
        *,
        ephemeral: bool = False,
        persist: Callable[[Session], None] | None = None,
        metrics: Metrics,
        language: str = PYTHON,
    ) -> None:
        self.id = session_id
        self.language = language
        """The language its kernel runs (a name from `GET /languages`), fixed for its life."""
        self.metrics = metrics
        self.ephemeral = ephemeral
        """One execution, then gone: never revived, files sent whole in events."""
        self.slot = slot
        self.files = files
        self._settings = settings
        self._signalling = asyncio.Lock()
        """Held while a signal is on its way, so it cannot land in the next cell."""
        self._tasks = TaskSet()
        self._grace_timers = TaskSet()
        """Waits for a detached cell's client to come back (cancelled when the session closes)."""
        self._queue: list[Execution] = []
        self._submitted = 0
        self._adopted_after = 0
        """Executions numbered by an earlier gateway (their events were not kept)."""
        self._last_event_id = 0
        self._history: deque[Execution] = deque()
        """Executions whose events are kept (queued, running, and recent finished ones)."""
        self.current: Execution | None = None
        self.execution_count = 0
        self.created_at = datetime.now(UTC)
        self.last_activity = time.monotonic()
        self.closed = False
        self.draining = False
        """The gateway is stopping: no new cells; running ones are left to run."""
        self._persist = persist
        self._persisted_activity = 0.0
        self._running: RunningCell | None = None
        """The running cell as a successor gateway would need it (persisted)."""
        self.network: SessionNetwork | None = None
        """Its network policy and way out, when it may reach some domains (`network.py`)."""
        self.hibernator: Hibernator | None = None
        """How it hibernates and resumes (None: it cannot, e.g. not a Python kernel)."""
        self.hibernation: HibernatedState | None = None
        """Set while it is hibernated (`slot.hibernated`): its snapshot's particulars."""
        self.carrier: SessionStorage | None = None
        """The storage of the warm kernel that resumed it, carrying its disk (`hibernation.py`)."""
        self.hibernating = False
        """A hibernation or a resume is under way (a stop waits for it to end)."""
        self.holders = 0
        """Clients holding a live connection to its kernel (Jupyter WebSockets): it is not
        hibernated under them."""
        self.resume_notice: JSON | None = None
        """What its last resume could not bring back, for the next cell's stream (and
        `done`), given once."""

    # -- what the API asks -------------------------------------------------------------------

    def submit(
        self, code: str, timeout: float | None, around: tuple[str, str] | None = None
    ) -> Execution:
        """Queue a cell; its events can be read from the returned Execution at once.

        `around`: code the kernel runs silently just before the cell and just after it
        (unless the kernel died), in the cell's turn: for example environment variables
        set for one cell and restored (E2B's `env_vars`).
        """
        if self.closed:
            raise SessionClosed(f"session {self.id} was deleted")
        if self.draining:
            raise ShuttingDown(
                "the gateway is restarting; retry shortly (the session will still be there)",
                retry_after=2,
            )
        if self.slot.policy.failed:
            raise SessionFailed(self.slot.policy.failed)
        if len(self._queue) >= self._settings.max_queued_executions:
            raise SessionBusy(
                f"session {self.id} already has {len(self._queue)} executions waiting; "
                "wait for them or interrupt"
            )
        s = self._settings
        execution = Execution(
            code,
            timeout if timeout is not None else s.exec_timeout,
            OutputLimiter(s.max_output_bytes, s.max_display_bytes),
            self._submitted + 1,
            self._next_event_id,
        )
        execution.around = around
        self._submitted += 1
        self._queue.append(execution)
        self._history.append(execution)
        self.touch()
        execution.task = self._tasks.spawn(self._run(execution))
        return execution

    async def interrupt(self) -> bool:
        """Interrupt the running cell; False when nothing was running."""
        self.touch()
        execution, kernel = self.current, self.slot.kernel
        if execution is None or kernel is None or not execution.running:
            return False
        execution.stop(StopReason.INTERRUPT)
        await self._signal(execution, kernel)
        self._tasks.spawn(self._keep_interrupting(execution, kernel))
        return True

    def _next_event_id(self) -> int:
        self._last_event_id += 1
        return self._last_event_id

    def execution(self, execution_id: str) -> Execution:
        """A kept execution by id; 410 if it aged out of retention, 404 if it never was."""
        for execution in self._history:
            if execution.id == execution_id:
                return execution
        digits = execution_id.isascii() and execution_id.isdigit() and len(execution_id) < 19
        number = int(execution_id) if digits else 0
        if 0 < number <= self._adopted_after and all(e.number != number for e in self._history):
            raise ExecutionExpired(
                f"the events of execution {execution_id} of session {self.id} are gone: the "
                "gateway restarted since, and replay buffers are not kept across restarts"
            )
        if 0 < number <= self._submitted:
            raise ExecutionExpired(
                f"the events of execution {execution_id} of session {self.id} are no longer "
                f"kept (sessions keep their last {self._settings.replay_executions} executions "
                f"and {self._settings.replay_bytes} bytes of events)"
            )
        raise ExecutionNotFound(f"session {self.id} has no execution {execution_id!r}")

    def executions(self) -> list[Execution]:
        return list(self._history)

    def attach(self, execution: Execution) -> None:
        """A client starts reading the execution's events."""
        execution.readers += 1
        self.touch()

    def detach(self, execution: Execution) -> None:
        """A client stopped reading; with none left, the cell is abandoned after the grace."""
        execution.readers -= 1
        if execution.finished:
            self._keep_recent()  # it may have been kept only for this reader
            return
        if execution.readers > 0:
            return
        if self.draining and not self.ephemeral:
            return  # the gateway is stopping: the cell runs on, for a successor to adopt
        grace = self._settings.reconnect_grace
        if grace <= 0 or self.ephemeral:  # a stateless cell has nothing to resume
            self.abandon(execution)
        else:
            self._grace_timers.spawn(self._abandon_unless_resumed(execution, grace))

    async def _abandon_unless_resumed(self, execution: Execution, grace: float) -> None:
        await asyncio.sleep(grace)
        if execution.readers == 0 and not execution.finished and not self.draining:
            logger.info(
                "session %s: nobody resumed execution %s within %g s; interrupting it",
                self.id,
                execution.id,
                grace,
            )
            self.abandon(execution)

    def _keep_recent(self) -> None:
        """Keep the newest finished executions within the retention limits; expire the rest.

        The newest finished one is always kept (its size is bounded by the output
        caps), and one a client is reading right now is kept until it is done.
        """
        s = self._settings
        count = kept = 0
        for execution in reversed([e for e in self._history if e.finished]):
            count, kept = count + 1, kept + execution.bytes
            if count == 1 or (count <= s.replay_executions and kept <= s.replay_bytes):
                continue
            if execution.readers:
                continue
            self._history.remove(execution)
            execution.expire()

    def abandon(self, execution: Execution) -> None:
        """The client stopped listening: stop the cell rather than run it for nobody.

        Even if a stop was already asked for (a user's interrupt that the cell ignores):
        with nobody left to see the cell, it must not run on until its timeout.
        """
        if execution.finished:
            return
        execution.stop(StopReason.DISCONNECT)
        kernel = self.slot.kernel
        if self.current is execution and kernel is not None:
            self._tasks.spawn(self._stop_abandoned(execution, kernel))

    async def restart(self) -> None:
        """Replace the kernel now, even if a cell is stuck in it; state is lost.

        Cells queued behind are dropped (they end `interrupted`). Raises
        KernelUnavailable when no new kernel could be started.
        """
        self.touch()
        for waiting in self._queue:
            waiting.stop(StopReason.RESTART)
        if self.current is not None:
            self.current.stop(StopReason.RESTART)
        old = self.slot.kernel
        if old is not None:
            await self.slot.retire(old)
        async with self.slot.lock:
            self.slot.policy.reset()
            if self.slot.hibernated and self.hibernator is not None:
                await self.hibernator.discard(self)  # a fresh kernel: the snapshot is moot
            if self.slot.kernel is old or not self.slot.alive:
                await self.slot.replace()
            self.slot.take_restart_notice()  # asked for: the next cell is not surprised
        self.persist()

    async def close(self) -> None:
        self.closed = True
        for waiting in self._queue:
            waiting.stop(StopReason.CLOSED)
        if self.current is not None:
            self.current.stop(StopReason.CLOSED)
        self._grace_timers.cancel()
        await self.slot.close()
        if self.network is not None:
            await self.network.close()
        await self._tasks.join(seconds=10)

    async def suspend(self) -> None:
        """Let go of the kernel without stopping it: the gateway stops, the session persists.

        The record written here names the running cell (if any), so the next gateway
        holds later cells back until it ends, and enforces its timeout.
        """
        self.draining = True
        for _ in range(int(SUSPEND_WAIT / 0.05)):  # a hibernation or resume ends consistent
            if not self.hibernating:
                break
            await asyncio.sleep(0.05)
        self.persist()
        self.closed = True
        self._grace_timers.cancel()
        self._tasks.cancel()
        await self._tasks.join(seconds=10)
        await self.slot.detach()
        if self.network is not None:
            await self.network.suspend()

    # -- hibernation (sessions/hibernation.py does the work) ----------------------------------

    async def hibernate(self) -> bool:
        """Save the namespace to disk and stop the kernel; False if it was already hibernated.
        Raises SessionBusy while a cell runs or waits, HibernationFailed if it could not be
        saved (the session runs on)."""
        if self.hibernator is None:
            raise Conflict(f"{self.language} sessions cannot be hibernated")
        return await self.hibernator.hibernate(self)

    async def resume(self) -> JSON | None:
        """Bring a hibernated session back now; what its resume reported (None: it was not
        hibernated). Its next cell's stream reports it too."""
        self.touch()
        async with self.slot.lock:
            if self.closed:
                raise SessionClosed(f"session {self.id} was deleted")
            return await self._wake()

    async def _wake(self) -> JSON | None:
        """Resume if hibernated (hold `slot.lock`): KernelUnavailable if no kernel came."""
        if not self.slot.hibernated or self.hibernator is None:
            return None
        self.resume_notice = await self.hibernator.wake(self)
        return self.resume_notice

    @property
    def hibernated(self) -> bool:
        return self.slot.hibernated

    @property
    def busy(self) -> bool:
        """A cell runs or waits."""
        return self.current is not None or bool(self._queue)

    @property
    def queued(self) -> int:
        """Cells waiting for the kernel."""
        return len(self._queue)

    def touch(self) -> None:
        self.last_activity = time.monotonic()
        if self.last_activity - self._persisted_activity >= PERSIST_ACTIVITY_EVERY:
            self.persist()

    # -- persistence -------------------------------------------------------------------------

    def persist(self) -> None:
        """Write this session's record, if sessions are persisted (and it still exists)."""
        if self._persist is not None and not self.closed and not self.ephemeral:
            self._persisted_activity = self.last_activity
            self._persist(self)

    def record(self) -> SessionRecord:
        return SessionRecord(
            id=self.id,
            kernel_id=self.slot.kernel_id,
            storage=self.slot.storage.root.name,
            created_at=self.created_at.isoformat(),
            last_activity=time.time() - (time.monotonic() - self.last_activity),
            submitted=self._submitted,
            last_event_id=self._last_event_id,
            execution_count=self.execution_count,
            restarts=self.slot.restarts,
            running=self._running,
            language=self.language,
            network=self.network.allow if self.network is not None else [],
            hibernated=self.hibernation if self.slot.hibernated else None,
            carrier=self.carrier.root.name if self.carrier is not None else None,
        )

    def restore(self, record: SessionRecord) -> None:
        """Take up where the gateway that wrote `record` left off (its kernel is adopted).

        Event ids go on from the record's; if a cell was running, it may have sent up
        up to its output cap more since, so ids skip past those: they only ever increase.
        """
        self.created_at = datetime.fromisoformat(record.created_at)
        idle_for = max(0.0, time.time() - record.last_activity)
        self.last_activity = time.monotonic() - idle_for
        self._persisted_activity = self.last_activity
        self._submitted = record.submitted
        self._adopted_after = record.submitted
        most = MAX_EVENTS + self._settings.max_file_events + 16  # + markers, errors, done
        self._last_event_id = record.last_event_id + (most if record.running else 0)
        self.execution_count = record.execution_count
        self.slot.restarts = record.restarts
        if record.hibernated is not None:  # no kernel to settle: it resumes when called
            self.hibernation = record.hibernated
            return
        execution = None
        if record.running is not None:
            execution = self._adopted_execution(record.running)
        self._tasks.spawn(self._settle_adopted(execution, record.running))

    def _adopted_execution(self, running: RunningCell) -> Execution:
        """The cell an earlier gateway left running, followed from here on."""
        s = self._settings
        execution = Execution(
            "",
            running.timeout,
            OutputLimiter(s.max_output_bytes, s.max_display_bytes),
            running.execution,
            self._next_event_id,
        )
        execution.start()
        # It started under the earlier gateway: its duration counts from then.
        execution.started = time.monotonic() - max(
            0.0, running.timeout - (running.deadline - time.time())
        )
        self._history.append(execution)
        self.current = execution
        self._running = running
        kernel = self.slot.kernel
        assert kernel is not None
        kernel.follow(running.msg_id, execution)
        return execution

    async def _settle_adopted(
        self, execution: Execution | None, running: RunningCell | None
    ) -> None:
        """Hold the adopted kernel until it is free; stop a left-over cell at its deadline.

        A kernel answers on shell only between cells, so its answer to a
        kernel_info_request says the left-over cell (if any) has ended, and that
        its output reaches this gateway. Past the cell's deadline it is interrupted,
        and if it will not stop the kernel is restarted, as for any timeout.
        """
        kernel = self.slot.kernel
        assert kernel is not None
        try:
            async with self.slot.lock:
                # Files from before are not news; those a left-over cell writes from now on are.
                await self.files.take_baseline()
                if running is not None:
                    wait = max(running.deadline - time.time(), ADOPTED_READY_WAIT)
                else:  # idle, or a cell sent just before its record was written
                    wait = max(ADOPTED_READY_WAIT, self._settings.exec_timeout)
                if await self._ready(kernel, wait):
                    if execution is not None and running is not None:
                        # Its reply went to the stopped gateway; the kernel kept the outcome.
                        reply = await kernel.outcome(running.msg_id, REPLY_WAIT)
                        if reply is not None:
                            execution.on_reply(reply)
                    return
                if kernel.exit_info is not None:
                    if execution is not None:
                        self._died(execution, kernel)
                    else:
                        self.slot.note_death(kernel)
                    return
                if execution is not None:
                    execution.stop(StopReason.TIMEOUT)
                logger.info(
                    "session %s: an adopted cell ran past its deadline; interrupting", self.id
                )
                await kernel.interrupt()
                if await self._ready(kernel, 2 * self._settings.interrupt_grace + 1):
                    return
                await self._retire_stuck(execution, kernel)
        finally:
            if running is not None:
                kernel.forget(running.msg_id)
            if execution is not None:
                with contextlib.suppress(Exception):
                    await self._report_files(execution)
                self._end_cell(execution)

    @staticmethod
    async def _ready(kernel: Kernel, seconds: float) -> bool:
        try:
            await kernel.wait_ready(seconds)
        except KernelUnavailable:
            return False
        return True

    def idle_seconds(self) -> float:
        if self.current is not None or self._queue:
            return 0.0
        return time.monotonic() - self.last_activity

    @property
    def status(self) -> SessionStatus:
        if self.closed:
            return "closed"
        if self.slot.hibernated:
            return "hibernated"
        if self.slot.policy.failed:
            return "failed"
        if self.current is not None:
            return "busy"
        if not self.slot.alive:
            return "restarting"
        return "idle"

    def to_json(self) -> JSON:
        return {
            "id": self.id,
            "language": self.language,
            "status": self.status,
            "created_at": self.created_at.isoformat().replace("+00:00", "Z"),
            "idle_seconds": round(self.idle_seconds(), 3),
            "execution_count": self.execution_count,
            "queued": self.queued,
            "restarts": self.slot.restarts,
            "failed": self.slot.policy.failed,
            "network": self.network.to_json() if self.network is not None else "none",
            "hibernation": self._hibernation_json(),
        }

    def _hibernation_json(self) -> JSON | None:
        state = self.hibernation
        if state is None or not self.slot.hibernated:
            return None
        since = datetime.fromtimestamp(state.since, UTC).isoformat().replace("+00:00", "Z")
        lost = list(state.lost)
        if state.error:
            lost = [{"name": "*", "reason": f"the snapshot was not kept: {state.error}"}]
        return {"since": since, "bytes": state.bytes, "lost": lost}

    # -- one cell ----------------------------------------------------------------------------

    async def _run(self, execution: Execution) -> None:
        logs.bind(session_id=self.id, execution_id=execution.id)  # this task's log lines
        try:
            async with self.slot.lock:
                self._queue.remove(execution)
                if self._refused(execution):
                    return
                self.current = execution
                try:
                    await self._execute(execution)
                    await self._report_files(execution)
                except Exception as exc:
                    logger.exception("session %s: execution failed", self.id)
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
            self._end_cell(execution)

    async def _report_files(self, execution: Execution) -> None:
        """The cell stopped in the kernel: a `file` event for each file it changed."""
        execution.finishing()
        if not self.closed:
            for event in await self.files.changed_file_events():
                execution.emit(event)

    def _end_cell(self, execution: Execution) -> None:
        """End a cell, however it went: the one place a cell ends, its own or adopted.

        If it held the kernel, the session moves on: no current cell, none running in
        the record, the kernel's execution count taken, activity touched and the record
        persisted. Then, for every cell (refused and stopped-while-queued ones too):
        its one `done` (which releases its readers), the metric, and retention.
        Called once per cell (each call counts in the metric).
        """
        if self.current is execution:
            self.current = None
            self._running = None
            if execution.execution_count is not None:
                self.execution_count = execution.execution_count
            self.touch()
            self.persist()
        execution.finish()
        self.metrics.execution_ended(execution, stateless=self.ephemeral)
        self._keep_recent()

    def _refused(self, execution: Execution) -> bool:
        """A cell that must not run (session gone or failed, stopped while queued): its
        reason and error set, for `_end_cell`."""
        if self.closed:
            execution.stop(StopReason.CLOSED)
            execution.emit(error_event("SessionClosed", f"session {self.id} was deleted"))
        elif self.slot.policy.failed:  # queued before the session failed: never revive for it
            execution.stop(StopReason.DEATH, "session_failed")
            execution.emit(error_event("SessionFailed", self.slot.policy.failed))
        elif execution.stop_reason is None:
            return False
        return True

    async def _execute(self, execution: Execution) -> None:
        try:
            await self._wake()
            await self.slot.revive()
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
        kernel = self.slot.kernel
        if execution.stop_reason is not None or kernel is None:
            # Stopped (abandoned, restarted, deleted) while its kernel was starting: not sent.
            if self.closed:
                execution.emit(error_event("SessionClosed", f"session {self.id} was deleted"))
            return
        execution.restarted = self.slot.take_restart_notice()
        if self.resume_notice is not None:
            execution.resumed, self.resume_notice = self.resume_notice, None
            execution.emit(Event("resumed", execution.resumed))
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
        self.persist()
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
                    await self.slot.retire(kernel)
                return
            if kernel.exit_info is None:
                await self._time_out(execution, kernel, reply)
                return
        finally:
            idle.cancel()
            kernel.forget(msg_id)
        self._died(execution, kernel)

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
        await self._retire_stuck(execution, kernel)

    async def _tear_down(self, execution: Execution, kernel: Kernel) -> None:
        """The silent code after the cell (`submit`'s `around`), while the cell still
        holds the kernel; a failure is logged (the cell's own outcome stands)."""
        if execution.around is None or kernel.exit_info is not None:
            return
        if not await kernel.run_silent(execution.around[1], AROUND_SECONDS):
            logger.warning("session %s: the code after cell %s failed", self.id, execution.id)

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
        if self.language == PYTHON:
            event = error_event(
                "KeyboardInterrupt",
                "interrupted before the cell's code ran, or between its statements: "
                "the kernel stopped it without a traceback",
            )
        elif reason is StopReason.TIMEOUT:
            event = error_event(
                "Interrupted", f"execution exceeded {execution.timeout:g} s and was interrupted"
            )
        elif reason is StopReason.DISCONNECT:
            event = error_event(
                "Interrupted", "interrupted: its client disconnected and did not come back"
            )
        else:
            event = error_event("Interrupted", "interrupted on request")
        execution.emit(event)
        execution.saw_error = True

    async def _retire_stuck(self, execution: Execution | None, kernel: Kernel) -> None:
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
        await self.slot.retire(kernel)
        if execution is not None:
            self.slot.take_restart_notice()  # this cell already says so

    def _died(self, execution: Execution, kernel: Kernel) -> None:
        """The kernel ended while the cell ran: say why, and count it if unexpected."""
        if execution.stop_reason is StopReason.CLOSED:
            execution.restarted = True
            execution.emit(error_event("SessionClosed", f"session {self.id} was deleted"))
            return
        if self.slot.was_retired(kernel) or execution.stop_reason is StopReason.RESTART:
            if execution.stop_reason is None:  # else it says why the kernel was retired
                execution.stop(StopReason.RESTART)
            execution.restarted = True
            message = "the kernel was restarted during this cell; its state is lost"
            execution.emit(error_event("KernelRestarted", message))
            return
        exit_info = kernel.exit_info
        reason = exit_info.reason if exit_info else "killed"
        describe = exit_info.describe() if exit_info else "the kernel ended"
        execution.emit(error_event("KernelDied", f"{describe}; its state is lost"))
        execution.stop(StopReason.DEATH, reason)
        if not self.slot.note_death(kernel):
            execution.session_failed = True
            execution.emit(error_event("SessionFailed", self.slot.policy.failed or ""))

    # -- interrupts --------------------------------------------------------------------------

    async def _signal(self, execution: Execution, kernel: Kernel) -> None:
        """SIGINT, but only while `execution` still runs (checked under the lock).

        Signals to one cell are spaced out: a second one landing while the kernel
        is still handling the first can cost the cell its reply.
        """
        async with self._signalling:
            now = time.monotonic()
            if (
                self.current is execution
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
                if self.current is not execution:
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
        if self.current is execution and kernel is self.slot.kernel and execution.running:
            logger.info("session %s: an abandoned cell ignored interrupts; restarting", self.id)
            await self.slot.retire(kernel)
