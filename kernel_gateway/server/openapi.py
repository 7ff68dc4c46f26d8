"""The API's contract: an OpenAPI 3.1 document, served at `GET /openapi.json`.

Kept beside the routing table it describes (`routes/__init__.py`), one entry per
route and method in `_operations`; `tests/test_openapi.py` fails when the app
has a route this document does not describe (or describes one it lacks), and
Schemathesis (`tests/test_fuzz.py`) checks that every answer of a live gateway
matches it: status, content type, headers and body.

The document is built from the gateway's settings, so it states the limits in
force (the largest `timeout`) and whether a bearer token is required.

Event streams follow OpenAPI 3.1 practice: a `text/event-stream` response's
schema describes one event (`event`, `id`, and `data`, a JSON text whose
schema is its `contentSchema`), one alternative per event type.

Routes that are not part of this API are listed in `UNDOCUMENTED` with the
reason, so leaving a route out is always a visible decision.
"""

from __future__ import annotations

from typing import Any

from kernel_gateway import __version__
from kernel_gateway.errors import GatewayError
from kernel_gateway.kernels.workspace import MAX_PATH_LENGTH
from kernel_gateway.server.http import REQUEST_ID_HEADER
from kernel_gateway.settings import Settings
from kernel_gateway.types import DONE_STATUSES

JSON = dict[str, Any]

UNDOCUMENTED: dict[str, str] = {
    "/static": "the web UI's own files (HTML, CSS, JavaScript), public and not part of the API",
    "/mcp": "the Model Context Protocol's streamable-HTTP endpoint: its contract is the MCP "
    "specification, and its tools describe themselves (tools/list)",
    "/api": "Jupyter Server's kernel API (kernelspecs, kernels, the channels WebSocket): its "
    "contract is Jupyter's REST API and messaging protocol",
}
"""Route prefixes deliberately left out of the document, each with the reason.

Protocol endpoints that have their own specification (an MCP endpoint, a
Jupyter-compatible API) belong here too: their contract is that protocol's.
"""


DIED_REASONS = (
    "exited",
    "signal",
    "killed",
    "out_of_memory",
    "start_failed",
    "session_failed",
    "gateway_error",
)


def _error_types() -> list[str]:
    found: set[str] = set()
    pending: list[type[GatewayError]] = [GatewayError]
    while pending:
        cls = pending.pop()
        found.add(cls.error_type)
        pending.extend(cls.__subclasses__())
    # Raised by the router itself, mapped in app.py.
    found.update({"method_not_allowed", "http_error"})
    return sorted(found)


# A relative path in a session's working directory, as `workspace.split_path` accepts
# it: not absolute, no `..` part, at least one part that is not empty or `.`, no NUL,
# names of at most 255 characters (the gateway counts 255 bytes of UTF-8, which no
# pattern can; a longer non-ASCII name gets 400).
_NAME = r"(?:[^/\x00.][^/\x00]{0,254}|\.[^/\x00.][^/\x00]{0,253}|\.\.[^/\x00]{1,253})"
FILE_PATH_PATTERN = rf"^(?:\.(?:/\.?)*/)?{_NAME}(?:/(?:{_NAME}|\.?))*$"
# Event ids are decimal integers; the gateway reads at most 18 digits.
EVENT_ID_PATTERN = r"^[0-9]{0,18}$"
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def _ref(name: str) -> JSON:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(properties: JSON, required: list[str] | None = None, **extra: Any) -> JSON:
    schema: JSON = {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }
    schema.update(extra)
    return schema


def _counts(*names: str, **extra: Any) -> JSON:
    """An object of non-negative integers, every one required."""
    return _object({name: {"type": "integer", "minimum": 0} for name in names}, **extra)


_NULLABLE_INT: JSON = {"type": ["integer", "null"]}
_TIMESTAMP: JSON = {"type": "string", "format": "date-time"}


def _session_properties() -> JSON:
    return {
        "id": {"type": "string", "description": "The session id (32 hex digits)."},
        "status": {
            "type": "string",
            "enum": ["idle", "busy", "restarting", "failed", "closed"],
        },
        "created_at": _TIMESTAMP,
        "idle_seconds": {"type": "number", "minimum": 0},
        "execution_count": {"type": "integer", "minimum": 0},
        "queued": {"type": "integer", "minimum": 0},
        "restarts": {"type": "integer", "minimum": 0},
        "failed": {
            "type": ["string", "null"],
            "description": "Why the session failed (its kernel kept dying), else null.",
        },
    }


