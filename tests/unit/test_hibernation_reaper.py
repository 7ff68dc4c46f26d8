"""The registry's side of hibernation over fake kernels: which idle sessions the reaper
hibernates or removes, the time-to-live of hibernated ones (410 after), a failed hibernation
falling back to --idle-timeout, and capacity counting running sessions only."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernel_gateway.errors import HibernationFailed, SessionLost
from kernel_gateway.sessions.persistence import HibernatedState
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.sessions.session import Session
from kernel_gateway.tenants.principal import ADMIN
from tests.support.fake_kernel import fake_registry


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[Registry]:
    async with fake_registry(
        tmp_path, max_sessions=2, hibernate_after=60.0, hibernated_ttl=3600.0, idle_timeout=120.0
    ) as (registry, _):
        yield registry


def _idle_for(session: Session, seconds: float) -> None:
    session.last_activity = time.monotonic() - seconds


def _hibernated(session: Session) -> None:
    """As if hibernated: no kernel, a snapshot's particulars (the fake kernels write none)."""
    session.slot.park()
    assert session.hibernation is not None
    session.hibernation.take_up(HibernatedState(since=time.time()), None)


async def test_a_hibernated_session_lives_until_its_ttl_then_answers_410(
    registry: Registry,
) -> None:
    session = await registry.create_session(owner=ADMIN)
    _hibernated(session)
    _idle_for(session, 3000)  # far past --idle-timeout, within --hibernated-ttl
    await registry.reaper.reap(session)
    assert registry.get(session.id, ADMIN) is session and session.status == "hibernated"
    _idle_for(session, 3601)
    await registry.reaper.reap(session)
    with pytest.raises(SessionLost) as gone:
        registry.get(session.id, ADMIN)
    assert "--hibernated-ttl" in gone.value.message and gone.value.status_code == 410


async def test_a_failed_hibernation_falls_back_to_the_idle_timeout(registry: Registry) -> None:
    session = await registry.create_session(owner=ADMIN)
    with pytest.raises(HibernationFailed):  # the fake kernel cannot write a snapshot
        await registry.hibernate(session.id, ADMIN)
    assert registry.get(session.id, ADMIN).status == "idle"  # it runs on
    _idle_for(session, 121)  # past --hibernate-after and --idle-timeout
    await registry.reaper.reap(session)  # tries to hibernate it (in the background): fails
    await registry.reaper.join()
    assert registry.get(session.id, ADMIN) is session and not session.closed
    await registry.reaper.reap(session)  # not tried again while unused: removed as before
    assert session.closed
    with pytest.raises(Exception, match="no session"):
        registry.get(session.id, ADMIN)


async def test_hibernated_sessions_hold_no_capacity(registry: Registry) -> None:
    first = await registry.create_session(owner=ADMIN)
    await registry.create_session(owner=ADMIN)
    assert registry.stats()["sessions"] == 2
    _hibernated(first)
    assert registry.stats()["sessions"] == 1
    third = await registry.create_session(owner=ADMIN)  # --max-sessions 2 counts running ones
    assert third.status == "idle"
