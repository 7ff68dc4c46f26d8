"""Prometheus metrics: a known workload, then a scrape read with prometheus_client's parser.

The lifecycle counts (deaths by reason, restarts, executions by status) are
checked on the fake backend, where every death is scripted; the HTTP counts
(requests by route template, events and bytes sent, stateless rejections) on
a real gateway with real kernels, against what the test itself sent and read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from kernel_gateway.metrics import Metrics
from kernel_gateway.sessions.gauges import RegistryGauges
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.tenants.principal import ADMIN
from tests.support.fake_kernel import FakeBackend, fake_registry, run, until
from tests.support.metrics import Labels, nonzero, samples, value


@pytest.fixture
async def lifecycle(tmp_path: Path) -> AsyncIterator[tuple[Registry, FakeBackend, Metrics]]:
    metrics = Metrics()
    async with fake_registry(
        tmp_path, metrics, interrupt_grace=0.2, restart_budget=5, restart_window=60
    ) as (registry, backend):
        metrics.register(RegistryGauges(registry))
        yield registry, backend, metrics


def scrape_of(metrics: Metrics) -> dict[str, dict[Labels, float]]:
    return samples(generate_latest(metrics.registry).decode())


async def test_lifecycle_counts_are_exact(
    lifecycle: tuple[Registry, FakeBackend, Metrics],
) -> None:
    registry, backend, metrics = lifecycle
    session = await registry.create_session(owner=ADMIN)
    for code, limit in [
        ("print hi", None),
        ("error", None),
        ("sleep 5", 0.3),  # interrupted by the timeout, the kernel lives on
        ("die 1", None),
        ("print after", None),  # on the revived kernel
        ("oom", None),
    ]:
        await run(session, code, limit)
    await until(lambda: session.slot.alive and not session.slot.lock.locked())
    execution = session.submit("sleep 5", None)
    await until(lambda: execution.running)
    assert await session.interrupt()
    await execution.task  # type: ignore[misc]
    await session.restart()
    _, stateless = await registry.run_stateless("print x", None, [], owner=ADMIN)
    await stateless.task  # type: ignore[misc]

    await until(lambda: registry.warm.stats()["warm"] == 1)
    backend.fail_launches = 1  # the refill after the next hand-out fails once, then succeeds
    await registry.create_session(owner=ADMIN)
    await until(lambda: scrape_of(metrics)["kernel_gateway_kernel_start_failures_total"][()] == 1)
    await until(lambda: registry.warm.stats()["warm"] == 1, seconds=10)

    scrape = scrape_of(metrics)
    assert nonzero(scrape, "kernel_gateway_executions_total") == {
        (("kind", "session"), ("status", "ok")): 2,
        (("kind", "session"), ("status", "error")): 1,
        (("kind", "session"), ("status", "timeout")): 1,
        (("kind", "session"), ("status", "died")): 2,
        (("kind", "session"), ("status", "interrupted")): 1,
        (("kind", "stateless"), ("status", "ok")): 1,
    }
    assert nonzero(scrape, "kernel_gateway_kernel_deaths_total") == {
        (("reason", "exited"),): 1,
        (("reason", "out_of_memory"),): 1,
    }
    # Two revivals after the deaths, one restart on request.
    assert session.slot.restarts == 3
    assert scrape["kernel_gateway_kernel_restarts_total"][()] == 3
    assert value(scrape, "kernel_gateway_execution_duration_seconds_count", kind="session") == 7
    assert value(scrape, "kernel_gateway_execution_duration_seconds_count", kind="stateless") == 1
    # Cells whose kernel sent output: both prints, the error, and the two interrupted
    # sleeps (KeyboardInterrupt); the deaths only got the gateway's own events.
    assert value(scrape, "kernel_gateway_execution_first_output_seconds_count", kind="session") == 5
    started = registry.warm.kernels_started
    assert scrape["kernel_gateway_kernel_starts_total"][()] == started
    assert scrape["kernel_gateway_kernel_start_duration_seconds_count"][()] == started
    assert scrape["kernel_gateway_kernel_start_failures_total"][()] == 1
    assert scrape["kernel_gateway_sessions"][()] == 2
    assert scrape["kernel_gateway_pool_target_kernels"][()] == 1
    assert scrape["kernel_gateway_pool_warm_kernels"][()] == 1
    assert scrape["kernel_gateway_queued_executions"][()] == 0
    assert scrape["kernel_gateway_running_executions"][()] == 0


async def test_queue_and_running_gauges(lifecycle: tuple[Registry, FakeBackend, Metrics]) -> None:
    registry, _, metrics = lifecycle
    session = await registry.create_session(owner=ADMIN)
    first = session.submit("sleep 5", None)
    session.submit("print queued", None)
    await until(lambda: first.running)
    scrape = scrape_of(metrics)
    assert scrape["kernel_gateway_running_executions"][()] == 1
    assert scrape["kernel_gateway_queued_executions"][()] == 1
    await session.interrupt()
    await asyncio.wait_for(first.task, 5)  # type: ignore[arg-type]
