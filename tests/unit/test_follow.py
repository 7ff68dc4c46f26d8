"""`follow()`: one client reading a cell, and what each disconnect policy does to the cell."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernel_gateway.sessions.execution import Execution, StopReason
from kernel_gateway.sessions.follow import Disconnect, follow
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.session import Session
from kernel_gateway.tenants.principal import ADMIN
from tests.support.fake_kernel import fake_registry, until


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[Registry]:
    async with fake_registry(tmp_path, interrupt_grace=0.2, reconnect_grace=30) as (reg, _):
        yield reg


async def _leave_after_first_output(
    session: Session, execution: Execution, policy: Disconnect
) -> None:
    async with follow(session, execution, None, policy) as records:
        assert execution.readers == 1  # a follower is a reader
        async for record in records:
            if record.event.name == "stdout":
                break
    assert execution.readers == 0


async def _running(registry: Registry) -> tuple[Session, Execution]:
    session = await registry.create_session(owner=ADMIN)
    execution = session.submit("print started\nsleep 30", None)
    await until(lambda: execution.running)
    return session, execution


async def test_reading_to_the_end_stops_nothing(registry: Registry) -> None:
    session = await registry.create_session(owner=ADMIN)
    execution = session.submit("print a\nprint b", None)
    async with follow(session, execution, None, Disconnect.INTERRUPT) as records:
        names = [record.event.name async for record in records]
    assert names == ["stdout", "stdout", "done"]
    assert execution.status == "ok" and execution.stop_reason is None


async def test_records_start_after_the_event_id_given(registry: Registry) -> None:
    session = await registry.create_session(owner=ADMIN)
    execution = session.submit("print a\nprint b", None)
    await execution.task  # type: ignore[misc]
    async with follow(session, execution) as records:
        first = [r async for r in records]
    async with follow(session, execution, first[0].id) as records:
        rest = [r async for r in records]
    assert rest == first[1:]


async def test_grace_leaves_the_cell_to_the_sessions_rule(registry: Registry) -> None:
    session, execution = await _running(registry)
    await _leave_after_first_output(session, execution, Disconnect.GRACE)
    await asyncio.sleep(0.1)
    assert execution.running and execution.stop_reason is None  # within --reconnect-grace
    await registry.delete_session(session.id, ADMIN)


@pytest.mark.parametrize("policy", [Disconnect.INTERRUPT, Disconnect.INTERRUPT_UNLESS_DRAINING])
async def test_interrupting_policies_stop_the_cell_at_once(
    registry: Registry, policy: Disconnect
) -> None:
    session, execution = await _running(registry)
    await _leave_after_first_output(session, execution, policy)
    assert execution.stop_reason is StopReason.DISCONNECT
    await asyncio.wait_for(asyncio.shield(execution.task), 3)  # type: ignore[arg-type]
    assert execution.status == "interrupted"


async def test_a_draining_gateway_keeps_the_cell_only_where_the_policy_says(
    tmp_path: Path,
) -> None:
    async with fake_registry(tmp_path, interrupt_grace=0.2) as (registry, _):
        kept_session, kept = await _running(registry)
        stopped_session, stopped = await _running(registry)
        registry.stop_taking_work()
        await _leave_after_first_output(kept_session, kept, Disconnect.INTERRUPT_UNLESS_DRAINING)
        await _leave_after_first_output(stopped_session, stopped, Disconnect.INTERRUPT)
        assert kept.stop_reason is None and kept.running
        assert stopped.stop_reason is StopReason.DISCONNECT


async def test_a_stateless_cell_is_abandoned_once(registry: Registry) -> None:
    session, execution = await registry.run_stateless(
        "print started\nsleep 30", None, [], owner=ADMIN
    )
    await _leave_after_first_output(session, execution, Disconnect.INTERRUPT_UNLESS_DRAINING)
    assert execution.stop_reason is StopReason.DISCONNECT
    await asyncio.wait_for(asyncio.shield(execution.task), 3)  # type: ignore[arg-type]
    assert execution.status == "interrupted"
