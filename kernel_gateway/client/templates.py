"""Templates as the client sees them: typed builds and templates, build steps, the folder
packed as a build's context, and the calls of `/templates` (shared by both clients).

    from kernel_gateway.client import Client, Step

    with Client() as client:
        build = client.templates.create(
            "analytics",
            steps=[Step.run("pip install tabulate", user="root"),
                   Step.copy("data", "/opt/data/"), Step.env(DATASET="/opt/data/t.csv")],
            context="./build-context",          # a folder (packed here), or tar bytes
            wait=True, on_log=print,            # follow the log; TemplateBuildError on failure
        )
        with client.session(template="analytics") as session:
            session.run("import tabulate")

Pure: no I/O but reading a context folder; `Templates` (in `_sync`) and `AsyncTemplates`
(in `_async`) send these calls and read the log's event stream.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import io
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, TypeVar
from urllib.parse import quote

import httpx

from kernel_gateway.client._base import Call, json_object, read
from kernel_gateway.client.errors import ProtocolError, StreamEnded, TemplateBuildError
from kernel_gateway.client.sse import SSEDecoder

T = TypeVar("T")


def _time(value: Any) -> datetime.datetime | None:
    return datetime.datetime.fromisoformat(value) if isinstance(value, str) else None


@dataclass(frozen=True)
class TemplateBuild:
    """One build of a template: `waiting`, `building`, then `ready` (its `image`) or `error`
    (its `reason`, and the `failed_step` numbered from 1 as the log numbers them)."""

    id: str
    template: str
    """The template's name."""
    template_id: str
    state: str
    reason: str | None
    failed_step: int | None
    base: str | None
    steps: int
    created_at: datetime.datetime | None
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    image: str | None
    size_bytes: int
    tags: list[str]
    """The template's tags that point at it."""

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def failed(self) -> bool:
        return self.state == "error"

    @property
    def finished(self) -> bool:
        return self.state in ("ready", "error")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TemplateBuild:
        return cls(
            id=str(data["id"]),
            template=str(data["template"]),
            template_id=str(data["template_id"]),
            state=str(data["state"]),
            reason=data.get("reason"),
            failed_step=data.get("failed_step"),
            base=data.get("base"),
            steps=int(data.get("steps") or 0),
            created_at=_time(data.get("created_at")),
            started_at=_time(data.get("started_at")),
            finished_at=_time(data.get("finished_at")),
            image=data.get("image"),
            size_bytes=int(data.get("size_bytes") or 0),
            tags=[str(t) for t in data.get("tags") or ()],
        )


@dataclass(frozen=True)
class TemplateInfo:
    """A template: sessions started on it run its `ready_build`'s image."""

    id: str
    name: str
    language: str | None
    state: str
    """Its newest build's state."""
    ready_build: str | None
    """The build its name starts (tag `default`, else the newest ready one)."""
    tags: dict[str, str]
    """Tag → build id."""
    created_at: datetime.datetime | None
    updated_at: datetime.datetime | None
    sessions: int
    """Sessions running on it now."""
    warm: int
    spawn_count: int
    last_spawned_at: datetime.datetime | None
    builds: list[TemplateBuild]

    @property
    def latest(self) -> TemplateBuild | None:
        return self.builds[-1] if self.builds else None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TemplateInfo:
        return cls(
            id=str(data["id"]),
            name=str(data["name"]),
            language=data.get("language"),
            state=str(data["state"]),
            ready_build=data.get("ready_build"),
            tags={str(k): str(v) for k, v in (data.get("tags") or {}).items()},
            created_at=_time(data.get("created_at")),
            updated_at=_time(data.get("updated_at")),
            sessions=int(data.get("sessions") or 0),
            warm=int(data.get("warm") or 0),
            spawn_count=int(data.get("spawn_count") or 0),
            last_spawned_at=_time(data.get("last_spawned_at")),
            builds=[TemplateBuild.from_json(b) for b in data.get("builds") or ()],
        )


@dataclass(frozen=True)
class BuildLogEntry:
    """One line of a build's log; `str()` of it is its message."""

    timestamp: datetime.datetime | None
    level: str
    """`debug`, `info`, `warn` or `error`."""
    message: str
    step: str | None = None
    """The step it belongs to (from 1), if any."""

    def __str__(self) -> str:
        return self.message

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BuildLogEntry:
        step = data.get("step")
        return cls(
            _time(data.get("timestamp")),
            str(data.get("level", "info")),
            str(data["message"]),
            None if step is None else str(step),
        )


