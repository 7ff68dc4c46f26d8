"""Durable sessions' lifecycle (sessions/durable.py) on the fake backend.

`PersistingBackend` is the fake backend claiming it can keep kernels running
without the gateway: its fake kernels are tasks of the test's event loop, so a
"successor" in the same test adopts them (the real thing, on docker containers,
is tests/integration/test_persistence.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq.asyncio

from kernel_gateway.errors import SessionLost, ShuttingDown
from kernel_gateway.kernels.backends.base import KernelProcess
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.kernels.runtime_dir import RuntimeDir
from kernel_gateway.sessions.durable import DurableSessions
from kernel_gateway.sessions.persistence import SessionStore
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.settings import Settings
from kernel_gateway.tenants.principal import ADMIN
from tests.support.fake_kernel import FakeBackend, FakeKernelProcess, run


class PersistingBackend(FakeBackend):
    persists = True

    async def adopt(self, kernel_ids: Collection[str]) -> dict[str, KernelProcess]:
        return {k.id: k for k in self.kernels if k.id in kernel_ids and k.poll() is None}


def settings_for(tmp_path: Path, *, persist: bool, drain_timeout: float = 30.0) -> Settings:
    return Settings(
        backend="docker",  # only named: the backend is the fake one given to `start`
        pool_size=1,
        preload="",
        runtime_dir=tmp_path,
        kernel_start_timeout=5,
        persist_sessions=persist,
        drain_timeout=drain_timeout,
    )


@dataclass
class Gateway:
    """What a gateway's lifespan holds, without HTTP."""

    durable: DurableSessions
    registry: Registry
    runtime: RuntimeDir

    @classmethod
    async def start(
        cls, settings: Settings, backend: FakeBackend, context: zmq.asyncio.Context
    ) -> Gateway:
        durable = DurableSessions(settings)
        runtime = await durable.open_runtime()
        registry = Registry(
            settings, WarmPool(settings, backend, runtime, context), runtime.instance
        )
        await durable.start(backend, runtime, registry)
        registry.start()
        return cls(durable, registry, runtime)

    async def stop(self) -> int:
        """As the lifespan does, except that the backend is left to the fixture."""
        left = await self.durable.stop()
        self.runtime.close(keep=left > 0)
        return left


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
async def backend() -> AsyncIterator[PersistingBackend]:
    backend = PersistingBackend()
    yield backend
    await backend.close()


def process_of(registry: Registry, session_id: str) -> FakeKernelProcess:
    kernel = registry.get(session_id, ADMIN).slot.kernel
    assert kernel is not None and isinstance(kernel.process, FakeKernelProcess)
    return kernel.process


async def test_without_persistence_stop_closes_the_registry(
    tmp_path: Path, context: zmq.asyncio.Context, caplog: pytest.LogCaptureFixture
) -> None:
    backend = FakeBackend()  # persists = False: the flag alone does not make sessions durable
    try:
        with caplog.at_level(logging.WARNING):
            gw = await Gateway.start(settings_for(tmp_path, persist=True), backend, context)
        assert not gw.durable.persist and gw.durable.store is None and gw.registry.store is None
        assert "cannot keep kernels running" in caplog.text
        session = await gw.registry.create_session(owner=ADMIN)
        process = process_of(gw.registry, session.id)
        gw.durable.stop_requested()
        assert not gw.registry.draining  # a stop request drains only durable sessions
        assert await gw.stop() == 0
        assert session.closed and gw.registry.sessions() == []
        assert process.poll() is not None  # its kernel was stopped
        assert not gw.runtime.path.exists()
    finally:
        await backend.close()


