"""Idle sessions: hibernated (`--hibernate-after`) or removed (`--idle-timeout`); hibernated
ones removed past `--hibernated-ttl`, answering 410 from then on.

A session that can hibernate is never removed for being idle: it hibernates instead (not
while a notebook holds its kernel, nor while E2B contexts run on its files). If its
hibernation fails, it is not tried again until the session is used, and the idle timeout
applies meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from kernel_gateway import logs
from kernel_gateway.errors import GatewayError, SessionBusy, SessionNotFound
from kernel_gateway.sessions.session import Session
from kernel_gateway.settings import Settings
from kernel_gateway.tasks import TaskSet
from kernel_gateway.tenants.principal import ADMIN, Principal

logger = logging.getLogger(__name__)


class Reaped(Protocol):
    """What the reaper needs of the sessions' registry (`Registry` is one)."""

    def sessions(self) -> list[Session]: ...

    def companions(self, owner_id: str) -> list[Session]: ...

    async def delete_session(self, session_id: str, viewer: Principal) -> None: ...

    def gone(self, session_id: str, message: str, owner: str | None = None) -> None:
        """`session_id` answers 410 with `message` from now on (to `owner` and the admin)."""


class IdleReaper:
    def __init__(self, registry: Reaped, settings: Settings) -> None:
        self._registry = registry
        self._settings = settings
        self._loop: asyncio.Task[None] | None = None
        self._tasks = TaskSet()
        """Hibernations of idle sessions under way."""
        self._hibernating: set[str] = set()
        self._unsaved: dict[str, float] = {}
        """Sessions a hibernation failed for, with their activity then: not tried again
        until they are used."""

    def start(self) -> None:
        self._loop = asyncio.ensure_future(self._reap_idle())

    async def stop(self) -> None:
        """No more rounds (hibernations under way go on: `join` waits for them)."""
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)

    async def join(self) -> None:
        await self._tasks.join()

    def forget(self, session_id: str) -> None:
        """The session is deleted."""
        self._unsaved.pop(session_id, None)

    async def _reap_idle(self) -> None:
        """Every few seconds, every session (`reap`)."""
        s = self._settings
        shortest = min(t for t in (s.idle_timeout, s.hibernate_after, s.hibernated_ttl) if t > 0)
        while True:
            await asyncio.sleep(min(30.0, max(0.5, shortest / 4)))
            for session in self._registry.sessions():
                with logs.bound(session_id=session.id):  # its lines name it and its key
                    try:
                        await self.reap(session)
                    except SessionNotFound:
                        pass
                    except Exception:
                        logger.exception("reaping idle session %s failed", session.id)

    async def reap(self, session: Session) -> None:
        """Hibernate or remove `session` if it has been idle long enough."""
        s = self._settings
        idle = session.idle_seconds()
        if session.hibernated:
            if idle >= s.hibernated_ttl:
                logger.info(
                    "session %s hibernated and idle for %.0f s; removing it", session.id, idle
                )
                await self._registry.delete_session(session.id, ADMIN)
                self._registry.gone(
                    session.id,
                    f"session {session.id} was hibernated for longer than --hibernated-ttl "
                    f"({s.hibernated_ttl:g} s) and was deleted with its variables and files",
                    session.owner,
                )
            return
        if self._may_hibernate(session):  # never removed while it can hibernate instead
            if idle >= s.hibernate_after and session.id not in self._hibernating:
                self._hibernating.add(session.id)
                self._tasks.spawn(self._hibernate_idle(session))
            return
        if idle >= s.idle_timeout:
            logger.info("session %s idle for %.0f s; removing it", session.id, s.idle_timeout)
            await self._registry.delete_session(session.id, ADMIN)

    def _may_hibernate(self, session: Session) -> bool:
        return (
            self._settings.hibernate_after > 0
            and session.hibernation is not None
            and not session.holders  # a notebook is connected to its kernel
            and not self._registry.companions(session.id)  # E2B contexts: their kernels run on
            and self._unsaved.get(session.id) != session.last_activity
        )

    async def _hibernate_idle(self, session: Session) -> None:
        try:
            await session.hibernate()
        except SessionBusy:
            pass  # used meanwhile: idle again later
        except GatewayError as exc:
            logger.warning("session %s was not hibernated: %s", session.id, exc.message)
            self._unsaved[session.id] = session.last_activity
        finally:
            self._hibernating.discard(session.id)
            if session.closed:
                self._unsaved.pop(session.id, None)
