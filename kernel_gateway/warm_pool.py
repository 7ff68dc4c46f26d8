"""Warm kernels kept ready, each on its own prepared storage.

Taking a kernel never waits on a start when a warm one is ready. Refills run
in the background, several at once, and callers who found the pool empty are
served first by whichever start finishes next, so a drained pool recovers as
fast as the backend can start kernels. Storage is prepared here, off the path
that hands kernels out.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq.asyncio

from .backends.base import Backend, KernelProcess, RuntimeDir, SessionStorage
from .errors import GatewayError, KernelUnavailable
from .kernel import Kernel
from .settings import Settings
from .types import JSON

logger = logging.getLogger(__name__)


@dataclass
class WarmKernel:
    kernel: Kernel
    storage: SessionStorage


class WarmPool:
    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        runtime: RuntimeDir,
        context: zmq.asyncio.Context,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self._runtime = runtime
        self._context = context
        self._warm: deque[WarmKernel] = deque()
        self._waiters: deque[asyncio.Future[WarmKernel]] = deque()
        self._starting = 0
        self._failures = 0
        self._retry_at = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.kernels_started = 0
        self._preload_code = preload_code(settings.preload_list)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._fill()

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        # Let cancelled starts finish their cleanup before the backend removes containers.
        await asyncio.gather(*tasks, return_exceptions=True)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(KernelUnavailable("the gateway is shutting down"))
        warm, self._warm = list(self._warm), deque()
        await asyncio.gather(*(self.discard(w) for w in warm), return_exceptions=True)

    def stats(self) -> JSON:
        return {
            "warm": len(self._warm),
            "starting": self._starting,
            "target": self.settings.pool_size,
            "kernels_started": self.kernels_started,
        }

    # -- kernels -----------------------------------------------------------------------------

    async def remove_storage(self, storage: SessionStorage) -> None:
        try:
            await self.backend.release_storage(storage)
        finally:
            await asyncio.to_thread(shutil.rmtree, storage.root, True)

    @property
    def workspaces(self) -> Path:
        """The folder holding every session's storage root."""
        return self._runtime.path / "w"

    async def unclaimed_storage(self, keep: set[str]) -> list[SessionStorage]:
        """Every storage root in `workspaces` whose name is not in `keep`.

        For a gateway that adopted its predecessor's sessions: the disks of its warm
        and stateless kernels, and of sessions that could not be adopted.
        """

        def names() -> set[str]:
            return {p.name.removesuffix(".img") for p in self.workspaces.iterdir()}

        return [
            SessionStorage(self.workspaces / n)
            for n in sorted(await asyncio.to_thread(names) - keep)
        ]

    async def remove_storages(self, storages: list[SessionStorage]) -> None:
        await asyncio.gather(*(self.remove_storage(s) for s in storages))

    def connect(self, process: KernelProcess) -> Kernel:
        """A connection to a kernel that already runs (one a predecessor left)."""
        return Kernel(process, self._context)

    async def acquire(self) -> WarmKernel:
        """A ready kernel: a warm one at once, else the next one to finish starting."""
        while self._warm:
            warm = self._warm.popleft()
            if not warm.kernel.exited.done():
                self._fill()
                return warm
            self._spawn(self.discard(warm))
        waiter: asyncio.Future[WarmKernel] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._fill()
        try:
            return await asyncio.wait_for(
                asyncio.shield(waiter), self.settings.kernel_start_timeout
            )
        except TimeoutError:
            if _has_result(waiter):
                return waiter.result()
            raise KernelUnavailable(
                f"no kernel became ready within {self.settings.kernel_start_timeout:g} s",
                retry_after=5,
            ) from None
        except asyncio.CancelledError:
            if _has_result(waiter):  # the caller left; keep the kernel for the next one
                self._hand_out(waiter.result())
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            if not waiter.done():
                waiter.cancel()

    async def launch(self, storage: SessionStorage) -> Kernel:
        """Start a kernel on `storage`, wait until it answers, and preload modules.

        Raises only KernelUnavailable (the backend maps its own failures; anything
        else that goes wrong while connecting is mapped here), so whoever replaces
        kernels handles exactly one exception.
        """
        process = await self.backend.launch(storage)
        try:
            kernel = Kernel(process, self._context)
        except BaseException as exc:
            await process.cleanup()
            _raise_unavailable(exc)
            raise
        try:
            await kernel.wait_ready(self.settings.kernel_start_timeout)
            if self._preload_code and not await kernel.run_silent(
                self._preload_code, self.settings.kernel_start_timeout
            ):
                logger.warning(
                    "preloading %s failed in kernel %s", self.settings.preload, kernel.id
                )
        except BaseException as exc:
            await kernel.close()
            _raise_unavailable(exc)
            raise
        self.kernels_started += 1
        return kernel

    def _fill(self) -> None:
        if self._closed or time.monotonic() < self._retry_at:
            return
        wanted = self.settings.pool_size + len(self._waiters)
        while (
            self._starting < self.settings.max_concurrent_starts
            and len(self._warm) + self._starting < wanted
        ):
            self._starting += 1
            self._spawn(self._start_one())

    async def _start_one(self) -> None:
        storage: SessionStorage | None = None
        try:
            root = self._runtime.new_workspace()
            storage = SessionStorage(root)
            storage = await self.backend.prepare_storage(root)
            kernel = await self.launch(storage)
        except BaseException as exc:
            if storage is not None:
                await asyncio.shield(self.remove_storage(storage))
            if not isinstance(exc, Exception):
                raise
            self._on_start_failure(exc)
            return
        finally:
            self._starting -= 1
        self._failures = 0
        warm = WarmKernel(kernel, storage)
        if self._closed:
            await self.discard(warm)
            return
        self._hand_out(warm)
        self._fill()

    def _hand_out(self, warm: WarmKernel) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(warm)
                return
        self._warm.append(warm)
        warm.kernel.exited.add_done_callback(lambda _: self._on_warm_exit(warm))

    def _on_warm_exit(self, warm: WarmKernel) -> None:
        if warm in self._warm:
            self._warm.remove(warm)
            logger.warning("a warm kernel died before use; replacing it")
            self._spawn(self.discard(warm))
            self._fill()

    def _on_start_failure(self, exc: Exception) -> None:
        self._failures += 1
        delay = min(30.0, 0.5 * 2 ** min(self._failures, 6))
        self._retry_at = time.monotonic() + delay
        message = exc.message if isinstance(exc, GatewayError) else str(exc)
        logger.error("kernel start failed (%s); retrying in %.1f s", message, delay)
        if self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(
                    KernelUnavailable(f"could not start a kernel: {message}", retry_after=delay)
                )
        self._spawn(self._retry_later(delay))

    async def _retry_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._fill()

    async def discard(self, warm: WarmKernel) -> None:
        try:
            await warm.kernel.close()
        finally:
            await self.remove_storage(warm.storage)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _raise_unavailable(exc: BaseException) -> None:
    """Raise KernelUnavailable for any failure to bring a kernel up; else return."""
    if isinstance(exc, Exception) and not isinstance(exc, KernelUnavailable):
        raise KernelUnavailable(f"the kernel did not start: {exc}", retry_after=5) from exc


def _has_result(future: asyncio.Future[WarmKernel]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def preload_code(modules: list[str]) -> str:
    """Import `modules` (and warm matplotlib's renderer) without leaving a name behind.

    A first chart otherwise pays for importing pyplot, loading fonts and a first
    render: half a second or more. Everything happens inside a function that is
    deleted at once, so the user's namespace stays exactly as a fresh kernel's.
    """
    if not modules:
        return ""
    lines = [
        "def __kg_preload():",
        "    import importlib",
        f"    for name in {modules!r}:",
        "        try:",
        "            importlib.import_module(name)",
        "        except Exception:",
        "            pass",
    ]
    if "matplotlib" in modules:
        lines += [
            "    import io",
            "    import matplotlib.pyplot as plt",
            "    fig = plt.figure()",
            "    plt.plot([0, 1])",
            "    fig.savefig(io.BytesIO(), format='png', bbox_inches='tight')",
            "    plt.close(fig)",
        ]
    lines += ["try:", "    __kg_preload()", "finally:", "    del __kg_preload"]
    return "\n".join(lines)
