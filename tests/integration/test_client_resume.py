"""The Python clients resume a broken stream by themselves, from the last event id they saw.

A transport around httpx's real one cuts each event stream after some bytes (an
`httpx.ReadError`, as a dropped connection gives), against a real gateway.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from kernel_gateway.client import AsyncClient, Client, TransportError
from tests.support.server import ServerThread

CELL = (
    "import time\n"
    "for i in range(300):\n"
    "    print(f'line {i}', flush=True)\n"
    "    if i % 20 == 0:\n"
    "        time.sleep(0.02)\n"
)
EXPECTED = "".join(f"line {i}\n" for i in range(300))


class Cuts:
    """Which responses to cut (the first `cuts` event streams), and every request seen."""

    def __init__(self, cuts: int, budget: int) -> None:
        self.cuts, self.budget = cuts, budget
        self.requests: list[tuple[str, str, str | None]] = []

    def cut(self, request: httpx.Request, response: httpx.Response, stream: Any) -> httpx.Response:
        self.requests.append(
            (request.method, request.url.path, request.headers.get("last-event-id"))
        )
        streaming = response.headers.get("content-type", "").startswith("text/event-stream")
        if not (self.cuts and streaming):
            return response
        self.cuts -= 1
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=stream(response.stream, self.budget),
            extensions=response.extensions,
        )


class _CutStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, budget: int) -> None:
        self._inner, self._budget = inner, budget

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            if len(chunk) >= self._budget:
                yield chunk[: self._budget]
                raise httpx.ReadError("connection cut by the test")
            self._budget -= len(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class CuttingTransport(httpx.BaseTransport):
    """Cuts the first `cuts` event streams after `budget` bytes each."""

    def __init__(self, cuts: int, budget: int = 1500) -> None:
        self._inner = httpx.HTTPTransport()
        self.counter = Cuts(cuts, budget)
        self.requests = self.counter.requests

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.counter.cut(request, self._inner.handle_request(request), _CutStream)

    def close(self) -> None:
        self._inner.close()


class _AsyncCutStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, budget: int) -> None:
        self._inner, self._budget = inner, budget

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            if len(chunk) >= self._budget:
                yield chunk[: self._budget]
                raise httpx.ReadError("connection cut by the test")
            self._budget -= len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class AsyncCuttingTransport(httpx.AsyncBaseTransport):
    def __init__(self, cuts: int, budget: int = 1500) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.counter = Cuts(cuts, budget)
        self.requests = self.counter.requests

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        return self.counter.cut(request, response, _AsyncCutStream)

    async def aclose(self) -> None:
        await self._inner.aclose()


def test_the_sync_client_resumes_a_cut_stream(gateway: ServerThread) -> None:
    transport = CuttingTransport(cuts=6)
    with Client(gateway.url, transport=transport) as client, client.session() as session:
        run = session.run(CELL)
    assert run.status == "ok"
    assert run.stdout == EXPECTED  # every line once, in order
    resumed = [r for r in transport.requests if r[0] == "GET" and "/executions/" in r[1]]
    assert len(resumed) == 6
    assert all(last_id and last_id.isdecimal() for _, _, last_id in resumed)


async def test_the_async_client_resumes_a_cut_stream(gateway: ServerThread) -> None:
    transport = AsyncCuttingTransport(cuts=6)
    async with AsyncClient(gateway.url, transport=transport) as client:
        async with client.session() as session:
            run = await session.run(CELL)
    assert run.status == "ok" and run.stdout == EXPECTED
    assert sum(1 for r in transport.requests if r[0] == "GET" and "/events" in r[1]) == 6


def test_a_stream_that_keeps_breaking_is_given_up_after_the_retries(gateway: ServerThread) -> None:
    transport = CuttingTransport(cuts=100, budget=1)  # no connection brings a whole event
    with Client(gateway.url, transport=transport, resume_retries=2) as client:
        with client.session() as session:
            with pytest.raises(TransportError):
                session.run(CELL)
    assert sum(1 for r in transport.requests if r[0] == "GET" and "/events" in r[1]) == 2


def test_a_stateless_stream_is_never_resumed_or_sent_again(gateway: ServerThread) -> None:
    transport = CuttingTransport(cuts=1)
    with Client(gateway.url, transport=transport) as client:
        with pytest.raises(TransportError):
            client.run(CELL)
    assert [m for m, _, _ in transport.requests] == ["POST"]
