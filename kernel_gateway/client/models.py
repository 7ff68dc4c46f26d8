"""What an execution produces, as typed objects: one class per event, and `Execution`,
everything one cell produced, collected; a chat turn's own events, and `ChatReply`, a turn
collected.

Pure data: no I/O here, so the sync and async clients share all of it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Stdout:
    text: str


@dataclass(frozen=True)
class Stderr:
    text: str


@dataclass(frozen=True)
class Display:
    data: dict[str, Any]
    metadata: dict[str, Any]
    display_id: str | None
    update: bool

    @property
    def png(self) -> bytes | None:
        value = self.data.get("image/png")
        return base64.b64decode(value) if isinstance(value, str) else None


@dataclass(frozen=True)
class Result:
    data: dict[str, Any]
    metadata: dict[str, Any]
    execution_count: int | None

    @property
    def text(self) -> str:
        return str(self.data.get("text/plain", ""))


@dataclass(frozen=True)
class Clear:
    wait: bool


@dataclass(frozen=True)
class Error:
    ename: str
    evalue: str
    traceback: list[str]


@dataclass(frozen=True)
class File:
    path: str
    size: int
    mime: str
    url: str | None
    data: bytes | None = None


@dataclass(frozen=True)
class Lost:
    """A name a hibernated session's snapshot could not keep, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class Resumed:
    """The session was hibernated and resumed for this cell: what did not come back."""

    lost: list[Lost]
    hibernated_seconds: float
    resume_ms: float


@dataclass(frozen=True)
class Done:
    status: str
    execution_count: int | None
    duration_ms: float
    restarted: bool
    reason: str | None = None
    truncated: bool = False
    resumed: Resumed | None = None
    """Set when the session resumed from hibernation for this cell."""


Event = Resumed | Stdout | Stderr | Display | Result | Clear | Error | File | Done


def _resumed(data: dict[str, Any]) -> Resumed:
    return Resumed(
        [Lost(str(x["name"]), str(x["reason"])) for x in data["lost"]],
        float(data["hibernated_seconds"]),
        float(data["resume_ms"]),
    )


def event_from(name: str, data: dict[str, Any]) -> Event | None:
    """One SSE event as a typed object; None for event names this client does not know."""
    if name == "stdout":
        return Stdout(data["text"])
    if name == "stderr":
        return Stderr(data["text"])
    if name == "display":
        return Display(data["data"], data["metadata"], data.get("display_id"), data["update"])
    if name == "result":
        return Result(data["data"], data["metadata"], data.get("execution_count"))
    if name == "clear":
        return Clear(bool(data["wait"]))
    if name == "error":
        return Error(data["ename"], data["evalue"], list(data["traceback"]))
    if name == "file":
        raw = data.get("data")
        return File(
            data["path"],
            data["size"],
            data["mime"],
            data.get("url"),
            base64.b64decode(raw) if raw else None,
        )
    if name == "done":
        return Done(
            data["status"],
            data.get("execution_count"),
            data["duration_ms"],
            data["restarted"],
            data.get("reason"),
            bool(data.get("truncated", False)),
            _resumed(data["resumed"]) if data.get("resumed") else None,
        )
    if name == "resumed":
        return _resumed(data)
    return None


# -- executions --------------------------------------------------------------------------------


@dataclass
class Callbacks:
    on_stdout: Callable[[str], object] | None = None
    on_stderr: Callable[[str], object] | None = None
    on_display: Callable[[Display], object] | None = None
    on_result: Callable[[Result], object] | None = None
    on_error: Callable[[Error], object] | None = None
    on_file: Callable[[File], object] | None = None
    on_event: Callable[[Event], object] | None = None

    def dispatch(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)
        if isinstance(event, Stdout) and self.on_stdout is not None:
            self.on_stdout(event.text)
        elif isinstance(event, Stderr) and self.on_stderr is not None:
            self.on_stderr(event.text)
        elif isinstance(event, Display) and self.on_display is not None:
            self.on_display(event)
        elif isinstance(event, Result) and self.on_result is not None:
            self.on_result(event)
        elif isinstance(event, Error) and self.on_error is not None:
            self.on_error(event)
        elif isinstance(event, File) and self.on_file is not None:
            self.on_file(event)


