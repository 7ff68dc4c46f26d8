"""The chat's shapes: the message a client sends, what the routes answer, and the `data` of
the chat's own events (a turn's stream also carries its cells' events, `events.py`'s)."""

from __future__ import annotations

from typing import Annotated, NotRequired

from pydantic import AfterValidator, Field
from typing_extensions import TypedDict

from kernel_gateway.shapes.meta import Count, closed
from kernel_gateway.shapes.requests import FilePath, RequestModel, valid_unicode
from kernel_gateway.types import TurnStatus

MAX_MESSAGE_CHARS = 32_000
MAX_FILES = 10


class ChatRequest(RequestModel):
    """A message for the session's chat: the model answers it, running code in the session."""

    message: Annotated[
        str,
        AfterValidator(valid_unicode),
        Field(min_length=1, max_length=MAX_MESSAGE_CHARS),
    ]
    """What the person asks, in words."""
    files: Annotated[list[FilePath], Field(max_length=MAX_FILES)] | None = None
    """Files of the session to tell the model about (name, size; a table's columns and
    first rows); upload them first."""


@closed
class ChatInfo(TypedDict):
    enabled: bool
    """Whether this gateway has a model (`--llm-url`, `--llm-model`)."""
    model: str | None
    max_steps: Count
    max_tokens: Count
    vision: bool


@closed
class ChatCell(TypedDict):
    execution_id: str
    code: str
    status: str


@closed
class ChatTurn(TypedDict):
    turn: int
    message: str
    files: list[str]
    status: TurnStatus
    text: str
    """The model's words in this turn, all of them."""
    cells: list[ChatCell]
    tokens: Count
    started_at: float
    """Epoch seconds."""


@closed
class ChatConversation(TypedDict):
    running: bool
    turns: list[ChatTurn]


@closed
class ChatStopped(TypedDict):
    stopped: bool
    """false when no turn was running"""


@closed
class TurnData(TypedDict):
    turn: int
    message: str
    files: list[str]


@closed
class ChatTextData(TypedDict):
    text: str
    """The next piece of the model's words, as it generated them."""


@closed
class CellData(TypedDict):
    cell: int
    """1 for the turn's first cell."""
    execution_id: str
    """The cell's execution in the session (its events follow, ending with its `done`)."""
    code: str


@closed
class ChatError(TypedDict):
    type: str
    """`model_error`, `model_unavailable`, `model_timeout`, `model_malformed`, `call_limit`,
    or the gateway's error type when the session failed."""
    message: str


@closed
class EndData(TypedDict):
    turn: int
    status: TurnStatus
    text: str
    cells: Count
    tokens: Count
    error: NotRequired[ChatError]


CHAT_EVENT_DATA: dict[str, type] = {
    "turn": TurnData,
    "text": ChatTextData,
    "cell": CellData,
    "end": EndData,
}
"""The chat's own events -> the TypedDict of their `data`."""
