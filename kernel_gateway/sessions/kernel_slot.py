"""A session's kernel: launched, watched, retired on purpose, revived after a death.

The slot owns `lock`, held by whoever uses the kernel (a running cell) or
replaces it, so cells and replacements never overlap and a cell queued behind
a death waits for the new kernel.

Two ways a kernel ends:
- **retired**: the gateway killed it on purpose (timeout, restart, exit(), an
  abandoned cell that ignored interrupts). Not a death: it costs no budget.
- **died**: anything else. Counted once by the `RestartPolicy`; past the budget
  the session fails and is not revived until an explicit restart.

Either way the next user of the kernel is told (`take_restart_notice`), and a
replacement starts in the background as soon as the lock is free, after the
policy's backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from kernel_gateway.errors import KernelUnavailable, SessionFailed
from kernel_gateway.kernels.backends.base import SessionStorage
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.metrics import Metrics
from kernel_gateway.sessions.restart_policy import RestartPolicy
from kernel_gateway.tasks import TaskSet

logger = logging.getLogger(__name__)

Launcher = Callable[[SessionStorage], Awaitable[Kernel]]


class KernelSlot:
    def __init__(
        self,
        session_id: str,
        kernel: Kernel | None,
        storage: SessionStorage,
        launch: Launcher,
        policy: RestartPolicy,
        *,
        revive: bool = True,
        on_replace: Callable[[], None] | None = None,
        metrics: Metrics,
    ) -> None:
        self._metrics = metrics
        self._session_id = session_id
        self.kernel: Kernel | None = kernel
        self.kernel_id = kernel.id if kernel is not None else ""
        """The id of the kernel last put in the slot (kept while a replacement starts)."""
        self.hibernated = kernel is None
        """No kernel, on purpose: the session is hibernated (`park`); it resumes with a kernel
        given to `install` (sessions/hibernation.py), never by `revive`."""
        self.storage = storage
        self._launch = launch
        self.policy = policy
        self._revive_in_background = revive
        self.on_replace = on_replace
        """Called once a new kernel is in the slot (the session persists its id)."""
        self.prepare: list[Callable[[Kernel], Awaitable[object]]] = []
        """Awaited in turn with each new kernel before any cell reaches it: what every
        kernel of this slot must have (its network policy's proxy, E2B's environment
        variables)."""
        self.lock = asyncio.Lock()
        self.restarts = 0
        self.closed = False
        self._retired: set[Kernel] = set()
        self._counted: set[Kernel] = set()
        self._notice = False
        self._tasks = TaskSet()
        if kernel is not None:
            self._watch(kernel)

    @property
    def alive(self) -> bool:
        """A kernel is in the slot, running, and not retired (its end may not be seen yet)."""
        kernel = self.kernel
        return kernel is not None and kernel.exit_info is None and kernel not in self._retired

    async def live_kernel(self, seconds: float) -> Kernel | None:
        """The slot's running kernel, waiting up to `seconds` while one is revived after a
        death (in the background); None if none is there by then, or none will be (the slot
        closed, hibernated, or its session failed). For work beside the cells (commands in
        the kernel's sandbox), which must not wait for the cell lock."""
        deadline = time.monotonic() + seconds
        while not self.alive:
            if self.closed or self.hibernated or self.policy.failed:
                return None
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.05)
        return self.kernel

    def take_restart_notice(self) -> bool:
        """Whether kernel state was lost (a death or a retirement) since last asked."""
        notice, self._notice = self._notice, False
        return notice

    def was_retired(self, kernel: Kernel) -> bool:
        return kernel in self._retired

    async def retire(self, kernel: Kernel) -> None:
        """Kill `kernel` on purpose: its state is lost, no death is counted."""
        self._retired.add(kernel)
        self._notice = True
        await kernel.kill()

    def note_death(self, kernel: Kernel) -> bool:
        """Count `kernel`'s unexpected death once; False if that failed the session."""
        if kernel in self._retired or kernel in self._counted:
            return self.policy.failed is None
        self._counted.add(kernel)
        self._notice = True
        exit_info = kernel.exit_info
        self._metrics.kernel_died(exit_info.reason if exit_info else "killed")
        logger.info(
            "session %s: %s", self._session_id, exit_info.describe() if exit_info else "died"
        )
        if not self.policy.record_death(self._session_id):
            logger.warning("session %s failed: %s", self._session_id, self.policy.failed)
            return False
        return True

    async def revive(self) -> bool:
        """Make sure a live kernel is in the slot (hold `lock`); True if one was started.

        Raises SessionFailed past the restart budget and KernelUnavailable when no
        kernel could be started (the next call tries again).
        """
        if self.alive:
            return False
        if self.hibernated:
            raise KernelUnavailable("the session is hibernated: resume it first")
        if self.kernel is not None:
            self.note_death(self.kernel)
        if self.policy.failed:
            raise SessionFailed(self.policy.failed)
        if self.kernel is not None and self.kernel not in self._retired:
            await asyncio.sleep(self.policy.backoff())
        await self.replace()
        return True

    async def replace(self) -> None:
        """Close the current kernel (if any) and launch a new one (hold `lock`)."""
        old, self.kernel = self.kernel, None
        if old is not None:
            await old.close()
            self._retired.discard(old)
            self._counted.discard(old)
        if self.closed:
            return
        kernel = await self._launch(self.storage)
        if self.closed:
            await kernel.close()
            return
        self.restarts += 1
        self._metrics.kernel_restarted()
        await self.install(kernel)
        if self.on_replace is not None:
            self.on_replace()

    def park(self) -> Kernel | None:
        """Take the kernel out without a death or a restart notice: the session hibernates
        (hold `lock`). Returns it, for the caller to end once it has saved what it needs."""
        kernel, self.kernel = self.kernel, None
        self.hibernated = True
        return kernel

    async def install(self, kernel: Kernel) -> None:
        """Put a new, running `kernel` in the slot and prepare it (hold `lock`): after a
        replacement, or as a hibernated session resumes. Raises KernelUnavailable, with the
        kernel closed, when it could not be prepared. (A resuming session stays `hibernated`
        until its snapshot is loaded.)"""
        if self.closed:
            await kernel.close()
            raise KernelUnavailable("the session was deleted")
        self.kernel, self.kernel_id = kernel, kernel.id
        self._watch(kernel)
        try:
            for prepare in self.prepare:
                await prepare(kernel)
        except Exception as exc:
            # A kernel without what the slot promises (its proxy, its environment) is not
            # kept: it counts as a failed start, and the next revival tries again.
            self.kernel = None
            await kernel.close()
            raise KernelUnavailable(f"the new kernel could not be set up: {exc}") from exc

    async def close(self) -> None:
        self.closed = True
        kernel, self.kernel = self.kernel, None
        if kernel is not None:
            await kernel.close()
        await self._tasks.close()  # a revival may be sleeping out a backoff

    async def detach(self) -> None:
        """Let go of the kernel, leaving it running (the gateway stops; the session persists)."""
        self.closed = True
        kernel, self.kernel = self.kernel, None
        if kernel is not None:
            kernel.disconnect()
        await self._tasks.close()

    def _watch(self, kernel: Kernel) -> None:
        """Notice a kernel that ends while nobody uses it, and revive the slot."""

        def on_exit(_: object) -> None:
            if not self.closed and self.kernel is kernel and self._revive_in_background:
                self._tasks.spawn(self._recover(kernel))

        kernel.exited.add_done_callback(on_exit)

    async def _recover(self, kernel: Kernel) -> None:
        async with self.lock:
            if self.closed or self.kernel is not kernel:
                return  # already replaced by whoever held the lock
            with contextlib.suppress(KernelUnavailable, SessionFailed):
                await self.revive()
