"""The MCP tools the gateway offers, and how a cell's events become MCP content. Pure.

A model reads the tool descriptions and nothing else, so they say what the
sandbox has, what persists, and how to keep a sandbox across calls. A cell's
events become one text block (output, result, traceback: what a person would
read in a notebook, without terminal colours), one image block per chart, and a
resource link per file the cell wrote.

Sandboxes are gateway sessions; their handle is the session id. Clients on the
handshake-era protocol (an MCP session) get one sandbox per MCP session without
passing anything; on the sessionless 2026-07-28 protocol a model keeps its
sandbox by passing back the `session` handle every result names.

Each tool's arguments are a model, built of the HTTP API's own field types
(`kernel_gateway.sessions.models`): the tool's input schema is generated from
it, and the server validates the arguments with it.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

import mcp_types as types
from pydantic import BaseModel, Field, PlainValidator, ValidationInfo
from pydantic_core import PydanticCustomError

from kernel_gateway.errors import GatewayError
from kernel_gateway.kernels.events import resumed_note
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

MAX_TEXT = 40_000
"""Characters of text a result carries; the middle of longer output is cut out."""
MAX_IMAGES = 20
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")

M = TypeVar("M", bound=BaseModel)

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


class RunPythonArguments(RequestModel):
    code: Code
    timeout: Timeout = None
    session: SessionHandle = None
    language: ToolLanguage = None
    network: ToolNetwork = None


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


class UploadFileArguments(RequestModel):
    path: ToolPath
    encoding: Encoding = "text"
    content: Content
    session: SessionHandle = None


class ReadFileArguments(RequestModel):
    path: ToolPath
    session: SessionHandle = None


class SessionArguments(RequestModel):
    """list_files and restart_kernel: which sandbox, and nothing else."""

    session: SessionHandle = None


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
) -> types.Tool:
    """The run_python tool; `egress`: the domains the gateway lets sessions reach (none: the
    `network` argument is left out, as `language` is with Python alone)."""
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
        input_schema=_with_network(
            _with_languages(
                input_schema(arguments, Timeouts(default_timeout, max_timeout)), languages
            ),
            egress,
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


def _other_languages(languages: list[str]) -> str:
    others = [name for name in languages if name != "python"]
    if not others:
        return ""
    return (
        " Other languages run the same way with `language` set to one of: "
        + ", ".join(others)
        + " (their output, errors, charts and files come back the same way)."
    )


def file_tools(max_upload_bytes: int) -> list[types.Tool]:
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
            input_schema=input_schema(UploadFileArguments),
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
            input_schema=input_schema(SessionArguments),
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
            input_schema=input_schema(ReadFileArguments),
            annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
        ),
        types.Tool(
            name=RESTART_KERNEL,
            title="Restart the kernel",
            description=(
                "Restart the sandbox's Python kernel: every variable and import is lost, files "
                "are kept. Use it when the kernel is stuck or its state is broken."
            ),
            input_schema=input_schema(SessionArguments),
            annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True),
        ),
    ]


# -- results -----------------------------------------------------------------------------------


def text_block(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[text_block(message)], is_error=True)


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """`text`, with its middle replaced by a note when it is longer than `limit`."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit // 2], text[-limit // 2 :]
    return f"{head}\n[... {len(text) - limit} characters omitted ...]\n{tail}"


def plain(text: str) -> str:
    return ANSI.sub("", text)


@dataclass
class _Display:
    data: JSON
    index: int


