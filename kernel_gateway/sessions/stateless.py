"""Stateless executions: one cell each, in a fresh kernel destroyed once the cell ends.

Each gets a session of its own, released when its execution's task ends, whatever
happens to the HTTP response (the task always ends, at the latest at its timeout).
Python's kernels come from the fork servers when there are some (unless the cell may
reach some domains: a forked kernel shares its server's container, so it gets a kernel
of its own); other languages' and templates' from their warm pool. At most
`--max-stateless` run or wait at once, and each API key within its `max_stateless`.
"""

from __future__ import annotations

import time
from typing import Protocol

from kernel_gateway.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    TooManySessions,
)
from kernel_gateway.kernels.pools.fork import ForkPool
from kernel_gateway.kernels.pools.lease import Lease
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.sessions import network_policy
from kernel_gateway.sessions.execution import Execution
from kernel_gateway.sessions.key_quotas import KeyQuotas
from kernel_gateway.sessions.session import Session
from kernel_gateway.settings import Settings
from kernel_gateway.templates.model import TemplateRef
from kernel_gateway.tenants.principal import Principal


class Host(Protocol):
    """What stateless executions need of the registry (`Registry` is one)."""

    warm: WarmPool

    def refuse_if_draining(self) -> None: ...

    def network_policy(self, asked: list[str] | str | None) -> list[str]: ...

    def pool_for(
        self, language: str | None, template: str | None, owner: Principal
    ) -> tuple[WarmPool, TemplateRef | None]: ...

    async def ephemeral_session(
        self, lease: Lease, pool: WarmPool, template: TemplateRef | None, owner: str | None
    ) -> Session: ...

    async def give_network(self, session: Session, allow: list[str]) -> None: ...

    def close_later(self, session: Session) -> None: ...


class StatelessRuns:
    def __init__(
        self, host: Host, settings: Settings, forks: ForkPool | None, quotas: KeyQuotas
    ) -> None:
        self._host = host
        self._settings = settings
        self._forks = forks
        self._quotas = quotas
        self.limit = settings.stateless_limit(forked=forks is not None)
        """At most this many at once (`--max-stateless`)."""
        self._running: dict[Session, float] = {}
        """Each running one's session, and when it got its kernel (monotonic)."""
        self._reserved = 0

    def sessions(self) -> list[Session]:
        return list(self._running)

    def take_all(self) -> list[Session]:
        """Every running one's session, forgotten here (the registry is closing them)."""
        running, self._running = list(self._running), {}
        return running

    async def run(
        self,
        code: str,
        cell_timeout: float | None,
        files: list[tuple[str, bytes]],
        language: str | None,
        network: list[str] | str | None,
        template: str | None,
        owner: Principal,
    ) -> tuple[Session, Execution]:
        host = self._host
        host.refuse_if_draining()
        allow = host.network_policy(network)
        pool, ref = host.pool_for(language, template, owner)
        network_policy.check_language(pool.language.name, allow)
        forks = self._forks if pool is host.warm and not allow else None
        # A forked request waiting for a fork server holds nothing; one that gets a
        # container of its own holds that container: by default it is let in only under
        # the lower limit (`Settings.stateless_limit`).
        limit = self.limit if forks else self._settings.stateless_limit(forked=False)
        if len(self._running) + self._reserved >= limit:
            raise TooManySessions(
                f"{limit} stateless executions are already running; retry shortly",
                retry_after=1,
            )
        self._quotas.take_stateless(owner)
        self._reserved += 1
        try:
            lease: Lease = await (forks.acquire(forks.is_light(code)) if forks else pool.acquire())
        except BaseException:
            self._quotas.give_back(owner.key_id)
            raise
        finally:
            self._reserved -= 1
        session = await host.ephemeral_session(lease, pool, ref, owner.key_id)
        self._running[session] = time.monotonic()
        try:
            if allow:
                await host.give_network(session, allow)
            for i, (path, data) in enumerate(files):
                try:
                    await session.files.write(path, data, self._settings.max_upload_bytes)
                except (BadRequest, Conflict, Forbidden, NotFound) as exc:
                    # a bad path, or one that clashes with an earlier file: the body's fault
                    raise InvalidRequest(f"'files[{i}]': {exc.message}") from None
            execution = session.submit(code, cell_timeout)
        except BaseException:
            self.release(session)
            raise
        assert execution.task is not None
        execution.task.add_done_callback(lambda _: self.release(session))
        return session, execution

    def release(self, session: Session) -> None:
        started = self._running.pop(session, None)
        if started is not None:
            self._quotas.give_back(session.owner, time.monotonic() - started)
            self._host.close_later(session)
