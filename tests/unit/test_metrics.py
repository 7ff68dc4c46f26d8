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
import zmq.asyncio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kernel_gateway.kernels.backends.base import RuntimeDir
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.metrics import Metrics
from kernel_gateway.sessions.gauges import RegistryGauges
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.settings import Settings
from tests.support.fake_kernel import FakeBackend, run, until

Labels = tuple[tuple[str, str], ...]


def samples(exposition: str) -> dict[str, dict[Labels, float]]:
    """Sample name -> sorted labels -> value."""
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(scrape: dict[str, dict[Labels, float]], name: str, **labels: str) -> float:
    return scrape[name][tuple(sorted(labels.items()))]


def nonzero(scrape: dict[str, dict[Labels, float]], name: str) -> dict[Labels, float]:
    return {labels: v for labels, v in scrape[name].items() if v}


@pytest.fixture
async def lifecycle(tmp_path: Path) -> AsyncIterator[tuple[Registry, FakeBackend, Metrics]]:
    settings = Settings(
        backend="local",
        pool_size=1,
        preload="",
        runtime_dir=tmp_path,
        interrupt_grace=0.2,
        kernel_start_timeout=5,
        restart_budget=5,
        restart_window=60,
    )
    runtime = RuntimeDir(tmp_path)
    runtime.open()
    backend = FakeBackend()
    context = zmq.asyncio.Context()
    metrics = Metrics()
    registry = Registry(settings, WarmPool(settings, backend, runtime, context, metrics), "i")
    registry.start()
    metrics.register(RegistryGauges(registry))
    try:
        yield registry, backend, metrics
    finally:
        await registry.close()
        await backend.close()
        context.destroy(linger=0)
        runtime.close()


def scrape_of(metrics: Metrics) -> dict[str, dict[Labels, float]]:
    return samples(generate_latest(metrics.registry).decode())


async def test_lifecycle_counts_are_exact(
    lifecycle: tuple[Registry, FakeBackend, Metrics],
) -> None:
    registry, backend, metrics = lifecycle
    session = await registry.create_session()
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
    _, stateless = await registry.run_stateless("print x", None, [])
    await stateless.task  # type: ignore[misc]

    await until(lambda: registry.warm.stats()["warm"] == 1)
    backend.fail_launches = 1  # the refill after the next hand-out fails once, then succeeds
    await registry.create_session()
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
    session = await registry.create_session()
    first = session.submit("sleep 5", None)
    session.submit("print queued", None)
    await until(lambda: first.running)
    scrape = scrape_of(metrics)
    assert scrape["kernel_gateway_running_executions"][()] == 1
    assert scrape["kernel_gateway_queued_executions"][()] == 1
    await session.interrupt()
    await asyncio.wait_for(first.task, 5)  # type: ignore[arg-type]
