"""A session's executions as clients see them: numbered, their events kept, followed.

Every execution of a session is numbered here (its id in the API: 1, 2, ...), and its
events get ids that increase within the session (the SSE ids), so a client can resume a
stream from any point, even after a gateway restart (numbers and ids go on from the
session's record). The log keeps the events of queued, running and recent finished
executions, within `replay_executions` and `replay_bytes` (the newest finished one, and
one a client is reading, always), and expires the rest: asking for one of those answers
410, for one that never was 404.

Clients follow an execution (`attach`) and stop following it (`detach`). A cell whose last
follower left keeps running for `reconnect_grace` seconds, so its client can come back, and
is only then abandoned (the session interrupts it); a stateless cell, with nothing to come
back to, at once. While the gateway drains, a session's cell runs on for a successor.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Protocol

from kernel_gateway.errors import ExecutionExpired, ExecutionNotFound
from kernel_gateway.kernels.events import MAX_EVENTS, OutputLimiter
from kernel_gateway.sessions.execution import Execution
from kernel_gateway.sessions.persistence import RunningCell, SessionRecord
from kernel_gateway.settings import Settings
from kernel_gateway.tasks import TaskSet

logger = logging.getLogger(__name__)


class Followed(Protocol):
    """What the log needs of its session (`Session` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def draining(self) -> bool:
        """The gateway is stopping: a cell nobody follows runs on, for a successor."""

    def abandon(self, execution: Execution) -> None:
        """Stop a cell nobody follows any more."""


class ExecutionLog:
    def __init__(self, session: Followed, settings: Settings, *, ephemeral: bool) -> None:
        self._session = session
        self._settings = settings
        self._ephemeral = ephemeral
        self._history: deque[Execution] = deque()
        """Executions whose events are kept (queued, running, and recent finished ones)."""
        self._submitted = 0
        self._adopted_after = 0
        """Executions numbered by an earlier gateway (their events were not kept)."""
        self._last_event_id = 0
        self._grace_timers = TaskSet()
        """Waits for a detached cell's client to come back (cancelled when the session ends)."""

    @property
    def submitted(self) -> int:
        """Executions numbered so far (in the session's record)."""
        return self._submitted

    @property
    def last_event_id(self) -> int:
        """The last event id given out (in the session's record)."""
        return self._last_event_id

    # -- new executions ----------------------------------------------------------------------

    def new(self, code: str, timeout: float | None, around: tuple[str, str] | None) -> Execution:
        """The session's next execution, kept from now on (`Session.submit`)."""
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
        self._history.append(execution)
        return execution

    def adopted(self, running: RunningCell) -> Execution:
        """The cell an earlier gateway left running, kept from here on (it has started)."""
        s = self._settings
        execution = Execution(
            "",
            running.timeout,
            OutputLimiter(s.max_output_bytes, s.max_display_bytes),
            running.execution,
            self._next_event_id,
        )
        self._history.append(execution)
        return execution

    def take_up(self, record: SessionRecord) -> None:
        """Number on from where the gateway that wrote `record` left off.

        Event ids go on from the record's; if a cell was running, it may have sent up to
        its output cap more since, so ids skip past those: they only ever increase.
        """
        self._submitted = record.submitted
        self._adopted_after = record.submitted
        most = MAX_EVENTS + self._settings.max_file_events + 16  # + markers, errors, done
        self._last_event_id = record.last_event_id + (most if record.running else 0)

    def _next_event_id(self) -> int:
        self._last_event_id += 1
        return self._last_event_id

    def next_event_id(self) -> int:
        """An event id for an event of the session's that is not a cell's (the chat's)."""
        return self._next_event_id()

    # -- what clients ask --------------------------------------------------------------------

    def find(self, execution_id: str) -> Execution:
        """A kept execution by id; 410 if it aged out of retention, 404 if it never was."""
        for execution in self._history:
            if execution.id == execution_id:
                return execution
        session_id = self._session.id
        digits = execution_id.isascii() and execution_id.isdigit() and len(execution_id) < 19
        number = int(execution_id) if digits else 0
        if 0 < number <= self._adopted_after and all(e.number != number for e in self._history):
            raise ExecutionExpired(
                f"the events of execution {execution_id} of session {session_id} are gone: "
                "the gateway restarted since, and replay buffers are not kept across restarts"
            )
        if 0 < number <= self._submitted:
            raise ExecutionExpired(
                f"the events of execution {execution_id} of session {session_id} are no "
                f"longer kept (sessions keep their last {self._settings.replay_executions} "
                f"executions and {self._settings.replay_bytes} bytes of events)"
            )
        raise ExecutionNotFound(f"session {session_id} has no execution {execution_id!r}")

    def all(self) -> list[Execution]:
        return list(self._history)

    def attach(self, execution: Execution) -> None:
        """A client starts reading the execution's events."""
        execution.readers += 1

    def detach(self, execution: Execution) -> None:
        """A client stopped reading; with none left, the cell is abandoned after the grace."""
        execution.readers -= 1
        if execution.finished:
            self.keep_recent()  # it may have been kept only for this reader
            return
        if execution.readers > 0:
            return
        if self._session.draining and not self._ephemeral:
            return  # the gateway is stopping: the cell runs on, for a successor to adopt
        grace = self._settings.reconnect_grace
        if grace <= 0 or self._ephemeral:  # a stateless cell has nothing to resume
            self._session.abandon(execution)
        else:
            self._grace_timers.spawn(self._abandon_unless_resumed(execution, grace))

    async def _abandon_unless_resumed(self, execution: Execution, grace: float) -> None:
        await asyncio.sleep(grace)
        session = self._session
        if execution.readers == 0 and not execution.finished and not session.draining:
            logger.info(
                "session %s: nobody resumed execution %s within %g s; interrupting it",
                session.id,
                execution.id,
                grace,
            )
            session.abandon(execution)

    # -- retention ---------------------------------------------------------------------------

    def keep_recent(self) -> None:
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

    def stop_waiting(self) -> None:
        """No detached cell waits for its client any more (the session closes or suspends)."""
        self._grace_timers.cancel()