@dataclass
class CellReport:
    """A cell's events, folded the way a notebook shows them, ready to become MCP content."""

    base_url: str
    """Prefix for download URLs (the gateway's own URL), without a trailing slash."""
    parts: list[tuple[str, Any]] = field(default_factory=list)
    """In order: ("text", str), ("display", _Display) and ("error", str)."""
    files: list[JSON] = field(default_factory=list)
    done: JSON = field(default_factory=dict)
    _displays: dict[str, _Display] = field(default_factory=dict)
    _count: int = 0

    def add(self, event: Event) -> None:
        name, data = event
        if name in ("stdout", "stderr"):
            self._text(str(data.get("text", "")))
        elif name == "result":
            self._rich(data, None)
        elif name == "display":
            display_id = data.get("display_id")
            if data.get("update") and display_id in self._displays:
                self._displays[display_id].data = data.get("data") or {}
            else:
                self._rich(data, display_id if isinstance(display_id, str) else None)
        elif name == "clear":
            self.parts.clear()
            self._displays.clear()
        elif name == "error":
            traceback = [plain(str(line)) for line in data.get("traceback") or []]
            text = "\n".join(traceback) or f"{data.get('ename')}: {data.get('evalue')}"
            self.parts.append(("error", text))
        elif name == "file":
            self.files.append(data)
        elif name == "resumed":
            note = resumed_note(data)
            if note:
                self._text(note)
        elif name == "done":
            self.done = data

    def _text(self, text: str) -> None:
        if self.parts and self.parts[-1][0] == "text":
            self.parts[-1] = ("text", self.parts[-1][1] + text)
        else:
            self.parts.append(("text", text))

    def _rich(self, data: JSON, display_id: str | None) -> None:
        self._count += 1
        display = _Display(data.get("data") or {}, self._count)
        if display_id is not None:
            self._displays[display_id] = display
        self.parts.append(("display", display))

    @property
    def status(self) -> str:
        return str(self.done.get("status", "died"))

    def content(
        self, session_id: str | None
    ) -> list[types.TextContent | types.ImageContent | types.EmbeddedResource | types.ResourceLink]:
        """Text (output, results, traceback, notes), then images, then the files written."""
        text: list[str] = []
        images: list[types.ImageContent] = []
        omitted = 0
        for kind, value in self.parts:
            if kind == "text":
                text.append(plain(value))
            elif kind == "error":
                text.append(value if value.endswith("\n") else value + "\n")
            else:
                data: JSON = value.data
                image = next((m for m in IMAGE_TYPES if isinstance(data.get(m), str)), None)
                if image is not None:
                    if len(images) < MAX_IMAGES:
                        payload = "".join(str(data[image]).split())
                        images.append(
                            types.ImageContent(type="image", data=payload, mime_type=image)
                        )
                        text.append(f"[image {len(images)}: {image}]\n")
                    else:
                        omitted += 1
                elif isinstance(data.get("text/plain"), str):
                    text.append(plain(data["text/plain"]) + "\n")
        if omitted:
            text.append(f"[{omitted} more images not shown (at most {MAX_IMAGES} per call)]\n")
        text.append(self._status_note())
        links: list[types.ResourceLink] = []
        inline: list[types.TextContent | types.ImageContent | types.EmbeddedResource] = []
        if self.files:
            text.append("Files written:\n")
        for file in self.files:
            url = file.get("url")
            where = f"{self.base_url}{url}" if url else "(returned below)"
            text.append(f"  {file['path']} ({file['size']} bytes, {file['mime']}): {where}\n")
            if url:
                links.append(
                    types.ResourceLink(
                        type="resource_link",
                        name=str(file["path"]),
                        uri=f"{self.base_url}{url}",
                        mime_type=str(file["mime"]),
                        size=int(file["size"]),
                    )
                )
            elif isinstance(file.get("data"), str):
                inline.append(file_content(str(file["path"]), str(file["mime"]), file["data"]))
        if session_id is not None:
            text.append(f"session: {session_id}\n")
        blocks: list[
            types.TextContent | types.ImageContent | types.EmbeddedResource | types.ResourceLink
        ] = [text_block(clip("".join(text)))]
        return [*blocks, *images, *inline, *links]

    def _status_note(self) -> str:
        status, done = self.status, self.done
        lost = (
            " The kernel was restarted: earlier variables are gone."
            if done.get("restarted")
            else ""
        )
        if status in ("ok", "error"):
            return f"[{lost.strip()}]\n" if lost else ""
        if status == "timeout":
            return f"[timed out: the cell ran past its timeout and was interrupted.{lost}]\n"
        if status == "interrupted":
            return f"[interrupted.{lost}]\n"
        reason = done.get("reason") or "unknown"
        return f"[the kernel died ({reason}); variables are gone; the next call gets a new one]\n"


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
