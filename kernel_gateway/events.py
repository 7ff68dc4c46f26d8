"""Jupyter IOPub messages -> the events clients see. Pure functions, no I/O.

    stream (stdout/stderr)      -> stdout / stderr   {"text"}
    display_data                -> display           {"data", "metadata", "display_id",
                                                      "update": false}
    update_display_data         -> display           {... "update": true}
    execute_result              -> result            {"data", "metadata", "execution_count"}
    clear_output                -> clear             {"wait"}
    error                       -> error             {"ename", "evalue", "traceback"}

`status`, `execute_input` and comm traffic drive the execution itself and are
not forwarded. Output caps live here too, so one execution's events stay
bounded however much the code prints.
"""

from __future__ import annotations

from typing import Any

from .types import JSON, DoneStatus, Event, Message

TRUNCATION_MARKER = "\n[output truncated: this execution exceeded {limit} bytes of output]\n"


def translate(msg: Message) -> Event | None:
    """The client event for one IOPub message, or None for protocol-internal traffic."""
    msg_type = msg["header"]["msg_type"]
    content = msg["content"]
    if msg_type == "stream":
        name = "stderr" if content.get("name") == "stderr" else "stdout"
        return Event(name, {"text": str(content.get("text", ""))})
    if msg_type == "display_data" or msg_type == "update_display_data":
        transient = content.get("transient") or {}
        return Event(
            "display",
            {
                "data": content.get("data", {}),
                "metadata": content.get("metadata", {}),
                "display_id": transient.get("display_id"),
                "update": msg_type == "update_display_data",
            },
        )
    if msg_type == "execute_result":
        return Event(
            "result",
            {
                "data": content.get("data", {}),
                "metadata": content.get("metadata", {}),
                "execution_count": content.get("execution_count"),
            },
        )
    if msg_type == "clear_output":
        return Event("clear", {"wait": bool(content.get("wait", False))})
    if msg_type == "error":
        return Event(
            "error",
            {
                "ename": str(content.get("ename", "")),
                "evalue": str(content.get("evalue", "")),
                "traceback": [str(line) for line in content.get("traceback", [])],
            },
        )
    return None


def is_idle(msg: Message) -> bool:
    return bool(
        msg["header"]["msg_type"] == "status" and msg["content"].get("execution_state") == "idle"
    )


def error_event(ename: str, evalue: str) -> Event:
    """An error the gateway itself reports (timeout, kernel death), shaped like a kernel's."""
    return Event("error", {"ename": ename, "evalue": evalue, "traceback": []})


def done_event(
    status: DoneStatus,
    execution_count: int | None,
    duration_ms: float,
    restarted: bool,
    **extra: Any,
) -> Event:
    data: JSON = {
        "status": status,
        "execution_count": execution_count,
        "duration_ms": round(duration_ms, 3),
        "restarted": restarted,
    }
    data.update(extra)
    return Event("done", data)


class OutputLimiter:
    """Caps everything one execution may send, so no cell can exhaust gateway memory.

    - stream text past `max_output_bytes` is cut at the limit, with a visible marker;
    - a display or result bigger than `max_display_bytes` becomes a short note;
    - rich output (display, result, error) past `max_rich_bytes` in total, or any
      output past `max_events` events, is dropped after one marker.
    """

    def __init__(
        self,
        max_output_bytes: int,
        max_display_bytes: int,
        max_rich_bytes: int = 64 * 1024 * 1024,
        max_events: int = 10_000,
    ) -> None:
        self.max_output_bytes = max_output_bytes
        self.max_display_bytes = max_display_bytes
        self.max_rich_bytes = max_rich_bytes
        self.max_events = max_events
        self.output_bytes = 0
        self.rich_bytes = 0
        self.events = 0
        self.text_truncated = False
        self.rich_truncated = False

    @property
    def truncated(self) -> bool:
        return self.text_truncated or self.rich_truncated

    def limit(self, event: Event) -> Event | None:
        if self.rich_truncated:
            return None
        if self.events >= self.max_events:
            return self._stop(f"more than {self.max_events} output events")
        if event.name in ("stdout", "stderr"):
            limited = self._limit_text(event)
        elif event.name in ("display", "result", "error"):
            limited = self._limit_rich(event)
        else:
            limited = event
        if limited is not None:
            self.events += 1
        return limited

    def _stop(self, why: str) -> Event:
        self.rich_truncated = True
        return Event("stderr", {"text": f"\n[output truncated: this execution produced {why}]\n"})

    def _limit_text(self, event: Event) -> Event | None:
        if self.text_truncated:
            return None
        text: str = event.data["text"]
        size = len(text.encode("utf-8", "surrogatepass"))
        if self.output_bytes + size <= self.max_output_bytes:
            self.output_bytes += size
            return event
        room = self.max_output_bytes - self.output_bytes
        head = text.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
        self.output_bytes = self.max_output_bytes
        self.text_truncated = True
        marker = TRUNCATION_MARKER.format(limit=self.max_output_bytes)
        return Event(event.name, {"text": head + marker})

    def _limit_rich(self, event: Event) -> Event:
        size = _rough_size(event.data)
        if size > self.max_display_bytes and event.name != "error":
            note = (
                f"[output omitted: this {event.name} was {size} bytes, "
                f"over the {self.max_display_bytes}-byte limit]"
            )
            event = Event(event.name, {**event.data, "data": {"text/plain": note}, "metadata": {}})
            size = len(note)
        self.rich_bytes += size
        if self.rich_bytes > self.max_rich_bytes:
            return self._stop(f"more than {self.max_rich_bytes} bytes of rich output")
        return event


def _rough_size(value: Any) -> int:
    """Bytes a JSON value will take, near enough, without serializing it."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(k)) + _rough_size(v) for k, v in value.items()) + 2
    if isinstance(value, list | tuple):
        return sum(_rough_size(v) for v in value) + 2
    return 8