@dataclass(frozen=True)
class Step:
    """One build step, as E2B's SDK makes them (see docs/templates.md for each):

        Step.run("apt-get install -y jq", user="root")
        Step.copy("data", "/opt/data/")        # from the build's context
        Step.env(DATASET="/opt/data/t.csv")
        Step.workdir("/opt/app"), Step.user("root")

    A plain `{"type": "RUN", "args": [...]}` dict works too."""

    type: str
    args: tuple[str, ...] = ()
    files_hash: str | None = None
    """COPY: files uploaded beforehand (`PUT /templates/files/{hash}`); default: the context."""
    force: bool = False
    """Run it (and every step after it) uncached."""

    @classmethod
    def run(cls, command: str, *, user: str | None = None, force: bool = False) -> Step:
        return cls("RUN", (command, *([user] if user else [])), force=force)

    @classmethod
    def copy(
        cls,
        source: str,
        destination: str,
        *,
        user: str | None = None,
        mode: int | None = None,
        files_hash: str | None = None,
    ) -> Step:
        args = [source, destination]
        if user is not None or mode is not None:
            args.append(user or "")
        if mode is not None:
            args.append(f"{mode:04o}")
        return cls("COPY", tuple(args), files_hash=files_hash)

    @classmethod
    def env(cls, **variables: str) -> Step:
        return cls("ENV", tuple(x for pair in variables.items() for x in pair))

    @classmethod
    def workdir(cls, path: str) -> Step:
        return cls("WORKDIR", (path,))

    @classmethod
    def user(cls, name: str) -> Step:
        return cls("USER", (name,))

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": self.type, "args": list(self.args)}
        if self.files_hash is not None:
            body["files_hash"] = self.files_hash
        if self.force:
            body["force"] = True
        return body


# -- the build's context -----------------------------------------------------------------------

Context = bytes | str | os.PathLike[str]
"""Files for COPY steps: tar bytes (or tar.gz), a folder (packed here), or a tar file's path."""


@dataclass
class DockerIgnore:
    """A `.dockerignore`'s rules, as Docker reads them: one pattern a line (`#` comments),
    `*`, `?` and `**` (any folders), `!` to take a path back; the last rule that matches a
    path (or a folder above it) decides."""

    rules: list[tuple[re.Pattern[str], bool]] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> DockerIgnore:
        rules = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            keep = line.startswith("!")
            pattern = os.path.normpath(line.removeprefix("!").strip()).strip("/")
            if pattern and pattern != ".":
                rules.append((re.compile(_glob(pattern)), keep))
        return cls(rules)

    def ignored(self, path: str) -> bool:
        """Whether `path` (relative, `/`-separated) is left out: a rule matches it when it
        matches the path or a folder above it (Docker's `MatchesOrParentMatches`)."""
        parts = path.split("/")
        prefixes = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]
        ignored = False
        for pattern, keep in self.rules:
            if any(pattern.fullmatch(prefix) for prefix in prefixes):
                ignored = not keep
        return ignored


