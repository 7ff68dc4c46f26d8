"""Hibernation: an idle session gives back its kernel's memory and keeps its variables on disk;
it resumes by itself on its next call (docs/hibernation.md).

To hibernate (under the session's kernel lock, so no cell runs meanwhile), the kernel writes
its namespace to a snapshot (`kernels/hibernation.py`); if the session was used while it did
(a cell, a notebook, a command), the hibernation is cancelled and nothing changes. Otherwise
the snapshot is kept in the gateway's folder, the session's record says it is hibernated,
and only then is its kernel killed and removed. The session's disk stays as it was (mounted,
no copy), so its files are served while it sleeps.

To resume (under the same lock: two calls resume it once), a warm kernel takes up the
session's disk (`Backend.carry`, with no copy: the kernel checks it sees that disk before it
loads anything), or, where the backend cannot do that, a kernel starts on the disk. It is
prepared like any of the session's kernels (network, environment), then loads the snapshot;
the snapshot is deleted once the record says the session runs again. The names it could not
keep are reported to the next cell (a `resumed` event and `done.resumed`); if it cannot be
loaded at all, that is reported the same way and the file set aside. Whatever fails or is
cancelled half-way, the session is left hibernated with its snapshot, and no kernel or
carried disk behind.

A session that can hibernate holds a `Hibernation`: its state here (the snapshot's
particulars while it is hibernated, the disk it was carried on, whether a hibernation or
resume is under way, what its last resume reported), which only the `Hibernator` changes.
The hibernator sees the session itself through `Sleeper`, a narrow Protocol: it reads it,
and writes nothing of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Protocol

from kernel_gateway.errors import (
    RETRY_SAVE,
    Conflict,
    HibernationFailed,
    KernelUnavailable,
    SessionBusy,
    SessionClosed,
)
from kernel_gateway.kernels.backends.base import SessionStorage
from kernel_gateway.kernels.hibernation import SnapshotError, Snapshots
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.languages import PYTHON
from kernel_gateway.kernels.pools.warm import WarmKernel, WarmPool
from kernel_gateway.metrics import Metrics
from kernel_gateway.sessions.kernel_slot import KernelSlot
from kernel_gateway.sessions.persistence import HibernatedState
from kernel_gateway.shapes import responses
from kernel_gateway.shapes.events import LostName, ResumedData
from kernel_gateway.tasks import TaskSet

logger = logging.getLogger(__name__)

NOT_ITS_STORAGE = "is not this session's storage"
"""What a kernel says when it does not see the disk it was given (in_kernel/hibernation.py)."""

SETTLE_STEP = 0.05  # seconds between two looks at a hibernation or resume under way


class Sleeper(Protocol):
    """What hibernation needs of a session (`Session` is one): it reads, never writes."""

    @property
    def id(self) -> str: ...

    @property
    def slot(self) -> KernelSlot: ...

    @property
    def closed(self) -> bool: ...

    @property
    def busy(self) -> bool:
        """A cell runs or waits."""

    @property
    def holders(self) -> int:
        """Clients holding a live connection to its kernel (Jupyter WebSockets)."""

    @property
    def last_activity(self) -> float: ...

    def persist(self) -> None:
        """Write the session's record (it reads `Hibernation.record_state` and `carrier`)."""


