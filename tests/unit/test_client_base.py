"""The client's layers above the transport, against httpx.MockTransport: no gateway needed.

Error classes chosen by the API's type, status fallbacks, transport errors mapped at one
boundary, event streams decoded by the one SSE decoder; sync and async alike.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from kernel_gateway import errors as server_errors
from kernel_gateway.client import (
    APIError,
    AsyncClient,
    BackendUnavailableError,
    BadGatewayError,
    BadRequestError,
    Client,
    ConflictError,
    ConnectFailed,
    Done,
    Execution,
    GoneError,
    KernelUnavailableError,
    NodeLostError,
    NodeUnavailableError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    SessionBusyError,
    SessionClosedError,
    SessionFailedError,
    SessionNotFoundError,
    ShuttingDownError,
    Stdout,
    StreamEnded,
    TransportError,
    UnavailableError,
)
from kernel_gateway.client.errors import BY_STATUS, BY_TYPE
from kernel_gateway.http.sse import encode
from kernel_gateway.types import Event

Handler = Callable[[httpx.Request], httpx.Response]


def error(status: int, kind: str, **headers: str) -> Handler:
    body = {"error": {"type": kind, "message": "nope"}}
    return lambda request: httpx.Response(status, json=body, headers=headers)


def sse(*events: Event, tail: bytes = b"") -> Handler:
    body = b": ping\n\n" + b"".join(encode(e) for e in events) + tail
    return lambda request: httpx.Response(
        200, content=body, headers={"content-type": "text/event-stream; charset=utf-8"}
    )


def sync_client(handler: Handler, reconnect: float = 0.3) -> Client:
    return Client("http://gw", transport=httpx.MockTransport(handler), reconnect_seconds=reconnect)


def async_client(handler: Handler, reconnect: float = 0.3) -> AsyncClient:
    return AsyncClient(
        "http://gw", transport=httpx.MockTransport(handler), reconnect_seconds=reconnect
    )


def run_both(
    handler: Handler, code: str = "x", reconnect: float = 0.3
) -> list[Execution | BaseException]:
    """`session.run(code)` through both clients: what each returned or raised."""
    outcomes: list[Execution | BaseException] = []
    with sync_client(handler, reconnect) as client:
        try:
            outcomes.append(client.session("s1").run(code))
        except Exception as exc:
            outcomes.append(exc)

    async def main() -> None:
        async with async_client(handler, reconnect) as client:
            gateway = handler
            if isinstance(gateway, Restarting):  # the same restart, seen by this client
                gateway.refusals, gateway.draining = gateway.initial
            try:
                outcomes.append(await (await client.session("s1")).run(code))
            except Exception as exc:
                outcomes.append(exc)

    asyncio.run(main())
    return outcomes


DONE = Event("done", {"status": "ok", "execution_count": 1, "duration_ms": 1.0, "restarted": False})


@pytest.mark.parametrize(
    ("status", "kind", "expected", "family"),
    [
        (409, "session_failed", SessionFailedError, ConflictError),
        (409, "session_busy", SessionBusyError, ConflictError),
        (409, "session_closed", SessionClosedError, ConflictError),
        (404, "session_not_found", SessionNotFoundError, NotFoundError),
        (403, "forbidden", PermissionDeniedError, APIError),
        (413, "payload_too_large", PayloadTooLargeError, BadRequestError),
        (503, "backend_unavailable", BackendUnavailableError, UnavailableError),
        (503, "kernel_unavailable", KernelUnavailableError, UnavailableError),
        (409, "something_new", ConflictError, APIError),  # unknown type: by status
        (418, "teapot", APIError, APIError),  # unknown status: by family
        (502, "bad_gateway", BadGatewayError, ServerError),
        (502, "proxy_error", ServerError, APIError),  # unknown 5xx type: by family
        (410, "node_lost", NodeLostError, GoneError),
        (503, "node_unavailable", NodeUnavailableError, ShuttingDownError),
    ],
)
def test_errors_are_chosen_by_type_then_status(
    status: int, kind: str, expected: type[APIError], family: type[APIError]
) -> None:
    for outcome in run_both(error(status, kind)):
        assert type(outcome) is expected
        assert isinstance(outcome, family)
        assert (outcome.status_code, outcome.type, outcome.message) == (status, kind, "nope")


def test_every_gateway_error_type_has_its_class_within_its_status_family() -> None:
    types = {
        cls.error_type: cls.status_code
        for cls in vars(server_errors).values()
        if isinstance(cls, type) and issubclass(cls, server_errors.GatewayError)
    }
    assert "backend_unavailable" in types and "session_failed" in types
    for kind, status in types.items():
        assert kind in BY_TYPE, kind
        family = BY_STATUS.get(status, ServerError if status >= 500 else APIError)
        assert issubclass(BY_TYPE[kind], family), (kind, status)


def test_retry_after_and_non_json_error_bodies() -> None:
    with sync_client(error(429, "too_many_sessions", **{"Retry-After": "2"})) as client:
        with pytest.raises(RateLimitError) as caught:
            client.create_session()
        assert caught.value.retry_after == 2.0
    proxy = sync_client(lambda request: httpx.Response(502, text="<html>Bad Gateway</html>"))
    with proxy as client, pytest.raises(ServerError) as failed:
        client.health()
    assert failed.value.type == "http_error" and "Bad Gateway" in failed.value.message


def test_transport_errors_are_mapped_at_the_boundary() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    for outcome in run_both(refuse):
        assert type(outcome) is ConnectFailed  # a TransportError: nothing was sent
        assert isinstance(outcome.__cause__, httpx.ConnectError)
    with sync_client(refuse) as client, pytest.raises(TransportError):
        client.request("GET", "/health")

    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("connection reset", request=request)

    for outcome in run_both(reset):
        assert type(outcome) is TransportError  # sent: never sent again


class Restarting:
    """A gateway that refuses connections, then drains (503 shutting_down), then answers."""

    def __init__(self, refusals: int, draining: int, answer: Handler) -> None:
        self.refusals, self.draining, self.answer = refusals, draining, answer
        self.initial = (refusals, draining)
        self.requests: list[tuple[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.refusals:
            self.refusals -= 1
            raise httpx.ConnectError("connection refused", request=request)
        self.requests.append((request.method, request.url.path))
        if self.draining:
            self.draining -= 1
            body = {"error": {"type": "shutting_down", "message": "restarting"}}
            return httpx.Response(503, json=body, headers={"Retry-After": "0.05"})
        return self.answer(request)


def test_calls_wait_out_a_gateway_restart_and_are_sent_once_it_answers() -> None:
    gateway = Restarting(3, 2, sse(Event("stdout", {"text": "hi"}), DONE))
    for outcome in run_both(gateway, "print('hi')", reconnect=5.0):
        assert isinstance(outcome, Execution) and outcome.stdout == "hi", outcome
    posts = [r for r in gateway.requests if r[0] == "POST"]
    assert len(posts) == 2 * 3  # per client: two refused as draining, then the one that ran
    health = Restarting(4, 1, lambda r: httpx.Response(200, json={"status": "ok"}))
    with sync_client(health, reconnect=5.0) as client:
        assert client.health() == {"status": "ok"}
        health.refusals = 2
        assert client.request("GET", "/health").json() == {"status": "ok"}


def test_a_gateway_down_for_longer_than_the_reconnect_time_is_an_error() -> None:
    gateway = Restarting(10**6, 0, sse(DONE))
    started = time.monotonic()
    with sync_client(gateway, reconnect=0.5) as client, pytest.raises(ConnectFailed):
        client.health()
    assert 0.3 < time.monotonic() - started < 3
    draining = Restarting(0, 10**6, sse(DONE))
    for outcome in run_both(draining):
        assert isinstance(outcome, ShuttingDownError) and outcome.retry_after == 0.05


def test_streams_decode_text_that_httpx_iter_lines_would_split() -> None:
    text = "a\u2028b\x85c\u2029\n"
    handler = sse(Event("stdout", {"text": text}), DONE)
    for outcome in run_both(handler):
        assert isinstance(outcome, Execution), outcome
        assert outcome.stdout == text
        assert outcome.ok


def test_a_stream_without_done_or_with_bad_json_is_a_protocol_error() -> None:
    for outcome in run_both(sse(Event("stdout", {"text": "1"}))):
        assert type(outcome) is StreamEnded and "done" in str(outcome)  # a ProtocolError
    for outcome in run_both(sse(tail=b"event: stdout\ndata: {not json\n\n")):
        assert isinstance(outcome, TransportError) and "not JSON" in str(outcome)


def test_events_after_done_and_unknown_events_are_ignored() -> None:
    handler = sse(Event("future", {"x": 1}), Event("stdout", {"text": "1"}), DONE, DONE)
    for outcome in run_both(handler):
        assert isinstance(outcome, Execution)
        assert [type(e) for e in outcome.events] == [Stdout, Done]


def test_requests_are_built_once_for_both_clients() -> None:
    seen: list[tuple[str, str, dict[str, str], Any]] = []

    def record(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content.startswith(b"{") else request.content
        seen.append((request.method, request.url.raw_path.decode(), dict(request.headers), body))
        if request.url.path.endswith("/execute"):
            return sse(DONE)(request)
        if request.method == "DELETE" or request.url.path.endswith("/restart"):
            return httpx.Response(204)
        return httpx.Response(200, json={"id": "s 1", "interrupted": True, "files": []})

    def sync_calls() -> None:
        with Client("http://gw", token="t", transport=httpx.MockTransport(record)) as client:
            session = client.session("s 1")
            session.run("1", timeout=5)
            client.run("2", files={"a.txt": b"hi"})
            assert session.interrupt() is True
            session.restart()
            session.upload("/d/a b.txt", b"raw")
            session.download("d/a b.txt")
            assert session.files() == []
            session.delete_file("a.txt")
            session.delete()

    async def async_calls() -> None:
        transport = httpx.MockTransport(record)
        async with AsyncClient("http://gw", token="t", transport=transport) as client:
            session = await client.session("s 1")
            await session.run("1", timeout=5)
            await client.run("2", files={"a.txt": b"hi"})
            assert await session.interrupt() is True
            await session.restart()
            await session.upload("/d/a b.txt", b"raw")
            await session.download("d/a b.txt")
            assert await session.files() == []
            await session.delete_file("a.txt")
            await session.delete()

    sync_calls()
    sync_seen, seen[:] = list(seen), []
    asyncio.run(async_calls())

    def shape(
        calls: list[tuple[str, str, dict[str, str], Any]],
    ) -> list[tuple[str, str, str | None, str | None, Any]]:
        return [(m, p, h.get("authorization"), h.get("accept"), b) for m, p, h, b in calls]

    assert shape(seen) == shape(sync_seen)
    events = "text/event-stream"
    stateless = {"code": "2", "files": [{"path": "a.txt", "data": "aGk="}]}
    assert shape(sync_seen) == [
        ("POST", "/sessions/s%201/execute", "Bearer t", events, {"code": "1", "timeout": 5}),
        ("POST", "/execute", "Bearer t", events, stateless),
        ("POST", "/sessions/s%201/interrupt", "Bearer t", "*/*", b""),
        ("POST", "/sessions/s%201/restart", "Bearer t", "*/*", b""),
        ("PUT", "/sessions/s%201/files/d/a%20b.txt", "Bearer t", "*/*", b"raw"),
        ("GET", "/sessions/s%201/files/d/a%20b.txt", "Bearer t", "*/*", b""),
        ("GET", "/sessions/s%201/files", "Bearer t", "*/*", b""),
        ("DELETE", "/sessions/s%201/files/a.txt", "Bearer t", "*/*", b""),
        ("DELETE", "/sessions/s%201", "Bearer t", "*/*", b""),
    ]  # fmt: skip


def test_callbacks_fire_as_events_arrive() -> None:
    handler = sse(Event("stdout", {"text": "1\n"}), Event("stderr", {"text": "w"}), DONE)
    lines: list[str] = []
    events: list[object] = []
    with sync_client(handler) as client:
        execution = client.run("x", on_stdout=lines.append, on_event=events.append)
    assert lines == ["1\n"] and len(events) == 3 and execution.stderr == "w"
    with sync_client(handler) as client, pytest.raises(TypeError):
        client.run("x", on_stdot=print)  # a misspelt callback is refused


def test_session_context_deletes_and_tolerates_a_vanished_session() -> None:
    deleted: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(201, json={"id": "new"})
        deleted.append(request.url.path)
        return error(404, "session_not_found")(request)

    with sync_client(handler) as client, client.session() as session:
        assert session.id == "new"

    async def main() -> None:
        async with async_client(handler) as client, client.session() as session:
            assert session.id == "new"

    asyncio.run(main())
    assert deleted == ["/sessions/new", "/sessions/new"]
