"""Background tasks owned by one object: spawned, kept until done, stopped at its close.

asyncio keeps only a weak reference to a task, so a task nobody holds can vanish
mid-run; and an owner that closes must not leave its tasks running. `TaskSet` holds
every task it spawned until the task is done (then forgets it at once, so the set
never grows), and at the owner's close either cancels them (`close`, `cancel`) or
waits for them (`join`).

Invariants:

- A task is in the set from `spawn` until it is done; `len()` counts those not done.
- A task that fails with an exception (not a cancellation) is logged once, with its
  traceback, when it ends: nothing else awaits these tasks, so the failure would
  otherwise surface only as asyncio's "exception was never retrieved" at garbage
  collection, or not at all.
- `close()` and `join()` never raise what the tasks raised (nor their
  CancelledError); a cancellation of the caller itself still propagates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


class TaskSet:
    """The background tasks of one owner."""

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Run `coro` as a task held here until it is done."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            logger.error("background task %s failed", task.get_name(), exc_info=error)

    def __len__(self) -> int:
        return len(self._tasks)

    def cancel(self) -> None:
        """Ask every task to stop (they end at their next await)."""
        for task in list(self._tasks):
            task.cancel()

    async def join(self, seconds: float | None = None) -> None:
        """Wait for the tasks there are now to end, without cancelling them.

        Without a timeout, as `asyncio.gather`: if the caller is cancelled, so are they.
        With `seconds`, as `asyncio.wait`: those still running after that long are
        left running.
        """
        tasks = list(self._tasks)
        if not tasks:
            return
        if seconds is None:
            await asyncio.gather(*tasks, return_exceptions=True)
        else:
            await asyncio.wait(tasks, timeout=seconds)

    async def close(self) -> None:
        """Cancel every task and wait until all have ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