def _event_data_schemas() -> JSON:
    """The `data` of each event type."""
    free_object: JSON = {"type": "object"}
    return {
        "TextData": _object({"text": {"type": "string"}}),
        "DisplayData": _object(
            {
                "data": {**free_object, "description": "MIME type -> value, as Jupyter sends it."},
                "metadata": free_object,
                "display_id": {"type": ["string", "null"]},
                "update": {"type": "boolean", "description": "true for update_display_data"},
            }
        ),
        "ResultData": _object(
            {"data": free_object, "metadata": free_object, "execution_count": _NULLABLE_INT}
        ),
        "ClearData": _object({"wait": {"type": "boolean"}}),
        "ErrorData": _object(
            {
                "ename": {"type": "string"},
                "evalue": {"type": "string"},
                "traceback": {"type": "array", "items": {"type": "string"}},
            }
        ),
        "FileData": _object(
            {
                "path": {"type": "string"},
                "size": {"type": "integer", "minimum": 0},
                "mime": {"type": "string"},
                "url": {
                    "type": ["string", "null"],
                    "description": "Where to download it; null for stateless executions.",
                },
                "data": {
                    "type": "string",
                    "contentEncoding": "base64",
                    "description": "The bytes, for images (and every file of a stateless run) "
                    "up to KG_MAX_INLINE_FILE_BYTES.",
                },
            },
            required=["path", "size", "mime", "url"],
        ),
        "DoneData": _object(
            {
                "status": {"type": "string", "enum": list(DONE_STATUSES)},
                "execution_count": _NULLABLE_INT,
                "duration_ms": {"type": "number", "minimum": 0},
                "restarted": {"type": "boolean"},
                "reason": {
                    "type": "string",
                    "enum": list(DIED_REASONS),
                    "description": "Why the kernel went away; only with status `died`.",
                },
                "session_failed": {"const": True},
                "truncated": {"const": True},
            },
            required=["status", "execution_count", "duration_ms", "restarted"],
        ),
    }


_EVENT_DATA = {
    "stdout": "TextData",
    "stderr": "TextData",
    "display": "DisplayData",
    "result": "ResultData",
    "clear": "ClearData",
    "error": "ErrorData",
    "file": "FileData",
    "done": "DoneData",
}


def _events() -> JSON:
    """Each event as an SSE frame, and as an item of a collected document."""
    frames = [
        {
            "type": "object",
            "title": name,
            "properties": {
                "event": {"const": name},
                "id": {
                    "type": "string",
                    "pattern": "^[0-9]+$",
                    "description": "Increases within the session; send it back as "
                    "Last-Event-ID to resume.",
                },
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": _ref(data),
                },
            },
            "required": ["event", "id", "data"],
        }
        for name, data in _EVENT_DATA.items()
    ]
    items = [
        _object({"event": {"const": name}, "data": _ref(data)}, title=name)
        for name, data in _EVENT_DATA.items()
    ]
    return {
        "ServerSentEvent": {
            "description": "One frame of an execution's event stream: `id:`, `event:` and "
            "one `data:` line of JSON. Keepalive comments (`: ping`) come every 10 s. "
            "`done` is always the last event, exactly once.",
            "oneOf": frames,
        },
        "Event": {"oneOf": items},
        "CollectedExecution": _object(
            {
                "execution_id": {"type": "string"},
                "status": {"type": "string", "enum": list(DONE_STATUSES)},
                "stdout": {"type": "string"},
                "stderr": {"type": "string"},
                "error": {"oneOf": [_ref("ErrorData"), {"type": "null"}]},
                "done": _ref("DoneData"),
                "events": {"type": "array", "items": _ref("Event")},
            }
        ),
    }


