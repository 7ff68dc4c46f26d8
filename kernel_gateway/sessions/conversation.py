"""A session's chat: what the model has read, the turns it answered, the one running.

The conversation belongs to its session (`Session.conversation`): deleted with it, kept
while it hibernates, and with `--persist-sessions` written to a file of its own
(`ConversationStore`, beside the session records) after every step, so a restarted
gateway's model remembers it. Asking the model and running its code is
`kernel_gateway.chat`'s; this module only holds the state.

A turn's events (`turn`, `text`, `cell`, its cells' own events, `end`) are kept in memory
while it runs and after it, until the next turn begins, so a client that lost the stream
reads it again from an event id. Their ids are the session's (`ExecutionLog`): one
increasing sequence across cells and turns.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, get_args

from kernel_gateway.errors import Conflict, Gone, NotFound, TurnRunning
from kernel_gateway.records import RecordStore
from kernel_gateway.types import Event, Record, TurnStatus

FORMAT = 1
MAX_TURNS = 50
"""Turns kept (for `GET .../chat`, and for the model); older ones are dropped whole."""
MAX_MESSAGE_CHARS = 600_000
"""Characters of messages kept for the model (about 150,000 tokens); the oldest turns'
messages are dropped past it, so the context sent stays within what models take."""


@dataclass
class CellSummary:
    execution_id: str
    code: str
    status: str = "running"


@dataclass
class TurnSummary:
    """One turn as `GET /sessions/{id}/chat` shows it."""

    turn: int
    message: str
    files: list[str] = field(default_factory=list)
    status: TurnStatus = "running"
    """`running`, or how it ended (the `end` event's status)."""
    text: str = ""
    """The model's words in this turn, all of them."""
    cells: list[CellSummary] = field(default_factory=list)
    tokens: int = 0
    started_at: float = field(default_factory=time.time)
    first_message: int = 0
    """Index in `Conversation.messages` of this turn's first message (dropping old turns)."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("first_message")
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], first_message: int) -> TurnSummary:
        return cls(
            turn=int(data["turn"]),
            message=str(data["message"]),
            files=[str(f) for f in data.get("files") or []],
            status=_turn_status(data["status"]),
            text=str(data.get("text", "")),
            cells=[
                CellSummary(str(c["execution_id"]), str(c["code"]), str(c["status"]))
                for c in data.get("cells") or []
            ],
            tokens=int(data.get("tokens", 0)),
            started_at=float(data.get("started_at", 0.0)),
            first_message=first_message,
        )


def _turn_status(value: object) -> TurnStatus:
    if value not in get_args(TurnStatus):
        raise ValueError(f"not a turn's status: {value!r}")
    return value  # type: ignore[return-value]  # checked just above


class Turn:
    """A turn's events, for its readers: kept whole, read live or from after an event id."""

    def __init__(self, summary: TurnSummary) -> None:
        self.summary = summary
        self._log: list[Record] = []
        self._appended = asyncio.Event()
        self.finished = False
        self.stop_reason: TurnStatus | None = None
        """Why it was asked to stop (`interrupted`), if it was."""
        self.task: asyncio.Task[None] | None = None
        """What runs it (`kernel_gateway.chat`): cancelled to stop it."""

    @property
    def number(self) -> int:
        return self.summary.turn

    def add(self, record: Record) -> None:
        self._log.append(record)
        self._appended.set()
        self._appended = asyncio.Event()

    def finish(self) -> None:
        self.finished = True
        self._appended.set()

    def stop(self, reason: TurnStatus = "interrupted") -> bool:
        """Ask it to stop (its model call cancelled, its cell interrupted); False when it
        had ended."""
        if self.finished or self.task is None or self.task.done():
            return False
        self.stop_reason = self.stop_reason or reason
        self.task.cancel()
        return True

    @property
    def last_event_id(self) -> int | None:
        return self._log[-1].id if self._log else None

    async def records(self, after: int | None = None) -> AsyncIterator[Record]:
        """Its events from after event id `after` (all if None), then live ones until `end`."""
        log = self._log
        index = 0 if after is None else bisect.bisect_right(log, after, key=lambda r: r.id)
        while True:
            while index < len(log):
                record = log[index]
                index += 1
                yield record
                if record.event.name == "end":
                    return
            if self.finished:
                return
            await self._appended.wait()


class Conversation:
    """A session's chat (see the module's docstring). `messages` are the model's view, in
    OpenAI's chat format, without the system message (made afresh for every call)."""

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.messages: list[dict[str, Any]] = []
        self.turns: list[TurnSummary] = []
        self.current: Turn | None = None
        """The turn running, or the last one this gateway ran (its events)."""
        self.told_up_to = 0
        """The person's cells up to this execution number were told to the model."""
        self.model_cells: set[int] = set()
        """Execution numbers of the cells the model ran since (not the person's)."""
        self.store: ConversationStore | None = None
        self.closed = False

    @property
    def running(self) -> bool:
        return self.current is not None and not self.current.finished

    def refuse_if_running(self) -> None:
        """409 `turn_running` while a turn runs."""
        if self.closed:
            raise Conflict(f"session {self.id} was deleted")
        if self.running:
            raise TurnRunning(
                f"session {self.id} is answering a message (turn {self.turns[-1].turn}); "
                "wait for its end, or stop it (POST /sessions/{id}/chat/stop)"
            )

    def begin(self, message: str, files: list[str]) -> Turn:
        """A new turn; 409 `turn_running` while one runs."""
        self.refuse_if_running()
        number = self.turns[-1].turn + 1 if self.turns else 1
        summary = TurnSummary(number, message, files, first_message=len(self.messages))
        self.turns.append(summary)
        self.current = Turn(summary)
        self._trim()
        return self.current

    def stop(self) -> bool:
        """Stop the running turn, if any."""
        return self.current.stop() if self.current is not None else False

    def clear(self) -> None:
        """Forget every turn (the session's variables stay); 409 while one runs."""
        if self.running:
            raise TurnRunning(f"session {self.id} is answering a message; stop it first")
        self.messages, self.turns, self.current = [], [], None
        self.save()

    def events(self) -> Turn:
        """The latest turn's events; 404 when there was none, 410 when this gateway did not
        run it (it restarted since)."""
        if self.current is not None:
            return self.current
        if self.turns:
            raise Gone(
                f"the events of turn {self.turns[-1].turn} of session {self.id} are gone: "
                "the gateway restarted since (GET /sessions/{id}/chat has what it answered)"
            )
        raise NotFound(f"session {self.id} has no chat turn yet")

    def _trim(self) -> None:
        """Drop the oldest turns past `MAX_TURNS` or `MAX_MESSAGE_CHARS` (never the last)."""
        size = sum(len(str(m.get("content") or "")) for m in self.messages)
        while len(self.turns) > 1 and (len(self.turns) > MAX_TURNS or size > MAX_MESSAGE_CHARS):
            dropped = self.turns.pop(0)
            cut = self.turns[0].first_message
            size -= sum(len(str(m.get("content") or "")) for m in self.messages[:cut])
            del self.messages[:cut]
            for turn in self.turns:
                turn.first_message -= cut
            del dropped

    # -- durable ----------------------------------------------------------------------------

    def answer_pending_calls(self) -> None:
        """Every tool call of the last assistant message gets an answer ("not run" for one
        that never ran): the API refuses a conversation where one has none."""
        messages = self.messages
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if message.get("role") == "assistant":
                answered = {m.get("tool_call_id") for m in messages[index + 1 :]}
                for call in message.get("tool_calls") or []:
                    if call.get("id") not in answered:
                        messages.append(
                            {
                                "role": "tool",
                                "tool_call_id": call.get("id"),
                                "content": "Not run: the turn was stopped before it ran",
                            }
                        )
                return
            if message.get("role") == "user" and isinstance(message.get("content"), str):
                return

    def save(self) -> None:
        """Written as it is now (a copy: the writer's thread never sees it change)."""
        if self.store is not None and not self.closed:
            snapshot = SavedConversation(
                self.id,
                copy.deepcopy(self.messages),
                [replace(t, cells=[replace(c) for c in t.cells]) for t in self.turns],
                self.told_up_to,
            )
            with contextlib.suppress(ValueError):
                self.store.save(snapshot)

    def close(self) -> None:
        """The session ended: its turn stopped, its file removed."""
        self.closed = True
        if self.current is not None:
            self.current.stop("failed")
        if self.store is not None:
            with contextlib.suppress(ValueError):
                self.store.delete(self.id)

    def to_json(self) -> dict[str, Any]:
        return SavedConversation(self.id, self.messages, self.turns, self.told_up_to).to_json()

    def take_up(self, record: SavedConversation) -> None:
        """Carry on from what an earlier gateway saved (a turn running then ended there)."""
        self.messages = record.messages
        self.turns = record.turns
        self.told_up_to = record.told_up_to
        for turn in self.turns:
            if turn.status == "running":
                turn.status = "interrupted"
                turn.text += "\n\n[the gateway restarted during this turn]"
                for cell in turn.cells:
                    if cell.status == "running":
                        cell.status = "interrupted"
        self.answer_pending_calls()  # a gateway killed during a cell of the model's


@dataclass
class SavedConversation:
    """A conversation as read back from its file."""

    id: str
    messages: list[dict[str, Any]]
    turns: list[TurnSummary]
    told_up_to: int

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "id": self.id,
            "messages": self.messages,
            "turns": [t.to_json() | {"first_message": t.first_message} for t in self.turns],
            "told_up_to": self.told_up_to,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SavedConversation:
        if data.get("format") != FORMAT:
            raise ValueError(f"unknown conversation format {data.get('format')!r}")
        messages = data["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages is not a list of objects")
        return cls(
            id=str(data["id"]),
            messages=messages,
            turns=[TurnSummary.from_json(t, int(t["first_message"])) for t in data["turns"]],
            told_up_to=int(data.get("told_up_to", 0)),
        )


class ConversationStore(RecordStore[Any]):
    """Conversations in `folder`, one file per session (named by its id)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, SavedConversation.from_json)


def turn_event(name: str, data: dict[str, Any], event_id: int) -> Record:
    """A chat event (`turn`, `text`, `cell`, `end`) as a record of the turn's log."""
    return Record(event_id, Event(name, data))
