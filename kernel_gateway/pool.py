"""Warm kernels kept ready, the sessions made from them, and idle reaping.

Taking a session never waits on a kernel start when a warm one is ready.
Refills run in the background, several at once, and callers who found the
pool empty are served first by whichever start finishes next, so a drained
pool recovers as fast as the backend can start kernels.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import uuid
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import zmq.asyncio

from .backends.base import Backend, RuntimeDir, SessionStorage
from .errors import GatewayError, KernelUnavailable, SessionNotFound, TooManySessions
from .kernel import Kernel
from .session import Session
from .settings import Settings
from .types import JSON
from .workspace import Workspace

logger = logging.getLogger(__name__)


@dataclass
class WarmKernel:
    kernel: Kernel
    storage: SessionStorage


class Pool:
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
        self._sessions: dict[str, Session] = {}
        self._ephemeral: set[Session] = set()
        self._stateless = 0
        self._reserved = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.kernels_started = 0
        self._preload_code = preload_code(settings.preload_list)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._fill()
        self._spawn(self._reap_idle())

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
        sessions = [*self._sessions.values(), *self._ephemeral]
        self._sessions, self._ephemeral = {}, set()
        warm, self._warm = list(self._warm), deque()
        await asyncio.gather(
            *(self._close_session(s) for s in sessions),
            *(self._discard(w) for w in warm),
            return_exceptions=True,
        )

    @property
    def instance(self) -> str:
        """This gateway's id; its kernel containers carry it as a label."""
        return self._runtime.instance

    def stats(self) -> JSON:
        return {
            "warm": len(self._warm),
            "starting": self._starting,
            "target": self.settings.pool_size,
            "sessions": len(self._sessions),
            "max_sessions": self.settings.max_sessions,
            "stateless": self._stateless,
            "max_stateless": self.settings.max_stateless,
            "kernels_started": self.kernels_started,
        }

    # -- sessions ----------------------------------------------------------------------------

    async def create_session(self) -> Session:
        if len(self._sessions) + self._reserved >= self.settings.max_sessions:
            raise TooManySessions(
                f"the gateway holds its maximum of {self.settings.max_sessions} sessions; "
                "delete one or retry later",
                retry_after=5,
            )
        self._reserved += 1
        try:
            warm = await self.acquire()
        finally:
            self._reserved -= 1
        workspace = Workspace(warm.storage.files, self.backend.workspace_owner)
        session = Session(
            uuid.uuid4().hex, warm.kernel, warm.storage, workspace, self.launch, self.settings
        )
        self._sessions[session.id] = session
        return session

    async def ephemeral_session(self) -> Session:
        """A fresh kernel for one stateless execution; `release()` destroys it after."""
        if self._stateless >= self.settings.max_stateless:
            raise TooManySessions(
                f"{self.settings.max_stateless} stateless executions are already running; "
                "retry shortly",
                retry_after=1,
            )
        self._stateless += 1  # held from here until release()
        try:
            warm = await self.acquire()
        except BaseException:
            self._stateless -= 1
            raise
        workspace = Workspace(warm.storage.files, self.backend.workspace_owner)
        session = Session(
            uuid.uuid4().hex,
            warm.kernel,
            warm.storage,
            workspace,
            self.launch,
            self.settings,
            ephemeral=True,
        )
        self._ephemeral.add(session)
        return session

    def release(self, session: Session) -> None:
        """Destroy a stateless session's kernel and files, in the background."""
        if session in self._ephemeral:
            self._ephemeral.discard(session)
            self._stateless -= 1
            self._spawn(self._close_session(session))

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(f"no session with id {session_id!r}")
        return session

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    async def delete_session(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise SessionNotFound(f"no session with id {session_id!r}")
        await self._close_session(session)

    async def _close_session(self, session: Session) -> None:
        try:
            await session.close()
        finally:
            await self._remove_storage(session.storage)

    async def _remove_storage(self, storage: SessionStorage) -> None:
        try:
            await self.backend.release_storage(storage)
        finally:
            await asyncio.to_thread(shutil.rmtree, storage.root, True)

    # -- kernels -----------------------------------------------------------------------------

    async def acquire(self) -> WarmKernel:
        """A ready kernel: a warm one at once, else the next one to finish starting."""
        while self._warm:
            warm = self._warm.popleft()
            if not warm.kernel.exited.done():
                self._fill()
                return warm
            self._spawn(self._discard(warm))
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
        """Start a kernel on `storage`, wait until it answers, and preload modules."""
        process = await self.backend.launch(storage)
        kernel = Kernel(process, self._context)
        try:
            await kernel.wait_ready(self.settings.kernel_start_timeout)
            if self._preload_code and not await kernel.run_silent(
                self._preload_code, self.settings.kernel_start_timeout
            ):
                logger.warning(
                    "preloading %s failed in kernel %s", self.settings.preload, kernel.id
                )
        except BaseException:
            await kernel.close()
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
        root = self._runtime.new_workspace()
        storage = SessionStorage(root)
        try:
            storage = await self.backend.prepare_storage(root)
            kernel = await self.launch(storage)
        except BaseException as exc:
            await asyncio.shield(self._remove_storage(storage))
            if not isinstance(exc, Exception):
                raise
            self._on_start_failure(exc)
            return
        finally:
            self._starting -= 1
        self._failures = 0
        warm = WarmKernel(kernel, storage)
        if self._closed:
            await self._discard(warm)
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
            self._spawn(self._discard(warm))
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

    async def _discard(self, warm: WarmKernel) -> None:
        try:
            await warm.kernel.close()
        finally:
            await self._remove_storage(warm.storage)

    async def _reap_idle(self) -> None:
        timeout = self.settings.idle_timeout
        while True:
            await asyncio.sleep(min(30.0, max(0.5, timeout / 4)))
            for session in list(self._sessions.values()):
                if session.idle_seconds() >= timeout:
                    logger.info("session %s idle for %.0f s; removing it", session.id, timeout)
                    try:
                        await self.delete_session(session.id)
                    except SessionNotFound:
                        pass
                    except Exception:
                        logger.exception("removing idle session %s failed", session.id)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


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
