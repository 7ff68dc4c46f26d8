"""The API's contract: an OpenAPI 3.1 document, served at `GET /openapi.json`.

Built from the same records as the routes (`server/routes/`: one `Operation` per endpoint,
beside its handler), so a route cannot exist undocumented nor an operation unrouted;
`tests/unit/test_openapi.py` checks it all the same, and Schemathesis
(`tests/integration/test_fuzz.py`) checks that every answer of a live gateway matches the document:
status, content type, headers and body. This module turns records into operations and adds
what all share: the error answers, the request id header, the security scheme.

Its schemas are not written here: `components.schemas` is generated from the
typed models of `kernel_gateway.sessions.models`, the same ones the routes
validate request bodies with. This module holds the operations (paths,
parameters, responses, descriptions) and the event-stream frame.

The document is built from the gateway's settings, so it states the limits in
force (the largest `timeout`) and whether a bearer token is required.

Event streams follow OpenAPI 3.1 practice: a `text/event-stream` response's
schema describes one event (`event`, `id`, and `data`, a JSON text whose
schema is its `contentSchema`), one alternative per event type.

Routes that are not part of this API are the surfaces' (`Surface`: MCP, Jupyter's API,
E2B's, the web UI's files), each left out with the reason, so leaving a route out is always
a visible decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernel_gateway import __version__
from kernel_gateway.http.operations import Operation, Reply
from kernel_gateway.http.responses import REQUEST_ID_HEADER
from kernel_gateway.server.routes import OPERATIONS, SURFACES
from kernel_gateway.settings import Settings
from kernel_gateway.shapes import chat, events, responses, schema

JSON = dict[str, Any]

UNDOCUMENTED: dict[str, str] = {surface.prefix: surface.reason for surface in SURFACES}
"""Route prefixes deliberately left out of the document, each with the reason (the
surfaces': protocol endpoints that have their own specification, the web UI's files)."""

REF_TEMPLATE = "#/components/schemas/{model}"

REQUESTS = tuple(
    dict.fromkeys(op.body.model for op in OPERATIONS if op.body and op.body.model is not None)
)
"""The request bodies, as clients send them: those the operations name."""
RESPONSES = tuple(
    dict.fromkeys(
        [
            responses.Error,
            *(reply.shape for op in OPERATIONS for reply in op.replies if reply.shape),
            responses.CollectedExecution,
            responses.BuildLog,
            *events.EVENT_DATA.values(),
            *chat.CHAT_EVENT_DATA.values(),
        ]
    )
)
"""The response bodies the operations name, the error body, the collected execution, a
build's log page and the events' `data`, as the gateway sends them."""


def _ref(name: str) -> JSON:
    return {"$ref": REF_TEMPLATE.format(model=name)}


def _schemas(settings: Settings) -> JSON:
    """Every model's schema (with the limits of these settings), and the event stream."""
    schemas = schema.definitions(REQUESTS, RESPONSES, settings, ref_template=REF_TEMPLATE)
    return {**schemas, "ServerSentEvent": _server_sent_event(), "ChatEvent": _chat_event()}


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