class Hibernation:
    """One session's hibernation: its state, kept here rather than on the session, changed
    only by these methods and the `Hibernator`. The session holds one when it can hibernate
    (a Python session that is not stateless) and calls it; the hibernator does the work."""

    def __init__(self, hibernator: Hibernator, session: Sleeper) -> None:
        self.session = session
        self._hibernator = hibernator
        self.saved: HibernatedState | None = None
        """Set while it is hibernated (`slot.hibernated`): its snapshot's particulars."""
        self.carrier: SessionStorage | None = None
        """The storage of the warm kernel that resumed it, carrying its disk."""
        self.under_way = False
        """A hibernation or a resume is under way (a stop waits for it to end)."""
        self.saving = False
        """Its kernel is writing its variables (the session shows `hibernating`)."""
        self._notice: ResumedData | None = None
        """What its last resume could not bring back, for the next cell (given once)."""

    # -- what the session asks -----------------------------------------------------------------

    async def hibernate(self) -> bool:
        """See `Session.hibernate`."""
        return await self._hibernator.hibernate(self)

    async def wake(self) -> ResumedData | None:
        """Resume if hibernated (hold the slot's lock): what the resume reported, also kept
        for the next cell (None: it was not hibernated). KernelUnavailable if no kernel
        came, SessionClosed if the session was deleted meanwhile."""
        if not self.session.slot.hibernated:
            return None
        self._notice = await self._hibernator.wake(self)
        return self._notice

    def take_notice(self) -> ResumedData | None:
        """What the last resume reported, once: for the next cell's stream and `done`."""
        notice, self._notice = self._notice, None
        return notice

    async def discard(self) -> None:
        """The session restarts while hibernated (hold its slot's lock): see
        `Hibernator.discard`."""
        await self._hibernator.discard(self)

    def kernel_replaced(self) -> None:
        """See `Hibernator.kernel_replaced`."""
        self._hibernator.kernel_replaced(self)

    async def forget(self) -> None:
        """The session is gone (its kernel closed): its snapshot and carrier too."""
        await self._hibernator.forget(self)

    def take_up(self, saved: HibernatedState | None, carrier: SessionStorage | None) -> None:
        """Where a predecessor gateway's record left it (`Session.restore`): hibernated with
        `saved`, and/or running on a kernel that `carrier` holds."""
        self.saved = saved
        self.carrier = carrier

    async def settle(self, seconds: float) -> None:
        """Wait, up to `seconds`, for a hibernation or resume under way to end (the gateway
        stops: the record it writes then is consistent)."""
        for _ in range(int(seconds / SETTLE_STEP)):
            if not self.under_way:
                break
            await asyncio.sleep(SETTLE_STEP)

    # -- what the session reports --------------------------------------------------------------

    @property
    def record_state(self) -> HibernatedState | None:
        """What the session's record says of it: its snapshot, while it is hibernated."""
        return self.saved if self.session.slot.hibernated else None

    def to_json(self) -> responses.Hibernation | None:
        """The session's `hibernation` in the API: its snapshot while it is hibernated."""
        state = self.saved
        if state is None or not self.session.slot.hibernated:
            return None
        since = datetime.fromtimestamp(state.since, UTC).isoformat().replace("+00:00", "Z")
        lost = list(state.lost)
        if state.error:
            lost = [{"name": "*", "reason": f"the snapshot was not kept: {state.error}"}]
        return {"since": since, "bytes": state.bytes, "lost": lost}