def _schemas(settings: Settings) -> JSON:
    session = _session_properties()
    timeout: JSON = {
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "maximum": settings.max_exec_timeout,
        "description": f"Seconds the cell may run (default {settings.exec_timeout:g}).",
    }
    code: JSON = {"type": "string", "description": "Python source, run as one IPython cell."}
    return {
        "Error": _object(
            {
                "error": _object(
                    {
                        "type": {"type": "string", "enum": _error_types()},
                        "message": {"type": "string"},
                    }
                )
            }
        ),
        "Session": _object(session),
        "InterruptedSession": _object(
            {
                **session,
                "interrupted": {
                    "type": "boolean",
                    "description": "false when nothing was running",
                },
            }
        ),
        "SessionList": _object({"sessions": {"type": "array", "items": _ref("Session")}}),
        "ExecutionSummary": _object(
            {
                "id": {"type": "string"},
                "status": {"type": "string", "enum": ["queued", "running", *DONE_STATUSES]},
                "submitted_at": _TIMESTAMP,
                "duration_ms": {"type": "number", "minimum": 0},
                "execution_count": _NULLABLE_INT,
                "last_event_id": _NULLABLE_INT,
            }
        ),
        "ExecutionList": _object(
            {"executions": {"type": "array", "items": _ref("ExecutionSummary")}}
        ),
        "FileInfo": _object(
            {
                "path": {"type": "string"},
                "size": {"type": "integer", "minimum": 0},
                "modified": _TIMESTAMP,
                "mime": {"type": "string"},
                "url": {"type": "string"},
            }
        ),
        "FileList": _object({"files": {"type": "array", "items": _ref("FileInfo")}}),
        "Health": _object(
            {
                "status": {"const": "ok"},
                "backend": {"type": "string", "enum": ["docker", "local"]},
                "instance": {"type": "string"},
                "isolation": {"type": "string"},
                "node": {
                    "type": "string",
                    "description": "This gateway's node in a cluster (`--node-name`); session "
                    "ids made here start with it and a dot.",
                },
                "pool": _counts(
                    "warm",
                    "starting",
                    "target",
                    "kernels_started",
                    "sessions",
                    "max_sessions",
                    "stateless",
                    "max_stateless",
                ),
                "stateless_mode": {
                    "type": "string",
                    "enum": ["fork", "container"],
                    "description": "How stateless requests get a kernel (`--stateless-mode`).",
                },
                "fork_servers": _counts(
                    "idle",
                    "busy",
                    "starting",
                    "target",
                    "servers_started",
                    "requests_served",
                    description="Fork-server containers (only with `stateless_mode` fork).",
                ),
            },
            required=["status", "backend", "instance", "isolation", "pool", "stateless_mode"],
        ),
        "NewSession": _object({}, maxProperties=0),
        "ExecuteRequest": _object({"code": code, "timeout": timeout}, required=["code"]),
        "StatelessExecuteRequest": _object(
            {
                "code": code,
                "timeout": timeout,
                "files": {
                    "type": ["array", "null"],
                    "description": "Files put in the working directory before the code runs.",
                    "items": _object(
                        {
                            "path": {"$ref": "#/components/schemas/FilePath"},
                            "data": {
                                "type": "string",
                                "contentEncoding": "base64",
                                "pattern": BASE64_PATTERN,
                            },
                        }
                    ),
                },
            },
            required=["code"],
        ),
        "FilePath": {
            "type": "string",
            "description": "Relative to the session's working directory; `..`, absolute paths "
            "and NUL bytes are refused, and each name may have at most 255 bytes of UTF-8. "
            "Folders are created on upload.",
            "minLength": 1,
            "maxLength": MAX_PATH_LENGTH,
            "pattern": FILE_PATH_PATTERN,
        },
        **_event_data_schemas(),
        **_events(),
    }


# -- responses -------------------------------------------------------------------------------

_ERROR_REASONS = {
    400: "Bad request: the body is not JSON, a bad file path, or (without a token) a `Host` "
    "that is not a loopback name.",
    401: "Missing or wrong bearer token (the same answer for both).",
    403: "The file path is or passes through a symlink, or cannot be accessed.",
    404: "No such session, execution, file or route.",
    409: "The session is busy (too many queued executions), deleted, or failed; or the file "
    "path names a folder.",
    410: "The execution's events are past the session's retention (`execution_expired`), or "
    "the session was persisted but its kernel did not survive the gateway's restart "
    "(`session_lost`).",
    413: "The body is over the size limit (refused before it is read whole).",
    415: "A JSON body sent without `Content-Type: application/json`.",
    422: "Well-formed JSON with wrong or unknown fields, or a bad value.",
    429: "Too many sessions or stateless executions at once; retry after `Retry-After`.",
    503: "No kernel could be started in time (`kernel_unavailable`), or the gateway is "
    "draining for a restart and did nothing (`shutting_down`); retry after `Retry-After`.",
}
_RETRY_AFTER = {
    "description": "Seconds to wait before retrying.",
    "required": True,
    "schema": {"type": "string", "pattern": "^[0-9]+$"},
}


