"""A cell adopted from a predecessor gateway ends as every other cell does (`_end_cell`):
one `done`, counted in the executions metric, and the session's activity touched."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernel_gateway.sessions.persistence import RunningCell, SessionRecord
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.tenants.principal import ADMIN
from tests.support.fake_kernel import fake_registry, until


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[Registry]:
    async with fake_registry(tmp_path) as (registry, _):
        yield registry


def ended(registry: Registry) -> float:
    value = 0.0
    for metric in registry.warm.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "kernel_gateway_executions_total":
                value += sample.value
    return value


async def test_an_adopted_cell_is_counted_and_touches_the_session(registry: Registry) -> None:
    session = await registry.create_session(owner=ADMIN)
    long_ago = time.time() - 1000
    running = RunningCell(execution=3, msg_id="m-1", timeout=60.0, deadline=time.time() + 60)
    record = SessionRecord(
        id=session.id,
        kernel_id=session.slot.kernel_id,
        storage=session.slot.storage.root.name,
        created_at=session.created_at.isoformat(),
        last_activity=long_ago,
        submitted=3,
        last_event_id=10,
        execution_count=2,
        restarts=0,
        running=running,
    )
    before = ended(registry)
    session.restore(record)
    assert session.idle_seconds() == 0.0  # busy with the adopted cell
    (execution,) = session.executions()
    await until(lambda: execution.finished, 10)
    names = [record.event.name async for record in execution.records()]
    assert names.count("done") == 1
    assert ended(registry) == before + 1
    assert session.current is None
    assert session.idle_seconds() < 60  # touched when it ended, not idle since long_ago
