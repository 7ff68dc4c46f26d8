"""A cell's events as a language model reads them: text, images and files. Pure.

The one renderer of both tool front ends: the client's tool helpers (`client/tools.py`,
for OpenAI and Anthropic tool calls) and the gateway's MCP tools (`protocols/mcp/tools.py`
imports it). It sits below the client, at the very bottom of the tree, and imports nothing
but the standard library: the gateway loads it without loading the client (httpx), and the
client ships it in its wheel. Events are the API's own, `(name, data)` as they come over the wire.

The text is what a person would read in a notebook: output, results, tracebacks in order,
without terminal colours; `clear_output` drops what came before it, and a display updated
by id shows its last value. Then a note when the cell did not end `ok`, the files it wrote
and, for MCP, the `session` handle. Charts come back as images, each named in the text
where it appeared.

The limits, one set for every model (they were 20,000 characters and 4 images in the
client, 40,000 and 20 in MCP):

- `MAX_TEXT` = 20,000 characters (about 5,000 tokens). A tool result stays in the
  conversation and is read again on every later turn, so an agent's loop of many cells
  must stay affordable; what a model acts on is at the two ends (the first lines, then
  the last ones: the value, the traceback), so the middle of longer text is cut out, with
  a note saying how much.
- `MAX_IMAGES` = 10 images. A default matplotlib chart (640×480) costs about 400 tokens
  at Anthropic's and OpenAI's rates, so ten cost about what the text may; a cell rarely
  shows more, and one that does is told how many were left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_TEXT = 20_000
"""Characters of text a result carries; the middle of longer text is cut out."""
MAX_IMAGES = 10
"""Images a result carries; the text says how many more there were."""
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
"""What models take as images, in the order a display's types are looked at."""
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
"""Terminal colours and titles (CSI and OSC sequences)."""

Data = Mapping[str, Any]


def plain(text: str) -> str:
    """`text` without terminal escape sequences."""
    return ANSI.sub("", text)


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """`text`, with its middle replaced by a note when it is longer than `limit`."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit // 2], text[-limit // 2 :]
    return f"{head}\n[... {len(text) - limit} characters omitted ...]\n{tail}"


def resumed_note(data: Data) -> str | None:
    """What a text-only reader is told of a `resumed` event (the session came back from
    hibernation): the names that did not come back, each with why; None when none was lost."""
    lost = data.get("lost") or []
    if not isinstance(lost, list) or not lost:
        return None
    names = "; ".join(f"{x.get('name')} ({x.get('reason')})" for x in lost if isinstance(x, dict))
    return f"[the session resumed from hibernation; not kept: {names}]\n"


@dataclass(frozen=True)
class Image:
    mime: str
    data: str
    """Base64, without whitespace."""


@dataclass(frozen=True)
class FileRef:
    """A file the cell wrote: at `url` (the gateway's, made absolute with the base URL), or
    carried in the events (`data`, base64: a stateless cell's)."""

    path: str
    size: int
    mime: str
    url: str | None
    data: str | None


@dataclass(frozen=True)
class Rendered:
    text: str
    """At most `MAX_TEXT` characters (and the notes that say what was cut)."""
    images: list[Image]
    """The charts, in order, then the images among the files that came with their bytes;
    at most `MAX_IMAGES`."""
    files: list[FileRef]
    """Every file the cell wrote, in order (images with their bytes are also in `images`)."""
    status: str


@dataclass
class _Display:
    data: Data


@dataclass
class Transcript:
    """A cell's events, folded the way a notebook shows them (`add` them in order), and
    rendered for a model (`render`)."""

    parts: list[tuple[str, Any]] = field(default_factory=list)
    """In order: ("text", str), ("display", _Display) and ("error", str)."""
    files: list[Data] = field(default_factory=list)
    done: Data = field(default_factory=dict)
    """The `done` event's data; empty until it came."""
    _displays: dict[str, _Display] = field(default_factory=dict)

    def add(self, name: str, data: Data) -> None:
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

    def _rich(self, data: Data, display_id: str | None) -> None:
        display = _Display(data.get("data") or {})
        if display_id is not None:
            self._displays[display_id] = display
        self.parts.append(("display", display))

    @property
    def status(self) -> str:
        """The cell's `done` status, or `incomplete` when its end was not seen."""
        return str(self.done.get("status", "incomplete"))

    def render(
        self, *, base_url: str = "", session_id: str | None = None, inline_files: bool = True
    ) -> Rendered:
        """The text (output, results, tracebacks, notes, the files written, the session
        handle when given), the images, the files. `base_url` prefixes the files' URLs.
        A file with a URL (a session's) is a link; one without (a stateless cell's) comes
        with its bytes: an image as an image (always), others when the caller returns them
        beside the text (`inline_files`)."""
        text: list[str] = []
        images: list[Image] = []
        omitted = 0
        for kind, value in self.parts:
            if kind == "text":
                text.append(plain(value))
            elif kind == "error":
                text.append(value if value.endswith("\n") else value + "\n")
            else:
                data = value.data
                mime = next((m for m in IMAGE_TYPES if isinstance(data.get(m), str)), None)
                if mime is not None:
                    if len(images) < MAX_IMAGES:
                        images.append(Image(mime, "".join(str(data[mime]).split())))
                        text.append(f"[image {len(images)}: {mime}]\n")
                    else:
                        omitted += 1
                elif isinstance(data.get("text/plain"), str):
                    text.append(plain(data["text/plain"]) + "\n")
        if omitted:
            text.append(f"[{omitted} more images not shown (at most {MAX_IMAGES} per call)]\n")
        text.append(self._status_note())
        files = [self._file(data, base_url) for data in self.files]
        if files:
            text.append("Files written:\n")
        for file in files:
            where = [file.url] if file.url is not None else []
            if file.url is not None:
                pass  # a link: a chart saved to a file was shown already by its display
            elif file.data is not None and file.mime in IMAGE_TYPES:
                if len(images) < MAX_IMAGES:
                    images.append(Image(file.mime, "".join(file.data.split())))
                    where.append(f"(image {len(images)}, below)")
                else:
                    where.append(f"(not shown: at most {MAX_IMAGES} images per call)")
            elif file.url is None:
                returned = file.data is not None and inline_files
                where.append("(returned below)" if returned else "(not returned)")
            text.append(f"  {file.path} ({file.size} bytes, {file.mime}): {' '.join(where)}\n")
        if session_id is not None:
            text.append(f"session: {session_id}\n")
        return Rendered(clip("".join(text)), images, files, self.status)

    @staticmethod
    def _file(data: Data, base_url: str) -> FileRef:
        url, inline = data.get("url"), data.get("data")
        return FileRef(
            str(data.get("path")),
            int(data.get("size") or 0),
            str(data.get("mime")),
            f"{base_url}{url}" if url else None,
            inline if isinstance(inline, str) else None,
        )

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
        if status == "incomplete":
            return "[the cell's end was not seen: its output may be cut short]\n"
        reason = done.get("reason") or "unknown"
        return f"[the kernel died ({reason}); variables are gone; the next call gets a new one]\n"


def render(
    events: Iterable[tuple[str, Data]],
    *,
    base_url: str = "",
    session_id: str | None = None,
    inline_files: bool = True,
) -> Rendered:
    """`events` (an iterable of `(name, data)`) rendered: `Transcript.render`."""
    transcript = Transcript()
    for name, data in events:
        transcript.add(name, data)
    return transcript.render(base_url=base_url, session_id=session_id, inline_files=inline_files)
