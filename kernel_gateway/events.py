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
    """Caps the text and rich output of one execution.

    Stream text past `max_output_bytes` is cut at the limit and a visible marker
    is appended once; a display or result bigger than `max_display_bytes` is
    replaced by a short text/plain note saying so.
    """

    def __init__(self, max_output_bytes: int, max_display_bytes: int) -> None:
        self.max_output_bytes = max_output_bytes
        self.max_display_bytes = max_display_bytes
        self.output_bytes = 0
        self.truncated = False

    def limit(self, event: Event) -> Event | None:
        if event.name in ("stdout", "stderr"):
            return self._limit_text(event)
        if event.name in ("display", "result"):
            return self._limit_rich(event)
        return event

    def _limit_text(self, event: Event) -> Event | None:
        if self.truncated:
            return None
        text: str = event.data["text"]
        size = len(text.encode("utf-8", "surrogatepass"))
        if self.output_bytes + size <= self.max_output_bytes:
            self.output_bytes += size
            return event
        room = self.max_output_bytes - self.output_bytes
        head = text.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
        self.output_bytes = self.max_output_bytes
        self.truncated = True
        marker = TRUNCATION_MARKER.format(limit=self.max_output_bytes)
        return Event(event.name, {"text": head + marker})

    def _limit_rich(self, event: Event) -> Event:
        data = event.data["data"]
        size = sum(len(v) if isinstance(v, str) else len(str(v)) for v in data.values())
        if size <= self.max_display_bytes:
            return event
        note = (
            f"[output omitted: this {event.name} was {size} bytes, "
            f"over the {self.max_display_bytes}-byte limit]"
        )
        return Event(event.name, {**event.data, "data": {"text/plain": note}, "metadata": {}})
