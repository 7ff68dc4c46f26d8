"""TaskSet: background tasks held until done, cancelled or awaited at the owner's close."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kernel_gateway.tasks import TaskSet


async def test_a_task_is_held_until_it_is_done() -> None:
    tasks = TaskSet()
    gate = asyncio.Event()
    task = tasks.spawn(gate.wait(), name="waiting")
    assert len(tasks) == 1 and task.get_name() == "waiting"
    gate.set()
    assert await task is True
    await asyncio.sleep(0)  # done callbacks run on the next turn of the loop
    assert len(tasks) == 0


async def test_close_cancels_and_awaits_every_task() -> None:
    tasks = TaskSet()
    cleaned: list[str] = []

    async def sleeper(name: str) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits is waited for
            cleaned.append(name)

    spawned = [tasks.spawn(sleeper(n)) for n in ("a", "b")]
    await asyncio.sleep(0)
    await tasks.close()
    assert sorted(cleaned) == ["a", "b"]
    assert all(t.cancelled() for t in spawned)
    assert len(tasks) == 0
    await tasks.close()  # again: nothing to do


async def test_cancel_asks_without_waiting() -> None:
    tasks = TaskSet()
    task = tasks.spawn(asyncio.sleep(60))
    await asyncio.sleep(0)
    tasks.cancel()
    assert not task.done()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_join_waits_without_cancelling_and_swallows_failures() -> None:
    tasks = TaskSet()
    finished: list[int] = []

    async def work(n: int) -> None:
        await asyncio.sleep(0.01 * n)
        finished.append(n)

    async def fail() -> None:
        raise RuntimeError("boom")

    tasks.spawn(work(1))
    tasks.spawn(work(2))
    tasks.spawn(fail())
    await tasks.join()
    assert finished == [1, 2]


async def test_join_with_a_limit_leaves_slow_tasks_running() -> None:
    tasks = TaskSet()
    slow = tasks.spawn(asyncio.sleep(60))
    await tasks.join(seconds=0.01)
    assert not slow.done() and len(tasks) == 1
    await tasks.close()
    assert slow.cancelled()


async def test_a_failed_task_is_logged_once_a_cancelled_one_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = TaskSet()

    async def fail() -> None:
        raise RuntimeError("boom")

    caplog.set_level(logging.ERROR, logger="kernel_gateway.tasks")
    failing = tasks.spawn(fail(), name="doomed")
    cancelled = tasks.spawn(asyncio.sleep(60), name="stopped")
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(failing, cancelled, return_exceptions=True)
    await asyncio.sleep(0)
    records = [r for r in caplog.records if r.name == "kernel_gateway.tasks"]
    assert len(records) == 1
    assert "doomed" in records[0].getMessage()
    assert records[0].exc_info is not None and "boom" in str(records[0].exc_info[1])
