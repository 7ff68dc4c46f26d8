"""The sessions a gateway holds: made from warm kernels, found by id, reaped when idle.

Stateless executions get a session of their own that is destroyed as soon as
its one execution ends, whatever happens to the HTTP response: the release is
tied to the execution's task, which always ends (at the latest at its timeout).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Coroutine
from typing import Any

from .backends.base import Backend
from .errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    SessionNotFound,
    TooManySessions,
)
from .execution import Execution
from .kernel_slot import KernelSlot
from .restart_policy import RestartPolicy
from .session import Session
from .session_files import SessionFiles
from .settings import Settings
from .types import JSON
from .warm_pool import WarmKernel, WarmPool
from .workspace import Workspace

logger = logging.getLogger(__name__)


class Registry:
    def __init__(self, settings: Settings, warm: WarmPool, instance: str) -> None:
        self.settings = settings
        self.warm = warm
        self.instance = instance
        """This gateway's id; its kernel containers carry it as a label."""
        self._sessions: dict[str, Session] = {}
        self._ephemeral: set[Session] = set()
        self._reserved = 0
        self._reserved_stateless = 0
        self._reaper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def backend(self) -> Backend:
        return self.warm.backend

    def start(self) -> None:
        self.warm.start()
        self._reaper = asyncio.ensure_future(self._reap_idle())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        # Taken out first, so a stateless cell that ends meanwhile starts no release of its own.
        sessions = [*self._sessions.values(), *self._ephemeral]
        self._sessions, self._ephemeral = {}, set()
        await asyncio.gather(*(self._close(s) for s in sessions), return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)  # releases under way
        await self.warm.close()

    def stats(self) -> JSON:
        return {
            **self.warm.stats(),
            "sessions": len(self._sessions),
            "max_sessions": self.settings.max_sessions,
            "stateless": len(self._ephemeral),
            "max_stateless": self.settings.max_stateless,
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
            warm = await self.warm.acquire()
        finally:
            self._reserved -= 1
        session = self._session_on(warm, ephemeral=False)
        self._sessions[session.id] = session
        return session

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
        await self._close(session)

    # -- stateless ---------------------------------------------------------------------------

    async def run_stateless(
        self, code: str, cell_timeout: float | None, files: list[tuple[str, bytes]]
    ) -> tuple[Session, Execution]:
        """Run one cell in a fresh kernel that is destroyed once the cell ends."""
        if len(self._ephemeral) + self._reserved_stateless >= self.settings.max_stateless:
            raise TooManySessions(
                f"{self.settings.max_stateless} stateless executions are already running; "
                "retry shortly",
                retry_after=1,
            )
        self._reserved_stateless += 1
        try:
            warm = await self.warm.acquire()
        finally:
            self._reserved_stateless -= 1
        session = self._session_on(warm, ephemeral=True)
        self._ephemeral.add(session)
        try:
            for i, (path, data) in enumerate(files):
                try:
                    await session.files.write(path, data, self.settings.max_upload_bytes)
                except (BadRequest, Conflict, Forbidden, NotFound) as exc:
                    # a bad path, or one that clashes with an earlier file: the body's fault
                    raise InvalidRequest(f"'files[{i}]': {exc.message}") from None
            execution = session.submit(code, cell_timeout)
        except BaseException:
            self._release(session)
            raise
        assert execution.task is not None
        execution.task.add_done_callback(lambda _: self._release(session))
        return session, execution

    def _release(self, session: Session) -> None:
        if session in self._ephemeral:
            self._ephemeral.discard(session)
            self._spawn(self._close(session))

    # -- internals ---------------------------------------------------------------------------

    def _session_on(self, warm: WarmKernel, *, ephemeral: bool) -> Session:
        session_id = uuid.uuid4().hex
        s = self.settings
        slot = KernelSlot(
            session_id,
            warm.kernel,
            warm.storage,
            self.warm.launch,
            RestartPolicy(s.restart_budget, s.restart_window),
            revive=not ephemeral,
            metrics=self.warm.metrics,
        )
        workspace = Workspace(warm.storage.files, self.backend.workspace_owner)
        files = SessionFiles(session_id, workspace, s, inline_all=ephemeral)
        return Session(session_id, slot, files, s, ephemeral=ephemeral, metrics=self.warm.metrics)

    async def _close(self, session: Session) -> None:
        try:
            await session.close()
        finally:
            await self.warm.remove_storage(session.slot.storage)

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