async def test_a_stop_request_begins_the_drain_once(
    tmp_path: Path, backend: PersistingBackend, context: zmq.asyncio.Context
) -> None:
    gw = await Gateway.start(settings_for(tmp_path, persist=True), backend, context)
    assert gw.durable.persist and gw.registry.store is gw.durable.store is not None
    session = await gw.registry.create_session(owner=ADMIN)
    gw.durable.stop_requested()
    first = gw.durable.stop_requested_at
    timer = gw.durable._end_streams_timer
    assert first is not None and timer is not None
    assert gw.registry.draining and session.draining
    with pytest.raises(ShuttingDown):
        await gw.registry.create_session(owner=ADMIN)
    with pytest.raises(ShuttingDown):
        session.submit("print x", None)
    gw.durable.stop_requested()  # a second signal changes nothing
    assert gw.durable.stop_requested_at == first and gw.durable._end_streams_timer is timer
    assert await gw.stop() == 1
    assert timer.cancelled()


async def test_a_cell_running_at_the_stop_request_finishes_within_the_drain(
    tmp_path: Path, backend: PersistingBackend, context: zmq.asyncio.Context
) -> None:
    gw = await Gateway.start(settings_for(tmp_path, persist=True), backend, context)
    session = await gw.registry.create_session(owner=ADMIN)
    execution = session.submit("sleep 0.3\nprint done", None)
    gw.durable.stop_requested()
    assert await gw.stop() == 1
    assert execution.finished and execution.status == "ok"


async def test_at_the_drain_deadline_streams_end_without_done_and_the_cell_runs_on(
    tmp_path: Path, backend: PersistingBackend, context: zmq.asyncio.Context
) -> None:
    settings = settings_for(tmp_path, persist=True, drain_timeout=0.2)
    gw = await Gateway.start(settings, backend, context)
    session = await gw.registry.create_session(owner=ADMIN)
    execution = session.submit("print started\nsleep 30", None)
    stream = asyncio.ensure_future(_names(execution.stream()))
    await asyncio.sleep(0.05)
    gw.durable.stop_requested()
    names = await asyncio.wait_for(stream, 5)  # ended by the timer the signal set
    assert "stdout" in names and "done" not in names
    assert not execution.finished
    process = process_of(gw.registry, session.id)
    assert await gw.stop() == 1
    assert process.poll() is None and process.executed  # the cell runs on in its kernel


async def _names(events: AsyncIterator[Any]) -> list[str]:
    return [e.name async for e in events]


async def test_stop_with_persistence_suspends_and_reports_the_kernels_left(
    tmp_path: Path, backend: PersistingBackend, context: zmq.asyncio.Context
) -> None:
    gw = await Gateway.start(settings_for(tmp_path, persist=True), backend, context)
    sessions = [await gw.registry.create_session(owner=ADMIN) for _ in range(2)]
    processes = [process_of(gw.registry, s.id) for s in sessions]
    await run(sessions[0], "print a")
    assert await gw.stop() == 2
    assert all(p.poll() is None for p in processes)  # left running for a successor
    assert gw.registry.sessions() == []
    store = SessionStore(gw.runtime.sessions_path)
    records = {r.id: r for r in store.load()}
    assert set(records) == {s.id for s in sessions}
    assert records[sessions[0].id].execution_count == 1
    await store.close()


async def test_a_successor_adopts_the_sessions_and_reports_the_lost(
    tmp_path: Path, backend: PersistingBackend, context: zmq.asyncio.Context
) -> None:
    first = await Gateway.start(settings_for(tmp_path, persist=True), backend, context)
    kept, gone = [await first.registry.create_session(owner=ADMIN) for _ in range(2)]
    await run(kept, "print a")
    gone_process = process_of(first.registry, gone.id)
    assert await first.stop() == 2
    await gone_process.cleanup()  # its kernel died while no gateway was up

    # Without the flag, a successor on the same runtime dir adopts, then removes everything.
    second = await Gateway.start(settings_for(tmp_path, persist=False), backend, context)
    assert second.runtime.adopted and second.runtime.instance == first.runtime.instance
    adopted = second.registry.get(kept.id, ADMIN)
    assert adopted.execution_count == 1
    events = await run(adopted, "print b")
    assert ("stdout", {"text": "b\n"}) in events
    assert events[-1][1]["execution_count"] == 2  # the count goes on
    with pytest.raises(SessionLost):
        second.registry.get(gone.id, ADMIN)
    process = process_of(second.registry, kept.id)
    assert await second.stop() == 0
    assert process.poll() is not None
