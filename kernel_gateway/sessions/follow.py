"""Following an execution: one client reading a cell's events, and what its leaving does.

Every front door that streams a cell (the HTTP API's SSE and JSON, E2B's `/execute`,
MCP's `run_python`) reads it the same way:

    async with follow(session, execution, after, Disconnect.GRACE) as records:
        async for record in records:
            ...

From entering to leaving the block the client is one of the execution's readers
(`Session.attach`). Leaving before `done` (the client went away, the call was cancelled,
the response torn down) is a disconnect, and the policy says what becomes of the cell:

    GRACE                       the session's rule (`Session.detach`): with no reader
                                left the cell runs `--reconnect-grace` seconds for a
                                client to resume from its last event id, then is
                                interrupted; a stateless cell at once; while the gateway
                                drains, never (its successor adopts it)
    INTERRUPT_UNLESS_DRAINING   interrupted at once (nobody can resume it), unless the
                                gateway drains: then it runs on for the successor
    INTERRUPT                   interrupted at once, even while the gateway drains

Entering and leaving are a context manager's, not the iterator's: a generator torn down
before its first step never runs its `finally`, and one left suspended at a `yield` runs it
only when collected. Both steps are synchronous, so a cancelled response can always take
them.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import AsyncIterator
from types import TracebackType

from kernel_gateway.sessions.execution import Execution, StopReason
from kernel_gateway.sessions.session import Session
from kernel_gateway.types import Record

logger = logging.getLogger(__name__)


class Disconnect(enum.Enum):
    """What a client leaving before `done` does to the cell (see the module's docstring)."""

    GRACE = "grace"
    INTERRUPT_UNLESS_DRAINING = "interrupt_unless_draining"
    INTERRUPT = "interrupt"


class Following:
    """One client reading one execution: an async context manager (attached inside it)
    and an async iterator of the execution's records (live, ending with `done`)."""

    def __init__(
        self, session: Session, execution: Execution, after: int | None, on_disconnect: Disconnect
    ) -> None:
        self.session = session
        self.execution = execution
        self.on_disconnect = on_disconnect
        self._records = execution.records(after)
        self._attached = False

    async def __aenter__(self) -> Following:
        if not self._attached:
            self._attached = True
            self.session.attach(self.execution)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._attached:
            return
        self._attached = False
        self.session.detach(self.execution)
        if self.execution.finished or self.on_disconnect is Disconnect.GRACE:
            return
        if self.on_disconnect is Disconnect.INTERRUPT_UNLESS_DRAINING and self.session.draining:
            return  # the cell runs on, for the gateway that adopts the session
        if self.execution.stop_reason is StopReason.DISCONNECT:
            return  # abandoned already (a stateless cell, by `detach` just now)
        logger.info(
            "session %s: the client of execution %s left before its end; stopping it",
            self.session.id,
            self.execution.id,
        )
        self.session.abandon(self.execution)

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._records


def follow(
    session: Session,
    execution: Execution,
    after: int | None = None,
    on_disconnect: Disconnect = Disconnect.GRACE,
) -> Following:
    """Read `execution`'s records from after event id `after` (None: from its first),
    live until `done`; a client leaving before `done` is dealt with by `on_disconnect`.
    Raises ExecutionExpired (on the first step) when the events are no longer kept."""
    return Following(session, execution, after, on_disconnect)
