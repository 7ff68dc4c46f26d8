"""envd's HTTP and `filesystem.Filesystem` on a sandbox's working directory.

E2B users write paths as `/home/user/...` (the sandbox user's home and working
directory) or relative to it; here that directory is the session's workspace (the
kernel's `/workspace`, also reachable as `/home/user` in the kernel image). Paths
elsewhere are refused rather than resolved on the host: every access goes through
`Workspace`, which walks from the workspace's own fd and never follows a symlink.

    GET  /health                          204
    GET  /files?path=P                    the file's bytes
    POST /files[?path=P]                  multipart (field `file`, filename = the path)
                                          or octet-stream (gzip allowed): [{name, type, path}]
    POST /filesystem.Filesystem/<Method>  Stat, ListDir, MakeDir, Move, Remove,
                                          CreateWatcher, GetWatcherEvents, RemoveWatcher
                                          (unary), WatchDir (server stream)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import posixpath
import secrets
import time
import zlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kernel_gateway.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    GatewayError,
    NotFound,
    PayloadTooLarge,
)
from kernel_gateway.http.bodies import capped, read_body
from kernel_gateway.kernels.workspace import Entry, Workspace
from kernel_gateway.protocols.e2b.connect import (
    STREAM_TYPE,
    ConnectError,
    EnvelopeReader,
    end_stream,
    envelope,
    field,
    parse_message,
    read_message_body,
)
from kernel_gateway.sessions.session import Session

HOME = "/home/user"
WATCH_POLL_SECONDS = 0.5
MAX_WATCHERS = 16
KEEPALIVE_SECONDS = 50.0


def to_workspace(path: object) -> str:
    """An E2B path as a path in the workspace ("" for the workspace itself)."""
    if path is None or path == "":
        return ""
    if not isinstance(path, str) or "\0" in path:
        raise ConnectError("invalid_argument", f"{path!r} is not a path")
    if path == HOME or path == HOME + "/":
        return ""
    if path.startswith(HOME + "/"):
        return path[len(HOME) + 1 :]
    if path.startswith("/"):
        raise ConnectError(
            "permission_denied",
            f"{path!r} is outside the sandbox's working directory {HOME}: only paths under "
            "it (or relative to it) are served",
        )
    return path


def to_e2b(rel: str) -> str:
    return f"{HOME}/{rel}" if rel else HOME


FILE_TYPES = {
    "file": "FILE_TYPE_FILE",
    "dir": "FILE_TYPE_DIRECTORY",
    "symlink": "FILE_TYPE_SYMLINK",
}


LINK_HOPS = 8


def followed(workspace: Workspace, entry: Entry) -> Entry:
    """A symlink as envd shows one: the type of what it points to, and that target as an
    absolute path (`symlinkTarget`), when the target is in the sandbox's working directory
    (found there without following any link, hop by hop); else the link as it is."""
    if entry.kind != "symlink" or entry.link_target is None:
        return entry
    at = entry
    for _ in range(LINK_HOPS):
        assert at.link_target is not None
        base = posixpath.dirname(to_e2b(at.path))
        target = posixpath.normpath(posixpath.join(base, at.link_target))
        try:
            rel = to_workspace(target)
            at = workspace.entry(rel)
        except (ConnectError, GatewayError):
            return entry
        if at.kind != "symlink":
            return dataclasses.replace(entry, kind=at.kind, link_target=target)
    return entry


def entry_json(entry: Entry) -> dict[str, Any]:
    """An `EntryInfo` in proto3 JSON."""
    mode = entry.mode
    kind = entry.kind
    letter = {"dir": "d", "symlink": "L"}.get(kind, "-")
    bits = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    out: dict[str, Any] = {
        "name": entry.path.rsplit("/", 1)[-1] if entry.path else "user",
        "type": FILE_TYPES.get(kind, "FILE_TYPE_UNSPECIFIED"),
        "path": to_e2b(entry.path),
        "size": str(entry.size),
        "mode": mode,
        "permissions": letter + bits,
        "owner": "user",
        "group": "user",
        "modifiedTime": datetime.fromtimestamp(entry.modified, UTC)
        .isoformat()
        .replace("+00:00", "Z"),
    }
    if entry.link_target is not None:
        out["symlinkTarget"] = entry.link_target
        out["isSymlink"] = True
    return out


def _connect_error(exc: GatewayError) -> ConnectError:
    if isinstance(exc, NotFound):
        return ConnectError("not_found", exc.message)
    if isinstance(exc, Forbidden):
        return ConnectError("permission_denied", exc.message)
    if isinstance(exc, Conflict):
        return ConnectError(
            "already_exists" if "exists" in exc.message else "invalid_argument", exc.message
        )
    if isinstance(exc, PayloadTooLarge):
        return ConnectError("resource_exhausted", exc.message)
    if isinstance(exc, BadRequest):
        return ConnectError("invalid_argument", exc.message)
    return ConnectError("internal", exc.message)


class Envd:
    """One sandbox's envd, on its session's workspace; watchers kept per sandbox."""

    def __init__(self) -> None:
        self._watchers: dict[str, dict[str, Any]] = {}
        self._watch_streams = 0
        """WatchDir streams open now (each polls the folder): at most MAX_WATCHERS."""

    # -- HTTP ------------------------------------------------------------------------------

    async def download(self, request: Request, session: Session) -> Response:
        workspace = session.files.workspace
        try:
            rel = to_workspace(request.query_params.get("path"))
            if not rel:
                raise BadRequest("a file path is required")
            fd, info = await asyncio.to_thread(workspace.open_read, rel)
        except ConnectError as exc:
            return _http_error(403 if exc.code == "permission_denied" else 400, exc.message)
        except GatewayError as exc:
            return _http_error(_http_status(exc), exc.message)
        data = await asyncio.to_thread(_read_all, fd)
        return Response(data, media_type="application/octet-stream")

    async def upload(self, request: Request, session: Session, limit: int, total: int) -> Response:
        """Files from a multipart form (each at most `limit` bytes, all together at most
        `total`) or one octet-stream body (at most `limit`)."""
        files = session.files
        query_path = request.query_params.get("path")
        kind = request.headers.get("content-type", "")
        written: list[dict[str, str]] = []
        try:
            if kind.startswith("multipart/form-data"):
                # All the files of one request together cannot be more than the disk holds.
                whole = capped(request, max(limit, total))
                async with whole.form(max_files=1000, max_part_size=limit) as form:
                    parts = [(k, v) for k, v in form.multi_items() if k == "file"]
                    seen: set[str] = set()
                    for _, part in parts:
                        if isinstance(part, str):
                            continue
                        path = query_path or part.filename or ""
                        rel = to_workspace(path)
                        if not rel or rel in seen:
                            raise BadRequest(f"a missing or repeated path: {path!r}")
                        seen.add(rel)
                        data = await part.read()
                        await files.write(rel, data, limit)
                        written.append(_written(rel))
            else:
                rel = to_workspace(query_path)
                if not rel:
                    raise BadRequest("'path' is required for an octet-stream upload")
                data = await read_body(request, limit)
                if request.headers.get("content-encoding", "").lower() == "gzip":
                    data = _gunzip(data, limit)
                await files.write(rel, data, limit)
                written.append(_written(rel))
        except ConnectError as exc:
            return _http_error(403 if exc.code == "permission_denied" else 400, exc.message)
        except GatewayError as exc:
            return _http_error(_http_status(exc), exc.message)
        if not written:
            return _http_error(400, "no file in the request (multipart field 'file')")
        return JSONResponse(written)

    # -- filesystem.Filesystem ------------------------------------------------------------

    async def filesystem(self, method: str, request: Request, session: Session) -> Response:
        if method == "WatchDir":
            return await self._watch_dir(request, session)
        try:
            message = parse_message(await read_message_body(request))
            handler = {
                "Stat": self._stat,
                "ListDir": self._list_dir,
                "MakeDir": self._make_dir,
                "Move": self._move,
                "Remove": self._remove,
                "CreateWatcher": self._create_watcher,
                "GetWatcherEvents": self._watcher_events,
                "RemoveWatcher": self._remove_watcher,
            }.get(method)
            if handler is None:
                raise ConnectError("unimplemented", f"filesystem.Filesystem/{method} is not served")
            answer = await handler(message, session.files.workspace)
        except ConnectError as exc:
            return JSONResponse(exc.to_json(), status_code=exc.status)
        except GatewayError as exc:
            error = _connect_error(exc)
            return JSONResponse(error.to_json(), status_code=error.status)
        return JSONResponse(answer)

    async def _stat(self, message: dict[str, Any], workspace: Workspace) -> dict[str, Any]:
        entry = await asyncio.to_thread(workspace.entry, to_workspace(field(message, "path")))
        entry = await asyncio.to_thread(followed, workspace, entry)
        return {"entry": entry_json(entry)}

    async def _list_dir(self, message: dict[str, Any], workspace: Workspace) -> dict[str, Any]:
        depth = field(message, "depth") or 1
        if not isinstance(depth, int) or depth < 1:
            raise ConnectError("invalid_argument", "'depth' must be a positive integer")
        rel = to_workspace(field(message, "path"))
        entries = await asyncio.to_thread(workspace.list_dir, rel, min(depth, 32))
        entries = [await asyncio.to_thread(followed, workspace, e) for e in entries]
        entries.sort(key=lambda e: e.path)  # as envd lists them: a folder, then what is in it
        return {"entries": [entry_json(e) for e in entries]}

    async def _make_dir(self, message: dict[str, Any], workspace: Workspace) -> dict[str, Any]:
        rel = to_workspace(field(message, "path"))
        if not rel:
            raise ConnectError("already_exists", f"{HOME} already exists")
        if not await asyncio.to_thread(workspace.make_dir, rel):
            raise ConnectError("already_exists", f"{to_e2b(rel)} already exists")
        return {"entry": entry_json(await asyncio.to_thread(workspace.entry, rel))}

    async def _move(self, message: dict[str, Any], workspace: Workspace) -> dict[str, Any]:
        source = to_workspace(field(message, "source"))
        destination = to_workspace(field(message, "destination"))
        if not source or not destination:
            raise ConnectError("invalid_argument", f"cannot move {HOME} itself")
        await asyncio.to_thread(workspace.move, source, destination)
        return {"entry": entry_json(await asyncio.to_thread(workspace.entry, destination))}

    async def _remove(self, message: dict[str, Any], workspace: Workspace) -> dict[str, Any]:
        rel = to_workspace(field(message, "path"))
        if not rel:
            raise ConnectError("invalid_argument", f"cannot remove {HOME} itself")
        with contextlib.suppress(NotFound):  # envd's remove is `rm -rf`: nothing there is done
            await asyncio.to_thread(workspace.remove, rel)
        return {}

    # -- watching a folder (by scans of the workspace) -------------------------------------

    async def _create_watcher(
        self, message: dict[str, Any], workspace: Workspace
    ) -> dict[str, Any]:
        if len(self._watchers) >= MAX_WATCHERS:
            raise ConnectError("resource_exhausted", f"at most {MAX_WATCHERS} watchers")
        rel = to_workspace(field(message, "path"))
        recursive = bool(field(message, "recursive"))
        entry = await asyncio.to_thread(workspace.entry, rel)
        if entry.kind != "dir":
            raise ConnectError("invalid_argument", f"{to_e2b(rel)} is not a folder")
        watcher_id = secrets.token_hex(8)
        snapshot = await asyncio.to_thread(_snapshot, workspace, rel, recursive)
        self._watchers[watcher_id] = {"rel": rel, "recursive": recursive, "snapshot": snapshot}
        return {"watcherId": watcher_id}

    async def _watcher_events(
        self, message: dict[str, Any], workspace: Workspace
    ) -> dict[str, Any]:
        watcher = self._watchers.get(str(field(message, "watcher_id", "watcherId")))
        if watcher is None:
            raise ConnectError("not_found", "no such watcher")
        now = await asyncio.to_thread(_snapshot, workspace, watcher["rel"], watcher["recursive"])
        events = _events(watcher["snapshot"], now)
        watcher["snapshot"] = now
        return {"events": events}

    async def _remove_watcher(
        self, message: dict[str, Any], workspace: Workspace
    ) -> dict[str, Any]:
        if self._watchers.pop(str(field(message, "watcher_id", "watcherId")), None) is None:
            raise ConnectError("not_found", "no such watcher")
        return {}

    async def _watch_dir(self, request: Request, session: Session) -> Response:
        workspace = session.files.workspace
        error: ConnectError | None = None
        try:
            reader = EnvelopeReader()
            messages = list(reader.feed(await read_message_body(request)))
            reader.finish()
            message = messages[0] if messages else {}
            rel = to_workspace(field(message, "path"))
            recursive = bool(field(message, "recursive"))
            entry = await asyncio.to_thread(workspace.entry, rel)
            if entry.kind != "dir":
                raise ConnectError("invalid_argument", f"{to_e2b(rel)} is not a folder")
            if self._watch_streams >= MAX_WATCHERS:
                raise ConnectError("resource_exhausted", f"at most {MAX_WATCHERS} watches at once")
        except ConnectError as exc:
            error = exc
        except GatewayError as exc:
            error = _connect_error(exc)

        async def stream() -> AsyncIterator[bytes]:
            if error is not None:
                yield end_stream(error)
                return
            yield envelope({"start": {}})
            self._watch_streams += 1
            try:
                async for out in watching():
                    yield out
            finally:
                self._watch_streams -= 1

        async def watching() -> AsyncIterator[bytes]:
            before = await asyncio.to_thread(_snapshot, workspace, rel, recursive)
            quiet_since = time.monotonic()
            while True:
                await asyncio.sleep(WATCH_POLL_SECONDS)
                try:
                    now = await asyncio.to_thread(_snapshot, workspace, rel, recursive)
                except GatewayError as exc:
                    yield end_stream(_connect_error(exc))
                    return
                for event in _events(before, now):
                    yield envelope({"filesystem": event})
                    quiet_since = time.monotonic()
                before = now
                if time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
                    yield envelope({"keepalive": {}})
                    quiet_since = time.monotonic()

        return StreamingResponse(stream(), media_type=STREAM_TYPE)


def _snapshot(workspace: Workspace, rel: str, recursive: bool) -> dict[str, tuple[str, int]]:
    """name (relative to the watched folder) -> (kind, mtime_ns-ish) of what is in it."""
    depth = 32 if recursive else 1
    prefix = f"{rel}/" if rel else ""
    return {
        e.path[len(prefix) :]: (e.kind, int(e.modified * 1e9) ^ e.size)
        for e in workspace.list_dir(rel, depth)
    }


def _events(
    before: dict[str, tuple[str, int]], now: dict[str, tuple[str, int]]
) -> list[dict[str, str]]:
    events = []
    for name in sorted(now.keys() - before.keys()):
        events.append({"name": name, "type": "EVENT_TYPE_CREATE"})
    for name in sorted(before.keys() & now.keys()):
        if before[name] != now[name] and now[name][0] == "file":
            events.append({"name": name, "type": "EVENT_TYPE_WRITE"})
    for name in sorted(before.keys() - now.keys()):
        events.append({"name": name, "type": "EVENT_TYPE_REMOVE"})
    return events


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _gunzip(data: bytes, limit: int) -> bytes:
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decompressor.decompress(data, limit + 1)
    except zlib.error as exc:
        raise BadRequest(f"the gzip body does not decompress: {exc}") from None
    if len(out) > limit or decompressor.unconsumed_tail:
        raise PayloadTooLarge("the file is over the upload limit")
    return out


def _written(rel: str) -> dict[str, str]:
    return {"name": rel.rsplit("/", 1)[-1], "type": "file", "path": to_e2b(rel)}


def _http_status(exc: GatewayError) -> int:
    if isinstance(exc, PayloadTooLarge):
        return 507 if "full" in exc.message else 413
    return exc.status_code if exc.status_code in (400, 401, 403, 404, 409, 413) else 500


def _http_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)