def _headers(extra: JSON | None = None) -> JSON:
    return {REQUEST_ID_HEADER: {"$ref": "#/components/headers/RequestId"}, **(extra or {})}


def _json(schema: str) -> JSON:
    return {"application/json": {"schema": _ref(schema)}}


def _error(status: int) -> JSON:
    extra: JSON = {}
    if status in (429, 503):
        extra["Retry-After"] = _RETRY_AFTER
    if status == 401:
        extra["WWW-Authenticate"] = {
            "required": True,
            "schema": {"const": "Bearer"},
        }
    return {
        "description": _ERROR_REASONS[status],
        "headers": _headers(extra),
        "content": _json("Error"),
    }


def _ok(description: str, content: JSON | None = None, headers: JSON | None = None) -> JSON:
    response: JSON = {"description": description, "headers": _headers(headers)}
    if content is not None:
        response["content"] = content
    return response


_STREAM = {
    "text/event-stream": {"schema": _ref("ServerSentEvent")},
    "application/json": {"schema": _ref("CollectedExecution")},
}
_EXECUTION_ID = {
    "Execution-Id": {
        "description": "The execution's id within its session.",
        "required": True,
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    }
}
_RESUME_AT = {
    "Content-Location": {
        "description": "Where to resume this execution's events.",
        "required": True,
        "schema": {"type": "string"},
    }
}


# -- parameters ------------------------------------------------------------------------------

