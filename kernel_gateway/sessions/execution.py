"""One cell's run: its life as one state and one stop reason, and its ordered events.

    QUEUED ──start()──▶ RUNNING ──finishing()──▶ FINISHING ──finish()──▶ DONE

Why a cell did not simply run to its end is one `StopReason`, recorded through
`stop()` only. Requests to stop (a user's interrupt, a client's disconnect) may
be overtaken by what actually ended the cell (a timeout, the kernel's death, a
restart, the session closing); nothing overtakes those. `done_data()` is the one
place the final `done` event is computed, from the state, the stop reason and
the kernel's reply.

The kernel's reader feeds `on_input`/`on_event`/`on_idle` directly (no task per
message). Every event is appended to the execution's log with an id that
increases within its session, so any number of readers can follow it live or
replay it from after any id (`records(after)`), while it runs and after it
ended, until the session's retention expires it. The log stays bounded because
`OutputLimiter` caps what one execution may produce.
"""

from __future__ import annotations

import asyncio
import bisect
import enum
import itertools
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

from kernel_gateway.errors import ExecutionExpired
from kernel_gateway.kernels.events import ExecuteReply, OutputLimiter, event, rough_size
from kernel_gateway.shapes.events import DoneData, ResumedData
from kernel_gateway.shapes.responses import ExecutionSummary
from kernel_gateway.types import DiedReason, DoneStatus, Event, ExecutionStatus, Record


