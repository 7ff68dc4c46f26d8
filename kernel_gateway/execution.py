"""One cell's run as seen by a client: an ordered queue of events ending in one `done`.

The kernel's reader feeds `on_message` directly (no task per message); the
HTTP side drains `stream()`. The queue stays bounded because `OutputLimiter`
caps what one execution may produce.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from .events import OutputLimiter, done_event, is_idle, translate
from .types import DoneStatus, Event, Message


class Execution:
    def __init__(self, code: str, timeout: float, limiter: OutputLimiter) -> None:
        self.id = uuid.uuid4().hex
        self.code = code
        self.timeout = timeout
        self.execution_count: int | None = None
        self.saw_error = False
        self.interrupted = False
        """Set when the user or a disconnect asked to stop this cell."""
        self.restarting = False
        """Set when the session is being restarted while this cell runs."""
        self.abandoned = False
        """Set when no client listens any more (it disconnected)."""
        self.idle = asyncio.Event()
        self.exit_requested = False
        """The cell called exit(): the kernel is replaced after it."""
        self.signalled_at = -1e9
        """When the gateway last sent this cell a SIGINT (monotonic seconds)."""
        self.task: asyncio.Task[None] | None = None
        self._limiter = limiter
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    def on_message(self, msg: Message) -> None:
        """Handle one IOPub message whose parent is this execution's request."""
        if is_idle(msg):
            self.idle.set()
            return
        if msg["header"]["msg_type"] == "execute_input":
            self.execution_count = msg["content"].get("execution_count")
            return
        event = translate(msg)
        if event is None:
            return
        if event.name == "error":
            self.saw_error = True
        limited = self._limiter.limit(event)
        if limited is not None:
            self.emit(limited)

    def emit(self, event: Event) -> None:
        if not self._finished:
            self._events.put_nowait(event)

    def finish(
        self, status: DoneStatus, duration_ms: float, restarted: bool, **extra: object
    ) -> None:
        """Emit the one and only `done` event; later calls are ignored."""
        if self._finished:
            return
        if self._limiter.truncated:
            extra.setdefault("truncated", True)
        self.emit(done_event(status, self.execution_count, duration_ms, restarted, **extra))
        self._finished = True

    async def stream(self) -> AsyncIterator[Event]:
        while True:
            event = await self._events.get()
            yield event
            if event.name == "done":
                return
