"""The fork pool counts every server it holds, also one handed to a waiting request that
has not run yet: steady load must not start servers it does not need (a start costs a
second of CPU)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kernel_gateway.kernels.pools.fork import ForkPool, ForkServer
from kernel_gateway.kernels.pools.refill import Refill
from kernel_gateway.settings import Settings


class _Process:
    def poll(self) -> None:
        return None


class _Server:
    """What the pool reads of a fork server when it hands one out and takes it back."""

    def __init__(self) -> None:
        self.healthy = True
        self.served = 0
        self.host = SimpleNamespace(process=_Process())


def _server() -> ForkServer:
    return cast(ForkServer, _Server())


def _pool(tmp_path: Path, servers: int) -> tuple[ForkPool, list[ForkServer]]:
    settings = Settings(runtime_dir=tmp_path, fork_servers=servers)
    pool = ForkPool(settings, cast(Any, None), cast(Any, None), cast(Any, None), cast(Any, None))
    started: list[ForkServer] = []

    async def start() -> ForkServer:
        server = _server()
        started.append(server)
        return server

    pool._refill._start = start
    return pool, started


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_server_handed_to_a_waiter_is_counted_busy(tmp_path: Path) -> None:
    pool, started = _pool(tmp_path, servers=2)
    pool.start()
    await _settle()
    assert len(started) == 2
    first, second = await pool._server(), await pool._server()
    waiting = asyncio.create_task(pool._server())
    await _settle()
    assert len(started) == 2  # both busy, one waits: no burst before BURST_AFTER

    pool._give_back(first)  # handed to the waiter, which has not run yet
    pool._refill.fill()  # what another request arriving now would do
    await _settle()
    assert len(started) == 2
    assert await waiting is first
    assert pool.stats()["busy"] == 2

    pool._give_back(first)
    pool._give_back(second)
    await _settle()
    assert len(started) == 2
    assert pool.stats()["idle"] == 2
    await pool._refill.tasks.close()


@pytest.mark.asyncio
async def test_a_server_kept_ready_is_never_counted_busy(tmp_path: Path) -> None:
    """A server handed to a waiter counts as busy; if that waiter leaves before it runs,
    Refill.wait puts the server back in the ready queue, and from then on it is idle."""
    pool, started = _pool(tmp_path, servers=1)
    pool.start()
    await _settle()
    server = await pool._server()
    pool._busy.discard(server)
    pool._refill._on_handed(server)  # type: ignore[misc]  # as when a waiter took it
    assert pool.stats()["busy"] == 1
    pool._refill.hand_out(server)  # what Refill.wait does when its caller left
    assert pool.stats()["busy"] == 0
    assert pool.stats()["idle"] == 1
    assert len(started) == 1
    await pool._refill.tasks.close()


@pytest.mark.asyncio
async def test_refill_tells_the_pool_when_a_waiter_takes_an_item() -> None:
    handed: list[str] = []

    async def start() -> str:
        return "item"

    refill: Refill[str] = Refill("thing", start, lambda: 0, 1, on_handed=handed.append)
    waiter = asyncio.create_task(refill.wait(5))
    await _settle()
    assert refill.hand_out("given") is True
    assert handed == ["given"]  # at once, before the waiter has run
    assert await waiter == "given"
    assert refill.hand_out("kept") is False
    assert handed == ["given"]
    await refill.close()
