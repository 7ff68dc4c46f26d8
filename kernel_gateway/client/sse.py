"""Decoding server-sent events, by the WHATWG rules: the one decoder the client, tests and
bench share.

    decoder = SSEDecoder()
    for chunk in response.iter_bytes():
        for event in decoder.feed(chunk):
            print(event.event, event.json(), event.id)

The decoder splits lines itself, on CR, LF and CRLF only: httpx's `iter_lines()`
follows `str.splitlines()` and would also split a JSON string holding U+2028, U+2029
or U+0085, which the gateway sends unescaped. It decodes UTF-8 itself too, replacing
bad bytes, whatever charset the response declares. Comments (`:`) are skipped;
several `data:` lines are joined with newlines; `id:` sets the last event id that
every later event carries (a resumed stream sends it back as `Last-Event-ID`);
`retry:` is recorded and otherwise ignored. An event not ended by a blank line when
the stream ends is discarded, as the specification says.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched event: its name, its data, and the last event id seen so far."""

    event: str = "message"
    data: str = ""
    id: str = ""
    retry: int | None = None

    def json(self) -> Any:
        return json.loads(self.data)


class SSEDecoder:
    """Incremental decoder: `feed(bytes)` for a raw body, or `decode(line)` for split lines."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial: list[str] = []  # text after the last line terminator
        self._held_cr = False
        self._first_line = True
        self._event = ""
        self._data: list[str] = []
        self._retry: int | None = None
        self.last_event_id = ""

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """The events completed by this chunk of the body (lines may span chunks)."""
        return self.feed_text(self._utf8.decode(chunk))

    def feed_text(self, text: str) -> list[ServerSentEvent]:
        """`feed` for text already decoded."""
        if self._held_cr:
            text, self._held_cr = "\r" + text, False
        if text.endswith("\r"):  # perhaps half of a CRLF: wait for the next chunk
            text, self._held_cr = text[:-1], True
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if "\n" not in text:
            if text:
                self._partial.append(text)  # a list: a 16 MiB line in 64 KiB chunks stays linear
            return []
        lines = text.split("\n")
        if self._partial:
            lines[0] = "".join(self._partial) + lines[0]
        last = lines.pop()
        self._partial = [last] if last else []
        return [event for line in lines if (event := self.decode(line)) is not None]

    def decode(self, line: str) -> ServerSentEvent | None:
        """Process one line (without its terminator); the event a blank line completes."""
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        if not self._data:
            self._event = ""
            return None
        event = ServerSentEvent(
            self._event or "message", "\n".join(self._data), self.last_event_id, self._retry
        )
        self._event, self._data = "", []
        return event


def iter_events(chunks: Iterable[bytes]) -> Iterator[ServerSentEvent]:
    """Events from a body read in chunks, such as httpx's `response.iter_bytes()`."""
    decoder = SSEDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)


async def aiter_events(chunks: AsyncIterable[bytes]) -> AsyncIterator[ServerSentEvent]:
    """Events from `response.aiter_bytes()`."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
