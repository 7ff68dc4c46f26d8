"""Pieces of OpenAPI that several operations' records share: event-stream answers, their
headers, the links from a new session to what can be done with it."""

from __future__ import annotations

from typing import Any

from kernel_gateway.shapes.responses import CollectedExecution

JSON = dict[str, Any]

EVENT_ID_PATTERN = r"^[0-9]{0,18}$"
"""Event ids are decimal integers; the gateway reads at most 18 digits."""


def ref(name: str) -> JSON:
    return {"$ref": f"#/components/schemas/{name}"}


STREAM: JSON = {
    "text/event-stream": {"schema": ref("ServerSentEvent")},
    "application/json": {"schema": ref(CollectedExecution.__name__)},
}
"""An execution's events: an event stream, or one document with `Accept: application/json`."""

RESUME_PARAMETERS: tuple[JSON, ...] = (
    {
        "name": "after",
        "in": "query",
        "required": False,
        "description": "Resume after this event id (wins over Last-Event-ID).",
        "schema": {"type": "string", "pattern": EVENT_ID_PATTERN},
    },
    {
        "name": "Last-Event-ID",
        "in": "header",
        "required": False,
        "description": "Resume after this event id, as EventSource sends it.",
        "schema": {"type": "string", "pattern": EVENT_ID_PATTERN},
    },
)
"""Where a stream is read again from: an execution's (`executionEvents`), a chat turn's."""

EXECUTION_ID: JSON = {
    "Execution-Id": {
        "description": "The execution's id within its session.",
        "required": True,
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    }
}
RESUME_AT: JSON = {
    "Content-Location": {
        "description": "Where to resume this execution's events.",
        "required": True,
        "schema": {"type": "string"},
    }
}
LOCATION: JSON = {"Location": {"required": True, "schema": {"type": "string"}}}

SESSION_LINKS: JSON = {
    name: {"operationId": op, "parameters": {"session_id": "$response.body#/id"}}
    for name, op in (
        ("GetSession", "getSession"),
        ("DeleteSession", "deleteSession"),
        ("ExecuteInSession", "executeInSession"),
        ("ListExecutions", "listExecutions"),
        ("Interrupt", "interruptSession"),
        ("Restart", "restartSession"),
        ("Hibernate", "hibernateSession"),
        ("Resume", "resumeSession"),
        ("ListFiles", "listFiles"),
    )
}

KERNEL_START = (503,)
"""A call that may start a kernel: 503 `kernel_unavailable` when none starts in time."""
JSON_BODY = (400, 413, 415, 422)
"""A call with a JSON body: not JSON, too large, not sent as JSON, refused by its model."""
