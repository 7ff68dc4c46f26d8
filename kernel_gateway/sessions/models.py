"""The API's shapes, each defined once: request bodies, responses, events and the error body.

Every shape here has three uses, all generated from its one definition:

- validation: the HTTP routes (`server/validation.py`) and the MCP tools validate what
  clients send with `validate`; a failure becomes the gateway's own error through
  `request_error`, the one place that words those messages;
- the OpenAPI document (`server/openapi.py`) takes its `components.schemas` from
  `definitions`;
- the MCP tools (`protocols/mcp/tools.py`) take their input schemas from `input_schema`,
  for argument models built of the same field types (`Code`, `Timeout`, `FilePath`).

Request bodies are frozen pydantic models, validated in strict mode: a string is never
taken for a number, nor `true` for one; unknown fields are refused. Responses and events
are TypedDicts: the gateway builds them as plain dicts on the hot path (no model object is
made per event), and their schemas state what those dicts hold.

Two limits come from the gateway's settings: the longest `timeout` and the largest
uploaded file. Validation reads them from its context (`Limits`, which `Settings`
satisfies); `definitions` and `input_schema` write the timeout's maximum and default
into the schemas they make.

The classes are named as the OpenAPI document's components (`Session` is the session's
JSON, not `kernel_gateway.sessions.session.Session`).
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
import types
from collections.abc import Iterable
from typing import (
    Annotated,
    Any,
    Literal,
    NamedTuple,
    NotRequired,
    Protocol,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    with_config,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import ErrorDetails, PydanticCustomError, core_schema
from typing_extensions import TypeAliasType, TypedDict

from kernel_gateway.errors import GatewayError, InvalidRequest, PayloadTooLarge
from kernel_gateway.kernels.workspace import MAX_PATH_LENGTH, split_path
from kernel_gateway.types import (
    EVENT_NAMES,
    JSON,
    DiedReason,
    DoneStatus,
    EventName,
    ExecutionStatus,
    SessionStatus,
)

M = TypeVar("M", bound=BaseModel)


class TimeoutLimits(Protocol):
    """The settings a schema states: the default and the largest `timeout`."""

    @property
    def exec_timeout(self) -> float: ...
    @property
    def max_exec_timeout(self) -> float: ...


class Limits(TimeoutLimits, Protocol):
    """The settings validation checks against (the gateway's `Settings` has them)."""

    @property
    def max_upload_bytes(self) -> int: ...


class Timeouts(NamedTuple):
    """`TimeoutLimits` given by value, where there are no settings at hand."""

    exec_timeout: float
    max_exec_timeout: float


def _limits(info: ValidationInfo) -> Limits:
    if info.context is None:
        raise TypeError("request models are validated with context=<Limits> (the settings)")
    limits: Limits = info.context
    return limits


# -- field types shared by requests and tool arguments -----------------------------------------

# A relative path in a session's working directory, as `workspace.split_path` accepts
# it: not absolute, no `..` part, at least one part that is not empty or `.`, no NUL,
# names of at most 255 characters (the gateway counts 255 bytes of UTF-8, which no
# pattern can; a longer non-ASCII name is refused all the same).
_NAME = r"(?:[^/\x00.][^/\x00]{0,254}|\.[^/\x00.][^/\x00]{0,253}|\.\.[^/\x00]{1,253})"
FILE_PATH_PATTERN = rf"^(?:\.(?:/\.?)*/)?{_NAME}(?:/(?:{_NAME}|\.?))*$"
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def valid_unicode(value: str) -> str:
    """`value`, refused when it holds a lone surrogate (it cannot be sent on as UTF-8)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("unicode", "is not valid Unicode (lone surrogate)") from None
    return value


def _file_path(value: str) -> str:
    """`split_path`'s check (the one the file API makes), as a validation error."""
    try:
        split_path(value)
    except GatewayError as exc:
        raise PydanticCustomError("file_path", "{reason}", {"reason": exc.message}) from None
    return value


def within_upload_limit(data: bytes, info: ValidationInfo) -> bytes:
    """`data`, refused when it is larger than an uploaded file may be."""
    limit = _limits(info).max_upload_bytes
    if len(data) > limit:
        raise PydanticCustomError(
            "too_large", "exceeds the {limit}-byte upload limit", {"limit": limit}
        )
    return data


def decode_base64(value: object) -> bytes:
    """Strict base64 (no stray characters, right padding) to bytes, or a validation error."""
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "Input should be a valid string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise PydanticCustomError("base64", "is not valid base64") from None


def _within_max_timeout(value: float | None, info: ValidationInfo) -> float | None:
    limit = _limits(info).max_exec_timeout
    if value is not None and value > limit:
        raise PydanticCustomError(
            "less_than_equal", "Input should be less than or equal to {le}", {"le": limit}
        )
    return value


TIMEOUT_DESCRIPTION = "Seconds the code may run before it is interrupted"

Code = Annotated[
    str,
    AfterValidator(valid_unicode),
    Field(
        description="Python source to run as one IPython cell, as in a notebook: the value "
        "of its last expression is its result."
    ),
]
Timeout = Annotated[
    float | None,
    Field(gt=0, allow_inf_nan=False, description=TIMEOUT_DESCRIPTION + "."),
    AfterValidator(_within_max_timeout),
]
"""At most the gateway's `max_exec_timeout` (stated in the schemas by `with_limits`)."""

FilePath = TypeAliasType(
    "FilePath",
    Annotated[
        str,
        AfterValidator(_file_path),
        WithJsonSchema(
            {
                "type": "string",
                "description": "Relative to the session's working directory; `..`, absolute "
                "paths and NUL bytes are refused, and each name may have at most 255 bytes of "
                "UTF-8. Folders are created on upload.",
                "minLength": 1,
                "maxLength": MAX_PATH_LENGTH,
                "pattern": FILE_PATH_PATTERN,
            }
        ),
    ],
)
Base64 = Annotated[
    bytes,
    PlainValidator(decode_base64),
    WithJsonSchema({"type": "string", "contentEncoding": "base64", "pattern": BASE64_PATTERN}),
]


# -- request bodies ----------------------------------------------------------------------------


class RequestModel(BaseModel):
    """What a client sends: strict types, unknown fields refused, read-only once valid."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True
    )


LanguageName = Annotated[
    str | None,
    Field(
        max_length=32,
        description="The kernel's language: one of `GET /languages` (python, javascript, "
        "typescript, r, bash, java where their images are built); default python. One this "
        "gateway lacks is refused with 400 `unknown_language`, naming those it has.",
    ),
]


class NetworkAllow(RequestModel):
    """Domains the session's code may reach through the gateway's egress proxy."""

    allow: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=255)]],
        Field(
            max_length=64,
            description="Domain names (`data.example.com`) and wildcards (`*.example.org`: "
            "the names under it). Each must be within the gateway's `--egress-allow`, or "
            "the request is refused with 403 `network_not_allowed` naming it.",
        ),
    ]


NetworkPolicy = Annotated[
    Literal["none"] | NetworkAllow | None,
    Field(
        description='`"none"`: no network at all (the default unless the operator set '
        '`--egress-default`); `{"allow": [...]}`: only those domains, through the egress '
        "proxy (HTTP and HTTPS, ports 80 and 443). See docs/network.md."
    ),
]


def network_asked(policy: Literal["none"] | NetworkAllow | None) -> list[str] | str | None:
    """A request's `network` as the registry takes it."""
    return policy.allow if isinstance(policy, NetworkAllow) else policy


class NewSession(RequestModel):
    """A new session: send an empty object (or no body) for Python."""

    language: LanguageName = None
    network: NetworkPolicy = None


class ExecuteRequest(RequestModel):
    """A cell to run in the session."""

    code: Code
    timeout: Timeout = None


class StatelessFile(RequestModel):
    """A file put in a stateless execution's working directory before its code runs."""

    path: FilePath
    data: Annotated[Base64, AfterValidator(within_upload_limit)]


class StatelessExecuteRequest(RequestModel):
    """A cell to run in a fresh kernel, with the files it needs."""

    code: Code
    timeout: Timeout = None
    files: list[StatelessFile] | None = None
    """Files put in the working directory before the code runs."""
    language: LanguageName = None
    network: NetworkPolicy = None


class StartKernelRequest(RequestModel):
    """`POST /api/kernels` (Jupyter's kernel API): of `env`, only `KERNEL_NETWORK_ALLOW` is
    applied (the domains the kernel may reach, comma-separated)."""

    name: str | None = None
    env: dict[str, str] | None = None
    path: str | None = None


# -- responses ---------------------------------------------------------------------------------

_closed = with_config(ConfigDict(extra="forbid", use_attribute_docstrings=True))
"""A response object: it holds exactly the fields its TypedDict names."""

Count = Annotated[int, Field(ge=0)]
Milliseconds = Annotated[float, Field(ge=0)]
Timestamp = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
Base64Text = Annotated[str, WithJsonSchema({"type": "string", "contentEncoding": "base64"})]


def error_types() -> list[str]:
    """Every error `type` the gateway answers with: one per `GatewayError` class."""
    found: set[str] = set()
    pending: list[type[GatewayError]] = [GatewayError]
    while pending:
        cls = pending.pop()
        found.add(cls.error_type)
        pending.extend(cls.__subclasses__())
    # Raised by the router itself, mapped in error_handlers.py.
    found.update({"method_not_allowed", "http_error"})
    return sorted(found)


def _known_error_type(value: str) -> str:
    if value not in error_types():
        raise PydanticCustomError("error_type", "is not an error type of the gateway")
    return value


def _error_type_enum(schema: dict[str, Any]) -> None:
    schema["enum"] = error_types()


@_closed
class ErrorDetail(TypedDict):
    type: Annotated[
        str, AfterValidator(_known_error_type), Field(json_schema_extra=_error_type_enum)
    ]
    message: str


@_closed
class Error(TypedDict):
    """Every error answer's body."""

    error: ErrorDetail


@_closed
class NetworkGranted(TypedDict):
    allow: list[str]
    """The domain patterns the session may reach (normalized: lower case, no final dot)."""


@_closed
class LostName(TypedDict):
    name: str
    """The variable's name (`Out[N]` for an output kept in `Out`; `*` for all of them)."""
    reason: str
    """Why it could not be kept, e.g. `TypeError: cannot pickle 'socket' object`."""


@_closed
class Hibernation(TypedDict):
    """A hibernated session's snapshot: its variables are on disk, its kernel stopped."""

    since: Timestamp
    bytes: Count
    """The snapshot's size on disk."""
    lost: list[LostName]
    """Names the snapshot could not keep: they will be missing when the session resumes."""


@_closed
class Session(TypedDict):
    """A session: a kernel kept for one client, with its working directory."""

    # Descriptions in Field, not docstrings: InterruptedSession's schema repeats them.
    id: Annotated[
        str,
        Field(description="The session id: 32 hex digits (after `node.` with `--node-name`)."),
    ]
    language: Annotated[str, Field(description="The language its kernel runs.")]
    status: SessionStatus
    created_at: Timestamp
    idle_seconds: Annotated[float, Field(ge=0)]
    execution_count: Count
    queued: Count
    restarts: Count
    failed: Annotated[
        str | None, Field(description="Why the session failed (its kernel kept dying), else null.")
    ]
    network: Annotated[
        Literal["none"] | NetworkGranted,
        Field(description='Its network policy: "none", or the domains it may reach.'),
    ]
    hibernation: Annotated[
        Hibernation | None,
        Field(
            description="While `status` is `hibernated`: its snapshot; else null. Any call "
            "that needs the kernel resumes it."
        ),
    ]


@_closed
class InterruptedSession(Session):
    interrupted: bool
    """false when nothing was running"""


@_closed
class ResumedSession(Session):
    resumed: Annotated[
        ResumedData | None,
        Field(
            description="What resuming it reported (the names that did not come back); null "
            "when it was not hibernated."
        ),
    ]


@_closed
class SessionList(TypedDict):
    sessions: list[Session]


@_closed
class ExecutionSummary(TypedDict):
    id: str
    status: ExecutionStatus
    submitted_at: Timestamp
    duration_ms: Milliseconds
    execution_count: int | None
    last_event_id: int | None


@_closed
class ExecutionList(TypedDict):
    executions: list[ExecutionSummary]


@_closed
class FileInfo(TypedDict):
    path: str
    size: Count
    modified: Timestamp
    mime: str
    url: str


@_closed
class FileList(TypedDict):
    files: list[FileInfo]


@_closed
class PoolStats(TypedDict):
    warm: Count
    starting: Count
    target: Count
    kernels_started: Count
    sessions: Count
    max_sessions: Count
    stateless: Count
    max_stateless: Count


@_closed
class ForkServerStats(TypedDict):
    idle: Count
    busy: Count
    starting: Count
    target: Count
    servers_started: Count
    requests_served: Count
    light_requests: Count
    """Of `requests_served`, those forked from the light template (`--fork-light-preload`)."""


@_closed
class Health(TypedDict):
    status: Literal["ok"]
    backend: Literal["docker", "local"]
    instance: str
    isolation: str
    languages: list[str]
    """The languages served (details: `GET /languages`)."""
    node: NotRequired[str]
    """This gateway's node (`--node-name`): session ids made here start with it and a dot."""
    pool: PoolStats
    stateless_mode: Literal["fork", "container"]
    """How stateless requests get a kernel (`--stateless-mode`)."""
    fork_servers: NotRequired[ForkServerStats]
    """Fork-server containers (only with `stateless_mode` fork)."""


@_closed
class LanguagePool(TypedDict):
    warm: Count
    starting: Count
    target: Count
    """Warm kernels kept (`--pool-size` for python, `--language-pool` for the others)."""


@_closed
class LanguageInfo(TypedDict):
    name: str
    """What `language` takes: python, javascript, typescript, r, bash, java, ..."""
    display_name: str
    version: str
    """The language's version in its image (empty when the image does not say)."""
    image: str | None
    """The kernel image it runs from (null: the gateway's own, `--image`)."""
    interrupt_mode: Literal["signal", "message"]
    """How a cell is interrupted: SIGINT, or Jupyter's interrupt_request (Deno)."""
    pool: LanguagePool


@_closed
class LanguageList(TypedDict):
    default: str
    languages: list[LanguageInfo]


# -- events: the `data` of each, and the events of a collected execution ----------------------

FreeObject = dict[str, Any]


@_closed
class TextData(TypedDict):
    text: str


@_closed
class DisplayData(TypedDict):
    data: FreeObject
    """MIME type -> value, as Jupyter sends it."""
    metadata: FreeObject
    display_id: str | None
    update: bool
    """true for update_display_data"""


@_closed
class ResultData(TypedDict):
    data: FreeObject
    metadata: FreeObject
    execution_count: int | None


@_closed
class ClearData(TypedDict):
    wait: bool


@_closed
class ErrorData(TypedDict):
    ename: str
    evalue: str
    traceback: list[str]


@_closed
class FileData(TypedDict):
    path: str
    size: Count
    mime: str
    url: str | None
    """Where to download it; null for stateless executions."""
    data: NotRequired[Base64Text]
    """The bytes, for images (and every file of a stateless run) up to KG_MAX_INLINE_FILE_BYTES."""


@_closed
class ResumedData(TypedDict):
    """The session was hibernated and resumed for this cell (or since its last one)."""

    lost: list[LostName]
    """Names that did not come back, each with why; empty when everything did."""
    hibernated_seconds: Annotated[float, Field(ge=0)]
    resume_ms: Milliseconds


@_closed
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


@_closed
class ResumedEvent(TypedDict):
    event: Literal["resumed"]
    data: ResumedData


@_closed
class StdoutEvent(TypedDict):
    event: Literal["stdout"]
    data: TextData


@_closed
class StderrEvent(TypedDict):
    event: Literal["stderr"]
    data: TextData


@_closed
class DisplayEvent(TypedDict):
    event: Literal["display"]
    data: DisplayData


@_closed
class ResultEvent(TypedDict):
    event: Literal["result"]
    data: ResultData


@_closed
class ClearEvent(TypedDict):
    event: Literal["clear"]
    data: ClearData


@_closed
class ErrorEvent(TypedDict):
    event: Literal["error"]
    data: ErrorData


@_closed
class FileEvent(TypedDict):
    event: Literal["file"]
    data: FileData


@_closed
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
        Field(discriminator="event"),
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


@_closed
class CollectedExecution(TypedDict):
    """An execution's events as one JSON document (`Accept: application/json`)."""

    execution_id: str
    status: DoneStatus
    stdout: str
    stderr: str
    error: ErrorData | None
    done: DoneData
    events: list[Event]


# -- validation --------------------------------------------------------------------------------


def validate(model: type[M], body: JSON, limits: Limits, *, noun: str = "field") -> M:
    """`body` as a `model`, or the gateway's error for its first problem (`request_error`)."""
    try:
        return model.model_validate(body, context=limits)
    except ValidationError as exc:
        raise request_error(exc, model, noun=noun) from None


_MESSAGES = {
    "missing": "'{loc}' is required",
    "string_type": "'{loc}' must be a string",
    "float_type": "'{loc}' must be a number",
    "int_type": "'{loc}' must be an integer",
    "bool_type": "'{loc}' must be true or false",
    "finite_number": "'{loc}' must be a finite number",
    "greater_than": "'{loc}' must be greater than {gt:g}",
    "less_than_equal": "'{loc}' must be at most {le:g}",
    "literal_error": "'{loc}' must be {expected}",
    "string_pattern_mismatch": "'{loc}' must match {pattern}",
    "list_type": "'{loc}' must be a list{shape}",
    "dict_type": "'{loc}' must be an object{shape}",
    "model_type": "'{loc}' must be an object{shape}",
    # Raised by the validators above.
    "unicode": "'{loc}' is not valid Unicode (lone surrogate)",
    "file_path": "'{loc}': {reason}",
    "base64": "'{loc}' is not valid base64",
    "too_large": "'{loc}' exceeds the {limit}-byte upload limit",
}


def request_error(
    exc: ValidationError, model: type[BaseModel], *, noun: str = "field"
) -> GatewayError:
    """The gateway's error for a body (or tool arguments, `noun="argument"`) that `model`
    refused: 422 `invalid_request` naming the field and what it must be, or 413 for a file
    over the upload limit. Unknown fields are reported first, all at once, with the allowed
    ones; otherwise the first problem in the order the fields are declared."""
    errors = exc.errors(include_url=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    top = [e for e in unknown if len(e["loc"]) == 1]
    if top or (unknown and errors[0]["type"] == "extra_forbidden"):
        parent = () if top else errors[0]["loc"][:-1]
        names = sorted(str(e["loc"][-1]) for e in unknown if e["loc"][:-1] == parent)
        allowed = sorted(_fields(_model_at(model, parent)))
        message = f"unknown {noun}(s): {', '.join(names)}; " + (
            f"allowed: {', '.join(allowed)}" if allowed else "none are allowed"
        )
        if parent:
            message = f"'{_where(parent)}': {message}"
        return InvalidRequest(message)
    error = errors[0]
    message = _message(error, model)
    if error["type"] == "too_large":
        return PayloadTooLarge(message)
    return InvalidRequest(message)


def _message(error: ErrorDetails, model: type[BaseModel]) -> str:
    kind, loc, value = error["type"], error["loc"], error.get("input")
    if kind.endswith("_type") and value is None and len(loc) == 1:
        kind = "missing"  # null stands for an absent value, and this one is required
    elif kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        kind = "finite_number"  # an integer too large for a float
    template = _MESSAGES.get(kind)
    if template is None:
        return f"'{_where(loc)}': {error['msg']}"
    return template.format(loc=_where(loc), shape=_shape(kind, model, loc), **error.get("ctx", {}))


def _where(loc: tuple[int | str, ...]) -> str:
    """`("files", 0, "path")` -> `files[0].path`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else part
    return out


def _shape(kind: str, model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """What an object (or a list's objects) at `loc` must hold, for the message."""
    if kind == "list_type":
        inner = _model_at(model, (*loc, 0))
        if inner is None:
            return ""
        names = [n if f.is_required() else f"{n}?" for n, f in inner.model_fields.items()]
        return " of {" + ", ".join(names) + "} objects"
    inner = _model_at(model, loc)
    if inner is None:
        return ""
    required = [f"'{n}'" for n, f in inner.model_fields.items() if f.is_required()]
    return " with " + " and ".join(required) if required else ""


def _fields(model: type[BaseModel] | None) -> list[str]:
    return list(model.model_fields) if model is not None else []


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The request model found at `loc` inside `model` (through lists and `| None`)."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(part, int):
            if get_origin(current) is not list:
                return None
            (current,) = get_args(current)
        elif isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(part)
            if field is None:
                return None
            current = field.annotation
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """`X | None` -> `X`; `Annotated[X, ...]` -> `X`."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
        elif get_origin(annotation) in (Union, types.UnionType):
            options = [a for a in get_args(annotation) if a is not type(None)]
            if len(options) != 1:
                return annotation
            annotation = options[0]
        else:
            return annotation


# -- JSON Schemas ------------------------------------------------------------------------------


class _Generator(GenerateJsonSchema):
    """pydantic's JSON Schemas, made compact: no title on every property, and `X | None`
    as `"type": [X, "null"]` where X is a plain type (so `timeout` states its `maximum`
    beside its type, not inside an `anyOf`)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        inner = self.generate_inner(schema["schema"])
        kind = inner.get("type")
        combined = {"$ref", "enum", "const", "anyOf", "oneOf", "allOf"}
        if isinstance(kind, str) and kind != "null" and not combined & inner.keys():
            return {**inner, "type": [kind, "null"]}
        return {"anyOf": [inner, {"type": "null"}]}


def with_limits(schema: JSON, limits: TimeoutLimits) -> JSON:
    """`schema` with the limits in force written in: every `timeout` property (in it, or in
    its `$defs`) gets the largest timeout as its `maximum`, and the default in its text."""
    for found in (schema, *schema.get("$defs", {}).values()):
        timeout = found.get("properties", {}).get("timeout")
        if timeout is not None:
            timeout["maximum"] = limits.max_exec_timeout
            timeout["description"] = (
                f"{TIMEOUT_DESCRIPTION} (default {limits.exec_timeout:g}, "
                f"at most {limits.max_exec_timeout:g})."
            )
    return schema


def definitions(
    validated: Iterable[Any],
    serialized: Iterable[Any],
    limits: TimeoutLimits,
    *,
    ref_template: str,
) -> JSON:
    """The JSON Schemas of these types and of every type they use, by name (for OpenAPI's
    `components.schemas`): `validated` ones as clients send them, `serialized` ones as the
    gateway answers them; `$ref`s follow `ref_template`."""
    generated = _definitions(tuple(validated), tuple(serialized), ref_template)
    schemas: JSON = with_limits({"$defs": copy.deepcopy(generated)}, limits)["$defs"]
    return schemas


@functools.cache
def _definitions(
    validated: tuple[Any, ...], serialized: tuple[Any, ...], ref_template: str
) -> JSON:
    """Made once per set of types (the limits are written into copies)."""
    inputs: list[tuple[Any, JsonSchemaMode, TypeAdapter[Any]]] = [
        *((t, "validation", TypeAdapter(t)) for t in validated),
        *((t, "serialization", TypeAdapter(t)) for t in serialized),
    ]
    _, schemas = TypeAdapter.json_schemas(
        inputs, ref_template=ref_template, schema_generator=_Generator
    )
    found: JSON = schemas.get("$defs", {})
    return found


def input_schema(model: type[BaseModel], limits: TimeoutLimits | None = None) -> JSON:
    """A self-contained JSON Schema of what `model` accepts (an MCP tool's `inputSchema`);
    `limits` are needed when it has a `timeout`."""
    schema = model.model_json_schema(schema_generator=_Generator)
    if limits is None:
        assert "timeout" not in schema["properties"], f"{model.__name__} needs its limits"
        return schema
    return with_limits(schema, limits)