@dataclass
class Execution:
    """Everything one cell produced, collected."""

    events: list[Event] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    results: list[Result] = field(default_factory=list)
    displays: list[Display] = field(default_factory=list)
    files: list[File] = field(default_factory=list)
    error: Error | None = None
    done: Done | None = None
    resumed: Resumed | None = None
    """Set when the session resumed from hibernation for this cell: `lost` names what did
    not come back."""

    @property
    def status(self) -> str:
        return self.done.status if self.done else "incomplete"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def text(self) -> str:
        """The cell's value as text (its last result), or "" if it had none."""
        return self.results[-1].text if self.results else ""

    def add(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, Stdout):
            self.stdout += event.text
        elif isinstance(event, Stderr):
            self.stderr += event.text
        elif isinstance(event, Result):
            self.results.append(event)
        elif isinstance(event, Display):
            self.displays.append(event)
        elif isinstance(event, File):
            self.files.append(event)
        elif isinstance(event, Error):
            self.error = event
        elif isinstance(event, Done):
            self.done = event
        elif isinstance(event, Resumed):
            self.resumed = event


# -- the chat ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatText:
    """The next piece of the model's words."""

    text: str


@dataclass(frozen=True)
class ChatCell:
    """The model runs code: the cell's own events follow, up to its `Done`."""

    cell: int
    execution_id: str
    code: str


@dataclass(frozen=True)
class ChatEnd:
    """The turn's end: `status` is `answered`, or why it stopped (docs/chat.md)."""

    turn: int
    status: str
    text: str
    cells: int
    tokens: int
    error: dict[str, str] | None = None


ChatEvent = Event | ChatText | ChatCell | ChatEnd


def chat_event_from(name: str, data: dict[str, Any]) -> ChatEvent | None:
    """One event of a chat turn's stream as a typed object (None for `turn` and names this
    client does not know)."""
    if name == "text":
        return ChatText(data["text"])
    if name == "cell":
        return ChatCell(int(data["cell"]), str(data["execution_id"]), str(data["code"]))
    if name == "end":
        error = data.get("error")
        return ChatEnd(
            int(data["turn"]),
            str(data["status"]),
            str(data["text"]),
            int(data["cells"]),
            int(data["tokens"]),
            {str(k): str(v) for k, v in error.items()} if isinstance(error, dict) else None,
        )
    return event_from(name, data)


@dataclass
class ChatReply:
    """A chat turn, collected: the model's words, each cell it ran with what the cell
    produced, and how the turn ended."""

    events: list[ChatEvent] = field(default_factory=list)
    cells: list[tuple[str, Execution]] = field(default_factory=list)
    """(code, what it produced), in the order the model ran them."""
    end: ChatEnd | None = None

    @property
    def text(self) -> str:
        """The model's words, all of them (its answers a paragraph each)."""
        if self.end is not None:
            return self.end.text
        return "".join(e.text for e in self.events if isinstance(e, ChatText))

    @property
    def status(self) -> str:
        return self.end.status if self.end is not None else "incomplete"

    @property
    def ok(self) -> bool:
        """The model answered (it was not stopped, limited, nor failed)."""
        return self.status == "answered"

    @property
    def error(self) -> dict[str, str] | None:
        """Why the model failed (`{"type", "message"}`), for a `model_error` turn."""
        return self.end.error if self.end is not None else None

    def add(self, event: ChatEvent) -> None:
        self.events.append(event)
        if isinstance(event, ChatCell):
            self.cells.append((event.code, Execution()))
        elif isinstance(event, ChatEnd):
            self.end = event
        elif not isinstance(event, ChatText) and self.cells:
            self.cells[-1][1].add(event)
