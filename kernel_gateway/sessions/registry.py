"""The sessions a gateway holds: made from warm kernels, found by id, reaped when idle.

Stateless executions get a session of their own that is destroyed as soon as
its one execution ends, whatever happens to the HTTP response: the release is
tied to the execution's task, which always ends (at the latest at its timeout).

Every session's kernel comes from a pool as a `Lease` (the warm pool's, or the
fork pool's for stateless executions in fork mode): the registry asks the lease
whether the kernel may be relaunched and who owns the session's files, and
releases it when the session closes; it never asks where the kernel came from.

Given a `SessionStore`, each session is recorded as it changes, for a successor
gateway. Everything else about sessions that outlive the gateway (`--persist-sessions`:
the drain, the suspension, the adoption) is `DurableSessions`' (sessions/durable.py);
the registry offers it a few named steps, and answers 410 `session_lost` for the
sessions it could not adopt.

Every session belongs to the principal that made it (an API key, or the admin): lookups
take the principal asking, and another key's session is missing (404), never forbidden; a
key's quotas are checked before any kernel is taken (`key_quotas.py`).

Beside it: which domains a session may reach (`network_policy.py`), and the reaping of
idle sessions (`reaper.py`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from kernel_gateway.errors import (
    BadRequest,
    Conflict,
    KernelUnavailable,
    SessionLost,
    SessionNotFound,
    ShuttingDown,
    TooManySessions,
    UnknownLanguage,
)
from kernel_gateway.kernels.backends.base import Backend, SessionStorage
from kernel_gateway.kernels.hibernation import Snapshots
from kernel_gateway.kernels.kernel import Kernel
from kernel_gateway.kernels.languages import PYTHON, Languages
from kernel_gateway.kernels.pools.fork import ForkPool
from kernel_gateway.kernels.pools.lease import Lease
from kernel_gateway.kernels.pools.warm import KernelLess, WarmPool
from kernel_gateway.kernels.volumes import VolumeMount
from kernel_gateway.kernels.workspace import Workspace
from kernel_gateway.sessions import network_policy
from kernel_gateway.sessions.execution import Execution
from kernel_gateway.sessions.files import SessionFiles
from kernel_gateway.sessions.hibernation import Hibernator
from kernel_gateway.sessions.kernel_limits import limited, limits_of
from kernel_gateway.sessions.kernel_slot import KernelSlot
from kernel_gateway.sessions.key_quotas import KeyQuotas
from kernel_gateway.sessions.persistence import SessionRecord, SessionStore
from kernel_gateway.sessions.reaper import IdleReaper
from kernel_gateway.sessions.restart_policy import RestartPolicy
from kernel_gateway.sessions.session import Session
from kernel_gateway.sessions.stateless import StatelessRuns
from kernel_gateway.sessions.template_pools import TemplatePools
from kernel_gateway.sessions.usage import UsageSink
from kernel_gateway.settings import Settings
from kernel_gateway.shapes.responses import PoolStats
from kernel_gateway.tasks import TaskSet
from kernel_gateway.templates.model import TemplateRef
from kernel_gateway.templates.service import Templates
from kernel_gateway.tenants.principal import Principal

if TYPE_CHECKING:  # the proxy's module loads the Docker SDK: only when egress is on
    from kernel_gateway.kernels.egress.proxy import EgressProxy

logger = logging.getLogger(__name__)

MAX_GONE_KEPT = 100_000  # ids of sessions gone for good, remembered to answer 410 (not 404)


class Registry:
    def __init__(
        self,
        settings: Settings,
        warm: WarmPool,
        instance: str,
        forks: ForkPool | None = None,
        others: Iterable[WarmPool] = (),
        egress: EgressProxy | None = None,
        templates: Templates | None = None,
        principals: Callable[[str], Principal] | None = None,
        usage: UsageSink | None = None,
    ) -> None:
        """`principals`, `usage`: a key's principal by id, where its use is counted."""
        self.settings = settings
        self.quotas = KeyQuotas(self.held_by, principals, usage)  # each API key's holdings
        self.template_pools = TemplatePools(templates, warm, settings, self.sessions)
        """Kernels of templates' builds (see template_pools.py)."""
        self.warm = warm
        """Python's pool (the default language's)."""
        self.pools: dict[str, WarmPool] = {warm.language.name: warm}
        """Every language's pool, by language name: Python's and `others`."""
        for pool in others:
            self.pools[pool.language.name] = pool
        self.forks = forks
        """Where stateless kernels come from when they are forked (else from `warm`)."""
        self.stateless = StatelessRuns(self, settings, forks, self.quotas)
        self.instance = instance
        """This gateway's id; its kernel containers carry it as a label."""
        self.store: SessionStore | None = None
        """Where sessions are recorded for a successor (None: they die with the gateway)."""
        self.draining = False
        self._sessions: dict[str, Session] = {}
        self._lost: dict[str, tuple[str, str | None]] = {}
        """Sessions gone for good (not adopted, reaped hibernated): id → (why, owner)."""
        self._leases: dict[Session, Lease] = {}
        """Where each session's kernel came from: released when the session closes."""
        self._companions: dict[str, list[Session]] = {}
        """Sessions whose kernels run on another session's storage, by that session's id."""
        self._reserved = 0
        self.egress = egress
        """The egress proxy, when the operator allows some domains (`--egress-allow`)."""
        self._tasks = TaskSet()
        snapshots = Snapshots(warm.workspaces.parent / "snapshots", settings.snapshot_timeout)
        self.hibernator = Hibernator(warm, snapshots, warm.metrics)
        """Hibernates and resumes Python sessions (on demand, idle ones: --hibernate-after)."""
        self.hibernator.flush = self._flush
        self.hibernator.pool_of = self._pool_of
        self.reaper = IdleReaper(self, settings)
        """Hibernates or removes idle sessions."""

    @property
    def backend(self) -> Backend:
        return self.warm.backend

    @property
    def languages(self) -> Languages:
        return self.backend.languages

    @property
    def templates(self) -> Templates | None:
        """The gateway's templates (None where the backend cannot build images)."""
        return self.template_pools.templates

    def pool(self, language: str | None) -> WarmPool:
        """The pool of `language` (None: Python), or `UnknownLanguage` (400) naming those
        there are."""
        name = self.languages.get_or_raise(language).name
        pool = self.pools.get(name)
        if pool is None:
            raise UnknownLanguage(f"language {name!r} has no kernels on this gateway")
        return pool

    def start(self) -> None:
        for pool in self.pools.values():
            pool.start()
        if self.forks is not None:
            self.forks.start()
        self.reaper.start()

    async def close(self) -> None:
        await self.stop_reaping()
        # Taken out first, so a stateless cell that ends meanwhile starts no release of its own.
        companions = [c for group in self._companions.values() for c in group]
        sessions = [*self._sessions.values(), *self.stateless.take_all()]
        self._sessions, self._companions = {}, {}
        # Companions first: their kernels run on their owners' storage.
        await asyncio.gather(*(self._close(c) for c in companions), return_exceptions=True)
        await asyncio.gather(*(self._close(s) for s in sessions), return_exceptions=True)
        await self._tasks.join()  # releases under way
        await self.reaper.join()  # hibernations of idle sessions under way
        await self.hibernator.close()
        if self.forks is not None:
            await self.forks.close()
        await asyncio.gather(
            *(pool.close() for pool in self.pools.values()), return_exceptions=True
        )
        await self.template_pools.close()

    # -- the steps of a durable stop and start (sessions/durable.py) ------------------------

    def stop_taking_work(self) -> None:
        """Refuse new sessions and cells (503 `shutting_down`); running cells run on."""
        self.draining = True
        for session in self._sessions.values():
            session.drain()

    def busy(self) -> bool:
        """A cell runs or waits, in a session or a stateless execution."""
        return any(s.busy for s in (*self._sessions.values(), *self.stateless.sessions()))

    def stop_stateless(self) -> None:
        """Stop every stateless cell still running: its session closes in the background
        (`close` waits for it)."""
        for session in self.stateless.sessions():
            self.stateless.release(session)

    async def stop_reaping(self) -> None:
        await self.reaper.stop()

    def forget(self, sessions: list[Session]) -> None:
        """Drop `sessions`, neither closed nor released: a successor's now (suspended)."""
        for session in sessions:
            if self._sessions.get(session.id) is session:
                del self._sessions[session.id]
            self._leases.pop(session, None)

    async def add_adopted(self, lease: Lease, record: SessionRecord) -> Session:
        """A session a predecessor persisted, on its adopted kernel, taking up at `record`
        (its network policy too: without the proxy, its kernel reaches nothing)."""
        pool, template = self.template_pools.recorded(record)
        session = await self._session_on(
            lease,
            ephemeral=False,
            id=record.id,
            language=record.language,
            template=template,
            pool=pool,
            owner=record.owner,
        )
        carrier = None
        if record.carrier is not None:  # its kernel runs on this disk, carrying the session's
            carrier = SessionStorage(self.warm.workspaces / record.carrier)
        session.restore(record, carrier)
        self._sessions[session.id] = session
        if record.network:
            await self._restore_network(session, record)
        return session

    async def add_hibernated(self, record: SessionRecord, storage: SessionStorage) -> Session:
        """A session a predecessor persisted while it was hibernated: no kernel to adopt; it
        resumes onto `storage` when next called."""
        template_pool, template = self.template_pools.recorded(record)
        pool = template_pool or self.pools[record.language]
        session = await self._session_on(
            KernelLess(storage, pool),
            ephemeral=False,
            id=record.id,
            language=record.language,
            template=template,
            pool=pool,
            owner=record.owner,
        )
        session.restore(record)
        self._sessions[session.id] = session
        if record.network:
            await self._restore_network(session, record)
        return session

    def mark_lost(self, session_id: str, reason: str, owner: str | None = None) -> None:
        """A persisted session that could not be adopted: it answers 410 `session_lost`."""
        self.gone(
            session_id,
            f"session {session_id} did not survive the gateway's restart ({reason}); "
            "its variables and files are gone: create a new session",
            owner,
        )

    def gone(self, session_id: str, message: str, owner: str | None = None) -> None:
        """`session_id` answers 410 `session_lost` with `message` from now on (to `owner`'s
        requests and the admin's; 404 to another key's)."""
        self._lost[session_id] = (message, owner)
        while len(self._lost) > MAX_GONE_KEPT:
            del self._lost[next(iter(self._lost))]

    def stats(self) -> PoolStats:
        return {
            **self.warm.stats(),
            # Running ones: what `--max-sessions` bounds (and a cluster router places by).
            "sessions": sum(1 for s in self._sessions.values() if not s.hibernated),
            "max_sessions": self.settings.max_sessions,
            "stateless": len(self.stateless.sessions()),
            "max_stateless": self.stateless.limit,
        }

    # -- sessions ----------------------------------------------------------------------------

    def network_policy(self, asked: list[str] | str | None) -> list[str]:
        """The allowlist a new session gets: `asked` (patterns, or "none") checked against
        `--egress-allow`, or `--egress-default` when it asks nothing."""
        return network_policy.allowlist(asked, self.settings, self.egress)

    async def _restore_network(self, session: Session, record: SessionRecord) -> None:
        """An adopted session's policy and secrets (`network_policy.restore`: fails closed)."""
        await network_policy.restore(session, record, self.settings, self.egress, self.warm.metrics)

    async def _give_network(self, session: Session, allow: list[str]) -> None:
        assert self.egress is not None  # its way out, now and for each later kernel
        await network_policy.give(session, allow, self.egress, self.warm.metrics)

    async def create_session(
        self,
        language: str | None = None,
        network: list[str] | str | None = None,
        template: str | None = None,
        mounts: tuple[VolumeMount, ...] = (),
        *,
        owner: Principal,
    ) -> Session:
        self._refuse_if_draining()
        self.quotas.check_session(owner)
        allow = self.network_policy(network)
        if mounts and self.backend.volumes is not None:
            raise BadRequest(self.backend.volumes)
        ref: TemplateRef | None = None
        if template is not None:
            pool, ref = self.template_pools.for_reference(template, language, owner)
        else:
            pool = self.pool(language)
        network_policy.check_language(pool.language.name, allow)
        if self._held() + self._reserved >= self.settings.max_sessions:
            raise TooManySessions(
                f"the gateway holds its maximum of {self.settings.max_sessions} sessions; "
                "delete one or retry later",
                retry_after=5,
            )
        self._reserved += 1
        try:
            lease = await (pool.acquire_mounting(mounts) if mounts else pool.acquire())
        finally:
            self._reserved -= 1
        session = await self._session_on(
            lease,
            ephemeral=False,
            language=pool.language.name,
            template=ref,
            pool=pool,
            owner=owner.owner,
        )
        if allow:
            try:
                await self._give_network(session, allow)
            except BaseException:
                await self._close(session)
                raise
        self._sessions[session.id] = session
        self.quotas.created(owner.key_id)
        if self.store is not None:
            session.persist()
            await self.store.flush()  # on disk before the client hears of it
        return session

    def get(self, session_id: str, viewer: Principal) -> Session:
        """The session, if `viewer` may see it (its owner, or the admin)."""
        session = self._sessions.get(session_id)
        if session is None or not viewer.sees(session.owner):
            raise self._missing(session_id, viewer)
        return session

    def _missing(self, session_id: str, viewer: Principal) -> SessionNotFound | SessionLost:
        lost = self._lost.get(session_id)
        if lost is not None and viewer.sees(lost[1]):
            return SessionLost(lost[0])
        return SessionNotFound(f"no session with id {session_id!r}")

    def held_by(self, key_id: str) -> int:
        """Kernels a key holds against its `max_sessions`: its sessions (hibernated ones
        too: each resumes when called) and their companions."""
        return sum(
            1 + len(self._companions.get(s.id, ()))
            for s in self._sessions.values()
            if s.owner == key_id
        )

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise ShuttingDown("the gateway is restarting; retry shortly", retry_after=2)

    def sessions(self) -> list[Session]:
        """Every session, whoever owns it: the gateway's own view (reaping, the drain)."""
        return list(self._sessions.values())

    def visible(self, viewer: Principal) -> list[Session]:
        """The sessions `viewer` may see: its own, or all for the admin."""
        return [s for s in self._sessions.values() if viewer.sees(s.owner)]

    async def delete_session(self, session_id: str, viewer: Principal) -> None:
        self.get(session_id, viewer)
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise self._missing(session_id, viewer)
        self.reaper.forget(session_id)
        if self.store is not None:  # first: a crash from here on must not bring it back
            self.store.delete(session_id)
            await self.store.flush()
        companions = self._companions.pop(session_id, [])
        await asyncio.gather(*(self._close(c) for c in companions), return_exceptions=True)
        await self._close(session)

    # -- companions: more kernels on one session's files ---------------------------------------

    async def create_companion(
        self, owner_id: str, language: str | None = None, *, viewer: Principal
    ) -> Session:
        """A session of `language` on session `owner_id`'s storage: its files, variables of its
        own (E2B's contexts). Closed with its owner; not persisted; counts as a session (and
        against its key's quota)."""
        self._refuse_if_draining()
        owner = self.get(owner_id, viewer)
        self.quotas.check_session(self.quotas.principal(owner.owner))
        # A context of a session on a template runs on the template too (its language's).
        pool = self.template_pools.for_session(owner, language) or self.pool(language)
        if self._held() + self._reserved >= self.settings.max_sessions:
            raise TooManySessions(
                f"the gateway holds its maximum of {self.settings.max_sessions} sessions "
                "(contexts count); delete one or retry later",
                retry_after=5,
            )
        self._reserved += 1
        try:
            lease = await pool.launch_on(owner.slot.storage)
        finally:
            self._reserved -= 1
        if self._sessions.get(owner_id) is not owner:  # deleted while the kernel started
            await lease.kernel.close()
            raise self._missing(owner_id, viewer)
        session = await self._session_on(
            lease,
            ephemeral=False,
            language=pool.language.name,
            template=owner.template,
            pool=pool,
            owner=owner.owner,
        )
        self._companions.setdefault(owner_id, []).append(session)
        self.quotas.created(owner.owner)
        return session

    def _held(self) -> int:
        """Kernels held against `--max-sessions`: sessions and companions (hibernated ones
        hold none: a resume is never refused for capacity; idle ones hibernate again)."""
        running = sum(1 for s in self._sessions.values() if not s.hibernated)
        return running + sum(len(c) for c in self._companions.values())

    def companions(self, owner_id: str) -> list[Session]:
        return list(self._companions.get(owner_id, ()))

    async def close_companion(self, owner_id: str, session: Session) -> None:
        companions = self._companions.get(owner_id, [])
        if session not in companions:
            raise SessionNotFound(f"no context {session.id!r} in session {owner_id!r}")
        companions.remove(session)
        await self._close(session)

    # -- stateless ---------------------------------------------------------------------------

    async def run_stateless(
        self,
        code: str,
        cell_timeout: float | None,
        files: list[tuple[str, bytes]],
        language: str | None = None,
        network: list[str] | str | None = None,
        template: str | None = None,
        *,
        owner: Principal,
    ) -> tuple[Session, Execution]:
        """Run one cell in a fresh kernel destroyed once the cell ends (`stateless.py`)."""
        return await self.stateless.run(
            code, cell_timeout, files, language, network, template, owner
        )

    # -- what stateless executions ask (stateless.Host) --------------------------------------

    def refuse_if_draining(self) -> None:
        self._refuse_if_draining()

    def pool_for(
        self, language: str | None, template: str | None, owner: Principal
    ) -> tuple[WarmPool, TemplateRef | None]:
        if template is not None:
            return self.template_pools.for_reference(template, language, owner)
        return self.pool(language), None

    async def ephemeral_session(
        self, lease: Lease, pool: WarmPool, template: TemplateRef | None, owner: str | None
    ) -> Session:
        return await self._session_on(
            lease,
            ephemeral=True,
            language=pool.language.name,
            template=template,
            pool=pool,
            owner=owner,
        )

    async def give_network(self, session: Session, allow: list[str]) -> None:
        await self._give_network(session, allow)

    def close_later(self, session: Session) -> None:
        self._tasks.spawn(self._close(session))

    # -- internals ---------------------------------------------------------------------------

    def _new_id(self) -> str:
        """A fresh session id; in a cluster `<node>.<hex>`, so a router finds its node."""
        node = self.settings.node_name
        return f"{node}.{uuid.uuid4().hex}" if node else uuid.uuid4().hex

    async def _session_on(
        self,
        lease: Lease,
        *,
        ephemeral: bool,
        id: str | None = None,
        language: str = PYTHON,
        template: TemplateRef | None = None,
        pool: WarmPool | None = None,
        owner: str | None = None,
    ) -> Session:
        session_id = id or self._new_id()
        s = self.settings
        pool = pool or self.pools.get(language, self.warm)
        slot = KernelSlot(
            session_id,
            None if isinstance(lease, KernelLess) else lease.kernel,
            lease.storage,
            pool.launch if lease.relaunchable else _never_relaunched,
            RestartPolicy(s.restart_budget, s.restart_window),
            revive=not ephemeral,
            metrics=self.warm.metrics,
        )
        workspace = Workspace(lease.storage.files, lease.files_owner)
        files = SessionFiles(session_id, workspace, s, inline_all=ephemeral)
        persist = self._save if self.store is not None and not ephemeral else None
        hibernates = self.hibernator.supports(language, ephemeral=ephemeral)
        session = Session(
            session_id,
            slot,
            files,
            s,
            ephemeral=ephemeral,
            persist=persist,
            metrics=self.warm.metrics,
            language=language,
            hibernator=self.hibernator if hibernates else None,
            template=template,
            owner=owner,
        )

        def replaced() -> None:
            session.persist()
            if session.hibernation is not None:  # a disk that carried it is no longer needed
                session.hibernation.kernel_replaced()

        slot.on_replace = replaced
        self._leases[session] = lease
        limits = limits_of(self.quotas.principal(owner).quotas, s)  # its key's, not stateless
        if limits is not None and not ephemeral:  # (those share the fork servers' limits)
            await limited(slot, limits, None if id else lambda: self._close(session))
        return session

    def _pool_of(self, sleeper: object) -> WarmPool:
        """The pool a session's kernels come from: its template's, or its language's."""
        session = self._sessions.get(getattr(sleeper, "id", ""))
        if session is not None:
            pool = self.template_pools.for_session(session, None)
            if pool is not None:
                return pool
            return self.pools.get(session.language, self.warm)
        return self.warm

    async def _flush(self) -> None:
        if self.store is not None:
            await self.store.flush()

    def _save(self, session: Session) -> None:
        if self.store is not None and self._sessions.get(session.id) is session:
            self.store.save(session.record())

    async def _close(self, session: Session) -> None:
        lease = self._leases.pop(session, None)
        try:
            await session.close()  # its snapshot, and the disk it was carried on, too
        finally:
            if lease is not None:
                await lease.release()

    async def hibernate(self, session_id: str, viewer: Principal) -> Session:
        """Hibernate a session now (`POST /sessions/{id}/hibernate`)."""
        session = self.get(session_id, viewer)
        if session.hibernation is None:  # a well-formed call this session cannot take
            raise Conflict(
                f"{session.language} sessions cannot be hibernated (only Python kernels' "
                "variables can be saved)"
            )
        if self._companions.get(session_id):
            raise Conflict(
                f"session {session_id} has other kernels on its files (E2B contexts); "
                "delete them first"
            )
        await session.hibernate()
        return session


async def _never_relaunched(storage: SessionStorage) -> Kernel:
    """A forked stateless kernel that died is not replaced: its fork server is emptied and
    given back, so the cell ends `died` with the reason."""
    raise KernelUnavailable("the stateless kernel ended before its cell could run")
