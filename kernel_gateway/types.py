"""Type aliases shared across the package."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, TypedDict, get_args

JSON = dict[str, Any]
Message = dict[str, Any]
"""A deserialized Jupyter message: header, parent_header, metadata, content."""

DoneStatus = Literal["ok", "error", "timeout", "interrupted", "died"]
"""How a cell ended: the `status` of its `done` event (one stop reason each)."""
DONE_STATUSES: tuple[DoneStatus, ...] = get_args(DoneStatus)

EventName = Literal[
    "resumed", "stdout", "stderr", "display", "result", "clear", "error", "file", "done"
]
"""The events a cell's stream carries (SSE `event:` names), in the API's documented order."""
EVENT_NAMES: tuple[EventName, ...] = get_args(EventName)

DiedReason = Literal[
    "exited", "signal", "killed", "out_of_memory", "start_failed", "session_failed", "gateway_error"
]
"""Why a cell's kernel went away: the `reason` of a `done` event with status `died`."""
DIED_REASONS: tuple[DiedReason, ...] = get_args(DiedReason)

TurnStatus = Literal[
    "running",
    "answered",
    "step_limit",
    "token_limit",
    "call_limit",
    "interrupted",
    "model_error",
    "failed",
]
"""Where a chat turn is: running, or how it ended (its `end` event's `status`)."""

ExecutionStatus = Literal[Literal["queued", "running"], DoneStatus]
"""Where an execution is: waiting its turn, running, or how it ended."""

SessionStatus = Literal[
    "idle", "busy", "restarting", "hibernating", "hibernated", "failed", "closed"
]
"""A session's state as the API reports it."""


class ConnectionInfo(TypedDict):
    """What a client needs to reach a kernel (jupyter_client's connection-file schema)."""

    transport: str
    ip: str
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    hb_port: int
    key: str
    signature_scheme: str
    kernel_name: str


class Event(NamedTuple):
    """One thing an execution produced, as sent to clients: SSE `event:` name and `data:`."""

    name: str
    data: JSON


class Record(NamedTuple):
    """One event in an execution's log; `id` increases within the session (the SSE id)."""

    id: int
    event: Event
