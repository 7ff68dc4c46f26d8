"""A cell's events as E2B's code interpreter streams them: one JSON object per line. Pure.

E2B's SDKs read `POST /execute` line by line and parse every line as JSON (a blank line
breaks both), keyed by `type` (see design/e2b-wire.md, section 5):

    stdout / stderr         {"text", "timestamp"}   (Python reads `timestamp` in callbacks)
    result                  {"text", "html", "markdown", "svg", "png", "jpeg", "pdf",
                             "latex", "json", "javascript", "data", "chart", "extra",
                             "is_main_result"}
    error                   {"name", "value", "traceback"}  (the traceback one string)
    number_of_executions    {"execution_count"}
    end_of_execution        {}
    keepalive               {}  (ignored by the SDKs; keeps an idle body alive)

The gateway's `result` event is E2B's main result; a `display` is a result that is not
main. `file` and `clear` events have no E2B counterpart and are left out.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from kernel_gateway.render import resumed_note

FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
    "application/vnd.e2b.data+json": "data",  # what our kernels send (in_kernel/kg_chart_data)
    "application/vnd.e2b.chart+json": "chart",
}
"""Jupyter MIME type -> the field of E2B's `Result` (as E2B's own kernel server maps them)."""


def line(kind: str, **fields: Any) -> bytes:
    return json.dumps({"type": kind, **fields}, separators=(",", ":")).encode() + b"\n"


def timestamp() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def result_fields(data: dict[str, Any], main: bool) -> dict[str, Any]:
    """A display bundle as E2B's `Result`: known MIME types in their fields, the rest in
    `extra`."""
    out: dict[str, Any] = {"is_main_result": main}
    extra: dict[str, Any] = {}
    for mime, value in data.items():
        name = FIELDS.get(mime)
        if name is None:
            extra[mime] = value
        elif name == "text" and isinstance(value, str):
            out["text"] = _unquoted(value)
        else:
            out[name] = value
    if extra:
        out["extra"] = extra
    return out


def _unquoted(text: str) -> str:
    """`'abc'` -> `abc`: a string's repr, shown as the string (as E2B's server does)."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def lines_of(name: str, data: dict[str, Any]) -> list[bytes]:
    """The NDJSON lines one gateway event becomes (none for events E2B has no word for)."""
    if name in ("stdout", "stderr"):
        return [line(name, text=str(data.get("text", "")), timestamp=timestamp())]
    if name in ("result", "display"):
        bundle = data.get("data")
        if not isinstance(bundle, dict) or not bundle:
            return []
        return [line("result", **result_fields(bundle, main=name == "result"))]
    if name == "error":
        traceback = data.get("traceback") or []
        return [
            line(
                "error",
                name=str(data.get("ename", "")),
                value=str(data.get("evalue", "")),
                traceback="\n".join(str(t) for t in traceback)
                if isinstance(traceback, list)
                else str(traceback),
            )
        ]
    if name == "resumed":  # E2B has no word for it: said on stderr when something was lost
        note = resumed_note(data)
        return [line("stderr", text=note, timestamp=timestamp())] if note else []
    if name == "done":
        out = []
        count = data.get("execution_count")
        if isinstance(count, int):
            out.append(line("number_of_executions", execution_count=count))
        out.append(line("end_of_execution"))
        return out
    return []


KEEPALIVE = line("keepalive")