class Hibernator:
    """Hibernates and resumes Python sessions; owns the snapshots and the carriers."""

    def __init__(self, pool: WarmPool, snapshots: Snapshots, metrics: Metrics) -> None:
        self.pool = pool
        self.snapshots = snapshots
        self.metrics = metrics
        self._carry = pool.backend.can_carry
        self._tasks = TaskSet()
        self.flush: Callable[[], Awaitable[None]] = _nothing_to_flush
        """Waits until the session records written so far are on disk (the registry's, when
        sessions are persisted)."""
        self.pool_of: Callable[[Sleeper], WarmPool] = lambda session: self.pool
        """The pool a session's kernels come from (a template's own, for one on a template:
        set by the registry); `pool` for the others."""

    @staticmethod
    def supports(language: str, *, ephemeral: bool) -> bool:
        return language == PYTHON and not ephemeral

    def attach(self, session: Sleeper) -> Hibernation:
        """The hibernation of `session` (one that `supports`)."""
        return Hibernation(self, session)

    async def close(self) -> None:
        await self._tasks.join()

    # -- hibernate ---------------------------------------------------------------------------

    async def hibernate(self, h: Hibernation) -> bool:
        """See `Session.hibernate`.

        The order keeps a stop or crash at any moment harmless: the snapshot is kept in the
        gateway's folder, then the record says the session is hibernated (on disk, with
        `--persist-sessions`), and only then is the kernel killed. A successor that finds a
        hibernated record with its kernel still running ends that kernel and resumes from
        the snapshot."""
        session = h.session
        slot = session.slot
        async with slot.lock:
            if session.closed or slot.hibernated:
                return False
            self._refuse_if_in_use(session)
            began = time.monotonic()
            if not slot.alive:
                await slot.revive()  # a kernel that died idle: its state is gone anyway
            kernel = slot.kernel
            assert kernel is not None
            activity = session.last_activity
            h.under_way = h.saving = True
            try:
                try:
                    saved, name = await self.snapshots.save(kernel)
                except SnapshotError as exc:
                    self.metrics.hibernation_failed()
                    raise HibernationFailed(
                        f"session {session.id} could not be saved ({exc}); it runs on as it was",
                        retry_after=RETRY_SAVE,
                    ) from None
                if session.closed or session.last_activity != activity or session.busy:
                    # Used meanwhile (a cell, a notebook, a command): the use wins.
                    with contextlib.suppress(OSError, SnapshotError):
                        await self.snapshots.drop(kernel, name)
                    raise SessionBusy(
                        f"session {session.id} was used while it was being saved; it runs on"
                    )
                try:
                    await self.snapshots.take(kernel, name, session.id)
                except SnapshotError as exc:
                    self.metrics.hibernation_failed()
                    raise HibernationFailed(
                        f"session {session.id} could not be saved ({exc}); it runs on as it was",
                        retry_after=RETRY_SAVE,
                    ) from None
                h.saved = HibernatedState(
                    since=time.time(), bytes=saved.bytes, lost=[x.to_json() for x in saved.lost]
                )
                slot.park()
                carrier, h.carrier = h.carrier, None
                session.persist()
                await self.flush()  # on disk before the kernel goes
                self._tasks.spawn(self._end(kernel, carrier))
            finally:
                h.under_way = h.saving = False
        self.metrics.hibernated(time.monotonic() - began)
        logger.info(
            "session %s hibernated: %d names, %d bytes%s",
            session.id,
            saved.names,
            saved.bytes,
            f"; not kept: {', '.join(x.name for x in saved.lost)}" if saved.lost else "",
        )
        return True

    @staticmethod
    def _refuse_if_in_use(session: Sleeper) -> None:
        if session.busy:
            raise SessionBusy(f"session {session.id} is running a cell; hibernate it when idle")
        if session.holders:
            raise Conflict(
                f"session {session.id} has a client connected to its kernel (a notebook); "
                "it cannot be hibernated under it"
            )

    async def _end(self, kernel: Kernel, carrier: SessionStorage | None) -> None:
        """A hibernated session's last kernel: ended and removed, then the disk it ran on
        when a warm kernel carried the session."""
        try:
            await kernel.close()
        finally:
            if carrier is not None:
                await self.release_carrier(carrier)

    # -- resume ------------------------------------------------------------------------------

    async def wake(self, h: Hibernation) -> ResumedData:
        """Resume `h`'s session (hold its kernel lock; it is hibernated): what it reports.

        Raises KernelUnavailable when no kernel could be had, SessionClosed when the session
        was deleted meanwhile: either way it stays as it was (hibernated, its snapshot kept),
        with no kernel or carried disk left behind."""
        began = time.monotonic()
        session = h.session
        slot = session.slot
        state = h.saved or HibernatedState(since=time.time())
        h.under_way = True
        try:
            failure = await self._load(h, state)
        except BaseException:
            await asyncio.shield(self._undo_wake(h))
            raise
        finally:
            h.under_way = False
        lost: list[LostName] = list(state.lost)
        if failure is not None:
            lost = [
                {
                    "name": "*",
                    "reason": f"the snapshot could not be loaded: {failure} (it is kept, "
                    "set aside, until the session is deleted)",
                }
            ]
        slot.hibernated = False
        h.saved = None
        session.persist()
        await self.flush()  # the resume on disk before the snapshot goes
        with contextlib.suppress(OSError, ValueError):
            if failure is None:
                await asyncio.to_thread(self.snapshots.delete, session.id)
            else:
                await asyncio.to_thread(self.snapshots.set_aside, session.id)
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

    async def _load(self, h: Hibernation, state: HibernatedState) -> str | None:
        """A kernel on the session's disk, prepared, with the snapshot loaded; None, or why
        the snapshot could not be loaded (the kernel is in the slot either way)."""
        session = h.session
        kernel, devices = await self._kernel_for(h)
        await self._install(session, kernel)
        if state.error is not None:
            return state.error
        try:
            await self.snapshots.load(kernel, session.id, devices)
            return None
        except SnapshotError as exc:
            if devices is None:
                return str(exc)
            # Carried: try once more, on a kernel started on the session's disk.
            logger.warning(
                "session %s: a warm kernel could not resume it (%s); starting one on its disk",
                session.id,
                exc,
            )
            if NOT_ITS_STORAGE in str(exc):
                self._carry = False  # warm kernels do not see the disks they are given here
                logger.warning("warm kernels cannot take up hibernated sessions' disks here")
        await self._undo_wake(h)
        self._refuse_if_closed(session)
        kernel = await self.pool_of(session).launch(session.slot.storage)
        await self._install(session, kernel)
        try:
            await self.snapshots.load(kernel, session.id)
        except SnapshotError as exc:
            return str(exc)
        return None

    @staticmethod
    def _refuse_if_closed(session: Sleeper) -> None:
        if session.closed:
            raise SessionClosed(f"session {session.id} was deleted")

    @classmethod
    async def _install(cls, session: Sleeper, kernel: Kernel) -> None:
        if session.closed:
            await kernel.close()
        cls._refuse_if_closed(session)
        await session.slot.install(kernel)

    async def _undo_wake(self, h: Hibernation) -> None:
        """Back to hibernated with nothing running: the kernel that was being resumed
        onto, and the disk it carried the session on, gone."""
        kernel = h.session.slot.park()
        if kernel is not None:
            with contextlib.suppress(Exception):
                await kernel.close()
        await self._drop_carrier(h)

    async def _kernel_for(self, h: Hibernation) -> tuple[Kernel, dict[str, int] | None]:
        """A running kernel on the session's disk: a warm one carrying it (with the devices
        it must see), else a new one started on it (None)."""
        session = h.session
        storage = session.slot.storage
        pool = self.pool_of(session)
        self._refuse_if_closed(session)
        if self._carry and not storage.mounts:  # a warm kernel mounts no volumes
            warm = await pool.acquire()
            try:
                devices = await pool.backend.carry(warm.storage, storage)
            except BaseException as exc:
                logger.warning("a warm kernel could not take up a session's disk: %s", exc)
                await asyncio.shield(self._discard_warm(warm))
                if not isinstance(exc, KernelUnavailable):
                    raise
            else:
                h.carrier = warm.storage
                return warm.kernel, devices
        self._refuse_if_closed(session)
        return await pool.launch(storage), None

    async def _discard_warm(self, warm: WarmKernel) -> None:
        await warm.pool.backend.uncarry(warm.storage)
        await warm.pool.discard(warm)

    # -- the end of a session ----------------------------------------------------------------

    async def _drop_carrier(self, h: Hibernation) -> None:
        carrier, h.carrier = h.carrier, None
        if carrier is not None:
            await self.release_carrier(carrier)

    async def release_carrier(self, carrier: SessionStorage) -> None:
        await self.pool.backend.uncarry(carrier)
        await self.pool.remove_storage(carrier)

    def kernel_replaced(self, h: Hibernation) -> None:
        """The session's kernel was replaced (a restart, a death): the new one runs on the
        session's own disk, so a disk that carried it is no longer needed."""
        if h.carrier is not None:
            self._tasks.spawn(self._drop_carrier(h))

    async def discard(self, h: Hibernation) -> None:
        """A hibernated session restarted (hold its kernel lock): its snapshot is dropped and
        it is no longer hibernated; its next kernel starts fresh on its disk."""
        with contextlib.suppress(OSError, ValueError):
            await asyncio.to_thread(self.snapshots.delete, h.session.id)
        h.saved = None
        h.session.slot.hibernated = False

    async def forget(self, h: Hibernation) -> None:
        """The session is gone (its kernel closed): its snapshot and carrier too."""
        await self._drop_carrier(h)
        with contextlib.suppress(OSError, ValueError):
            await asyncio.to_thread(self.snapshots.delete, h.session.id)


async def _nothing_to_flush() -> None:
    pass
