"""Executing over HTTP: an SSE reader that timestamps events, and one-call `execute`."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from kernel_gateway.client.sse import SSEDecoder


@dataclass
class Stream:
    """Events of one execution, each with the monotonic time it arrived."""

    events: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    status_code: int = 0

    def named(self, name: str) -> list[dict[str, Any]]:
        return [data for n, data, _ in self.events if n == name]

    @property
    def done(self) -> dict[str, Any]:
        assert self.events and self.events[-1][0] == "done", self.events
        return self.events[-1][1]

    @property
    def stdout(self) -> str:
        return "".join(d["text"] for d in self.named("stdout"))

    @property
    def names(self) -> list[str]:
        return [n for n, _, _ in self.events]


def parse_sse(chunks: Iterable[bytes] | Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, data) of each event, decoded by the client's own SSE decoder.

    Pass raw body chunks (`response.iter_bytes()`): the decoder splits lines by the SSE
    rules. Lines already split (`iter_lines()`) are accepted too, but httpx splits them
    on U+2028 and the like as well, which breaks JSON holding those characters.
    """
    decoder = SSEDecoder()
    for chunk in chunks:
        if isinstance(chunk, bytes):
            events = decoder.feed(chunk)
        else:
            event = decoder.decode(chunk)
            events = [event] if event is not None else []
        for event in events:
            yield event.event, event.json()


def execute(
    client: httpx.Client, session_id: str, code: str, timeout: float | None = None
) -> Stream:
    body: dict[str, Any] = {"code": code}
    if timeout is not None:
        body["timeout"] = timeout
    stream = Stream()
    with client.stream("POST", f"/sessions/{session_id}/execute", json=body) as response:
        stream.status_code = response.status_code
        if response.status_code != 200:
            response.read()
            raise AssertionError(f"{response.status_code}: {response.text}")
        assert response.headers["content-type"].startswith("text/event-stream")
        for name, data in parse_sse(response.iter_bytes()):
            stream.events.append((name, data, time.monotonic()))
    return stream


def collected(
    client: httpx.Client, path: str, body: dict[str, Any], timeout: float | None = None
) -> dict[str, Any]:
    """POST a cell to `path` (`/execute` or a session's) asking for the collected JSON
    document; it must be answered 200."""
    headers = {"Accept": "application/json"}
    if timeout is None:
        response = client.post(path, json=body, headers=headers)
    else:
        response = client.post(path, json=body, headers=headers, timeout=timeout)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document
