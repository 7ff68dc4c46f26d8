"""The API's contract: an OpenAPI 3.1 document, served at `GET /openapi.json`.

Kept beside the routing table it describes (`routes/__init__.py`), one entry per
route and method in `_operations`; `tests/test_openapi.py` fails when the app
has a route this document does not describe (or describes one it lacks), and
Schemathesis (`tests/test_fuzz.py`) checks that every answer of a live gateway
matches it: status, content type, headers and body.

Its schemas are not written here: `components.schemas` is generated from the
typed models of `kernel_gateway.sessions.models`, the same ones the routes
validate request bodies with. This module holds the operations (paths,
parameters, responses, descriptions) and the event-stream frame.

The document is built from the gateway's settings, so it states the limits in
force (the largest `timeout`) and whether a bearer token is required.

Event streams follow OpenAPI 3.1 practice: a `text/event-stream` response's
schema describes one event (`event`, `id`, and `data`, a JSON text whose
schema is its `contentSchema`), one alternative per event type.

Routes that are not part of this API are listed in `UNDOCUMENTED` with the
reason, so leaving a route out is always a visible decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernel_gateway import __version__
from kernel_gateway.http.responses import REQUEST_ID_HEADER
from kernel_gateway.settings import Settings
from kernel_gateway.shapes import events, requests, responses, schema

JSON = dict[str, Any]

UNDOCUMENTED: dict[str, str] = {
    "/static": "the web UI's own files (HTML, CSS, JavaScript), public and not part of the API",
    "/mcp": "the Model Context Protocol's streamable-HTTP endpoint: its contract is the MCP "
    "specification, and its tools describe themselves (tools/list)",
    "/api": "Jupyter Server's kernel API (kernelspecs, kernels, the channels WebSocket): its "
    "contract is Jupyter's REST API and messaging protocol",
    "/e2b": "E2B's API (sandboxes, the code interpreter, envd) for E2B's own SDKs: its "
    "contract is E2B's OpenAPI and envd specifications",
}
"""Route prefixes deliberately left out of the document, each with the reason.

Protocol endpoints that have their own specification (an MCP endpoint, a
Jupyter-compatible API) belong here too: their contract is that protocol's.
"""

# Event ids are decimal integers; the gateway reads at most 18 digits.
EVENT_ID_PATTERN = r"^[0-9]{0,18}$"
REF_TEMPLATE = "#/components/schemas/{model}"

REQUESTS = (requests.NewSession, requests.ExecuteRequest, requests.StatelessExecuteRequest)
"""The request bodies, as clients send them."""
RESPONSES = (
    responses.Error,
    responses.Session,
    responses.InterruptedSession,
    responses.ResumedSession,
    responses.SessionList,
    responses.ExecutionList,
    responses.FileInfo,
    responses.FileList,
    responses.Health,
    responses.LanguageList,
    responses.CollectedExecution,
    *events.EVENT_DATA.values(),
)
"""The response bodies and the events' `data`, as the gateway sends them."""


def _ref(name: str) -> JSON:
    return {"$ref": REF_TEMPLATE.format(model=name)}


def _schemas(settings: Settings) -> JSON:
    """Every model's schema (with the limits of these settings), and the event stream."""
    schemas = schema.definitions(REQUESTS, RESPONSES, settings, ref_template=REF_TEMPLATE)
    return {**schemas, "ServerSentEvent": _server_sent_event()}


def _with_languages(schemas: JSON, languages: Sequence[str] | None) -> JSON:
    """`language` as an enum of the gateway's languages, in every request that takes one:
    the contract says exactly what is accepted (anything else is 400 `unknown_language`)."""
    if not languages:
        return schemas
    for found in schemas.values():
        prop = found.get("properties", {}).get("language") if isinstance(found, dict) else None
        if not isinstance(prop, dict):
            continue
        kinds = prop.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if "string" in kinds:
            prop["enum"] = [*languages, *([None] if "null" in kinds else [])]
            prop.pop("maxLength", None)
    return schemas


def _server_sent_event() -> JSON:
    """One frame of an event stream, for each event: its `data` is a JSON text whose
    schema is that event's data model."""
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
                    "contentSchema": _ref(data.__name__),
                },
            },
            "required": ["event", "id", "data"],
        }
        for name, data in events.EVENT_DATA.items()
    ]
    return {
        "description": "One frame of an execution's event stream: `id:`, `event:` and "
        "one `data:` line of JSON. Keepalive comments (`: ping`) come every 10 s. "
        "`done` is always the last event, exactly once.",
        "oneOf": frames,
    }


# -- responses -------------------------------------------------------------------------------

_ERROR_REASONS = {
    400: "Bad request: the body is not JSON, a bad file path, or (without a token) a `Host` "
    "that is not a loopback name.",
    401: "Missing or wrong bearer token (the same answer for both).",
    403: "The file path is or passes through a symlink, or cannot be accessed; or the "
    "network policy asks for domains beyond the gateway's `--egress-allow` "
    "(`network_not_allowed`).",
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
        ("Hibernate", "hibernateSession"),
        ("Resume", "resumeSession"),
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
            "/languages",
            "get",
            {
                "operationId": "listLanguages",
                "summary": "The languages this gateway runs, with versions and warm kernels.",
                "tags": ["operations"],
                "responses": {"200": _ok("The languages, Python first.", _json("LanguageList"))},
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
                "x-errors": [*json_body, 403, 429, *kernel_start],
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
                "x-errors": [*json_body, 403, 429, *kernel_start],
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
            "/sessions/{session_id}/hibernate",
            "post",
            {
                "operationId": "hibernateSession",
                "summary": "Save the session's variables to disk and stop its kernel; it "
                "resumes by itself on its next call (Python sessions).",
                "description": "Waits until it is saved. 409 `session_busy` while a cell runs "
                "or waits (or the session is used while it is saved: the use wins); 409 "
                "`conflict` for a session of another language, or with a notebook connected; "
                "503 `hibernation_failed` when it could not be saved (it runs on as it was). "
                "`hibernation.lost` names what the snapshot could not keep.",
                "tags": ["sessions"],
                "parameters": [_SESSION_ID],
                "responses": {"200": _ok("The session, hibernated.", _json("Session"))},
                "x-errors": [404, 409, 410, 503],
            },
        ),
        (
            "/sessions/{session_id}/resume",
            "post",
            {
                "operationId": "resumeSession",
                "summary": "Bring a hibernated session back now (any call that needs its "
                "kernel does this by itself).",
                "tags": ["sessions"],
                "parameters": [_SESSION_ID],
                "responses": {
                    "200": _ok(
                        "The session, running, with what resuming it reported.",
                        _json("ResumedSession"),
                    )
                },
                "x-errors": [404, 409, 410, *kernel_start],
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


def build(settings: Settings, languages: Sequence[str] | None = None) -> JSON:
    """The OpenAPI 3.1 document for a gateway with these settings (and, when given, these
    languages: `language` then lists exactly them)."""
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
            "schemas": _with_languages(_schemas(settings), languages),
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