def _glob(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (close := pattern.find("]", i + 1)) > i:
            body = pattern[i + 1 : close]
            out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
            i = close + 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def pack_folder(folder: str | os.PathLike[str]) -> bytes:
    """A folder as the tar.gz a build's `context` is, leaving out what its `.dockerignore`
    does. The same files give the same bytes (sorted, no owner, gzip without a time), so a
    build with unchanged files reuses its COPY steps' cached layers."""
    root = Path(folder)
    ignore_file = root / ".dockerignore"
    ignore = DockerIgnore()
    if ignore_file.is_file():
        ignore = DockerIgnore.parse(ignore_file.read_text())
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in _walk(root, ignore):
            name = path.relative_to(root).as_posix()
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isreg():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def _walk(root: Path, ignore: DockerIgnore) -> Iterable[Path]:
    """Files, links and folders under `root`, sorted, without the ignored ones (a folder is
    descended even when ignored: a `!` rule may take back something inside it)."""
    for current, folders, files in os.walk(root):
        folders.sort()
        here = Path(current)
        for name in sorted([*folders, *files]):
            path = here / name
            relative = path.relative_to(root).as_posix()
            if not ignore.ignored(relative):
                yield path


def context_bytes(context: Context) -> bytes:
    """`context` as the bytes the API takes: tar bytes as they are, a folder packed, a tar
    file read."""
    if isinstance(context, bytes):
        return context
    path = Path(context)
    if path.is_dir():
        return pack_folder(path)
    if path.is_file():
        return path.read_bytes()
    raise FileNotFoundError(f"context {str(path)!r}: no such folder or tar file")


# -- requests ----------------------------------------------------------------------------------


class BuildOptions(TypedDict, total=False):
    """What a build is made of (`templates.create(name, **options)`, `.build(...)`)."""

    steps: Sequence[Step | Mapping[str, Any]]
    """`Step`s (or the API's `{"type", "args"}` objects), run in order on `base`."""
    base: str
    """`python` (the default), a language of `languages()`, or `template:NAME[:TAG]`."""
    dockerfile: str
    """Instead of `base` and `steps`: a Dockerfile (one stage; FROM names a base)."""
    context: Context
    """The files COPY steps copy: a folder (packed as tar.gz here, minus its
    `.dockerignore`), a tar file's path, or tar bytes."""
    tags: Sequence[str]
    """Tags the build takes once ready (default: `default`)."""
    start_cmd: str
    """Started beside each kernel of the template, before the kernel is handed out."""
    ready_cmd: str
    """Run until it succeeds before each kernel is handed out."""
    force: bool
    """Build every step uncached."""


def build_body(options: BuildOptions) -> dict[str, Any]:
    """A build's request body; a folder context is packed (reading it: call it off the event
    loop)."""
    body: dict[str, Any] = {}
    for key in ("base", "dockerfile", "start_cmd", "ready_cmd"):
        if options.get(key) is not None:
            body[key] = options.get(key)
    steps = options.get("steps")
    if steps is not None:
        body["steps"] = [s.to_json() if isinstance(s, Step) else dict(s) for s in steps]
    context = options.get("context")
    if context is not None:
        body["context"] = base64.b64encode(context_bytes(context)).decode()
    tags = options.get("tags")
    if tags is not None:
        body["tags"] = list(tags)
    if options.get("force"):
        body["force"] = True
    return body


def _build(response: httpx.Response) -> TemplateBuild:
    return _parsed(TemplateBuild.from_json, json_object(response))


def _info(response: httpx.Response) -> TemplateInfo:
    return _parsed(TemplateInfo.from_json, json_object(response))


def _list(response: httpx.Response) -> list[TemplateInfo]:
    document = json_object(response)
    return [_parsed(TemplateInfo.from_json, t) for t in document.get("templates") or ()]


def _parsed(parse: Callable[[Any], T], data: Any) -> T:
    try:
        return parse(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed template in the gateway's answer: {exc!r}") from exc


def _nothing(response: httpx.Response) -> None:
    read(response)


def _path(name: str) -> str:
    return f"/templates/{quote(name, safe='')}"


class TemplateCalls:
    """The calls of `/templates`; `Templates` and `AsyncTemplates` send them."""

    @staticmethod
    def _create(name: str, body: dict[str, Any]) -> Call[TemplateBuild]:
        return Call("POST", "/templates", _build, json={"name": name, **body})

    @staticmethod
    def _rebuild(name: str, body: dict[str, Any]) -> Call[TemplateBuild]:
        return Call("POST", f"{_path(name)}/builds", _build, json=body)

    @staticmethod
    def _list() -> Call[list[TemplateInfo]]:
        return Call("GET", "/templates", _list)

    @staticmethod
    def _get(name: str) -> Call[TemplateInfo]:
        return Call("GET", _path(name), _info)

    @staticmethod
    def _delete(name: str) -> Call[None]:
        return Call("DELETE", _path(name), _nothing)

    @staticmethod
    def _get_build(name: str, build_id: str) -> Call[TemplateBuild]:
        return Call("GET", f"{_path(name)}/builds/{quote(build_id, safe='')}", _build)


# -- following a build's log -------------------------------------------------------------------


class LogReader:
    """A build's log stream: bytes in, entries out, the build (its `end` event) last.

    It counts the lines read, so a broken stream is asked for again from where it broke
    (`url`: the log from `offset` on)."""

    def __init__(self, name: str, build_id: str, offset: int = 0) -> None:
        self._base = f"{_path(name)}/builds/{quote(build_id, safe='')}/logs"
        self.offset = offset
        self.build: TemplateBuild | None = None
        """The build as the `end` event gave it: set once the log is read to its end."""
        self._decoder = SSEDecoder()
        self._attempt = 0
        self._progress_at = offset

    @property
    def url(self) -> str:
        return f"{self._base}?offset={self.offset}" if self.offset else self._base

    @property
    def done(self) -> bool:
        return self.build is not None

    def reconnected(self) -> None:
        self._decoder = SSEDecoder()

    def feed(self, chunk: bytes) -> list[BuildLogEntry]:
        entries = []
        for sse in self._decoder.feed(chunk):
            if sse.event not in ("log", "end"):
                continue
            try:
                data = sse.json()
                if sse.event == "end":
                    self.build = TemplateBuild.from_json(data)
                    break
                entries.append(BuildLogEntry.from_json(data))
            except (KeyError, TypeError, ValueError) as exc:
                raise ProtocolError(f"malformed {sse.event!r} event: {exc!r}") from exc
            self.offset += 1
        return entries

    def incomplete(self) -> StreamEnded:
        return StreamEnded("the build's log ended without its `end` event")

    def retry(self, error: Exception, retries: int) -> float:
        """Seconds to wait before asking for the log again from `offset`, or `error` raised:
        after `retries` tries in a row that brought no line, or for an answer that broke the
        protocol (asking again would get it again)."""
        if isinstance(error, ProtocolError) and not isinstance(error, StreamEnded):
            raise error
        if self.offset != self._progress_at:
            self._attempt, self._progress_at = 0, self.offset
        if self._attempt >= retries:
            raise error
        self._attempt += 1
        self.reconnected()
        return float(min(2.0, 0.1 * 2**self._attempt))


def outcome(build: TemplateBuild | None) -> TemplateBuild:
    """The build a log read to its end gave: returned when ready, raised when it failed."""
    if build is None:
        raise StreamEnded("the build's log ended without its `end` event")
    if build.failed:
        raise TemplateBuildError(build)
    return build
