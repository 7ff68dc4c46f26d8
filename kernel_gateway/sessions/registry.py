"""The sessions a gateway holds: made from warm kernels, found by id, reaped when idle.

Stateless executions get a session of their own that is destroyed as soon as
its one execution ends, whatever happens to the HTTP response: the release is
tied to the execution's task, which always ends (at the latest at its timeout).

Every session's kernel comes from a pool as a `Lease` (the warm pool's, or the
fork pool's for stateless executions in fork mode): the registry asks the lease
whether the kernel may be relaunched and who owns the session's files, and
releases it when the session closes; it never asks where the kernel came from.

With a `SessionStore` (`--persist-sessions`) sessions outlive the gateway: each
is recorded as it changes, `suspend` stops the gateway leaving their kernels
running, and the next gateway's `adopt` takes them over, checking each kernel.
One that cannot be adopted is reported lost (410 `session_lost`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from kernel_gateway.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidRequest,
    KernelUnavailable,
    NotFound,
    SessionLost,
    SessionNotFound,
    ShuttingDown,
    TooManySessions,
)
from kernel_gateway.kernels.backends.base import Backend, KernelProcess, SessionStorage
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.pools.fork import ForkPool
from kernel_gateway.kernels.pools.lease import Lease
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.kernels.workspace import Workspace
from kernel_gateway.sessions.execution import Execution
from kernel_gateway.sessions.files import SessionFiles
from kernel_gateway.sessions.kernel_slot import KernelSlot
from kernel_gateway.sessions.persistence import SessionRecord, SessionStore
from kernel_gateway.sessions.restart_policy import RestartPolicy
from kernel_gateway.sessions.session import Session
from kernel_gateway.settings import Settings
from kernel_gateway.tasks import TaskSet
from kernel_gateway.types import JSON

logger = logging.getLogger(__name__)

ADOPT_PROBE_SECONDS = 2.0  # an adopted kernel must answer on its control channel within this


class Registry:
    def __init__(
        self,
        settings: Settings,
        warm: WarmPool,
        instance: str,
        store: SessionStore | None = None,
        forks: ForkPool | None = None,
    ) -> None:
        self.settings = settings
        self.warm = warm
        self.forks = forks
        """Where stateless kernels come from when they are forked (else from `warm`)."""
        self.instance = instance
        """This gateway's id; its kernel containers carry it as a label."""
        self.store = store
        """Where sessions are recorded for a successor; None when they die with the gateway."""
        self.draining = False
        self._sessions: dict[str, Session] = {}
        self._lost: dict[str, str] = {}
        """Sessions a predecessor persisted that could not be adopted, and why."""
        self._ephemeral: set[Session] = set()
        self._leases: dict[Session, Lease] = {}
        """Where each session's kernel came from: released when the session closes."""
        self._reserved = 0
        self._reserved_stateless = 0
        self._reaper: asyncio.Task[None] | None = None
        self._tasks = TaskSet()

    @property
    def backend(self) -> Backend:
        return self.warm.backend

    def start(self) -> None:
        self.warm.start()
        if self.forks is not None:
            self.forks.start()
        self._reaper = asyncio.ensure_future(self._reap_idle())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        # Taken out first, so a stateless cell that ends meanwhile starts no release of its own.
        sessions = [*self._sessions.values(), *self._ephemeral]
        self._sessions, self._ephemeral = {}, set()
        await asyncio.gather(*(self._close(s) for s in sessions), return_exceptions=True)
        await self._tasks.join()  # releases under way
        if self.forks is not None:
            await self.forks.close()
        await self.warm.close()
        if self.store is not None:
            await self.store.close()

    # -- stopping with sessions left running, and taking them over ---------------------------

    def begin_drain(self) -> None:
        """Take no new work; cells that run are left to run (and never abandoned)."""
        self.draining = True
        for session in self._sessions.values():
            session.draining = True

    def end_streams(self) -> None:
        """At the drain's end: live reads of session cells end (their clients resume from
        the next gateway); stateless cells still running are stopped."""
        for session in self._sessions.values():
            for execution in session.executions():
                if not execution.finished:
                    execution.release_readers()
        for session in list(self._ephemeral):
            self._ephemeral.discard(session)
            self._tasks.spawn(self._close(session))

    async def drain(self, deadline: float) -> None:
        """Wait until no cell runs or waits, or until `deadline` (monotonic seconds)."""
        self.begin_drain()
        while time.monotonic() < deadline:
            if not any(s.busy for s in (*self._sessions.values(), *self._ephemeral)):
                break
            await asyncio.sleep(0.05)
        self.end_streams()

    async def suspend(self) -> int:
        """Stop, leaving every session's kernel running for a successor to adopt.

        Stateless executions and warm kernels are removed as at `close`. Returns the
        number of sessions left.
        """
        assert self.store is not None
        self.begin_drain()
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        sessions = list(self._sessions.values())
        ephemeral, self._ephemeral = list(self._ephemeral), set()
        # Still registered while they suspend: each writes its last record.
        await asyncio.gather(
            *(s.suspend() for s in sessions),
            *(self._close(s) for s in ephemeral),
            return_exceptions=True,
        )
        self._sessions = {}
        self._leases.clear()  # what the suspended sessions hold is the successor's
        await self._tasks.join()
        if self.forks is not None:
            await self.forks.close()
        await self.warm.close()
        await self.store.close()
        return len(sessions)

    async def adopt(self) -> None:
        """Take over the sessions a stopped gateway of this instance persisted.

        Each kernel must be running and answer on its control channel within
        `ADOPT_PROBE_SECONDS` (all are checked at once); a session whose kernel or
        files are gone is lost. Storage no adopted session uses (warm and stateless
        kernels', lost sessions') is released. Call before `start`.
        """
        assert self.store is not None
        records = await asyncio.to_thread(self.store.load)
        processes = await self.backend.adopt([r.kernel_id for r in records])
        await asyncio.gather(*(self._adopt(r, processes.get(r.kernel_id)) for r in records))
        keep = {s.slot.storage.root.name for s in self._sessions.values()}
        # Listed now (before the warm pool makes new ones), released while serving.
        self._tasks.spawn(self.warm.remove_storages(await self.warm.unclaimed_storage(keep)))
        if records:
            logger.info(
                "adopted %d of %d persisted sessions%s",
                len(self._sessions),
                len(records),
                f"; {len(self._lost)} lost" if self._lost else "",
            )

    async def _adopt(self, record: SessionRecord, process: KernelProcess | None) -> None:
        assert self.store is not None
        storage = SessionStorage(self.warm.workspaces / record.storage)
        kernel: Kernel | None = None
        reason = None
        if process is None:
            reason = "its kernel is no longer running"
        elif not await asyncio.to_thread(storage.files.is_dir):
            reason = "its files are gone"
        else:
            kernel = self.warm.connect(process)
            if not await kernel.probe(ADOPT_PROBE_SECONDS):
                reason = f"its kernel did not answer within {ADOPT_PROBE_SECONDS:g} s"
        if reason is not None:
            logger.warning("session %s is lost: %s", record.id, reason)
            self._lost[record.id] = reason
            self.store.delete(record.id)
            if kernel is not None:
                await kernel.close()
            elif process is not None:
                await process.cleanup()
            return
        assert kernel is not None
        session = self._session_on(self.warm.lease(kernel, storage), ephemeral=False, id=record.id)
        session.restore(record)
        self._sessions[session.id] = session

    def stats(self) -> JSON:
        return {
            **self.warm.stats(),
            "sessions": len(self._sessions),
            "max_sessions": self.settings.max_sessions,
            "stateless": len(self._ephemeral),
            "max_stateless": self.settings.max_stateless,
        }

    def stateless_stats(self) -> JSON:
        """How stateless requests get kernels, for /health."""
        if self.forks is None:
            return {"stateless_mode": "container"}
        return {"stateless_mode": "fork", "fork_servers": self.forks.stats()}

    # -- sessions ----------------------------------------------------------------------------

    async def create_session(self) -> Session:
        self._refuse_if_draining()
        if len(self._sessions) + self._reserved >= self.settings.max_sessions:
            raise TooManySessions(
                f"the gateway holds its maximum of {self.settings.max_sessions} sessions; "
                "delete one or retry later",
                retry_after=5,
            )
        self._reserved += 1
        try:
            lease = await self.warm.acquire()
        finally:
            self._reserved -= 1
        session = self._session_on(lease, ephemeral=False)
        self._sessions[session.id] = session
        if self.store is not None:
            session.persist()
            await self.store.flush()  # on disk before the client hears of it
        return session

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise self._missing(session_id)
        return session

    def _missing(self, session_id: str) -> SessionNotFound | SessionLost:
        reason = self._lost.get(session_id)
        if reason is not None:
            return SessionLost(
                f"session {session_id} did not survive the gateway's restart ({reason}); "
                "its variables and files are gone: create a new session"
            )
        return SessionNotFound(f"no session with id {session_id!r}")

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise ShuttingDown("the gateway is restarting; retry shortly", retry_after=2)

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    async def delete_session(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise self._missing(session_id)
        if self.store is not None:  # first: a crash from here on must not bring it back
            self.store.delete(session_id)
            await self.store.flush()
        await self._close(session)

    # -- stateless ---------------------------------------------------------------------------

    async def run_stateless(
        self, code: str, cell_timeout: float | None, files: list[tuple[str, bytes]]
    ) -> tuple[Session, Execution]:
        """Run one cell in a fresh kernel that is destroyed once the cell ends."""
        self._refuse_if_draining()
        if len(self._ephemeral) + self._reserved_stateless >= self.settings.max_stateless:
            raise TooManySessions(
                f"{self.settings.max_stateless} stateless executions are already running; "
                "retry shortly",
                retry_after=1,
            )
        self._reserved_stateless += 1
        try:
            lease: Lease = await (self.forks or self.warm).acquire()
        finally:
            self._reserved_stateless -= 1
        session = self._session_on(lease, ephemeral=True)
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
            self._tasks.spawn(self._close(session))

    # -- internals ---------------------------------------------------------------------------

    def _new_id(self) -> str:
        """A fresh session id; in a cluster `<node>.<hex>`, so a router finds its node."""
        node = self.settings.node_name
        return f"{node}.{uuid.uuid4().hex}" if node else uuid.uuid4().hex

    def _session_on(self, lease: Lease, *, ephemeral: bool, id: str | None = None) -> Session:
        session_id = id or self._new_id()
        s = self.settings
        slot = KernelSlot(
            session_id,
            lease.kernel,
            lease.storage,
            self.warm.launch if lease.relaunchable else _never_relaunched,
            RestartPolicy(s.restart_budget, s.restart_window),
            revive=not ephemeral,
            metrics=self.warm.metrics,
        )
        workspace = Workspace(lease.storage.files, lease.files_owner)
        files = SessionFiles(session_id, workspace, s, inline_all=ephemeral)
        persist = self._save if self.store is not None and not ephemeral else None
        session = Session(
            session_id,
            slot,
            files,
            s,
            ephemeral=ephemeral,
            persist=persist,
            metrics=self.warm.metrics,
        )
        slot.on_replace = session.persist
        self._leases[session] = lease
        return session

    def _save(self, session: Session) -> None:
        if self.store is not None and self._sessions.get(session.id) is session:
            self.store.save(session.record())

    async def _close(self, session: Session) -> None:
        lease = self._leases.pop(session, None)
        try:
            await session.close()
        finally:
            if lease is not None:
                await lease.release()

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


async def _never_relaunched(storage: SessionStorage) -> Kernel:
    """A forked stateless kernel that died is not replaced: its fork server is emptied and
    given back, so the cell ends `died` with the reason."""
    raise KernelUnavailable("the stateless kernel ended before its cell could run")
