"""Prometheus metrics: a known workload, then a scrape read with prometheus_client's parser.

The lifecycle counts (deaths by reason, restarts, executions by status) are
checked on the fake backend, where every death is scripted; the HTTP counts
(requests by route template, events and bytes sent, stateless rejections) on
a real gateway with real kernels, against what the test itself sent and read.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kernel_gateway import __version__
from tests.support.api import parse_sse
from tests.support.metrics import nonzero, samples, value
from tests.support.server import ServerFactory, ServerThread

# -- the lifecycle, on the fake backend -------------------------------------------------------


# -- over HTTP, with real kernels -------------------------------------------------------------

TOKEN = "metrics-token"


@pytest.fixture(scope="module")
def server(servers: ServerFactory) -> ServerThread:
    return servers("local", preload="", max_stateless=1, token=TOKEN)


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
