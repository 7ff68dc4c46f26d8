"""Events on the wire: server-sent events, or one collected JSON document.

Each event is an `id:` line (increasing within the session: what a client
sends back as `Last-Event-ID` to resume), one `event:` line and one `data:`
line of compact JSON. JSON escapes every CR and LF, so nothing the code prints
can forge a frame.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from kernel_gateway.types import JSON, Event


def dumps(data: Any) -> bytes:
    """Compact UTF-8 JSON; text with lone surrogates falls back to ASCII escapes."""
    try:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


def encode(event: Event, event_id: int | None = None) -> bytes:
    head = b"" if event_id is None else b"id: %d\n" % event_id
    return head + b"event: " + event.name.encode() + b"\ndata: " + dumps(event.data) + b"\n\n"


async def collect(events: AsyncIterator[Event]) -> JSON:
    """All events of one execution as one document, with the text streams joined."""
    collected: list[JSON] = []
    stdout: list[str] = []
    stderr: list[str] = []
    error: JSON | None = None
    done: JSON = {}
    async for event in events:
        collected.append({"event": event.name, "data": event.data})
        if event.name == "stdout":
            stdout.append(event.data["text"])
        elif event.name == "stderr":
            stderr.append(event.data["text"])
        elif event.name == "error":
            error = event.data
        elif event.name == "done":
            done = event.data
    return {
        "status": done.get("status"),
        "stdout": "".join(stdout),
        "stderr": "".join(stderr),
        "error": error,
        "done": done,
        "events": collected,
    }
