"""The MCP tools the gateway offers, and how a cell's events become MCP content. Pure.

A model reads the tool descriptions and nothing else, so they say what the
sandbox has, what persists, and how to keep a sandbox across calls. A cell's
events become one text block (output, result, traceback: what a person would
read in a notebook, without terminal colours), one image block per chart, and a
resource link per file the cell wrote: the text, the images and their limits are
`kernel_gateway.render`'s, the renderer the client's tool helpers use too.

Sandboxes are gateway sessions; their handle is the session id. Clients on the
handshake-era protocol (an MCP session) get one sandbox per MCP session without
passing anything; on the sessionless 2026-07-28 protocol a model keeps its
sandbox by passing back the `session` handle every result names. Where the operator allows
it (`--mcp-templates`), every tool takes a `template`: a sandbox started on that template
(one per template, as per language).

Each tool's arguments are a model, built of the HTTP API's own field types
(`kernel_gateway.sessions.models`): the tool's input schema is generated from
it, and the server validates the arguments with it.
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal, TypeVar

import mcp_types as types
from pydantic import BaseModel, Field, PlainValidator, ValidationInfo
from pydantic_core import PydanticCustomError

from kernel_gateway.errors import GatewayError
from kernel_gateway.render import IMAGE_TYPES as IMAGE_TYPES
from kernel_gateway.render import MAX_IMAGES as MAX_IMAGES
from kernel_gateway.render import MAX_TEXT as MAX_TEXT
from kernel_gateway.render import Transcript
from kernel_gateway.render import clip as clip
from kernel_gateway.settings import NODE_NAME
from kernel_gateway.shapes.requests import (
    Code,
    FilePath,
    Limits,
    RequestModel,
    Timeout,
    Timeouts,
    decode_base64,
    valid_unicode,
    validate,
    within_upload_limit,
)
from kernel_gateway.shapes.schema import input_schema
from kernel_gateway.types import JSON, Event

RUN_PYTHON = "run_python"
UPLOAD_FILE = "upload_file"
LIST_FILES = "list_files"
READ_FILE = "read_file"
RESTART_KERNEL = "restart_kernel"

M = TypeVar("M", bound=BaseModel)
MAX_TEMPLATES_SHOWN = 30
"""Templates a tool's `template` argument names, at most (the rest are counted)."""

# -- arguments: models built of the HTTP API's field types (`Code`, `Timeout`, `FilePath`) ------

SESSION_ID_PATTERN = rf"^(?:{NODE_NAME.pattern}\.)?[0-9a-f]{{32}}$"
"""A gateway session id: 32 hex digits, after `node.` on a gateway with `--node-name`."""

SessionHandle = Annotated[
    str | None,
    Field(
        pattern=SESSION_ID_PATTERN,
        description="The sandbox to use: the `session` handle a previous result of these "
        "tools named. Pass it back on every call to keep your variables and files. Omit it "
        "on your first call; without it a call uses this connection's own sandbox, or a new "
        "one where the connection has none.",
    ),
]
ToolPath = Annotated[
    FilePath,
    Field(
        description="A path relative to the sandbox's working directory, such as `data.csv` "
        "or `out/plot.png`; folders are separated by `/`."
    ),
]
Encoding = Annotated[
    Literal["text", "base64"],
    Field(description="`text` (UTF-8, the default) or `base64` for bytes."),
]


def _content(value: object, info: ValidationInfo) -> bytes:
    """`content` as bytes, read in the `encoding` declared (and validated) before it."""
    encoding = info.data.get("encoding")
    if encoding == "base64":
        data = decode_base64(value)
    elif not isinstance(value, str):
        raise PydanticCustomError("string_type", "Input should be a valid string")
    elif encoding == "text":
        data = valid_unicode(value).encode("utf-8")
    else:  # `encoding` is invalid, and reported as such
        return b""
    return within_upload_limit(data, info)


Content = Annotated[
    bytes,
    PlainValidator(_content, json_schema_input_type=str),
    Field(description="The file's content."),
]


ToolLanguage = Annotated[
    str | None,
    Field(
        max_length=32,
        description="The language of `code` (default python). Each language has its own "
        "sandbox: variables do not cross languages, files do not either.",
    ),
]


ToolNetwork = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=255)]] | None,
    Field(
        max_length=64,
        description='Domains the code may reach over HTTP(S), e.g. ["pypi.org", '
        '"files.pythonhosted.org"] (default: none, the sandbox has no network). Only '
        "domains the gateway allows can be asked for. A sandbox keeps the domains it was "
        "made with: asking for others gives a fresh sandbox with those.",
    ),
]


ToolTemplate = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=200,
        pattern=r"^[a-z0-9][a-z0-9._-]*(?::[A-Za-z0-9_][A-Za-z0-9_.-]*)?$",
        description="A template to start the sandbox from: its name (`analytics`), "
        "`name:tag`, or its id. The sandbox then runs the template's image: its packages, "
        "files and environment variables. Each template gets a sandbox of its own; a sandbox "
        "keeps the template it was made on.",
    ),
]


