"""A session: cells run one at a time, in order, on one kernel whose state persists.

`Session` is the front the API calls, thin over the objects that do the work:

- `CellRunner` (`cells.py`): the queue of cells, each run in its turn: timeout → interrupt
  → retire, interrupts, deaths, and the one `end_cell`;
- `ExecutionLog` (`execution_log.py`): executions numbered, their events kept within the
  retention limits, clients following them (attach, detach, the reconnect grace);
- `Adoption` (`adoption.py`): a kernel a predecessor gateway left running, taken over;
- `KernelSlot` (`kernel_slot.py`): the kernel's life, with its `RestartPolicy`;
- `SessionFiles` (`files.py`): the files cells produce, uploads;
- `Hibernation` (`hibernation.py`): its snapshot and the disk it was carried on, when it
  can hibernate; the hibernator reads the session through a narrow Protocol.

The session itself holds what the API reports of it (its id, language, clocks, network),
writes its record for a successor gateway, and restores itself from one. Nothing else
assigns its fields: collaborators call its methods (`drain`, `hold`, `use_network`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from kernel_gateway.errors import (
    Conflict,
    SessionBusy,
    SessionClosed,
    SessionFailed,
    ShuttingDown,
)
from kernel_gateway.kernels.backends.base import SessionStorage
from kernel_gateway.kernels.languages import PYTHON
from kernel_gateway.kernels.volumes import VolumeMount
from kernel_gateway.metrics import Metrics
from kernel_gateway.sessions.adoption import Adoption
from kernel_gateway.sessions.cells import CellRunner
from kernel_gateway.sessions.conversation import Conversation
from kernel_gateway.sessions.execution import Execution, StopReason
from kernel_gateway.sessions.execution_log import ExecutionLog
from kernel_gateway.sessions.files import SessionFiles
from kernel_gateway.sessions.hibernation import Hibernation, Hibernator
from kernel_gateway.sessions.kernel_slot import KernelSlot
from kernel_gateway.sessions.network import SessionNetwork
from kernel_gateway.sessions.persistence import SessionRecord
from kernel_gateway.settings import Settings
from kernel_gateway.shapes import responses
from kernel_gateway.shapes.events import ResumedData
from kernel_gateway.templates.model import TemplateRef
from kernel_gateway.types import SessionStatus

PERSIST_ACTIVITY_EVERY = 5.0  # seconds: how stale a persisted idle clock may get
SUSPEND_WAIT = 60.0  # seconds a stopping gateway waits for a hibernation under way


class Session:
    def __init__(
        self,
        session_id: str,
        slot: KernelSlot,
        files: SessionFiles,
        settings: Settings,
        *,
        ephemeral: bool = False,
        persist: Callable[[Session], None] | None = None,
        metrics: Metrics,
        language: str = PYTHON,
        hibernator: Hibernator | None = None,
        template: TemplateRef | None = None,
        owner: str | None = None,
    ) -> None:
        self.id = session_id
        self.owner = owner
        """The id of the API key that made it (None: the admin); only it and the admin
        see it."""
        self.language = language
        """The language its kernel runs (a name from `GET /languages`), fixed for its life."""
        self.template = template
        """The template build its kernels start from (None: the language's own image)."""
        self.metrics = metrics
        self.ephemeral = ephemeral
        """One execution, then gone: never revived, files sent whole in events."""
        self.slot = slot
        self.files = files
        self._settings = settings
        self.created_at = datetime.now(UTC)
        self.last_activity = time.monotonic()
        self.closed = False
        self._draining = False
        self._persist = persist
        self._persisted_activity = 0.0
        self._network: SessionNetwork | None = None
        self._holders = 0
        self.hibernation: Hibernation | None = (
            hibernator.attach(self) if hibernator is not None else None
        )
        """How it hibernates and resumes, and its state there (None: it cannot, e.g. not a
        Python kernel)."""
        self.log = ExecutionLog(self, settings, ephemeral=ephemeral)
        """Its executions: numbered, their events kept, followed by clients."""
        self.cells = CellRunner(
            self,
            slot,
            files,
            self.log,
            settings,
            metrics,
            ephemeral=ephemeral,
            language=language,
            hibernation=self.hibernation,
        )
        """Its cells, run one at a time in order."""
        self.conversation = Conversation(session_id)
        """Its chat with a model (`kernel_gateway.chat` asks the model)."""

    # -- what the API asks -------------------------------------------------------------------

    def submit(
        self, code: str, timeout: float | None, around: tuple[str, str] | None = None
    ) -> Execution:
        """Queue a cell; its events can be read from the returned Execution at once.

        `around`: code the kernel runs silently just before the cell and just after it
        (unless the kernel died), in the cell's turn: for example environment variables
        set for one cell and restored (E2B's `env_vars`).
        """
        if self.closed:
            raise SessionClosed(f"session {self.id} was deleted")
        if self._draining:
            raise ShuttingDown(
                "the gateway is restarting; retry shortly (the session will still be there)",
                retry_after=2,
            )
        if self.slot.policy.failed:
            raise SessionFailed(self.slot.policy.failed)
        if self.cells.queued >= self._settings.max_queued_executions:
            raise SessionBusy(
                f"session {self.id} already has {self.cells.queued} executions waiting; "
                "wait for them or interrupt"
            )
        execution = self.log.new(code, timeout, around)
        self.cells.enqueue(execution)
        self.touch()
        return execution

    async def interrupt(self) -> bool:
        """Interrupt the running cell, and stop the chat's turn; False when nothing was
        running."""
        self.touch()
        stopped = self.conversation.stop()
        return await self.cells.interrupt() or stopped

    def execution(self, execution_id: str) -> Execution:
        """A kept execution by id; 410 if it aged out of retention, 404 if it never was."""
        return self.log.find(execution_id)

    def executions(self) -> list[Execution]:
        return self.log.all()

    def attach(self, execution: Execution) -> None:
        """A client starts reading the execution's events."""
        self.log.attach(execution)
        self.touch()

    def detach(self, execution: Execution) -> None:
        """A client stopped reading; with none left, the cell is abandoned after the grace."""
        self.log.detach(execution)

    def abandon(self, execution: Execution) -> None:
        """The client stopped listening: stop the cell rather than run it for nobody."""
        self.cells.abandon(execution)

    async def restart(self) -> None:
        """Replace the kernel now, even if a cell is stuck in it; state is lost.

        Cells queued behind are dropped (they end `interrupted`). Raises
        KernelUnavailable when no new kernel could be started.
        """
        self.touch()
        self.cells.stop_all(StopReason.RESTART)
        old = self.slot.kernel
        if old is not None:
            await self.slot.retire(old)
        async with self.slot.lock:
            self.slot.policy.reset()
            if self.slot.hibernated and self.hibernation is not None:
                await self.hibernation.discard()  # a fresh kernel: the snapshot is moot
            if self.slot.kernel is old or not self.slot.alive:
                await self.slot.replace()
            self.slot.take_restart_notice()  # asked for: the next cell is not surprised
        self.persist()

    async def close(self) -> None:
        """End the session: its cells stopped, its kernel closed, its snapshot and the disk
        it was carried on gone."""
        try:
            self.closed = True
            self.conversation.close()
            self.cells.stop_all(StopReason.CLOSED)
            self.log.stop_waiting()
            await self.slot.close()
            if self._network is not None:
                await self._network.close()
            await self.cells.close()
        finally:
            if self.hibernation is not None:
                await self.hibernation.forget()

    async def suspend(self) -> None:
        """Let go of the kernel without stopping it: the gateway stops, the session persists.

        The record written here names the running cell (if any), so the next gateway
        holds later cells back until it ends, and enforces its timeout.
        """
        self._draining = True
        if self.hibernation is not None:  # a hibernation or resume ends consistent
            await self.hibernation.settle(SUSPEND_WAIT)
        self.persist()
        self.closed = True
        self.log.stop_waiting()
        await self.cells.suspend()
        await self.slot.detach()
        if self._network is not None:
            await self._network.suspend()

    def drain(self) -> None:
        """The gateway is stopping: no new cells; running ones are left to run (and never
        abandoned, for a successor to adopt)."""
        self._draining = True

    def hold(self) -> None:
        """A client holds a live connection to its kernel (a Jupyter WebSocket) from now on:
        it is not hibernated under it. Paired with `let_go`."""
        self._holders += 1

    def let_go(self) -> None:
        """A client that held the kernel (`hold`) let go of it."""
        self._holders -= 1

    def use_network(self, network: SessionNetwork) -> None:
        """Its network policy and way out, for its kernel now and every later one (the
        caller attaches the kernel there is)."""
        self._network = network
        self.slot.prepare.append(network.attach)

    # -- hibernation (sessions/hibernation.py does the work) ----------------------------------

    async def hibernate(self) -> bool:
        """Save the namespace to disk and stop the kernel; False if it was already hibernated.
        Raises SessionBusy while a cell runs or waits, HibernationFailed if it could not be
        saved (the session runs on)."""
        if self.hibernation is None:
            raise Conflict(f"{self.language} sessions cannot be hibernated")
        if self.conversation.running:
            raise SessionBusy(f"session {self.id} is answering a chat message; try after it")
        return await self.hibernation.hibernate()

    async def resume(self) -> ResumedData | None:
        """Bring a hibernated session back now; what its resume reported (None: it was not
        hibernated). Its next cell's stream reports it too."""
        self.touch()
        async with self.slot.lock:
            if self.closed:
                raise SessionClosed(f"session {self.id} was deleted")
            if self.hibernation is None:
                return None
            return await self.hibernation.wake()

    # -- what it is --------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        """The gateway is stopping: no new cells; running ones are left to run."""
        return self._draining

    @property
    def holders(self) -> int:
        """Clients holding a live connection to its kernel (Jupyter WebSockets): it is not
        hibernated under them."""
        return self._holders

    @property
    def network(self) -> SessionNetwork | None:
        """Its network policy and way out, when it may reach some domains (`network.py`)."""
        return self._network

    @property
    def mounts(self) -> tuple[VolumeMount, ...]:
        """The volumes its kernels mount."""
        return self.slot.storage.mounts

    @property
    def carrier(self) -> SessionStorage | None:
        """The storage of the warm kernel that resumed it, carrying its disk."""
        return self.hibernation.carrier if self.hibernation is not None else None

    @property
    def current(self) -> Execution | None:
        """The cell that holds the kernel, if any."""
        return self.cells.current

    @property
    def execution_count(self) -> int:
        return self.cells.execution_count

    @property
    def hibernated(self) -> bool:
        return self.slot.hibernated

    @property
    def busy(self) -> bool:
        """A cell runs or waits."""
        return self.cells.busy

    @property
    def queued(self) -> int:
        """Cells waiting for the kernel."""
        return self.cells.queued

    def touch(self) -> None:
        self.last_activity = time.monotonic()
        if self.last_activity - self._persisted_activity >= PERSIST_ACTIVITY_EVERY:
            self.persist()

    def idle_seconds(self) -> float:
        if self.cells.busy or self.conversation.running:  # a turn waiting for its model too
            return 0.0
        return time.monotonic() - self.last_activity

    @property
    def status(self) -> SessionStatus:
        if self.closed:
            return "closed"
        if self.slot.hibernated:
            return "hibernated"
        if self.hibernation is not None and self.hibernation.saving:
            return "hibernating"
        if self.slot.policy.failed:
            return "failed"
        if self.cells.current is not None:
            return "busy"
        if not self.slot.alive:
            return "restarting"
        return "idle"

    def to_json(self) -> responses.Session:
        network = self._network
        return {
            "id": self.id,
            "language": self.language,
            "status": self.status,
            "created_at": self.created_at.isoformat().replace("+00:00", "Z"),
            "idle_seconds": round(self.idle_seconds(), 3),
            "execution_count": self.cells.execution_count,
            "queued": self.cells.queued,
            "restarts": self.slot.restarts,
            "failed": self.slot.policy.failed,
            "network": {"allow": network.allow}
            if network is not None and network.allow
            else "none",
            "secrets": list(network.secret_names) if network is not None else [],
            "hibernation": self.hibernation.to_json() if self.hibernation is not None else None,
            "template": self.template.to_json() if self.template is not None else None,
            "volumes": {m.target: m.name for m in self.mounts},
            "owner": self.owner,
        }

    # -- persistence -------------------------------------------------------------------------

    def persist(self) -> None:
        """Write this session's record, if sessions are persisted (and it still exists)."""
        if self._persist is not None and not self.closed and not self.ephemeral:
            self._persisted_activity = self.last_activity
            self._persist(self)

    def record(self) -> SessionRecord:
        hibernation, carrier = self.hibernation, self.carrier
        return SessionRecord(
            id=self.id,
            kernel_id=self.slot.kernel_id,
            storage=self.slot.storage.root.name,
            created_at=self.created_at.isoformat(),
            last_activity=time.time() - (time.monotonic() - self.last_activity),
            submitted=self.log.submitted,
            last_event_id=self.log.last_event_id,
            execution_count=self.cells.execution_count,
            restarts=self.slot.restarts,
            running=self.cells.running,
            language=self.language,
            network=self._network.allow if self._network is not None else [],
            hibernated=hibernation.record_state if hibernation is not None else None,
            carrier=carrier.root.name if carrier is not None else None,
            template=self.template.key if self.template is not None else None,
            mounts=[[m.volume_id, m.name, str(m.source), m.target] for m in self.mounts],
            owner=self.owner,
            secrets=list(self._network.secret_names) if self._network is not None else [],
            placeholder=self._network.placeholder
            if self._network is not None
            else "kg-secret:{name}",
            secret_rules=[[r.pattern, dict(r.headers)] for r in self._network.rules]
            if self._network is not None
            else [],
        )

    def restore(self, record: SessionRecord, carrier: SessionStorage | None = None) -> None:
        """Take up where the gateway that wrote `record` left off (its kernel is adopted,
        running on `carrier` when a warm kernel carried the session's disk)."""
        self.created_at = datetime.fromisoformat(record.created_at)
        idle_for = max(0.0, time.time() - record.last_activity)
        self.last_activity = time.monotonic() - idle_for
        self._persisted_activity = self.last_activity
        self.log.take_up(record)
        self.cells.take_up(record.execution_count)
        self.slot.restarts = record.restarts
        if self.hibernation is not None:
            self.hibernation.take_up(record.hibernated, carrier)
        if record.hibernated is not None:  # no kernel to settle: it resumes when called
            return
        adoption = Adoption(self.id, self.slot, self.files, self.cells, self.log, self._settings)
        adoption.start(record.running)
