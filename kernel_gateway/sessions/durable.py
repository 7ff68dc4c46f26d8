"""Durable sessions (`--persist-sessions`): sessions outlive the gateway process.

One object, `DurableSessions`, owns the concern at the gateway's level, with an
explicit lifecycle: `open_runtime` (take a predecessor's runtime folder over),
`start` (open the session store, adopt the predecessor's sessions, give the
registry the store), `stop_requested` (the stop signal: the drain starts there)
and `stop` (drain, then suspend leaving kernels running, or close everything).
The pieces it drives live with what they act on: a session writes its record and
restores itself from one (`session.py`; its running kernel is taken over by
`adoption.py`), a kernel slot lets go of its kernel without stopping it
(`kernel_slot.py`), the store writes records atomically (`persistence.py`), the backend
adopts and detaches containers (`kernels/backends/docker_adoption.py`), the runtime
folder is taken over (`kernels/runtime_dir.py`), the warm pool lists storage no session claims
(`kernels/pools/warm.py`). The registry only records sessions to the store it is given,
and offers the few named steps used here.

What is guaranteed:

- At a **SIGTERM** (or Ctrl-C), when sessions persist: from the signal on, new
  cells and sessions are refused (503 `shutting_down`) and running cells are left
  to finish and stream their `done` for up to `drain_timeout`; at its end the
  remaining streams end without `done` (their clients resume from the next
  gateway) and stateless cells are stopped. Then every session writes its last
  record (naming the cell still running, if any) and lets go of its kernel, which
  keeps running; warm-pool and stateless kernels are removed. Without
  persistence, a stop closes every session and removes every kernel.
- At a **SIGKILL** (a crash, an OOM kill): nothing runs, and nothing needs to: a
  session is on disk before `POST /sessions` answers and off it before `DELETE`
  answers, each record is written to a temporary file and renamed (a kill leaves
  the old record or the new one), and the kernels and their disks keep running
  where the next gateway looks.
- The **next gateway** on the same runtime folder adopts them before it serves:
  each kernel must be running, have its files, and answer on its control channel
  within `ADOPT_PROBE_SECONDS` (all are checked at once); any other session is
  lost and answers 410 `session_lost`. Storage no adopted session uses is removed.

What is lost: what a running cell printed while no gateway was up, the events of
cells that ended before the restart (410 `execution_expired`), and, after a
SIGKILL, activity newer than the last record (idle clocks are written at most
every few seconds). Variables and files are never lost with the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kernel_gateway import logs
from kernel_gateway.kernels.backends.base import Backend, KernelProcess, SessionStorage
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.sessions.persistence import SessionRecord, SessionStore
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.settings import Settings
from kernel_gateway.tasks import TaskSet

logger = logging.getLogger(__name__)

ADOPT_PROBE_SECONDS = 2.0  # an adopted kernel must answer on its control channel within this


class DurableSessions:
    """Whether sessions outlive this gateway, and their handover at its start and stop.

    Made with the app (the server's signal handler needs `stop_requested` before
    the lifespan runs); `start` and `stop` bracket the lifespan.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.persist = False
        """Whether sessions outlive this gateway (the flag, and a backend that can)."""
        self.store: SessionStore | None = None
        """Where sessions are recorded: open when persisting or when a predecessor's
        folder was adopted (its records are read, and kept up to date until the end)."""
        self.stop_requested_at: float | None = None
        """When the first stop signal came (monotonic seconds); the drain counts from it."""
        self._registry: Registry | None = None
        self._running = False
        self._end_streams_timer: asyncio.TimerHandle | None = None
        self._tasks = TaskSet()

    # -- start -------------------------------------------------------------------------------

    async def open_runtime(self) -> RuntimeDir:
        """The runtime folder, opened; a predecessor's is taken over.

        Its persisted sessions live in docker containers: only a backend that may be
        docker takes its folder over. With persistence, wait for a predecessor still
        stopping (up to `adopt_wait`).
        """
        settings = self.settings
        runtime = RuntimeDir(settings.runtime_dir)
        await asyncio.to_thread(
            runtime.open,
            adopt=settings.backend != "local",
            wait_for_predecessor=settings.adopt_wait if settings.persist_sessions else 0.0,
        )
        return runtime

    async def start(self, backend: Backend, runtime: RuntimeDir, registry: Registry) -> None:
        """Decide whether sessions persist, open the store, adopt a predecessor's sessions.

        Call before `registry.start()` (adoption lists the storage it does not claim
        before the warm pool makes new ones).
        """
        self._registry = registry
        persist = self.settings.persist_sessions and backend.persists
        if self.settings.persist_sessions and not persist:
            logger.warning(
                "--persist-sessions: the %s backend cannot keep kernels running without "
                "the gateway; sessions end when it stops",
                backend.name,
            )
        if persist or runtime.adopted:
            store = SessionStore(runtime.sessions_path)
            await asyncio.to_thread(store.open)
            self.store = registry.store = store
        self.persist = persist
        if runtime.adopted:
            await self._adopt(backend, registry)
        self._running = True

    async def _adopt(self, backend: Backend, registry: Registry) -> None:
        """Take over the sessions a stopped gateway of this instance persisted.

        Each kernel must be running and answer on its control channel within
        `ADOPT_PROBE_SECONDS` (all are checked at once); a session whose kernel or
        files are gone is lost. Storage no adopted session uses (warm and stateless
        kernels', lost sessions') is released.
        """
        assert self.store is not None
        records = await asyncio.to_thread(self.store.load)
        processes = await backend.adopt([r.kernel_id for r in records])
        adopted = await asyncio.gather(
            *(self._adopt_one(registry, r, processes.get(r.kernel_id)) for r in records)
        )
        warm = registry.warm
        keep = {s.slot.storage.root.name for s in registry.sessions()}
        keep |= {s.carrier.root.name for s in registry.sessions() if s.carrier is not None}
        # Snapshots of sessions not adopted: deleted with them.
        snapshots = registry.hibernator.snapshots
        for orphan in await asyncio.to_thread(snapshots.ids) - {s.id for s in registry.sessions()}:
            await asyncio.to_thread(snapshots.delete, orphan)
        # Listed now (before the warm pool makes new ones), released while serving.
        self._tasks.spawn(warm.remove_storages(await warm.unclaimed_storage(keep)))
        if records:
            lost = adopted.count(False)
            logger.info(
                "adopted %d of %d persisted sessions%s",
                len(registry.sessions()),
                len(records),
                f"; {lost} lost" if lost else "",
            )

    async def _adopt_one(
        self, registry: Registry, record: SessionRecord, process: KernelProcess | None
    ) -> bool:
        assert self.store is not None
        logs.bind(session_id=record.id, key=registry.quotas.principal(record.owner).name)
        warm = registry.pools.get(record.language)
        storage = SessionStorage(registry.warm.workspaces / record.storage, record.volume_mounts)
        kernel: Kernel | None = None
        reason = None
        if warm is None:
            reason = f"this gateway does not serve its language, {record.language}"
        elif record.hibernated is not None:  # no kernel: its disk and snapshot are enough
            if not await asyncio.to_thread(storage.files.is_dir):
                reason = "its files are gone"
            else:
                if process is not None:  # a kernel it had before it hibernated: not its own
                    await process.cleanup()
                await registry.add_hibernated(record, storage)
                return True
        elif process is None:
            reason = "its kernel is no longer running"
        elif not await asyncio.to_thread(storage.files.is_dir):
            reason = "its files are gone"
        else:
            assert process is not None
            kernel = warm.connect(process)
            if not await kernel.probe(ADOPT_PROBE_SECONDS):
                reason = f"its kernel did not answer within {ADOPT_PROBE_SECONDS:g} s"
        if reason is not None:
            logger.warning("session %s is lost: %s", record.id, reason)
            registry.mark_lost(record.id, reason, record.owner)
            self.store.delete(record.id)
            if kernel is not None:
                await kernel.close()
            elif process is not None:
                await process.cleanup()
            return False
        assert kernel is not None and warm is not None
        await registry.add_adopted(warm.lease(kernel, storage), record)
        return True

    # -- stop --------------------------------------------------------------------------------

    def stop_requested(self) -> None:
        """The first stop signal (called on the event loop): with persistence, the drain
        begins now, and at its end (`drain_timeout` later) the streams are let go."""
        if self.stop_requested_at is not None:
            return
        self.stop_requested_at = time.monotonic()
        registry = self._registry
        if self._running and self.persist and registry is not None:
            registry.stop_taking_work()
            self._end_streams_timer = asyncio.get_running_loop().call_later(
                self.settings.drain_timeout, _end_streams, registry
            )

    async def stop(self) -> int:
        """Stop the sessions; returns how many kernels are left running for a successor.

        With persistence: drain until `drain_timeout` after the first stop request (or
        from now), then suspend every session. Otherwise close every session. When the
        result is 0, the caller closes the backend and removes the runtime folder;
        otherwise it detaches the backend and keeps the folder.
        """
        registry, self._registry = self._registry, None
        self._running = False
        if self._end_streams_timer is not None:
            self._end_streams_timer.cancel()
        if registry is None:
            return 0
        try:
            if self.persist and self.store is not None:
                begun = self.stop_requested_at or time.monotonic()
                await self._drain(registry, begun + self.settings.drain_timeout)
                await self._tasks.join()
                return await self._suspend(registry)
            await registry.close()
            await self._tasks.join()
            return 0
        finally:
            if self.store is not None:
                await self.store.close()

    def log_stopped(self, left: int) -> None:
        """The last line a gateway logs, once the backend and the runtime folder are done."""
        if self.persist:
            logger.info(
                "stopped; %d sessions' kernels keep running for the next gateway to adopt "
                "(runtime dir %s)",
                left,
                self.settings.runtime_dir,
            )
        else:
            logger.info("stopped; every kernel this gateway started has been removed")

    async def _drain(self, registry: Registry, deadline: float) -> None:
        """Take no new work; wait until no cell runs or waits, or until `deadline`
        (monotonic seconds); then let the streams go."""
        registry.stop_taking_work()
        while time.monotonic() < deadline:
            if not registry.busy():
                break
            await asyncio.sleep(0.05)
        _end_streams(registry)

    async def _suspend(self, registry: Registry) -> int:
        """Stop, leaving every session's kernel running for a successor to adopt.

        Stateless executions and warm kernels are removed as at `Registry.close`.
        Returns the number of sessions left.
        """
        registry.stop_taking_work()
        await registry.stop_reaping()
        sessions = registry.sessions()
        registry.stop_stateless()
        # Still registered while they suspend: each writes its last record.
        await asyncio.gather(*(s.suspend() for s in sessions), return_exceptions=True)
        registry.forget(sessions)  # what the suspended sessions hold is the successor's
        await registry.close()  # the stateless sessions' closes, then the pools
        return len(sessions)


def _end_streams(registry: Registry) -> None:
    """At the drain's end: live reads of session cells end (their clients resume from the
    next gateway); stateless cells still running are stopped."""
    for session in registry.sessions():
        for execution in session.executions():
            if not execution.finished:
                execution.release_readers()
    registry.stop_stateless()