class RunPythonArguments(RequestModel):
    code: Code
    timeout: Timeout = None
    session: SessionHandle = None
    language: ToolLanguage = None
    network: ToolNetwork = None
    template: ToolTemplate = None


class ToolFile(RequestModel):
    path: ToolPath
    encoding: Encoding = "text"
    content: Content


class StatelessRunPythonArguments(RequestModel):
    code: Code
    timeout: Timeout = None
    files: list[ToolFile] | None = None
    """Files to put in the working directory before the code runs."""
    language: ToolLanguage = None
    network: ToolNetwork = None
    template: ToolTemplate = None


class UploadFileArguments(RequestModel):
    path: ToolPath
    encoding: Encoding = "text"
    content: Content
    session: SessionHandle = None
    template: ToolTemplate = None


class ReadFileArguments(RequestModel):
    path: ToolPath
    session: SessionHandle = None
    template: ToolTemplate = None


class SessionArguments(RequestModel):
    """list_files and restart_kernel: which sandbox, and nothing else."""

    session: SessionHandle = None
    template: ToolTemplate = None


class ToolInputError(ValueError):
    """The arguments do not fit the tool's schema: reported to the model as a tool error."""


def parse_arguments(model: type[M], arguments: JSON, limits: Limits) -> M:
    """The arguments as a `model` (`limits`: the gateway's settings), or a ToolInputError
    that says which argument is wrong and how, as the HTTP API would."""
    try:
        return validate(model, arguments, limits, noun="argument")
    except GatewayError as exc:
        raise ToolInputError(exc.message) from None


# -- the tools -----------------------------------------------------------------------------------


def run_python_tool(
    max_timeout: float,
    default_timeout: float,
    *,
    stateless: bool,
    languages: list[str] | None = None,
    egress: list[str] | None = None,
    templates: list[str] | None = None,
) -> types.Tool:
    """The run_python tool; `egress`: the domains the gateway lets sessions reach (none: the
    `network` argument is left out, as `language` is with Python alone); `templates`: those
    a sandbox may start on, described (None: the `template` argument is left out)."""
    if stateless:
        arguments: type[RequestModel] = StatelessRunPythonArguments
        persistence = (
            "Every call starts in a fresh, empty sandbox that is destroyed afterwards: define "
            "everything you need in the same call, and pass input files in `files`. Files "
            "the code writes are returned in full."
        )
    else:
        arguments = RunPythonArguments
        persistence = (
            "Variables, imports and files persist from call to call in the same sandbox "
            "(pass back the `session` handle each result names). Files the code writes "
            "in its working directory are listed with a download URL; read them with "
            "read_file."
        )
    return types.Tool(
        name=RUN_PYTHON,
        title="Run Python",
        description=(
            "Run Python code in a sandboxed IPython kernel (Python 3, with numpy, pandas, "
            "scipy, matplotlib, seaborn, openpyxl and Pillow; "
            + ("network only to the domains `network` names" if egress else "no internet access")
            + ") and get back "
            "what it printed, the value of its last expression, the full traceback if it "
            "raised, and every matplotlib/seaborn/pandas chart as an image (charts appear "
            "by themselves; no need to save them). " + persistence + " A cell that runs "
            "past its timeout is interrupted; cancelling the call interrupts it too."
            + _other_languages(languages or ["python"])
        ),
        input_schema=with_templates(
            _with_network(
                _with_languages(
                    input_schema(arguments, Timeouts(default_timeout, max_timeout)), languages
                ),
                egress,
            ),
            templates,
        ),
        annotations=types.ToolAnnotations(
            title="Run Python", read_only_hint=False, destructive_hint=False, open_world_hint=False
        ),
    )


def _with_languages(schema: JSON, languages: list[str] | None) -> JSON:
    """`language` offered with the gateway's languages as its enum; left out where Python is
    the only one (a model is not shown a choice it does not have)."""
    properties = schema["properties"]
    if not languages or len(languages) < 2:
        properties.pop("language", None)
        return schema
    properties["language"] = {
        **properties["language"],
        "type": "string",
        "enum": list(languages),
        "default": "python",
    }
    return schema


def _with_network(schema: JSON, egress: list[str] | None) -> JSON:
    """`network` offered only when the gateway allows some domains, naming them."""
    properties = schema["properties"]
    if not egress:
        properties.pop("network", None)
        return schema
    network = properties["network"]
    network["description"] = (
        network.get("description", "") + " This gateway allows: " + ", ".join(egress) + "."
    )
    return schema


def with_templates(schema: JSON, templates: list[str] | None) -> JSON:
    """`template` offered only where the operator allows it (`--mcp-templates`), naming the
    templates there are now (`templates`: their descriptions, such as `analytics (python)`)."""
    properties = schema["properties"]
    if templates is None:
        properties.pop("template", None)
        return schema
    shown = templates[:MAX_TEMPLATES_SHOWN]
    more = len(templates) - len(shown)
    listed = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    template = properties["template"]
    template["description"] = template.get("description", "") + (
        f" Templates on this gateway: {listed}." if listed else " There are no templates yet."
    )
    return schema


