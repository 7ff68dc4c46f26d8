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

Events are made with `event(name, data)`: at run time the `Event` tuple itself, to mypy a
function that takes each name with its own `data` shape (`shapes/events.py`), so a missing
or misspelled field, or data under the wrong name, fails the type check at no cost per event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

from kernel_gateway.shapes.events import (
    ClearData,
    DisplayData,
    DoneData,
    ErrorData,
    FileData,
    ResultData,
    ResumedData,
    TextData,
)
from kernel_gateway.types import JSON, Event, EventName, Message

if TYPE_CHECKING:

    @overload
    def event(name: Literal["stdout", "stderr"], data: TextData) -> Event: ...
    @overload
    def event(name: Literal["display"], data: DisplayData) -> Event: ...
    @overload
    def event(name: Literal["result"], data: ResultData) -> Event: ...
    @overload
    def event(name: Literal["clear"], data: ClearData) -> Event: ...
    @overload
    def event(name: Literal["error"], data: ErrorData) -> Event: ...
    @overload
    def event(name: Literal["file"], data: FileData) -> Event: ...
    @overload
    def event(name: Literal["resumed"], data: ResumedData) -> Event: ...
    @overload
    def event(name: Literal["done"], data: DoneData) -> Event: ...
    def event(name: EventName, data: Any) -> Event:
        """An event whose `data` has its name's shape (type-checked; see above)."""
        return Event(name, data)

else:
    event = Event

TRUNCATION_MARKER = "\n[output truncated: this execution exceeded {limit} bytes of output]\n"


class MalformedMessage(ValueError):
    """A kernel message whose content does not have the shape the protocol gives it.

    Code in a kernel can sign and publish any message, so shapes are checked, never
    trusted; the kernel's reader drops (and counts) such a message and carries on.
    """


def _text(content: JSON, key: str) -> str:
    value = content.get(key, "")
    if not isinstance(value, str):
        raise MalformedMessage(f"{key!r} is {type(value).__name__}, not a string")
    return value


def _mapping(content: JSON, key: str) -> JSON:
    value = content.get(key) or {}
    if not isinstance(value, dict):
        raise MalformedMessage(f"{key!r} is {type(value).__name__}, not an object")
    return value


def _count(content: JSON) -> int | None:
    value = content.get("execution_count")
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise MalformedMessage("'execution_count' is not an integer")


def translate(msg: Message) -> Event | None:
    """The client event for one IOPub message, or None for protocol-internal traffic.

    Raises MalformedMessage when the content has the wrong shape.
    """
    msg_type = msg["header"]["msg_type"]
    content = msg["content"]
    if not isinstance(content, dict):
        raise MalformedMessage("content is not an object")
    if msg_type == "stream":
        name: Literal["stdout", "stderr"] = (
            "stderr" if content.get("name") == "stderr" else "stdout"
        )
        return event(name, {"text": _text(content, "text")})
    if msg_type == "display_data" or msg_type == "update_display_data":
        display_id = _mapping(content, "transient").get("display_id")
        if display_id is not None and not isinstance(display_id, str):
            raise MalformedMessage("'display_id' is not a string")
        return event(
            "display",
            {
                "data": _mapping(content, "data"),
                "metadata": _mapping(content, "metadata"),
                "display_id": display_id,
                "update": msg_type == "update_display_data",
            },
        )
    if msg_type == "execute_result":
        return event(
            "result",
            {
                "data": _mapping(content, "data"),
                "metadata": _mapping(content, "metadata"),
                "execution_count": _count(content),
            },
        )
    if msg_type == "clear_output":
        return event("clear", {"wait": bool(content.get("wait", False))})
    if msg_type == "error":
        traceback = content.get("traceback") or []
        if not isinstance(traceback, list):
            raise MalformedMessage("'traceback' is not a list")
        ename, evalue = str(content.get("ename", "")), str(content.get("evalue", ""))
        if not ename:
            # bash_kernel's failed command: no name, the exit status as the value.
            ename, evalue = (
                ("ExitStatus", f"exit status {evalue}")
                if evalue.isdigit()
                else (
                    "Error",
                    evalue,
                )
            )
        return event(
            "error",
            {"ename": ename, "evalue": evalue, "traceback": [str(line) for line in traceback]},
        )
    return None


def is_idle(msg: Message) -> bool:
    content = msg["content"]
    return bool(
        msg["header"]["msg_type"] == "status"
        and isinstance(content, dict)
        and content.get("execution_state") == "idle"
    )


def input_count(msg: Message) -> int | None:
    """The execution count an `execute_input` message announces, else None."""
    if msg["header"]["msg_type"] != "execute_input" or not isinstance(msg["content"], dict):
        return None
    return _count(msg["content"])


@dataclass(frozen=True)
class ExecuteReply:
    """What the shell's `execute_reply` says about a finished cell."""

    status: str
    """ok, error or aborted."""
    execution_count: int | None
    exit_requested: bool
    """The cell called exit(): the frontend (the gateway) should end the kernel."""


def parse_reply(msg: Message) -> ExecuteReply:
    content = msg["content"]
    if not isinstance(content, dict):
        raise MalformedMessage("content is not an object")
    payloads = content.get("payload")
    if payloads is None:
        payloads = []
    if not isinstance(payloads, list):
        raise MalformedMessage("'payload' is not a list")
    return ExecuteReply(
        status=str(content.get("status", "error")),
        execution_count=_count(content),
        exit_requested=any(isinstance(p, dict) and p.get("source") == "ask_exit" for p in payloads),
    )


def error_event(ename: str, evalue: str) -> Event:
    """An error the gateway itself reports (timeout, kernel death), shaped like a kernel's."""
    return event("error", {"ename": ename, "evalue": evalue, "traceback": []})


MAX_EVENTS = 10_000
"""Output events one execution may produce (past it, one marker, then nothing)."""


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
        max_events: int = MAX_EVENTS,
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
        return event("stderr", {"text": f"\n[output truncated: this execution produced {why}]\n"})

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
        size = rough_size(event.data)
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


def rough_size(value: Any) -> int:
    """Bytes a JSON value will take, near enough, without serializing it."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(k)) + rough_size(v) for k, v in value.items()) + 2
    if isinstance(value, list | tuple):
        return sum(rough_size(v) for v in value) + 2
    return 8
