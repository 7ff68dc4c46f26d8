"""Hibernation: an idle session gives back its kernel's memory and keeps its variables on disk;
it resumes by itself on its next call (docs/hibernation.md).

To hibernate (under the session's kernel lock, so no cell runs meanwhile), the kernel writes
its namespace to a snapshot (`kernels/hibernation.py`); a cell that arrived while it did so
cancels the hibernation (the snapshot is dropped, nothing changes). Otherwise the kernel is
killed and removed, and the snapshot kept in the gateway's folder. The session's disk stays
as it was (mounted, no copy), so its files are served while it sleeps.

To resume (under the same lock: two calls resume it once), a warm kernel takes up the
session's disk (`Backend.carry`, with no copy: the kernel checks it sees that disk before it
loads anything), or, where the backend cannot do that, a kernel starts on the disk. It is
prepared like any of the session's kernels (network, environment), then loads the snapshot.
The names the snapshot could not keep are reported to the next cell (a `resumed` event and
`done.resumed`); if the snapshot cannot be loaded at all, that is reported the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from kernel_gateway.errors import HibernationFailed, KernelUnavailable, SessionBusy
from kernel_gateway.kernels.backends.base import SessionStorage
from kernel_gateway.kernels.hibernation import SnapshotError, Snapshots
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.languages import PYTHON
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.metrics import Metrics
from kernel_gateway.sessions.persistence import HibernatedState
from kernel_gateway.tasks import TaskSet
from kernel_gateway.types import JSON

if TYPE_CHECKING:
    from kernel_gateway.sessions.session import Session

logger = logging.getLogger(__name__)

KILL_WAIT = 10.0  # seconds for a killed kernel to be seen ended


class Hibernator:
    """Hibernates and resumes Python sessions; owns the snapshots and the carriers."""

    def __init__(self, pool: WarmPool, snapshots: Snapshots, metrics: Metrics) -> None:
        self.pool = pool
        self.snapshots = snapshots
        self.metrics = metrics
        self._carry = pool.backend.can_carry
        self._tasks = TaskSet()

    @staticmethod
    def supports(session: Session) -> bool:
        return session.language == PYTHON and not session.ephemeral

    async def close(self) -> None:
        await self._tasks.join()

    # -- hibernate ---------------------------------------------------------------------------

    async def hibernate(self, session: Session) -> bool:
        """See `Session.hibernate`."""
        if session.busy:
            raise SessionBusy(f"session {session.id} is running a cell; hibernate it when idle")
        slot = session.slot
        async with slot.lock:
            if session.closed or slot.hibernated:
                return False
            if session.busy:
                raise SessionBusy(f"session {session.id} is running a cell")
            began = time.monotonic()
            if not slot.alive:
                await slot.revive()  # a kernel that died idle: its state is gone anyway
            kernel = slot.kernel
            assert kernel is not None
            try:
                saved, name = await self.snapshots.save(kernel)
            except SnapshotError as exc:
                self.metrics.hibernation_failed()
                raise HibernationFailed(
                    f"session {session.id} could not be saved ({exc}); it runs on as it was"
                ) from None
            if session.busy or session.closed:  # a cell came meanwhile: it wins
                await self._drop_written(kernel, name)
                raise SessionBusy(
                    f"a cell arrived for session {session.id} while it was being saved; "
                    "it runs instead"
                )
            slot.park()
            state = HibernatedState(
                since=time.time(), bytes=saved.bytes, lost=[x.to_json() for x in saved.lost]
            )
            try:
                await kernel.kill()
                await asyncio.wait_for(asyncio.shield(kernel.exited), KILL_WAIT)
                await self.snapshots.take(kernel, name, session.id)
            except (SnapshotError, OSError, TimeoutError, KernelUnavailable) as exc:
                logger.error("session %s: its snapshot was not kept: %s", session.id, exc)
                state = replace(state, error=str(exc) or type(exc).__name__)
            finally:
                self._tasks.spawn(kernel.close())
            session.hibernation = state
            await self._drop_carrier(session)
            session.persist()
        self.metrics.hibernated(time.monotonic() - began)
        logger.info(
            "session %s hibernated: %d names, %d bytes%s",
            session.id,
            saved.names,
            saved.bytes,
            f"; not kept: {', '.join(x.name for x in saved.lost)}" if saved.lost else "",
        )
        return True

    async def _drop_written(self, kernel: Kernel, name: str) -> None:
        with contextlib.suppress(OSError, SnapshotError):
            await self.snapshots.drop(kernel, name)

    # -- resume ------------------------------------------------------------------------------

    async def wake(self, session: Session) -> JSON:
        """Resume `session` (hold its kernel lock; it is hibernated): what it reports.
        Raises KernelUnavailable when no kernel could be had (it stays hibernated)."""
        began = time.monotonic()
        slot = session.slot
        state = session.hibernation or HibernatedState(since=time.time())
        kernel, devices = await self._kernel_for(session)
        try:
            await slot.install(kernel)
        except BaseException:
            await self._drop_carrier(session)
            raise
        lost = list(state.lost)
        failure = state.error
        if failure is None:
            try:
                await self.snapshots.load(kernel, session.id, devices)
            except SnapshotError as exc:
                failure = str(exc)
                if devices is not None:  # carried: try once more, on a kernel of its disk
                    logger.warning(
                        "session %s: a warm kernel could not resume it (%s); starting one on "
                        "its disk",
                        session.id,
                        exc,
                    )
                    failure = await self._resume_cold(session)
        if failure is not None:
            lost = [{"name": "*", "reason": f"the snapshot could not be loaded: {failure}"}]
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self.snapshots.delete, session.id)
        slot.hibernated = False
        session.hibernation = None
        session.persist()
        seconds = time.monotonic() - began
        self.metrics.resumed(seconds)
        logger.info(
            "session %s resumed in %.0f ms%s",
            session.id,
            seconds * 1000,
            f"; lost: {', '.join(x['name'] for x in lost)}" if lost else "",
        )
        return {
            "lost": lost,
            "hibernated_seconds": round(max(0.0, time.time() - state.since), 3),
            "resume_ms": round(seconds * 1000, 3),
        }

    async def _kernel_for(self, session: Session) -> tuple[Kernel, dict[str, int] | None]:
        """A running kernel on the session's disk: a warm one carrying it (with the devices
        it must see), else a new one started on it (None)."""
        storage = session.slot.storage
        if self._carry:
            warm = await self.pool.acquire()
            try:
                devices = await self.pool.backend.carry(warm.storage, storage)
            except KernelUnavailable as exc:
                logger.warning("a warm kernel could not take up a session's disk: %s", exc)
                await self.pool.backend.uncarry(warm.storage)
                self._tasks.spawn(self.pool.discard(warm))
            else:
                session.carrier = warm.storage
                return warm.kernel, devices
        return await self.pool.launch(storage), None

    async def _resume_cold(self, session: Session) -> str | None:
        """The snapshot, loaded into a kernel started on the session's disk; None if it
        was, else why not."""
        slot = session.slot
        old = slot.park()
        if old is not None:
            await old.close()
        await self._drop_carrier(session)
        kernel = await self.pool.launch(slot.storage)
        await slot.install(kernel)
        try:
            await self.snapshots.load(kernel, session.id)
        except SnapshotError as exc:
            return str(exc)
        self._carry = False  # warm kernels do not see the disks they are given here
        logger.warning("warm kernels cannot take up hibernated sessions' disks here")
        return None

    # -- the end of a session ----------------------------------------------------------------

    async def _drop_carrier(self, session: Session) -> None:
        carrier, session.carrier = session.carrier, None
        if carrier is not None:
            await self.release_carrier(carrier)

    async def release_carrier(self, carrier: SessionStorage) -> None:
        await self.pool.backend.uncarry(carrier)
        await self.pool.remove_storage(carrier)

    async def discard(self, session: Session) -> None:
        """A hibernated session restarted (hold its kernel lock): its snapshot is dropped and
        it is no longer hibernated; its next kernel starts fresh on its disk."""
        with contextlib.suppress(OSError, ValueError):
            await asyncio.to_thread(self.snapshots.delete, session.id)
        session.hibernation = None
        session.slot.hibernated = False

    async def forget(self, session: Session) -> None:
        """The session is gone (its kernel closed): its snapshot and carrier too."""
        await self._drop_carrier(session)
        with contextlib.suppress(OSError, ValueError):
            await asyncio.to_thread(self.snapshots.delete, session.id)