def _frame(name: str, data: type) -> JSON:
    return {
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


def _chat_event() -> JSON:
    """One frame of a chat turn's stream: the chat's own events and its cells' events."""
    frames = [_frame(n, d) for n, d in (*chat.CHAT_EVENT_DATA.items(), *events.EVENT_DATA.items())]
    return {
        "description": "One frame of a chat turn's event stream: `turn` first, the model's "
        "`text`, each `cell` followed by that cell's events up to its `done`, and `end` last, "
        "exactly once. Keepalive comments (`: ping`) come every 10 s.",
        "oneOf": frames,
    }


def _server_sent_event() -> JSON:
    """One frame of an event stream, for each event: its `data` is a JSON text whose
    schema is that event's data model."""
    frames = [_frame(name, data) for name, data in events.EVENT_DATA.items()]
    return {
        "description": "One frame of an execution's event stream: `id:`, `event:` and "
        "one `data:` line of JSON. Keepalive comments (`: ping`) come every 10 s. "
        "`done` is always the last event, exactly once.",
        "oneOf": frames,
    }


# -- responses ---------------------------------------------------------------------------

_ERROR_REASONS = {
    400: "Bad request: the body is not JSON, a bad file path, or (without a token) a `Host` "
    "that is not a loopback name.",
    401: "Missing or wrong bearer token (the same answer for both).",
    403: "The file path is or passes through a symlink, or cannot be accessed; or the "
    "network policy asks for domains beyond the gateway's `--egress-allow` "
    "(`network_not_allowed`).",
    404: "No such session, execution, file, template (`template_not_found`) or route.",
    409: "The session is busy (too many queued executions), deleted, or failed; or the file "
    "path names a folder; or the template has no ready build (`template_conflict`); or the "
    "session's chat is answering a message (`turn_running`).",
    410: "The execution's events are past the session's retention (`execution_expired`), or "
    "the session was persisted but its kernel did not survive the gateway's restart "
    "(`session_lost`).",
    413: "The body is over the size limit (refused before it is read whole).",
    415: "A JSON body sent without `Content-Type: application/json`.",
    422: "Well-formed JSON with wrong or unknown fields, or a bad value.",
    429: "Too many sessions or stateless executions at once: retry after `Retry-After`; or a "
    "quota is full (`too_many_snapshots`, `too_many_templates`, `too_many_volumes`, no "
    "`Retry-After`): delete one first.",
    501: "This gateway has no model for the chat (`chat_not_configured`: start it with "
    "`--llm-url` and `--llm-model`), or keeps no secrets (`secrets_not_configured`: start it "
    "with `--secrets-key-file`).",
    503: "No kernel could be started in time (`kernel_unavailable`), or the gateway is "
    "draining for a restart and did nothing (`shutting_down`); retry after `Retry-After`; or "
    "the backend runs no templates (`backend_unavailable`).",
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
    if status == 503:
        extra["Retry-After"] = _RETRY_AFTER
    if status == 429:  # a full quota (snapshots, templates, volumes) frees only by a delete
        extra["Retry-After"] = {**_RETRY_AFTER, "required": False}
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


def _reply(reply: Reply) -> JSON:
    response: JSON = {"description": reply.description, "headers": _headers(dict(reply.headers))}
    if reply.shape is not None:
        response["content"] = _json(reply.shape.__name__)
    elif reply.content is not None:
        response["content"] = dict(reply.content)
    if reply.links:
        response["links"] = dict(reply.links)
    return response


def _parameter(name: str) -> JSON:
    """A path parameter: a plain string, or the file path's own schema."""
    if name == "path":
        return {
            "name": "path",
            "in": "path",
            "required": True,
            "description": "May contain `/`: it names a file in a folder of the working directory.",
            "schema": _ref("FilePath"),
        }
    if name == "hash":
        return {
            "name": "hash",
            "in": "path",
            "required": True,
            "description": "The files' SHA-256, 64 lowercase hex digits.",
            "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        }
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _operation(op: Operation, token: bool) -> JSON:
    """One operation of the document, from its record: its errors besides 400 (and 401
    behind a token, unless it is public) become responses with the error document."""
    document: JSON = {"operationId": op.id}
    if op.summary:
        document["summary"] = op.summary
    if op.description:
        document["description"] = op.description
    document["tags"] = list(op.tags)
    if op.public:
        document["security"] = []
    parameters = [_parameter(name) for name in op.path_parameters] + list(op.parameters)
    if parameters:
        document["parameters"] = parameters
    if op.body is not None:
        content = (
            _json(op.body.model.__name__)
            if op.body.model is not None
            else dict(op.body.content or {})
        )
        document["requestBody"] = {"required": op.body.required, "content": content}
    responses = {str(reply.status): _reply(reply) for reply in op.replies}
    errors = {400, *op.errors}  # a malformed request, or a non-loopback Host without a token
    if token and not op.public:
        errors.add(401)
    for status in sorted(errors):
        responses[str(status)] = _error(status)
    document["responses"] = responses
    return document


def build(settings: Settings, languages: Sequence[str] | None = None) -> JSON:
    """The OpenAPI 3.1 document for a gateway with these settings (and, when given, these
    languages: `language` then lists exactly them)."""
    token = settings.token is not None
    paths: JSON = {}
    for op in OPERATIONS:
        paths.setdefault(op.template, {})[op.method] = _operation(op, token)
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