class State(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHING = "finishing"
    """The cell stopped in the kernel; its files are being reported."""
    DONE = "done"


class StopReason(enum.Enum):
    """Why a cell ended other than by running to its end, by precedence (low to high)."""

    INTERRUPT = "interrupt"
    """The user asked to interrupt it."""
    DISCONNECT = "disconnect"
    """Its client went away."""
    TIMEOUT = "timeout"
    DEATH = "death"
    """The kernel died (or could not be started, or the session has failed)."""
    RESTART = "restart"
    """The session's kernel was restarted on request."""
    CLOSED = "closed"
    """The session was deleted."""


_PRECEDENCE = {reason: rank for rank, reason in enumerate(StopReason)}
_PRECEDENCE[StopReason.DISCONNECT] = _PRECEDENCE[StopReason.INTERRUPT]  # both mere requests


class Execution:
    def __init__(
        self,
        code: str,
        timeout: float,
        limiter: OutputLimiter,
        number: int = 1,
        event_ids: Callable[[], int] | None = None,
    ) -> None:
        self.number = number
        """Its place among the session's executions (1, 2, ...): its id in the API."""
        self.id = str(number)
        self.code = code
        self.timeout = timeout
        self.state = State.QUEUED
        self.stop_reason: StopReason | None = None
        self.death: DiedReason | None = None
        """With StopReason.DEATH: exited, signal, killed, out_of_memory, start_failed,
        session_failed or gateway_error."""
        self.reply: ExecuteReply | None = None
        self.saw_error = False
        """An `error` event came: the verdict when the shell reply never arrives."""
        self.execution_count: int | None = None
        self.restarted = False
        """The kernel was replaced before or during this cell: earlier state is gone."""
        self.session_failed = False
        """This cell's kernel death spent the session's restart budget."""
        self.resumed: ResumedData | None = None
        """The session resumed from hibernation for this cell (or since its last one): what
        was lost, in `done` too."""
        self.around: tuple[str, str] | None = None
        """Silent code the kernel runs just before and just after the cell (`submit`)."""
        self.idle = asyncio.Event()
        self.signalled_at = -1e9
        """When the gateway last sent this cell a SIGINT (monotonic seconds)."""
        self.task: asyncio.Task[None] | None = None
        self.submitted_at = datetime.now(UTC)
        self.started: float | None = None
        self.ended: float | None = None
        self.first_output: float | None = None
        """When the kernel sent the cell's first output event (monotonic seconds)."""
        self.readers = 0
        """Clients streaming this execution now (a disconnect with none left is a detach)."""
        self._limiter = limiter
        self._event_ids = event_ids or itertools.count(1).__next__
        self._log: list[Record] = []
        self.bytes = 0
        """Roughly what the log holds, for the session's retention cap."""
        self.expired = False
        self.released = False
        self._appended = asyncio.Event()

    # -- life --------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.state is State.DONE

    @property
    def running(self) -> bool:
        """Sent to the kernel and not yet idle there."""
        return self.state is State.RUNNING and not self.idle.is_set()

    def start(self) -> None:
        assert self.state is State.QUEUED, self.state
        self.state = State.RUNNING
        self.started = time.monotonic()

    def finishing(self) -> None:
        if self.state is State.RUNNING:
            self.state = State.FINISHING

    def stop(self, reason: StopReason, death: DiedReason | None = None) -> bool:
        """Record why the cell ends; True if `reason` is now the stop reason.

        A reason replaces an earlier one only if it ranks higher: a kernel death
        after an interrupt request is reported as the death. Once the cell has
        ended in the kernel (idle, or its files being reported), only a failure of
        the gateway itself changes its verdict: a restart or delete that comes
        after that did not stop it.
        """
        if self.finished:
            return False
        ended = self.idle.is_set() or self.state is State.FINISHING
        if ended and reason is not StopReason.DEATH:
            return False
        current = self.stop_reason
        if current is not None and _PRECEDENCE[reason] <= _PRECEDENCE[current]:
            return False
        self.stop_reason = reason
        self.death = death if reason is StopReason.DEATH else None
        return True

    def finish(self) -> None:
        """Emit the one and only `done` event; later calls are ignored."""
        if self.finished:
            return
        self.ended = time.monotonic()
        self.emit(event("done", self.done_data()))
        self.state = State.DONE

    # -- the outcome, computed in one place --------------------------------------------------

    @property
    def status(self) -> DoneStatus:
        reason = self.stop_reason
        if reason is StopReason.TIMEOUT:
            return "timeout"
        if reason is StopReason.DEATH:
            return "died"
        if reason in (StopReason.RESTART, StopReason.CLOSED):
            return "interrupted"
        if self.reply is not None:
            ok = self.reply.status == "ok"
        else:
            ok = self.idle.is_set() and not self.saw_error
        if reason is not None:  # an interrupt that landed after the cell ended changes nothing
            return "ok" if ok else "interrupted"
        return "ok" if ok else "error"

    @property
    def duration_ms(self) -> float:
        if self.started is None:
            return 0.0
        end = self.ended if self.ended is not None else time.monotonic()
        return (end - self.started) * 1000

    def done_data(self) -> DoneData:
        data: DoneData = {
            "status": self.status,
            "execution_count": self.execution_count,
            "duration_ms": round(self.duration_ms, 3),
            "restarted": self.restarted,
        }
        if self.stop_reason is StopReason.DEATH and self.death is not None:
            data["reason"] = self.death
            if self.session_failed:
                data["session_failed"] = True
        if self._limiter.truncated:
            data["truncated"] = True
        if self.resumed is not None:
            data["resumed"] = self.resumed
        return data

    # -- what the kernel sends (OutputSink) -------------------------------------------------

    def on_input(self, execution_count: int) -> None:
        self.execution_count = execution_count

    def on_event(self, event: Event) -> None:
        if self.first_output is None:
            self.first_output = time.monotonic()
        if event.name == "error":
            self.saw_error = True
        limited = self._limiter.limit(event)
        if limited is not None:
            self.emit(limited)

    def on_idle(self) -> None:
        self.idle.set()

    def on_reply(self, reply: ExecuteReply) -> None:
        self.reply = reply
        if reply.execution_count is not None:
            self.execution_count = reply.execution_count

    # -- what clients read -------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        if self.finished:
            return
        self._log.append(Record(self._event_ids(), event))
        self.bytes += rough_size(event.data) + 16
        self._appended.set()
        self._appended = asyncio.Event()

    async def records(self, after: int | None = None) -> AsyncIterator[Record]:
        """The log from after event id `after` (from the start if None), then live
        events, ending with `done`. Raises ExecutionExpired if the log is dropped."""
        if self.expired:
            raise ExecutionExpired(self._expired_message())
        log = self._log
        index = 0 if after is None else bisect.bisect_right(log, after, key=lambda r: r.id)
        while True:
            while index < len(log):
                record = log[index]
                index += 1
                yield record
                if record.event.name == "done":
                    return
            if self.finished:  # resumed from after its `done`: nothing more will come
                return
            if self.released:
                return
            appended = self._appended
            await appended.wait()
            if self.expired:
                raise ExecutionExpired(self._expired_message())

    async def stream(self) -> AsyncIterator[Event]:
        async for record in self.records():
            yield record.event

    def kept_records(self) -> list[Record]:
        """Its events so far (none once expired)."""
        return list(self._log)

    @property
    def last_event_id(self) -> int | None:
        return self._log[-1].id if self._log else None

    def release_readers(self) -> None:
        """End every live read now, without `done`: the gateway is stopping, and readers
        resume the stream (`Last-Event-ID`) from the gateway that adopts the session."""
        self.released = True
        self._appended.set()

    def expire(self) -> None:
        """Drop the log (the session's retention): readers of it get ExecutionExpired."""
        self.expired = True
        self._log = []
        self.bytes = 0
        self._appended.set()

    def _expired_message(self) -> str:
        return f"the events of execution {self.id} are no longer kept (retention)"

    def summary(self) -> ExecutionSummary:
        """What the list of a session's executions says about this one."""
        status: ExecutionStatus
        if self.state is State.QUEUED:
            status = "queued"
        elif not self.finished:
            status = "running"
        else:
            status = self.status
        return {
            "id": self.id,
            "status": status,
            "submitted_at": self.submitted_at.isoformat().replace("+00:00", "Z"),
            "duration_ms": round(self.duration_ms, 3),
            "execution_count": self.execution_count,
            "last_event_id": self.last_event_id,
        }
