"""envd's HTTP and `filesystem.Filesystem` on a sandbox's working directory.

Paths are E2B's (`envd_entries.py`: `/home/user/...` is the session's workspace); every
access goes through `Workspace`, which walks from the workspace's own fd and never follows
a symlink. A file's metadata (`X-Metadata-<key>` headers on an upload) is kept as its
`user.e2b.<key>` extended attributes, and shown in its `EntryInfo`.

    GET  /health                          204
    GET  /files?path=P                    the file's bytes
    POST /files[?path=P]                  multipart (field `file`, filename = the path)
                                          or octet-stream (gzip allowed): [{name, type, path,
                                          metadata?}]
    POST /filesystem.Filesystem/<Method>  Stat, ListDir, MakeDir, Move, Remove,
                                          CreateWatcher, GetWatcherEvents, RemoveWatcher
                                          (unary), WatchDir (server stream)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import time
import zlib
from collections.abc import AsyncIterator
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
from kernel_gateway.kernels.workspace import Workspace
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
from kernel_gateway.protocols.e2b.envd_entries import (
    HOME,
    described,
    entry_json,
    followed,
    to_e2b,
    to_workspace,
    upload_metadata,
)
from kernel_gateway.protocols.e2b.outside import Outside, outside
from kernel_gateway.protocols.e2b.watch import POLL_SECONDS, Watch
from kernel_gateway.sessions.session import Session

MAX_WATCHERS = 16
KEEPALIVE_SECONDS = 50.0


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

    def __init__(self, limit: int) -> None:
        self._limit = limit
        """The most bytes a file read or written outside `/home/user` may have."""
        self._watchers: dict[str, Watch] = {}
        self._watch_streams = 0
        """WatchDir streams open now (each polls the folder): at most MAX_WATCHERS."""

    # -- HTTP ------------------------------------------------------------------------------

    async def download(self, request: Request, session: Session) -> Response:
        """The file's bytes; outside `/home/user`, read in the sandbox (`outside.py`)."""
        workspace = session.files.workspace
        path = request.query_params.get("path")
        try:
            absolute = outside(path)
            if absolute is not None:
                data = await Outside(session, self._limit).read(absolute)
                return Response(data, media_type="application/octet-stream")
            rel = to_workspace(path)
            if not rel:
                raise BadRequest("a file path is required")
            fd, info = await asyncio.to_thread(workspace.open_read, rel)
        except ConnectError as exc:
            return _http_error(HTTP_STATUS.get(exc.code, 500), exc.message)
        except GatewayError as exc:
            return _http_error(_http_status(exc), exc.message)
        data = await asyncio.to_thread(_read_all, fd)
        return Response(data, media_type="application/octet-stream")

    async def upload(self, request: Request, session: Session, limit: int, total: int) -> Response:
        """Files from a multipart form (each at most `limit` bytes, all together at most
        `total`) or one octet-stream body (at most `limit`)."""
        query_path = request.query_params.get("path")
        kind = request.headers.get("content-type", "")
        written: list[dict[str, Any]] = []
        metadata = upload_metadata(request)
        try:
            if kind.startswith("multipart/form-data"):
                # All the files of one request together cannot be more than the disk holds.
                whole = capped(request, max(limit, total))
                async with whole.form(max_files=1000, max_part_size=limit) as form:
                    parts = [(k, v) for k, v in form.multi_items() if k == "file"]
                    seen: set[str] = set()
                    for _, part in parts:
                        # A plain field (no file name) is the file's text, as envd takes it.
                        filename = None if isinstance(part, str) else part.filename
                        path = query_path or filename or ""
                        if path in seen:
                            raise BadRequest(f"a repeated path: {path!r}")
                        seen.add(path)
                        data = part.encode() if isinstance(part, str) else await part.read()
                        written.append(await self._write(session, path, data, limit, metadata))
            else:
                if not query_path:
                    raise BadRequest("'path' is required for an octet-stream upload")
                data = await read_body(request, limit)
                if request.headers.get("content-encoding", "").lower() == "gzip":
                    data = _gunzip(data, limit)
                written.append(await self._write(session, query_path, data, limit, metadata))
        except ConnectError as exc:
            return _http_error(HTTP_STATUS.get(exc.code, 500), exc.message)
        except GatewayError as exc:
            return _http_error(_http_status(exc), exc.message)
        if not written:
            return _http_error(400, "no file in the request (multipart field 'file')")
        return JSONResponse(written)

    @staticmethod
    async def _write(
        session: Session, path: str, data: bytes, limit: int, metadata: dict[str, str]
    ) -> dict[str, Any]:
        """One file of an upload, in the workspace or (outside `/home/user`) the sandbox."""
        absolute = outside(path)
        if absolute is not None:
            if metadata:
                raise BadRequest(f"file metadata is kept under {HOME} only")

            async def one() -> AsyncIterator[bytes]:
                yield data

            return await Outside(session, limit).write(absolute, one())
        rel = to_workspace(path)
        if not rel:
            raise BadRequest(f"a file path is required, got {path!r}")
        await session.files.write(rel, data, limit, metadata)
        return _written(rel, metadata)

    # -- filesystem.Filesystem ------------------------------------------------------------

    async def filesystem(self, method: str, request: Request, session: Session) -> Response:
        if method == "WatchDir":
            return await self._watch_dir(request, session)
        try:
            message = parse_message(await read_message_body(request))
            if _names_outside(method, message):
                answer = await Outside(session, self._limit).call(method, message)
                return JSONResponse(answer)
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
        return {"entry": await asyncio.to_thread(described, workspace, entry)}

    async def _list_dir(self, message: dict[str, Any], workspace: Workspace) -> dict[str, Any]:
        depth = field(message, "depth") or 1
        if not isinstance(depth, int) or depth < 1:
            raise ConnectError("invalid_argument", "'depth' must be a positive integer")
        rel = to_workspace(field(message, "path"))
        entries = await asyncio.to_thread(workspace.list_dir, rel, min(depth, 32))
        entries = [await asyncio.to_thread(followed, workspace, e) for e in entries]
        entries.sort(key=lambda e: e.path)  # as envd lists them: a folder, then what is in it
        return {
            "entries": await asyncio.to_thread(lambda: [described(workspace, e) for e in entries])
        }

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
        entry = await asyncio.to_thread(workspace.entry, destination)
        return {"entry": await asyncio.to_thread(described, workspace, entry)}

    async def _remove(self, message: dict[str, Any], workspace: Workspace) -> dict[str, Any]:
        rel = to_workspace(field(message, "path"))
        if not rel:
            raise ConnectError("invalid_argument", f"cannot remove {HOME} itself")
        with contextlib.suppress(NotFound):  # envd's remove is `rm -rf`: nothing there is done
            await asyncio.to_thread(workspace.remove, rel)
        return {}

    # -- watching a folder (by scans of the workspace: `watch.py`) -----------------------

    async def _create_watcher(
        self, message: dict[str, Any], workspace: Workspace
    ) -> dict[str, Any]:
        if len(self._watchers) >= MAX_WATCHERS:
            raise ConnectError("resource_exhausted", f"at most {MAX_WATCHERS} watchers")
        watch = await self._start_watch(message, workspace)
        watcher_id = secrets.token_hex(8)
        self._watchers[watcher_id] = watch
        return {"watcherId": watcher_id}

    async def _watcher_events(
        self, message: dict[str, Any], workspace: Workspace
    ) -> dict[str, Any]:
        watch = self._watchers.get(str(field(message, "watcher_id", "watcherId")))
        if watch is None:
            raise ConnectError("not_found", "no such watcher")
        return {"events": await asyncio.to_thread(watch.changes, workspace)}

    async def _remove_watcher(
        self, message: dict[str, Any], workspace: Workspace
    ) -> dict[str, Any]:
        if self._watchers.pop(str(field(message, "watcher_id", "watcherId")), None) is None:
            raise ConnectError("not_found", "no such watcher")
        return {}

    @staticmethod
    async def _start_watch(message: dict[str, Any], workspace: Workspace) -> Watch:
        """A watch of the request's folder (`path`, `recursive`, `include_entry`; envd's
        `allow_network_mounts` changes nothing: a session has no network mounts)."""
        rel = to_workspace(field(message, "path"))
        entry = await asyncio.to_thread(workspace.entry, rel)
        if entry.kind != "dir":
            raise ConnectError("invalid_argument", f"{to_e2b(rel)} is not a folder")
        return await asyncio.to_thread(
            functools.partial(
                Watch.start,
                workspace,
                rel,
                recursive=bool(field(message, "recursive")),
                include_entry=bool(field(message, "include_entry", "includeEntry")),
            )
        )

    async def _watch_dir(self, request: Request, session: Session) -> Response:
        workspace = session.files.workspace
        error: ConnectError | None = None
        watch: Watch | None = None
        try:
            reader = EnvelopeReader()
            messages = list(reader.feed(await read_message_body(request)))
            reader.finish()
            if self._watch_streams >= MAX_WATCHERS:
                raise ConnectError("resource_exhausted", f"at most {MAX_WATCHERS} watches at once")
            watch = await self._start_watch(messages[0] if messages else {}, workspace)
        except ConnectError as exc:
            error = exc
        except GatewayError as exc:
            error = _connect_error(exc)

        async def stream() -> AsyncIterator[bytes]:
            if error is not None or watch is None:
                yield end_stream(error or ConnectError("internal", "no watch"))
                return
            yield envelope({"start": {}})
            self._watch_streams += 1
            try:
                async for out in watching(watch):
                    yield out
            finally:
                self._watch_streams -= 1

        async def watching(watch: Watch) -> AsyncIterator[bytes]:
            quiet_since = time.monotonic()
            while True:
                await asyncio.sleep(POLL_SECONDS)
                try:
                    found = await asyncio.to_thread(watch.changes, workspace)
                except GatewayError as exc:
                    yield end_stream(_connect_error(exc))
                    return
                for event in found:
                    yield envelope({"filesystem": event})
                    quiet_since = time.monotonic()
                if time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
                    yield envelope({"keepalive": {}})
                    quiet_since = time.monotonic()

        return StreamingResponse(stream(), media_type=STREAM_TYPE)


def _names_outside(method: str, message: dict[str, Any]) -> bool:
    """A filesystem call on a path outside `/home/user` (a move: either end)."""
    if method == "Move":
        return any(outside(field(message, name)) for name in ("source", "destination"))
    if method in ("Stat", "ListDir", "MakeDir", "Remove"):
        return outside(field(message, "path")) is not None
    return False


HTTP_STATUS = {
    "not_found": 404,
    "permission_denied": 403,
    "invalid_argument": 400,
    "already_exists": 409,
    "resource_exhausted": 507,
    "unavailable": 503,
    "deadline_exceeded": 504,
}
"""envd's HTTP status for a Connect error code (the /files routes speak HTTP)."""


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


def _written(rel: str, metadata: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": rel.rsplit("/", 1)[-1], "type": "file", "path": to_e2b(rel)}
    if metadata:
        out["metadata"] = metadata
    return out


def _http_status(exc: GatewayError) -> int:
    if isinstance(exc, PayloadTooLarge):
        return 507 if "full" in exc.message else 413
    return exc.status_code if exc.status_code in (400, 401, 403, 404, 409, 413) else 500


def _http_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)
