"""What the warm pool and the fork pool share: things started in the background and
handed out, waiters first, with a backoff after failed starts.

A pool says how to start one thing and how many it wants; `Refill` keeps the ready
ones, the callers waiting for one, the starts under way and the tasks it spawned, and
after a failed start waits 0.5 s, doubling up to 30 s, before starting again (a
broken engine or image is not hammered, and the first waiter learns why at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from kernel_gateway.errors import GatewayError, KernelUnavailable
from kernel_gateway.tasks import TaskSet

logger = logging.getLogger(__name__)
T = TypeVar("T")

MAX_BACKOFF = 30.0


class Refill(Generic[T]):
    def __init__(
        self,
        what: str,
        start: Callable[[], Awaitable[T | None]],
        wanted: Callable[[], int],
        max_starts: int,
        on_ready: Callable[[T], None] | None = None,
        on_handed: Callable[[T], None] | None = None,
    ) -> None:
        self.what = what
        """What it holds, for messages: "kernel", "fork server"."""
        self._start = start
        """Start one; None when it was started but is not to be handed out."""
        self._wanted = wanted
        """How many it should hold, ready or starting (those handed out not counted)."""
        self._max_starts = max_starts
        self._on_ready = on_ready
        """Called when an item is kept ready (not handed straight to a waiter)."""
        self._on_handed = on_handed
        """Called when a waiter takes an item: the waiter runs later, and until then the
        item is neither ready nor starting (a pool that counts items in use counts it now)."""
        self.ready: deque[T] = deque()
        self.waiters: deque[asyncio.Future[T]] = deque()
        self.starting = 0
        self.closed = False
        self._failures = 0
        self._retry_at = 0.0
        self.tasks = TaskSet()
        """Its starts and retries, and what the pool spawns (discarding items): cancelled
        at `close`."""

    def fill(self) -> None:
        """Start what is missing, a few at a time, unless backing off or closed."""
        if self.closed or time.monotonic() < self._retry_at:
            return
        while self.starting < self._max_starts and len(self.ready) + self.starting < self._wanted():
            self.starting += 1
            self.tasks.spawn(self._start_one())

    async def _start_one(self) -> None:
        try:
            item = await self._start()
        except Exception as exc:
            self._failed(exc)
            return
        finally:
            self.starting -= 1
        self._failures = 0
        if item is not None and not self.closed:
            self.hand_out(item)
        self.fill()

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        delay = min(MAX_BACKOFF, 0.5 * 2 ** min(self._failures, 6))
        self._retry_at = time.monotonic() + delay
        message = exc.message if isinstance(exc, GatewayError) else str(exc)
        logger.error("%s start failed (%s); retrying in %.1f s", self.what, message, delay)
        if self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(
                    KernelUnavailable(
                        f"could not start a {self.what}: {message}", retry_after=delay
                    )
                )
        self.tasks.spawn(self._retry_later(delay))

    async def _retry_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.fill()

    def hand_out(self, item: T, *, newest_first: bool = False) -> bool:
        """Give `item` to the first waiter, else keep it ready; True if a waiter took it."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(item)
                if self._on_handed is not None:
                    self._on_handed(item)
                return True
        if newest_first:
            self.ready.appendleft(item)
        else:
            self.ready.append(item)
        if self._on_ready is not None:
            self._on_ready(item)
        return False

    async def wait(self, seconds: float) -> T:
        """The next item handed out, within `seconds` (else KernelUnavailable)."""
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        self.fill()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), seconds)
        except TimeoutError:
            if _has_result(waiter):
                return waiter.result()
            raise KernelUnavailable(
                f"no {self.what} became ready within {seconds:g} s", retry_after=5
            ) from None
        except asyncio.CancelledError:
            if _has_result(waiter):  # the caller left; keep the item for the next one
                self.hand_out(waiter.result())
            raise
        finally:
            if waiter in self.waiters:
                self.waiters.remove(waiter)
            if not waiter.done():
                waiter.cancel()

    async def close(self) -> list[T]:
        """Stop starting (letting cancelled starts clean up), fail the waiters, and
        return the ready items for the caller to discard."""
        self.closed = True
        await self.tasks.close()
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_exception(KernelUnavailable("the gateway is shutting down"))
        ready, self.ready = list(self.ready), deque()
        return ready


def _has_result(future: asyncio.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None
