"""Logging: plain text or one JSON object per line, with the ids of what a line is about.

`--log-format json` writes every record (the gateway's and uvicorn's) as one
JSON object on one line: `time`, `level`, `logger`, `message`, the
`request_id`, `session_id`, `execution_id` and `key` (the API key's name, `admin` for
the token) the line is about (when there is one), any structured fields of the line
(the access log's `method`, `route`, `status`, `duration_ms`), and `exception` with the
traceback.

The ids travel in a `ContextVar`: the request middleware binds the request id
and the ids in the path, routes bind the execution they start, and each
execution's task binds its own (a task copies its context when created, so
work a request starts keeps that request's ids). Nothing here holds state
across requests; the variable's value lives in each task's context.

What is never logged: code, its output, request bodies, file paths, query
strings, and the token (settings are logged at debug with the token masked).
The access log names the route template (`/sessions/{session_id}/files/{path}`),
never the raw path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Literal

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

_context: ContextVar[Mapping[str, str]] = ContextVar(
    "kernel_gateway_log_context", default=MappingProxyType({})
)


ROUTE_TEMPLATE = "route_template"
"""The request-state key under which an app mounted under a prefix (E2B's `/e2b`) names the
route a request went to (`/e2b/sandboxes/{id}`): the access log and the HTTP metrics use it
instead of the mount's `/e2b/{path}`."""


def bind(**ids: str | None) -> None:
    """Name what the current task's log lines are about (None leaves a field as it is)."""
    update = {name: value for name, value in ids.items() if value is not None}
    if update:
        _context.set(MappingProxyType({**_context.get(), **update}))


@contextlib.contextmanager
def bound(**ids: str | None) -> Iterator[None]:
    """`bind` for the block only: a background task's work on one session after another
    (the reaper, the usage sampler) names each one in its lines."""
    token = _context.set(_context.get())
    bind(**ids)
    try:
        yield
    finally:
        _context.reset(token)


KeyNamer = Callable[[str], str | None]
"""A session id's owner's key name (`admin` for the admin's), or None if unknown."""
_namers: list[KeyNamer] = []


def name_keys(namer: KeyNamer) -> Callable[[], None]:
    """Let lines about a session that name no key name its owner's (a gateway's registry
    registers this while it runs); returns the call that stops it."""
    _namers.append(namer)

    def stop() -> None:
        if namer in _namers:
            _namers.remove(namer)

    return stop


def _key_of(session_id: str) -> str | None:
    for namer in list(_namers):
        try:
            name = namer(session_id)
        except Exception:  # noqa: BLE001 - a line is never lost for want of a name
            continue
        if name is not None:
            return name
    return None


def current() -> Mapping[str, str]:
    """The ids bound in the current context."""
    return _context.get()


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        document.update(_context.get())
        if "key" not in document and isinstance(sid := document.get("session_id"), str):
            if (name := _key_of(sid)) is not None:
                document["key"] = name  # a background line about a session: its owner's
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            document.update(fields)
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        # ASCII only: U+2028, NEL and the like would split the line for many readers.
        return json.dumps(document, default=str)


def formatter(log_format: LogFormat) -> logging.Formatter:
    return JSONFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def configure(log_format: LogFormat, level: str) -> None:
    """Send every logger's records (uvicorn's too) to stderr in `log_format`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    quiet_uvicorn_errors()


def quiet_uvicorn_errors() -> None:
    """uvicorn's error log passes over exceptions that say they are none (`QuietExceptions`);
    the gateway's request middleware calls it too, whoever configured the logs."""
    uvicorn_errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, QuietExceptions) for f in uvicorn_errors.filters):
        uvicorn_errors.addFilter(QuietExceptions())


class QuietExceptions(logging.Filter):
    """Drops the record of an exception that says it is no error (`quiet = True`: a stream
    that ended its connection on purpose, which uvicorn reports as an exception)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not getattr(exc, "quiet", False)
