"""The API's request bodies: what clients send, validated strictly, with the errors worded once.

Request bodies are frozen pydantic models, validated in strict mode: a string is never
taken for a number, nor `true` for one; unknown fields are refused. A failure becomes the
gateway's own error through `request_error`, the one place that words those messages; the
HTTP routes (`http.bodies.read_model`), the MCP tools and Jupyter's kernel API all go
through it. The field types (`Code`, `Timeout`, `FilePath`) are shared with the MCP tools'
argument models.

Two limits come from the gateway's settings: the longest `timeout` and the largest
uploaded file. Validation reads them from its context (`Limits`, which `Settings`
satisfies); `schema.py` writes the timeout's maximum and default into the schemas it makes.
"""

from __future__ import annotations

import base64
import binascii
import types
from typing import (
    Annotated,
    Any,
    Literal,
    NamedTuple,
    Protocol,
    Self,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
)
from pydantic_core import ErrorDetails, PydanticCustomError
from typing_extensions import TypeAliasType

from kernel_gateway.errors import GatewayError, InvalidRequest, PayloadTooLarge
from kernel_gateway.shapes.paths import MAX_PATH_LENGTH, split_path
from kernel_gateway.types import JSON

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

    @classmethod
    def from_json(cls, body: JSON, limits: Limits) -> Self:
        """`body` as this model, or the gateway's error for its first problem (what
        `kernel_gateway.http.bodies.read_model` calls)."""
        return validate(cls, body, limits)


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


TemplateName = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=200,
        description="A template (`GET /templates`) to start the kernel from: its name "
        "(`analytics`: its `default` tag, else its newest ready build), `name:tag`, or its "
        "id. Its kernels are its base's language; `language` may be left out.",
    ),
]


SnapshotName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Letters, digits and `-_.`, starting with a letter or digit.",
    ),
]


VolumeRef = Annotated[str, Field(min_length=1, max_length=128)]
MountPath = Annotated[str, Field(max_length=1024)]
VolumeMounts = Annotated[
    dict[VolumeRef, MountPath] | None,
    Field(
        max_length=16,
        description="Volumes (`GET /volumes`) to mount, by name or id → where: an absolute "
        'path such as `/mnt/data` (`{"datasets": "/mnt/data"}`). Not under the system '
        "(/usr, /etc, ...) nor over /tmp, the working directory or home themselves. A "
        "session with volumes gets a kernel started for it (about a second more).",
    ),
]


SECRETS = Field(max_length=32, description="Secrets (`GET /secrets`) its code may use.")


class NewSession(RequestModel):
    """A new session: send an empty object (or no body) for Python."""

    language: LanguageName = None
    network: NetworkPolicy = None
    template: TemplateName = None
    snapshot: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=200,
            description="A snapshot (`GET /snapshots`) to start from, by id or name: the "
            "session gets its files and (Python) variables, its language and template, and "
            "its network policy unless `network` asks another. A `language` or `template` "
            "given with it must be the snapshot's (else 409 `conflict`).",
        ),
    ] = None
    volumes: VolumeMounts = None
    secrets: Annotated[list[Annotated[str, Field(pattern=r"^\w{1,128}$")]] | None, SECRETS] = None


class NewVolume(RequestModel):
    """A new volume."""

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=128,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
            description="Its name, unique on the gateway: letters, digits and `-_.`, starting "
            "with a letter or digit.",
        ),
    ]
    size: Annotated[
        Annotated[int, Field(ge=1)]
        | Annotated[
            str, Field(pattern=r"^\s*0*[1-9][0-9]{0,15}\s*([kKmMgGtT]([iI]?[bB])?|[bB])?\s*$")
        ]
        | None,
        Field(
            description="Its size cap: bytes, or a size such as `512m` or `2g`; default the "
            "gateway's `--volume-size`. At least 16 MiB (smaller is rounded up); more than the "
            "gateway's `--max-volume-size` is refused with 403.",
        ),
    ] = None


class NetworkChange(RequestModel):
    """A running session's new network policy (it replaces the one it had)."""

    network: NetworkPolicy


class NewSnapshot(RequestModel):
    """A snapshot of the session as it is now."""

    name: Annotated[
        SnapshotName | None,
        Field(description="Keep it under this name: a snapshot of that name is replaced."),
    ] = None


def whole(value: object) -> object:
    """A JSON number with no fraction (`93.0`) is an integer, as JSON Schema says."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class ForkRequest(RequestModel):
    """Copies of the session as it is now."""

    count: Annotated[
        int,
        Field(ge=1, le=100, description="How many copies (1 to 100)."),
        BeforeValidator(whole),
    ] = 1


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
    template: TemplateName = None


class StartKernelRequest(RequestModel):
    """`POST /api/kernels` (Jupyter's kernel API): of `env`, only `KERNEL_NETWORK_ALLOW` (the
    domains the kernel may reach, comma-separated) and `KERNEL_TEMPLATE` (a template to start
    it on: `name`, `name:tag` or its id) are applied."""

    name: str | None = None
    env: dict[str, str] | None = None
    path: str | None = None


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


# -- templates ------------------------------------------------------------------------------

TemplateNameField = Annotated[
    str,
    Field(
        pattern=r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$",
        description="1 to 64 lowercase letters, digits, `.`, `_` or `-`, starting and ending "
        "with a letter or digit.",
    ),
]


class TemplateStep(RequestModel):
    """One build step: E2B's step types (see docs/templates.md)."""

    type: Annotated[
        Literal["RUN", "COPY", "ENV", "WORKDIR", "USER"],
        Field(
            description="`RUN [command, user?]`, `COPY [src, dest, user?, mode?]`, "
            "`ENV [key, value, ...]`, `WORKDIR [path]`, `USER [name]`."
        ),
    ]
    args: Annotated[list[Annotated[str, Field(max_length=65536)]], Field(max_length=256)] = []
    files_hash: Annotated[
        str | None,
        Field(
            pattern=r"^[0-9a-f]{64}$",
            description="COPY: the SHA-256 of files uploaded with `PUT /templates/files/{hash}` "
            "(default: the request's `context`).",
        ),
    ] = None
    force: Annotated[bool, Field(description="Run it (and every step after) uncached.")] = False


class TemplateBuildRequest(RequestModel):
    """A build: a base and steps, or a Dockerfile; files for COPY in `context`."""

    base: Annotated[
        str | None,
        Field(
            max_length=200,
            description="What to build on: `python` (the default image; E2B's `e2bdev/base`), "
            "a language of `GET /languages`, or `template:NAME[:TAG]`. Default python.",
        ),
    ] = None
    steps: Annotated[list[TemplateStep] | None, Field(max_length=100)] = None
    dockerfile: Annotated[
        str | None,
        Field(
            max_length=1 << 20,
            description="Instead of `base` and `steps`: a Dockerfile whose FROM names a base "
            "as `base` does (one stage; COPY sources come from `context`).",
        ),
    ] = None
    context: Annotated[
        Base64 | None,
        Field(description="A tar (or tar.gz) of the files COPY steps copy, base64."),
    ] = None
    start_cmd: Annotated[str | None, Field(max_length=65536)] = None
    ready_cmd: Annotated[str | None, Field(max_length=65536)] = None
    tags: Annotated[
        list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")]] | None,
        Field(max_length=32, description="Tags the build takes once ready (default: `default`)."),
    ] = None
    force: Annotated[bool, Field(description="Build every step uncached.")] = False


class NewTemplate(TemplateBuildRequest):
    """A new template and its first build."""

    name: TemplateNameField
