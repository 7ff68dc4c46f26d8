"""Prometheus metrics: a known workload, then a scrape read with prometheus_client's parser.

The lifecycle counts (deaths by reason, restarts, executions by status) are
checked on the fake backend, where every death is scripted; the HTTP counts
(requests by route template, events and bytes sent, stateless rejections) on
a real gateway with real kernels, against what the test itself sent and read.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq.asyncio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kernel_gateway import __version__
from kernel_gateway.kernels.backends.base import RuntimeDir
from kernel_gateway.kernels.pools.warm import WarmPool
from kernel_gateway.metrics import Metrics
from kernel_gateway.sessions.gauges import RegistryGauges
from kernel_gateway.sessions.registry import Registry
from kernel_gateway.settings import Settings

from .conftest import settings_for
from .fake_kernel import FakeBackend
from .helpers import ServerThread, parse_sse
from .test_lifecycle import run, until

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


# -- the lifecycle, on the fake backend -------------------------------------------------------


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


# -- over HTTP, with real kernels -------------------------------------------------------------

TOKEN = "metrics-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    settings = settings_for(
        "local", tmp_path_factory.mktemp("metrics"), preload="", max_stateless=1, token=TOKEN
    )
    with ServerThread(settings) as s:
        yield s


class Recorder:
    """An httpx client that remembers (method, route template, status) of each request."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(
            base_url=url, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        self.sent: Counter[tuple[str, str, str]] = Counter()
        self.lock = threading.Lock()

    def __call__(self, method: str, route: str, url: str, **kwargs: Any) -> httpx.Response:
        response = self.http.request(method, url, **kwargs)
        with self.lock:
            self.sent[(method, route, str(response.status_code))] += 1
        return response


@pytest.fixture
def call(server: ServerThread) -> Iterator[Recorder]:
    recorder = Recorder(server.url)
    with recorder.http:
        yield recorder


def test_a_scrape_after_a_known_workload(server: ServerThread, call: Recorder) -> None:
    sse_bytes = json_bytes = 0
    events: Counter[tuple[str, str]] = Counter()

    call("GET", "/health", "/health")
    sid = call("POST", "/sessions", "/sessions").json()["id"]
    code = {"code": "print('a', flush=True)\nimport time; time.sleep(0.2)\nprint('b')\n7"}
    response = call("POST", "/sessions/{session_id}/execute", f"/sessions/{sid}/execute", json=code)
    assert response.headers["content-type"].startswith("text/event-stream")
    sse_bytes += len(response.content)
    events.update((name, "sse") for name, _ in parse_sse([response.content]))
    response = call(
        "POST",
        "/sessions/{session_id}/execute",
        f"/sessions/{sid}/execute",
        json={"code": "1/0"},
        headers={"Accept": "application/json"},
    )
    json_bytes += len(response.content)
    events.update((e["event"], "json") for e in response.json()["events"])
    call("GET", "/sessions/{session_id}", f"/sessions/{sid}")
    call("GET", "/sessions/{session_id}", "/sessions/no-such-session")
    call("GET", "unmatched", f"/no/route/{sid}")
    call(
        "PUT", "/sessions/{session_id}/files/{path}", f"/sessions/{sid}/files/d/x.txt", content=b"1"
    )
    call("PATCH", "/sessions", "/sessions")

    slow: list[httpx.Response] = []

    def run_slow() -> None:
        slow.append(
            call(
                "POST",
                "/execute",
                "/execute",
                json={"code": "import time; time.sleep(2)"},
                headers={"Accept": "application/json"},
            )
        )

    thread = threading.Thread(target=run_slow)
    thread.start()
    deadline = time.monotonic() + 30
    while call("GET", "/health", "/health").json()["pool"]["stateless"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    refused = call("POST", "/execute", "/execute", json={"code": "1"})
    assert refused.status_code == 429
    thread.join()
    json_bytes += len(slow[0].content)
    events.update((e["event"], "json") for e in slow[0].json()["events"])
    call("DELETE", "/sessions/{session_id}", f"/sessions/{sid}")
    unauthorized = httpx.get(server.url + "/metrics")
    assert unauthorized.status_code == 401
    call.sent[("GET", "/metrics", "401")] += 1

    response = call.http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    scrape = samples(response.text)

    requests = {
        (dict(labels)["method"], dict(labels)["route"], dict(labels)["status"]): v
        for labels, v in nonzero(scrape, "kernel_gateway_http_requests_total").items()
    }
    assert requests == dict(call.sent)
    assert nonzero(scrape, "kernel_gateway_executions_total") == {
        (("kind", "session"), ("status", "ok")): 1,
        (("kind", "session"), ("status", "error")): 1,
        (("kind", "stateless"), ("status", "ok")): 1,
    }
    sent = {
        (dict(labels)["event"], dict(labels)["format"]): v
        for labels, v in nonzero(scrape, "kernel_gateway_events_sent_total").items()
    }
    assert sent == dict(events)
    assert value(scrape, "kernel_gateway_event_bytes_sent_total", format="sse") == sse_bytes
    assert value(scrape, "kernel_gateway_event_bytes_sent_total", format="json") == json_bytes
    assert scrape["kernel_gateway_stateless_requests_total"][()] == 2
    assert nonzero(scrape, "kernel_gateway_stateless_rejections_total") == {
        (("reason", "capacity"),): 1
    }
    assert nonzero(scrape, "kernel_gateway_session_rejections_total") == {}
    assert scrape["kernel_gateway_sessions"][()] == 0
    assert scrape["kernel_gateway_stateless_executions"][()] == 0
    assert scrape["kernel_gateway_pool_target_kernels"][()] == 1
    assert value(scrape, "kernel_gateway_info", version=__version__, backend="local") == 1
    assert value(scrape, "kernel_gateway_execution_first_output_seconds_count", kind="session") == 2
    # No raw id ever becomes a label value.
    assert sid not in response.text


def test_openmetrics_when_asked(server: ServerThread) -> None:
    response = httpx.get(
        server.url + "/metrics",
        headers={
            "Authorization": f"Bearer {TOKEN}",
            "Accept": "application/openmetrics-text; version=1.0.0",
        },
    )
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")
