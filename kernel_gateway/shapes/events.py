"""An execution's events: the `data` of each, and the events of a collected execution.

Built as plain dicts on the hot path (no model object per event); these TypedDicts say what
those dicts hold, and the event stream's schema is generated from them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, get_args, get_type_hints

from typing_extensions import TypeAliasType, TypedDict

from kernel_gateway.shapes.meta import Base64Text, Count, Milliseconds, closed, field
from kernel_gateway.types import EVENT_NAMES, DiedReason, DoneStatus, EventName

FreeObject = dict[str, Any]


@closed
class LostName(TypedDict):
    name: str
    """The variable's name (`Out[N]` for an output kept in `Out`; `*` for all of them)."""
    reason: str
    """Why it could not be kept, e.g. `TypeError: cannot pickle 'socket' object`."""


@closed
class TextData(TypedDict):
    text: str


@closed
class DisplayData(TypedDict):
    data: FreeObject
    """MIME type -> value, as Jupyter sends it."""
    metadata: FreeObject
    display_id: str | None
    update: bool
    """true for update_display_data"""


@closed
class ResultData(TypedDict):
    data: FreeObject
    metadata: FreeObject
    execution_count: int | None


@closed
class ClearData(TypedDict):
    wait: bool


@closed
class ErrorData(TypedDict):
    ename: str
    evalue: str
    traceback: list[str]


@closed
class FileData(TypedDict):
    path: str
    size: Count
    mime: str
    url: str | None
    """Where to download it; null for stateless executions."""
    data: NotRequired[Base64Text]
    """The bytes, for images (and every file of a stateless run) up to KG_MAX_INLINE_FILE_BYTES."""


@closed
class ResumedData(TypedDict):
    """The session was hibernated and resumed for this cell (or since its last one)."""

    lost: list[LostName]
    """Names that did not come back, each with why; empty when everything did."""
    hibernated_seconds: Annotated[float, field(ge=0)]
    resume_ms: Milliseconds


@closed
class DoneData(TypedDict):
    status: DoneStatus
    execution_count: int | None
    duration_ms: Milliseconds
    restarted: bool
    reason: NotRequired[DiedReason]
    """Why the kernel went away; only with status `died`."""
    session_failed: NotRequired[Literal[True]]
    truncated: NotRequired[Literal[True]]
    resumed: NotRequired[ResumedData]
    """Present when the session resumed from hibernation for this cell: what was lost."""


@closed
class ResumedEvent(TypedDict):
    event: Literal["resumed"]
    data: ResumedData


@closed
class StdoutEvent(TypedDict):
    event: Literal["stdout"]
    data: TextData


@closed
class StderrEvent(TypedDict):
    event: Literal["stderr"]
    data: TextData


@closed
class DisplayEvent(TypedDict):
    event: Literal["display"]
    data: DisplayData


@closed
class ResultEvent(TypedDict):
    event: Literal["result"]
    data: ResultData


@closed
class ClearEvent(TypedDict):
    event: Literal["clear"]
    data: ClearData


@closed
class ErrorEvent(TypedDict):
    event: Literal["error"]
    data: ErrorData


@closed
class FileEvent(TypedDict):
    event: Literal["file"]
    data: FileData


@closed
class DoneEvent(TypedDict):
    event: Literal["done"]
    data: DoneData


EVENT_TYPES = (
    ResumedEvent,
    StdoutEvent,
    StderrEvent,
    DisplayEvent,
    ResultEvent,
    ClearEvent,
    ErrorEvent,
    FileEvent,
    DoneEvent,
)
Event = TypeAliasType(
    "Event",
    Annotated[
        ResumedEvent
        | StdoutEvent
        | StderrEvent
        | DisplayEvent
        | ResultEvent
        | ClearEvent
        | ErrorEvent
        | FileEvent
        | DoneEvent,
        field(discriminator="event"),
    ],
)
"""One event of a collected execution: its name and its `data`."""


def _event_data() -> dict[EventName, type]:
    found: dict[EventName, type] = {}
    for event_type in EVENT_TYPES:
        hints = get_type_hints(event_type)
        (name,) = get_args(hints["event"])
        found[name] = hints["data"]
    assert tuple(found) == EVENT_NAMES, "one event type per name in types.EVENT_NAMES, in order"
    return found


EVENT_DATA = _event_data()
"""Each event name -> the TypedDict of its `data`."""