_SESSION_ID = {
    "name": "session_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}
_EXECUTION_PARAM = {
    "name": "execution_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}
_FILE_PATH = {
    "name": "path",
    "in": "path",
    "required": True,
    "description": "May contain `/`: it names a file in a folder of the working directory.",
    "schema": _ref("FilePath"),
}
_SESSION_LINKS = {
    name: {"operationId": op, "parameters": {"session_id": "$response.body#/id"}}
    for name, op in (
        ("GetSession", "getSession"),
        ("DeleteSession", "deleteSession"),
        ("ExecuteInSession", "executeInSession"),
        ("ListExecutions", "listExecutions"),
        ("Interrupt", "interruptSession"),
        ("Restart", "restartSession"),
        ("ListFiles", "listFiles"),
    )
}


def _operations(settings: Settings) -> list[tuple[str, str, JSON]]:
    """(path, method, operation) for every documented route.

    An operation's `x-errors` lists the error statuses it answers with besides 400 (and
    401 behind a token); `build` turns them into responses with the error document.
    """
    kernel_start = [503]
    json_body = [400, 413, 415, 422]
    return [
        (
            "/",
            "get",
            {
                "operationId": "webUI",
                "summary": "The browser UI (public: the page holds no data).",
                "tags": ["web"],
                "security": [],
                "responses": {"200": _ok("The page.", {"text/html": {"schema": {}}})},
            },
        ),
        (
            "/health",
            "get",
            {
                "operationId": "health",
                "summary": "Liveness, the backend in use, and the warm pool (public).",
                "tags": ["operations"],
                "security": [],
                "responses": {"200": _ok("The gateway is up.", _json("Health"))},
            },
        ),
        (
            "/openapi.json",
            "get",
            {
                "operationId": "openapi",
                "summary": "This document (public).",
                "tags": ["operations"],
                "security": [],
                "responses": {
                    "200": _ok("OpenAPI 3.1.", {"application/json": {"schema": {"type": "object"}}})
                },
            },
        ),
        (
            "/metrics",
            "get",
            {
                "operationId": "metrics",
                "summary": "Prometheus metrics, in the text exposition format (or OpenMetrics "
                "when the `Accept` header asks for it).",
                "tags": ["operations"],
                "responses": {
                    "200": _ok(
                        "The metrics.",
                        {
                            "text/plain": {"schema": {"type": "string"}},
                            "application/openmetrics-text": {"schema": {"type": "string"}},
                        },
                    )
                },
            },
        ),
        (
            "/execute",
            "post",
            {
                "operationId": "executeStateless",
                "summary": "Run one cell in a fresh kernel that is destroyed afterwards.",
                "description": "Answers with the events as `text/event-stream`, or as one "
                "collected JSON document with `Accept: application/json`. Stateless "
                "executions cannot be resumed. Bodies may be up to KG_MAX_STATELESS_BODY_BYTES.",
                "tags": ["stateless"],
                "requestBody": {"required": True, "content": _json("StatelessExecuteRequest")},
                "responses": {
                    "200": _ok("The execution's events.", _STREAM, _EXECUTION_ID),
                },
                "x-errors": [*json_body, 429, *kernel_start],
            },
        ),
        (
            "/sessions",
            "post",
            {
                "operationId": "createSession",
                "summary": "Start a session, on a warm kernel when one is ready.",
                "tags": ["sessions"],
                "requestBody": {"required": False, "content": _json("NewSession")},
                "responses": {
                    "201": {
                        **_ok(
                            "The new session.",
                            _json("Session"),
                            {"Location": {"required": True, "schema": {"type": "string"}}},
                        ),
                        "links": _SESSION_LINKS,
                    }
                },
                "x-errors": [*json_body, 429, *kernel_start],
            },
        ),
        (
            "/sessions",
            "get",
            {
                "operationId": "listSessions",
                "summary": "Every session.",
                "tags": ["sessions"],
                "responses": {"200": _ok("The sessions.", _json("SessionList"))},
            },
        ),
        (
            "/sessions/{session_id}",
            "get",
            {
                "operationId": "getSession",
                "tags": ["sessions"],
                "parameters": [_SESSION_ID],
                "responses": {"200": _ok("The session.", _json("Session"))},
                "x-errors": [404, 410],
            },
        ),
        (
            "/sessions/{session_id}",
            "delete",
            {
                "operationId": "deleteSession",
                "summary": "Remove the session, its kernel and its files.",
                "tags": ["sessions"],
                "parameters": [_SESSION_ID],
                "responses": {"204": _ok("Deleted.")},
                "x-errors": [404, 410],
            },
        ),
        (
            "/sessions/{session_id}/execute",
            "post",
            {
                "operationId": "executeInSession",
                "summary": "Run a cell in the session; cells run one at a time, in order.",
                "description": "Answers with the events as `text/event-stream`, or as one "
                "collected JSON document with `Accept: application/json`.",
                "tags": ["sessions"],
                "parameters": [_SESSION_ID],
                "requestBody": {"required": True, "content": _json("ExecuteRequest")},
                "responses": {
                    "200": {
                        **_ok("The execution's events.", _STREAM, {**_EXECUTION_ID, **_RESUME_AT}),
                        "links": {
                            "Resume": {
                                "operationId": "executionEvents",
                                "parameters": {
                                    "session_id": "$request.path.session_id",
                                    "execution_id": "$response.header.Execution-Id",
                                },
                            }
                        },
                    }
                },
                "x-errors": [*json_body, 404, 409, 410, 503],
            },
        ),
        (
            "/sessions/{session_id}/executions",
            "get",
            {
                "operationId": "listExecutions",
                "summary": "The executions whose events are kept, oldest first.",
                "tags": ["sessions"],
                "parameters": [_SESSION_ID],
                "responses": {"200": _ok("The executions.", _json("ExecutionList"))},
                "x-errors": [404, 410],
            },
        ),
        (
            "/sessions/{session_id}/executions/{execution_id}/events",
            "get",
            {
                "operationId": "executionEvents",
                "summary": "An execution's events, from its start or from after an event id, "
                "then live ones, ending with its `done`.",
                "tags": ["sessions"],
                "parameters": [
                    _SESSION_ID,
                    _EXECUTION_PARAM,
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
                ],
                "responses": {
                    "200": _ok("The execution's events.", _STREAM, {**_EXECUTION_ID, **_RESUME_AT})
                },
                "x-errors": [404, 410, 422],
            },
        ),
        (
            "/sessions/{session_id}/interrupt",
            "post",
            {
                "operationId": "interruptSession",
                "summary": "Interrupt the running cell, if any.",
                "tags": ["sessions"],
                "parameters": [_SESSION_ID],
                "responses": {"200": _ok("The session.", _json("InterruptedSession"))},
                "x-errors": [404, 410],
            },
        ),
        (
            "/sessions/{session_id}/restart",
            "post",
            {
                "operationId": "restartSession",
                "summary": "Replace the kernel (state is lost, files are kept); queued cells "
                "end `interrupted`.",
                "tags": ["sessions"],
                "parameters": [_SESSION_ID],
                "responses": {"200": _ok("The session, on a fresh kernel.", _json("Session"))},
                "x-errors": [404, 410, *kernel_start],
            },
        ),
        (
            "/sessions/{session_id}/files",
            "get",
            {
                "operationId": "listFiles",
                "tags": ["files"],
                "parameters": [_SESSION_ID],
                "responses": {"200": _ok("The files.", _json("FileList"))},
                "x-errors": [404, 410],
            },
        ),
        (
            "/sessions/{session_id}/files/{path}",
            "get",
            {
                "operationId": "downloadFile",
                "summary": "The file's bytes, with its Content-Type.",
                "tags": ["files"],
                "parameters": [_SESSION_ID, _FILE_PATH],
                "responses": {
                    "200": _ok(
                        "The file (an attachment unless it is an image).",
                        {"*/*": {"schema": {}}},
                    )
                },
                "x-errors": [400, 403, 404, 410],
            },
        ),
        (
            "/sessions/{session_id}/files/{path}",
            "put",
            {
                "operationId": "uploadFile",
                "summary": "Write a file (raw body); folders are created.",
                "tags": ["files"],
                "parameters": [_SESSION_ID, _FILE_PATH],
                "requestBody": {
                    "required": False,
                    "content": {
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        }
                    },
                },
                "responses": {
                    "201": {
                        **_ok("Written.", _json("FileInfo")),
                        "links": {
                            name: {
                                "operationId": op,
                                "parameters": {
                                    "session_id": "$request.path.session_id",
                                    "path": "$request.path.path",
                                },
                            }
                            for name, op in (("Download", "downloadFile"), ("Delete", "deleteFile"))
                        },
                    }
                },
                "x-errors": [400, 403, 404, 410, 409, 413],
            },
        ),
        (
            "/sessions/{session_id}/files/{path}",
            "delete",
            {
                "operationId": "deleteFile",
                "tags": ["files"],
                "parameters": [_SESSION_ID, _FILE_PATH],
                "responses": {"204": _ok("Deleted.")},
                "x-errors": [400, 403, 404, 410, 409],
            },
        ),
    ]


def build(settings: Settings) -> JSON:
    """The OpenAPI 3.1 document for a gateway with these settings."""
    token = settings.token is not None
    paths: JSON = {}
    for path, method, operation in _operations(settings):
        operation = dict(operation)
        errors = set(operation.pop("x-errors", []))
        errors.add(400)  # a malformed request, or a non-loopback Host without a token
        public = operation.get("security") == []
        if token and not public:
            errors.add(401)
        responses = dict(operation["responses"])
        for status in sorted(errors):
            responses[str(status)] = _error(status)
        operation["responses"] = responses
        paths.setdefault(path, {})[method] = operation
    document: JSON = {
        "openapi": "3.1.0",
        "info": {
            "title": "kernel-gateway",
            "version": __version__,
            "description": "Run code in sandboxed IPython kernels and stream what it produces "
            'as server-sent events. Every error is `{"error": {"type", "message"}}`; '
            f"every response carries an `{REQUEST_ID_HEADER}` header.",
        },
        "paths": paths,
        "components": {
            "schemas": _schemas(settings),
            "headers": {
                "RequestId": {
                    "description": "This request's id: the client's own `X-Request-Id` when "
                    "it is 1-128 characters of letters, digits and `-_.:`, else a new one. "
                    "Log lines about the request carry it.",
                    "required": True,
                    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
                }
            },
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The gateway's --token. Only a gateway started with a "
                    "token requires it.",
                }
            },
        },
    }
    if token:
        document["security"] = [{"bearer": []}]
    return document