def _other_languages(languages: list[str]) -> str:
    others = [name for name in languages if name != "python"]
    if not others:
        return ""
    return (
        " Other languages run the same way with `language` set to one of: "
        + ", ".join(others)
        + " (their output, errors, charts and files come back the same way)."
    )


def file_tools(max_upload_bytes: int, templates: list[str] | None = None) -> list[types.Tool]:
    """The tools on a sandbox's files and kernel; `templates` as for `run_python_tool`."""
    return [
        types.Tool(
            name=UPLOAD_FILE,
            title="Upload a file",
            description=(
                "Write a file into the sandbox's working directory (folders are created; an "
                "existing file is replaced), so code run with run_python can open it by its "
                f"relative path. Up to {max_upload_bytes} bytes. Use encoding `base64` for "
                "binary content."
            ),
            input_schema=with_templates(input_schema(UploadFileArguments), templates),
            annotations=types.ToolAnnotations(
                read_only_hint=False, destructive_hint=True, idempotent_hint=True
            ),
        ),
        types.Tool(
            name=LIST_FILES,
            title="List files",
            description=(
                "List the files in the sandbox's working directory (recursively): path, size, "
                "type, modification time and download URL of each."
            ),
            input_schema=with_templates(input_schema(SessionArguments), templates),
            annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
        ),
        types.Tool(
            name=READ_FILE,
            title="Read a file",
            description=(
                "Read a file from the sandbox's working directory: text files come back as "
                "text, images (PNG, JPEG, GIF, WebP) as images, anything else as an embedded "
                "binary resource."
            ),
            input_schema=with_templates(input_schema(ReadFileArguments), templates),
            annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
        ),
        types.Tool(
            name=RESTART_KERNEL,
            title="Restart the kernel",
            description=(
                "Restart the sandbox's Python kernel: every variable and import is lost, files "
                "are kept. Use it when the kernel is stuck or its state is broken."
            ),
            input_schema=with_templates(input_schema(SessionArguments), templates),
            annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True),
        ),
    ]


# -- results -----------------------------------------------------------------------------------


def text_block(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[text_block(message)], is_error=True)


Block = types.TextContent | types.ImageContent | types.EmbeddedResource | types.ResourceLink
"""A block of a tool result's content."""


class CellReport:
    """A cell's events (`add` them in order), ready to become MCP content."""

    def __init__(self, base_url: str) -> None:
        """`base_url`: prefix for download URLs (the gateway's own URL), without a
        trailing slash."""
        self.base_url = base_url
        self.transcript = Transcript()

    def add(self, event: Event) -> None:
        self.transcript.add(event.name, event.data)

    @property
    def done(self) -> JSON:
        """The `done` event's data; empty until it came."""
        return dict(self.transcript.done)

    @property
    def status(self) -> str:
        return self.transcript.status

    def content(self, session_id: str | None) -> list[Block]:
        """Text (output, results, traceback, notes, files, the handle), then images, then
        the files carried inline (a stateless cell's), then links to the files written."""
        rendered = self.transcript.render(base_url=self.base_url, session_id=session_id)
        images = [
            types.ImageContent(type="image", data=i.data, mime_type=i.mime) for i in rendered.images
        ]
        inline: list[Block] = [
            file_content(f.path, f.mime, f.data)
            for f in rendered.files
            if f.url is None and f.data is not None and f.mime not in IMAGE_TYPES
        ]
        links: list[Block] = [
            types.ResourceLink(
                type="resource_link", name=f.path, uri=f.url, mime_type=f.mime, size=f.size
            )
            for f in rendered.files
            if f.url is not None
        ]
        return [text_block(rendered.text), *images, *inline, *links]


def file_content(
    path: str, mime: str, data_b64: str, uri: str | None = None
) -> types.TextContent | types.ImageContent | types.EmbeddedResource:
    """A file as MCP content: an image, text (when it decodes as UTF-8), or a binary resource."""
    uri = uri or f"file:///{path}"
    if mime in IMAGE_TYPES:
        return types.ImageContent(type="image", data=data_b64, mime_type=mime)
    raw = base64.b64decode(data_b64)
    text = as_text(raw)
    if text is not None:
        resource: types.TextResourceContents | types.BlobResourceContents = (
            types.TextResourceContents(uri=uri, mime_type=mime, text=text)
        )
    else:
        resource = types.BlobResourceContents(uri=uri, mime_type=mime, blob=data_b64)
    return types.EmbeddedResource(type="resource", resource=resource)


def as_text(raw: bytes) -> str | None:
    """The bytes as text if they are UTF-8 without NUL bytes (what a text file holds)."""
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
